//! RAP (the Reactive Agent Protocol): invocation, callbacks, toolsets and the
//! runtime-to-tool-server notifications.

mod callback;
mod invocation;
mod notify;
mod peek;
mod toolset;

pub use callback::{
    Callback, CallbackError, ContentItem, DiffContent, DisplaySegment, ImageContent, KnownSegment,
    OAuth, SubscriptionEvent, ToolResult, UserChoice, ViewUpdate,
};
pub use invocation::Invocation;
pub use notify::{CancelToolCall, CloseThread, ToolCallStatus, ToolCallStatusReply};
pub use peek::{Ending, Peek};
pub use toolset::{Annotations, Manifest, ToolDef};
