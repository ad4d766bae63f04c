//! Ferry's cluster adapter on NATS JetStream: the store (`jetstream`) and
//! the pieces that join `ferry runtime` nodes and `ferry worker`s
//! (`cluster`).

pub mod audit;
pub mod cluster;
pub mod jetstream;

use ferry_core::{thread, toolsets};
use ferry_engine::engine;
use ferry_store as store;
