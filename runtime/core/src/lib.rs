//! Ferry's pure core: what a thread is and how each command changes it
//! (`thread`), what a registered toolset holds and how an `operation`
//! resolves to one of its tools (`toolsets`), and the callback tokens that
//! name one call (`token`). Nothing here does I/O or reads a clock: the
//! engine passes in the time and writes what is decided.

pub mod audit;
pub mod consumer;
pub mod credential;
pub mod digest;
pub mod identity;
pub mod limits;
pub mod thread;
pub mod token;
pub mod toolsets;
pub mod webhook;
