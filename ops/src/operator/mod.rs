//! Operator commands: `ferry toolsets`, `tools`, `calls`, `approvals`,
//! `threads` and `replay`, clients of a running Ferry's native API
//! (`ferry serve`, or any runtime node of a cluster). They print Ferry's
//! answers as JSON (a replay, one event per line) for people and scripts
//! alike, and say what Ferry refused on stderr, with an exit code per kind
//! of failure ([`Failure::exit_code`]).

mod approvals;
mod calls;
pub mod client;
mod threads;
mod toolsets;

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;

pub use approvals::Approvals;
pub use calls::Calls;
pub use client::Failure;
pub use threads::{Replay, Threads};
pub use toolsets::{Tools, Toolsets};

use crate::args::http_url;

/// Where Ferry is and how to be let in; every operator command takes these.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// Ferry's native API: `ferry serve`'s address, or any runtime node's.
    #[arg(
        long,
        global = true,
        env = "FERRY_URL",
        default_value = "http://127.0.0.1:8080",
        value_parser = http_url
    )]
    pub url: String,
    /// Sent as `Authorization: Bearer`, for a Ferry started with
    /// `--api-token` (prefer the variable: `ps` shows flags).
    #[arg(long, global = true, env = "FERRY_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}

/// The operator commands, as `ferry`'s subcommands.
#[derive(Subcommand)]
pub enum Operator {
    /// Register, list, refresh and remove toolsets.
    Toolsets(Toolsets),
    /// Every callable tool, as agents see them.
    Tools(Tools),
    /// Submit calls, read them, cancel them, answer their choices.
    Calls(Calls),
    /// What waits for a reviewer; approve, reject, revoke grants.
    Approvals(Approvals),
    /// Recent threads, one thread's metadata, closing a thread.
    Threads(Threads),
    /// Print a thread's events, one JSON object per line (`--follow` to
    /// keep reading).
    Replay(Replay),
}

/// Runs one operator command against the Ferry its arguments name.
pub async fn run(operator: Operator) -> Result<(), Failure> {
    match operator {
        Operator::Toolsets(command) => command.run().await,
        Operator::Tools(command) => command.run().await,
        Operator::Calls(command) => command.run().await,
        Operator::Approvals(command) => command.run().await,
        Operator::Threads(command) => command.run().await,
        Operator::Replay(command) => command.run().await,
    }
}

/// Prints one answer, pretty.
fn print(value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    emit(&text);
}

/// Writes one line to stdout; false once stdout is gone (a reader such as
/// `head` that has seen enough), so a replay stops quietly instead of
/// panicking on the broken pipe.
fn emit(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}
