//! Operator commands: `ferry toolsets`, `tools`, `calls`, `approvals`,
//! `threads`, `tokens`, `audit` and `replay`, clients of a running Ferry's native API
//! (`ferry serve`, or any runtime node of a cluster). They print Ferry's
//! answers as JSON (a replay, one event per line) for people and scripts
//! alike, and say what Ferry refused on stderr, with an exit code per kind
//! of failure ([`Failure::exit_code`]).

mod approvals;
mod audit;
mod calls;
pub mod client;
mod consumers;
mod threads;
mod tokens;
mod toolsets;

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;

pub use approvals::Approvals;
pub use audit::Audit;
pub use calls::Calls;
pub use client::Failure;
pub use consumers::Consumers;
pub use threads::{Replay, Threads};
pub use tokens::Tokens;
pub use toolsets::{Tools, Toolsets};

use crate::args::http_url;

/// `--url`: an http(s) URL with a host, to which the API's paths are
/// appended: a query or a fragment would swallow them, and a user name or
/// password would be sent to Ferry as Basic credentials it never reads
/// (and shown in errors); the token goes in `--api-token`.
fn ferry_url(text: &str) -> Result<String, String> {
    let checked = http_url(text)?;
    let url = reqwest::Url::parse(&checked).map_err(|e| e.to_string())?;
    let after_scheme = &text[url.scheme().len() + 1..];
    if !after_scheme.starts_with("//") || after_scheme.starts_with("///") {
        return Err(format!("no host after \"{}://\"", url.scheme()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "a user name or password in --url is not how Ferry takes credentials: give \
             FERRY_API_TOKEN (or --api-token) instead"
                .into(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(
            "a query or a fragment would swallow the API's paths: give Ferry's base URL alone"
                .into(),
        );
    }
    Ok(checked)
}

/// Where Ferry is and how to be let in; every operator command takes these.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// Ferry's native API: `ferry serve`'s address, or any runtime node's.
    #[arg(
        long,
        global = true,
        env = "FERRY_URL",
        default_value = "http://127.0.0.1:8080",
        value_parser = ferry_url
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
    /// Make, list and revoke named API tokens (needs `admin`).
    Tokens(Tokens),
    /// Read the audit log, one JSON object per line (needs `admin`).
    Audit(Audit),
    /// Durable delivery cursors over every thread: make, show, replay,
    /// delete; `tail` pulls and prints.
    Consumers(Consumers),
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
        Operator::Tokens(command) => command.run().await,
        Operator::Audit(command) => command.run().await,
        Operator::Consumers(command) => command.run().await,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_fit_to_append_paths_to() {
        for good in [
            "http://127.0.0.1:8080",
            "https://ferry.example/",
            "http://10.0.0.1/ferry",
        ] {
            assert_eq!(ferry_url(good).as_deref(), Ok(good));
        }
        for bad in [
            "ftp://127.0.0.1",
            "127.0.0.1:8080",
            "http:///v1",
            "http:/127.0.0.1",
            "http://u:pw@127.0.0.1",
            "http://127.0.0.1?x=1",
            "http://127.0.0.1#frag",
        ] {
            let refused = ferry_url(bad).expect_err(bad);
            assert!(!refused.contains("pw@"), "{refused}");
        }
    }
}
