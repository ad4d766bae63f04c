//! The bus port: how accepted work reaches workers. In `LocalBus`, the
//! in-process adapter of `ferry serve`, work of one thread is handled one
//! item at a time, in order, and threads proceed in parallel. In a cluster
//! the commit that accepts a call is itself the work ([`InTheLog`]).

mod local;

use async_trait::async_trait;
use ferry_proto::bus::Work;

pub use local::{Handler, LocalBus};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the bus is unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Hands `work` to the workers. The work is already durable in the
    /// store, so a publish lost in a crash is redone by recovery.
    async fn publish(&self, work: Work) -> Result<(), Error>;
}

/// The cluster's bus: nothing to send. A commit that hands calls to
/// dispatch is stored where workers consume it (`store::jetstream`), so
/// the work exists exactly when the decision does, and no crash can keep
/// one from the other.
pub struct InTheLog;

#[async_trait]
impl Bus for InTheLog {
    async fn publish(&self, _work: Work) -> Result<(), Error> {
        Ok(())
    }
}
