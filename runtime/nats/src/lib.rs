//! Ferry's cluster adapter on NATS JetStream: the store (`jetstream`) and
//! the pieces that join `ferry runtime` nodes and `ferry worker`s
//! (`cluster`).

pub mod cluster;
pub mod jetstream;

use ferry_engine::{engine, store, thread, toolsets};
