//! `ferry threads …` and `ferry replay`.

use std::time::Duration;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::Value;

use super::client::{Client, Failure};
use super::{emit, print, Connection};

#[derive(Args)]
pub struct Threads {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ThreadsCommand,
}

#[derive(Subcommand)]
enum ThreadsCommand {
    /// The most recently active threads.
    List {
        /// How many (Ferry's default 50, at most 500).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// A thread's metadata: ancestors, active subscriptions, counts,
    /// grants, last sequence number.
    Show { group_id: String },
    /// Close a thread: what is open in it is cancelled, its tool servers
    /// are told, and later calls in it are refused.
    Close { group_id: String },
}

impl Threads {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let answer = match &self.command {
            ThreadsCommand::List { limit } => {
                let query: Vec<_> = limit.iter().map(|l| ("limit", l.to_string())).collect();
                client.get(&["v1", "threads"], &query).await?
            }
            ThreadsCommand::Show { group_id } => {
                client.get(&["v1", "threads", group_id], &[]).await?
            }
            ThreadsCommand::Close { group_id } => {
                let path = ["v1", "threads", group_id, "close"];
                client.send(Method::POST, &path, &[], None).await?
            }
        };
        print(&answer);
        Ok(())
    }
}

#[derive(Args)]
pub struct Replay {
    #[command(flatten)]
    connection: Connection,
    group_id: String,
    /// Start after this sequence number (0: from the first event).
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// Only these event types, comma-separated (`tool_result,oauth`).
    #[arg(long)]
    types: Option<String>,
    /// Keep reading: print events as they happen, until interrupted.
    #[arg(long, short = 'f')]
    follow: bool,
}

/// Events asked for per read: Ferry's largest page.
const PAGE: u64 = 1_000;

/// How long one read waits for news with `--follow`.
const POLL: Duration = Duration::from_secs(30);

impl Replay {
    /// Reads the thread's log page by page from `--after`, printing each
    /// event as one line of JSON, until the log is read (or, following,
    /// for good).
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        if !self.follow {
            // A thread that does not exist has no events either: say so
            // (a mistyped name), where following waits for it to begin.
            client.get(&["v1", "threads", &self.group_id], &[]).await?;
        }
        let path = ["v1", "threads", self.group_id.as_str(), "events"];
        let wait = if self.follow { POLL } else { Duration::ZERO };
        let mut after = self.after;
        // Whether this Ferry answered once: from then on, following rides
        // out its outages (a mistyped --url still fails at once).
        let mut reached = false;
        loop {
            let mut query = vec![("after", after.to_string()), ("limit", PAGE.to_string())];
            if let Some(types) = &self.types {
                query.push(("types", types.clone()));
            }
            if self.follow {
                query.push(("wait", wait.as_secs().to_string()));
            }
            let page = if self.follow && reached {
                client.read_through_outages(&path, &query, wait).await?
            } else {
                client.poll(&path, &query, wait).await?
            };
            reached = true;
            let events = page["events"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            for event in events {
                if !emit(&event.to_string()) {
                    return Ok(());
                }
            }
            let next = next_after(&page, after)?;
            // An empty page that moved on skipped events `--types` did not
            // want; one that did not is the end of the log.
            if events.is_empty() && next == after && !self.follow {
                return Ok(());
            }
            after = next;
        }
    }
}

/// Where the page stopped; it never goes back.
fn next_after(page: &Value, after: u64) -> Result<u64, Failure> {
    match page["next_after"].as_u64() {
        Some(next) if next >= after => Ok(next),
        _ => Err(Failure::NotFerry(format!(
            "Ferry's page of events has no usable \"next_after\": {page}"
        ))),
    }
}
