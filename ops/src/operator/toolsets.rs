//! `ferry toolsets …` and `ferry tools`.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::client::{Client, Failure};
use super::{print, Connection};
use crate::args::tool_server_url;

#[derive(Args)]
pub struct Toolsets {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ToolsetsCommand,
}

#[derive(Subcommand)]
enum ToolsetsCommand {
    /// The registered toolsets.
    List,
    /// One toolset, every version registered.
    Show { name: String },
    /// Fetch `URL/.well-known/rap-toolset` and register what it serves.
    Add {
        /// The tool server's base URL (not `--url`, which names Ferry).
        #[arg(value_name = "TOOL_SERVER_URL", value_parser = tool_server_url)]
        server: String,
        /// Register it as this version (semver; Ferry's default 1.0.0).
        #[arg(long)]
        version: Option<String>,
    },
    /// Fetch a registered toolset's manifest again.
    Refresh {
        name: String,
        /// Only this version (default: every version).
        #[arg(long)]
        version: Option<String>,
    },
    /// Remove a toolset: its tools can no longer be called.
    Remove {
        name: String,
        /// Only this version (default: every version).
        #[arg(long)]
        version: Option<String>,
    },
}

impl Toolsets {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let version = |v: &Option<String>| -> Vec<(&str, String)> {
            v.iter().map(|v| ("version", v.clone())).collect()
        };
        let answer = match &self.command {
            ToolsetsCommand::List => client.get(&["v1", "toolsets"], &[]).await?,
            ToolsetsCommand::Show { name } => client.get(&["v1", "toolsets", name], &[]).await?,
            ToolsetsCommand::Add { server, version } => {
                let mut body = json!({ "url": server });
                if let Some(version) = version {
                    body["version"] = json!(version);
                }
                let path = ["v1", "toolsets"];
                client.send(Method::POST, &path, &[], Some(&body)).await?
            }
            ToolsetsCommand::Refresh { name, version: v } => {
                let path = ["v1", "toolsets", name, "refresh"];
                let query = version(v);
                client.send(Method::POST, &path, &query, None).await?
            }
            ToolsetsCommand::Remove { name, version: v } => {
                let path = ["v1", "toolsets", name];
                let query = version(v);
                client.send(Method::DELETE, &path, &query, None).await?
            }
        };
        print(&answer);
        Ok(())
    }
}

#[derive(Args)]
pub struct Tools {
    #[command(flatten)]
    connection: Connection,
}

impl Tools {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        print(&client.get(&["v1", "tools"], &[]).await?);
        Ok(())
    }
}
