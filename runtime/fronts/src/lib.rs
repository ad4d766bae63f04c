//! Ferry's fronts: the native HTTP API with its dashboard (`http`), MCP,
//! OXP and ACP. Each turns its protocol's requests into the engine's and
//! the engine's answers and errors into its protocol's shape; HTTP statuses
//! are chosen here and nowhere else.

pub mod acp;
pub mod http;
pub mod mcp;
pub mod oxp;

use ferry_core::{credential, digest, identity, limits, thread, toolsets};
use ferry_engine::{engine, metrics};
use ferry_store as store;
