//! Library side of the ferry binary: the demo tool (and later the benchmark).
pub mod demo_tool;
