//! The invocation the runtime POSTs to a tool (`rap-1`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tool invocation as sent on the wire. `call_id` is always sent (as
/// `null` when absent) because the spec's example shows it that way; the
/// optional thread fields are omitted when empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    pub operation: String,
    pub arguments: Value,
    pub id: String,
    #[serde(default)]
    pub call_id: Option<String>,
    pub callback_url: String,
    pub group_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_ancestors: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Ferry's addition to rap-1: the identity that submitted the call,
    /// which Ferry authenticated, where `user_id` is only what the caller
    /// claims. Omitted for calls recorded before identities were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Ferry's addition to rap-1: `true` when `user_id` is one the
    /// identity's credential is bound to (a token made with `--user`, an
    /// OXP JWT's `sub`), so a tool may authorize on it; absent when the
    /// caller only claims it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub user_verified: bool,
}
