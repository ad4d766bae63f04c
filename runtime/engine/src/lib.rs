//! Ferry's engine: it runs the pure thread state machine (`ferry-core`) on a
//! store and answers once what it decided is durable. Here are the ports it
//! owns (`store::Store`, `bus::Bus`, `sessions::Sessions`), their embedded
//! adapters (`store::sled`, `bus::LocalBus`, `sessions::InMemory`), and the
//! metrics it records. No HTTP: errors name an `ErrorCode`, and the fronts
//! choose statuses.

pub mod bus;
pub mod concurrency;
pub mod delivery;
pub mod engine;
pub mod limiter;
pub mod log_rate;
pub mod metrics;
pub mod sessions;
pub mod shared_lanes;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use engine::{Acknowledgements, Config, Engine};
pub use ferry_core::{
    audit, consumer, credential, digest, identity, limits, thread, token, toolsets, webhook,
};
pub use ferry_store as store;
