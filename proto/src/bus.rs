//! Envelopes that travel on the bus between the runtime and workers
//! (in-process in `ferry serve`, NATS subjects in the cluster), encoded as
//! MessagePack.

use serde::{Deserialize, Serialize};

use crate::rap::Invocation;

/// A unit of work for a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Work {
    /// POST `invocation` to `endpoint`. The call may already be finished or
    /// cancelled by the time this is taken: the worker checks first.
    Dispatch {
        endpoint: String,
        invocation: Invocation,
    },
}

impl Work {
    /// The thread whose order this work belongs to.
    pub fn group_id(&self) -> &str {
        match self {
            Work::Dispatch { invocation, .. } => &invocation.group_id,
        }
    }

    /// The call this work is for, within its thread.
    pub fn call_id(&self) -> &str {
        match self {
            Work::Dispatch { invocation, .. } => &invocation.id,
        }
    }
}
