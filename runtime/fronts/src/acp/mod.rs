//! The ACP front: a thread's calls as `session/update` notifications and
//! `session/request_permission` requests over SSE (`stream`), and the
//! client's permission responses POSTed back (`respond`). The session is
//! the thread: `sessionId` = `group_id`, `toolCallId` = call id.

mod kind;
mod messages;
mod respond;
mod stream;

pub use messages::{message, permission_request_id, PERMISSION_PREFIX};
pub use respond::respond;
pub use stream::stream;
