//! Readiness for the protocol fronts' health checks.

use super::{Engine, Error};

impl Engine {
    /// Ok when a call submitted now could be made durable: the store takes
    /// a flush. (OXP's `/health` answers 503 otherwise.)
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.flush().await?;
        Ok(())
    }
}
