//! The bus port: how accepted work reaches workers. In `LocalBus`, work of
//! one thread is handled one item at a time, in order, and threads proceed
//! in parallel; the JetStream bus shares work among workers without a
//! per-thread order.
//! `local` is the in-process adapter of `ferry serve`.

pub mod jetstream;
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
