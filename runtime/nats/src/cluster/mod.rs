//! Cluster mode: the pieces that join `ferry runtime` nodes and `ferry
//! worker`s through NATS JetStream. The JetStream store is
//! `crate::jetstream`; here are the subject layout, what every process
//! must agree on, the consumer workers share, their pulls, how they carry
//! out the work, and how they stop; and the buckets the shared state of
//! runtime nodes lives in (consumers, MCP sessions, limits).

pub mod deliveries;
pub mod identity;
pub(crate) mod kv;
pub mod lanes;
pub mod mcp_sessions;
pub mod pull;
pub mod rate_limits;
pub mod stop;
pub mod streams;
pub mod subjects;
pub mod worker;
