//! `ferry audit tail`: the audit log as JSON lines, `admin` only.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::client::{Client, Failure};
use super::{emit, Connection};

#[derive(Args)]
pub struct Audit {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Print entries as JSON lines, oldest first.
    Tail {
        /// Start after this place in the log (an entry's `seq`), or at
        /// this RFC 3339 time. Default: the beginning.
        #[arg(long)]
        since: Option<String>,
        /// Only these kinds, comma-separated (`token_created,auth_refused`).
        #[arg(long)]
        kind: Option<String>,
        /// Keep reading: print entries as they are recorded, until
        /// interrupted.
        #[arg(long, short = 'f')]
        follow: bool,
    },
}

/// Entries asked for per read: the API's largest page.
const PAGE: usize = 1_000;

/// How often `--follow` asks again once it has read everything.
const POLL: Duration = Duration::from_secs(1);

impl Audit {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let AuditCommand::Tail {
            since,
            kind,
            follow,
        } = self.command;
        let mut since = since.unwrap_or_else(|| "0".to_owned());
        loop {
            let mut query = vec![("since", since.clone()), ("limit", PAGE.to_string())];
            if let Some(kind) = &kind {
                query.push(("kind", kind.clone()));
            }
            let page = client.get(&["v1", "audit"], &query).await?;
            let records = page["records"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            for record in records {
                if !emit(&record.to_string()) {
                    return Ok(());
                }
            }
            let Some(next) = page["next"].as_u64() else {
                return Err(Failure::NotFerry(format!(
                    "Ferry's page of the audit log has no usable \"next\": {page}"
                )));
            };
            since = next.to_string();
            if records.len() < PAGE {
                if !follow {
                    return Ok(());
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}
