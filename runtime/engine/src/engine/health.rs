//! Readiness for the protocol fronts' health checks.

use super::{Engine, Error};

impl Engine {
    /// Ok when a call submitted now could be made durable: the store takes
    /// a flush. (OXP's `/health` answers 503 otherwise.)
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.writable()?;
        self.store.flush().await?;
        Ok(())
    }

    /// Whether the store could take a write now, as far as it can tell
    /// without one (`/healthz`: a probe must not cost an fsync).
    pub fn writable(&self) -> Result<(), Error> {
        Ok(self.store.writable()?)
    }
}
