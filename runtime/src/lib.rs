//! Ferry's runtime: the pure thread state machine, the storage and bus ports
//! with their embedded adapters, and the HTTP fronts.

pub mod thread;
