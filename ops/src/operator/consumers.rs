//! `ferry consumers …`: durable delivery cursors over every thread
//! (docs/api.md "Consumers"); `tail` pulls and prints, acknowledging what
//! it printed.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

use super::client::{Client, Failure};
use super::{emit, print, Connection};

#[derive(Args)]
pub struct Consumers {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ConsumersCommand,
}

#[derive(Subcommand)]
enum ConsumersCommand {
    /// Every consumer, with its lag.
    List,
    /// One consumer: its spec, lag and dead letters.
    Show { name: String },
    /// Make a consumer (needs `admin`); the same again changes nothing.
    Create {
        name: String,
        /// Event types it takes (repeatable, or comma-separated).
        #[arg(long = "type", value_delimiter = ',', required = true)]
        types: Vec<String>,
        /// Only threads whose `group_id` starts with this.
        #[arg(long)]
        group_prefix: Option<String>,
        /// Only events of calls to these toolsets (repeatable).
        #[arg(long = "toolset", value_delimiter = ',')]
        toolsets: Vec<String>,
        /// Seconds a puller may hold an event before it goes out again.
        #[arg(long)]
        ack_wait: Option<u64>,
        /// Deliveries after which an unacknowledged event is dead-lettered.
        #[arg(long)]
        max_deliver: Option<u32>,
        /// POST each event here instead of waiting for pulls.
        #[arg(long, requires = "push_secret")]
        push_url: Option<String>,
        /// The push signing secret, `whsec_…` (prefer the variable).
        #[arg(
            long,
            env = "FERRY_PUSH_SECRET",
            hide_env_values = true,
            requires = "push_url"
        )]
        push_secret: Option<String>,
        /// Seconds a push retries an event before dead-lettering it.
        #[arg(long, requires = "push_url")]
        max_age: Option<u64>,
    },
    /// Deliver again from a sequence number or a time (needs `admin`).
    #[command(group(clap::ArgGroup::new("from").required(true).args(["from_seq", "from_time"])))]
    Replay {
        name: String,
        /// From this `seq` (in each thread, or in `--group-id`'s).
        #[arg(long)]
        from_seq: Option<u64>,
        /// From this RFC 3339 time, in UTC (`2026-12-07T16:00:00Z`).
        #[arg(long)]
        from_time: Option<String>,
        /// Only this thread.
        #[arg(long)]
        group_id: Option<String>,
    },
    /// Delete a consumer and its cursors (needs `admin`).
    Delete { name: String },
    /// Pull events and print them as JSON lines, acknowledging each batch
    /// once it is printed; until interrupted, or with `--once` until a
    /// pull finds nothing.
    Tail {
        name: String,
        /// Events per pull.
        #[arg(long, default_value_t = 100)]
        max: usize,
        /// Seconds each pull waits for an event.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// Stop when a pull comes back empty.
        #[arg(long)]
        once: bool,
    },
}

impl Consumers {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let answer = match self.command {
            ConsumersCommand::List => client.get(&["v1", "consumers"], &[]).await?,
            ConsumersCommand::Show { name } => client.get(&["v1", "consumers", &name], &[]).await?,
            ConsumersCommand::Create {
                name,
                types,
                group_prefix,
                toolsets,
                ack_wait,
                max_deliver,
                push_url,
                push_secret,
                max_age,
            } => {
                let mut filter = json!({ "types": types });
                if let Some(prefix) = group_prefix {
                    filter["group_prefix"] = json!(prefix);
                }
                if !toolsets.is_empty() {
                    filter["toolsets"] = json!(toolsets);
                }
                let mut body = json!({ "name": name, "filter": filter });
                if let Some(secs) = ack_wait {
                    body["ack_wait_secs"] = json!(secs);
                }
                if let Some(n) = max_deliver {
                    body["max_deliver"] = json!(n);
                }
                if let (Some(url), Some(secret)) = (push_url, push_secret) {
                    body["push"] = json!({ "url": url, "secret": secret });
                    if let Some(secs) = max_age {
                        body["push"]["max_age_secs"] = json!(secs);
                    }
                }
                client
                    .send(Method::POST, &["v1", "consumers"], &[], Some(&body))
                    .await?
            }
            ConsumersCommand::Replay {
                name,
                from_seq,
                from_time,
                group_id,
            } => {
                let from = match (from_seq, from_time) {
                    (Some(seq), _) => json!({ "seq": seq }),
                    (None, Some(time)) => json!({ "time": time }),
                    (None, None) => unreachable!("clap requires one"),
                };
                let mut body = json!({ "from": from });
                if let Some(g) = group_id {
                    body["group_id"] = json!(g);
                }
                let path = ["v1", "consumers", &name, "replay"];
                client.send(Method::POST, &path, &[], Some(&body)).await?
            }
            ConsumersCommand::Delete { name } => {
                client
                    .send(Method::DELETE, &["v1", "consumers", &name], &[], None)
                    .await?
            }
            ConsumersCommand::Tail {
                name,
                max,
                wait,
                once,
            } => return tail(&client, &name, max, wait, once).await,
        };
        print(&answer);
        Ok(())
    }
}

async fn tail(
    client: &Client,
    name: &str,
    max: usize,
    wait: u64,
    once: bool,
) -> Result<(), Failure> {
    let query = [("max", max.to_string()), ("wait", wait.to_string())];
    loop {
        let page = client
            .get(&["v1", "consumers", name, "next"], &query)
            .await?;
        let events = page["events"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if events.is_empty() && once {
            return Ok(());
        }
        let mut acks = vec![];
        for event in events {
            if !emit(&event.to_string()) {
                // Nobody reads on: what was not printed is not acknowledged.
                break;
            }
            acks.push(json!({ "group_id": event["group_id"], "seq": event["seq"] }));
        }
        if !acks.is_empty() {
            let body: Value = json!({ "acks": acks });
            let path = ["v1", "consumers", name, "ack"];
            client.send(Method::POST, &path, &[], Some(&body)).await?;
        }
        if acks.len() < events.len() {
            return Ok(());
        }
    }
}
