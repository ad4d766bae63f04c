//! Library side of the ferry binary: `serve` assembly, the demo tool, and
//! the benchmark.

pub mod bench;
pub mod demo_tool;
pub mod serve;
