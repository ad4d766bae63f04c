//! A fixture for tests of the stores, here and in the adapters (feature
//! `testing`).

use ferry_core::thread::{CallRecord, Submission};
use ferry_proto::time::Timestamp;

/// A queued call `id`.
pub fn call(id: &str) -> CallRecord {
    let submission = Submission {
        operation: "t".into(),
        arguments: serde_json::json!({}),
        call_id: None,
        user_id: None,
        thread_ancestors: None,
    };
    CallRecord::queued(
        id,
        submission,
        "T.t@1.0.0".into(),
        None,
        1,
        Timestamp::UNIX_EPOCH,
    )
}
