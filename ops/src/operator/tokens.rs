//! `ferry tokens …`: named API tokens, with the `admin` scope.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::client::{Client, Failure};
use super::{print, Connection};

#[derive(Args)]
pub struct Tokens {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: TokensCommand,
}

#[derive(Subcommand)]
enum TokensCommand {
    /// Make a token; its secret (`token`) is printed this once.
    Create {
        /// The identity's name, as events and audit records show it.
        name: String,
        /// What it may do: submit, read, review, admin (repeatable, or
        /// comma-separated).
        #[arg(long = "scope", value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// A toolset (`Files`) or one tool (`Files.read`) it may call;
        /// repeatable. Default: every tool.
        #[arg(long = "tool", value_delimiter = ',')]
        tools: Vec<String>,
        /// The `group_id` prefix of every thread it may touch.
        #[arg(long)]
        group_prefix: Option<String>,
        /// A user it acts for; repeatable. A call's `user_id` must then
        /// be one of them.
        #[arg(long = "user", value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Every token, revoked ones too (never their secrets).
    List,
    /// Revoke a token by its id (`tok_…`).
    Revoke { id: String },
}

impl Tokens {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let answer = match &self.command {
            TokensCommand::Create {
                name,
                scopes,
                tools,
                group_prefix,
                users,
            } => {
                let mut body = json!({ "name": name, "scopes": scopes });
                if !tools.is_empty() {
                    body["tools"] = json!(tools);
                }
                if let Some(prefix) = group_prefix {
                    body["group_prefix"] = json!(prefix);
                }
                if !users.is_empty() {
                    body["users"] = json!(users);
                }
                client
                    .send(Method::POST, &["v1", "tokens"], &[], Some(&body))
                    .await?
            }
            TokensCommand::List => client.get(&["v1", "tokens"], &[]).await?,
            TokensCommand::Revoke { id } => {
                client
                    .send(Method::DELETE, &["v1", "tokens", id], &[], None)
                    .await?
            }
        };
        print(&answer);
        Ok(())
    }
}
