//! `ferry approvals …`: what waits for a reviewer, and deciding it.

use clap::{Args, Subcommand};
use ferry_proto::api::PermissionKind;
use reqwest::Method;
use serde_json::json;

use super::client::{Client, Failure};
use super::{print, Connection};

#[derive(Args)]
pub struct Approvals {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// Calls waiting for a reviewer, oldest first, across threads.
    List,
    /// Allow a waiting call to run.
    Approve(Decision),
    /// Reject a waiting call: it ends with an `Error: ` result.
    Reject(Decision),
    /// Revoke a standing grant (`--always`) of a tool in a thread.
    Revoke {
        group_id: String,
        /// The tool as the grant names it (`demo.drop_table`).
        tool: String,
    },
}

#[derive(Args)]
struct Decision {
    group_id: String,
    id: String,
    /// Decide the same for the tool's later calls in this thread and in
    /// threads that name it an ancestor, until revoked.
    #[arg(long)]
    always: bool,
    /// Recorded with the decision (Ferry's default: `anonymous`).
    #[arg(long, env = "FERRY_REVIEWER")]
    reviewer: Option<String>,
    /// Why, recorded with the decision.
    #[arg(long)]
    reason: Option<String>,
}

impl Approvals {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let answer = match &self.command {
            ApprovalsCommand::List => {
                let query = [("status", "pending".to_owned())];
                client.get(&["v1", "approvals"], &query).await?
            }
            ApprovalsCommand::Approve(decision) | ApprovalsCommand::Reject(decision) => {
                let allow = matches!(self.command, ApprovalsCommand::Approve(_));
                let kind = match (allow, decision.always) {
                    (true, false) => PermissionKind::AllowOnce,
                    (true, true) => PermissionKind::AllowAlways,
                    (false, false) => PermissionKind::RejectOnce,
                    (false, true) => PermissionKind::RejectAlways,
                };
                let mut body = json!({ "optionId": kind.id() });
                if let Some(reviewer) = &decision.reviewer {
                    body["reviewer"] = json!(reviewer);
                }
                if let Some(reason) = &decision.reason {
                    body["reason"] = json!(reason);
                }
                let path = ["v1", "approvals", &decision.group_id, &decision.id];
                client.send(Method::POST, &path, &[], Some(&body)).await?
            }
            ApprovalsCommand::Revoke { group_id, tool } => {
                let path = ["v1", "threads", group_id, "grants", tool];
                client.send(Method::DELETE, &path, &[], None).await?
            }
        };
        print(&answer);
        Ok(())
    }
}
