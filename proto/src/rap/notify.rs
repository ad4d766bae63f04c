//! Runtime-to-tool-server notifications (`rap-3`), POSTed to paths relative
//! to the tool server's base URL.

use serde::{Deserialize, Serialize};

/// `POST /cancel_tool_call`: best effort, single shot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelToolCall {
    pub thread_id: String,
    pub tool_call_id: String,
}

/// `POST /close_thread`: best effort, single shot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloseThread {
    pub thread_id: String,
}

/// `POST /tool_call_status`: asked on recovery, only of the server that got
/// the invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallStatus {
    pub thread_id: String,
    pub tool_call_id: String,
}

/// The answer to [`ToolCallStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallStatusReply {
    pub alive: bool,
}
