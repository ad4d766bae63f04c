//! Library side of the ferry binary: `serve` assembly, the demo tool, and
//! the benchmark.

pub mod args;
pub mod audit_lines;
pub mod bench;
pub mod cluster;
pub mod data_dir;
pub mod demo_tool;
pub mod listener;
pub mod operator;
pub mod serve;
pub mod tool_servers;
