//! Ferry's runtime: the pure thread state machine, the storage and bus ports
//! with their embedded adapters, the engine that joins them, and the HTTP
//! fronts.

pub mod acp;
pub mod bus;
pub mod cluster;
pub mod engine;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod oxp;
pub mod store;

pub use engine::{Config, Engine};
pub use ferry_core::{digest, thread, token, toolsets};
