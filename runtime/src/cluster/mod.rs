//! Cluster mode: the pieces that join `ferry runtime` nodes and `ferry
//! worker`s through NATS JetStream. The storage and bus adapters live with
//! their ports (`store::jetstream`, `bus::jetstream`); here are the streams,
//! the runtime node's outbox and relay, and the worker's consumers and how
//! it stops.

pub mod outbox;
pub mod provisional;
pub mod pull;
pub mod relay;
pub mod stop;
pub mod streams;
pub mod subjects;
pub mod worker;
