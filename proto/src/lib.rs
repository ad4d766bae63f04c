//! Ferry's wire types, with no I/O: what crosses HTTP to tools (RAP), what
//! agents send and read (the native API), and what travels on the bus.
//!
//! Every type here serializes to exactly the JSON the protocol documents in
//! `shared/specs/` show; `tests/spec_examples.rs` holds each example.

pub mod api;
pub mod audit;
pub mod bus;
pub mod error_code;
pub mod idempotency;
pub mod jsonrpc;
pub mod rap;
pub mod time;

pub use api::{CallStatus, ErrorBody, Event, EventKind};
pub use error_code::ErrorCode;
pub use rap::{Callback, ContentItem, DisplaySegment, Invocation, Manifest, ToolDef};
pub use time::{Deadline, Timestamp};
