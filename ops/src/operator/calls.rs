//! `ferry calls …`: submit a call (and wait for its outcome), read one or
//! a thread's, cancel one, answer a choice.

use std::io::Read;
use std::time::Duration;

use clap::{Args, Subcommand};
use ferry_proto::api::{CallStatus, SubmitCall};
use reqwest::Method;
use serde_json::{json, Value};

use super::client::{printable, unprintable, Client, Failure};
use super::{print, Connection};

#[derive(Args)]
pub struct Calls {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: CallsCommand,
}

#[derive(Subcommand)]
enum CallsCommand {
    /// Submit a call and print Ferry's answer (or, with `--wait`, the call
    /// once it has its outcome).
    Submit(Submit),
    /// A call: its status, attempts, result, or what it waits for.
    Show { group_id: String, id: String },
    /// A thread's calls.
    List { group_id: String },
    /// Cancel a pending call, or an active subscription.
    Cancel { group_id: String, id: String },
    /// Answer a call that waits on the user's choice: by the choice's text,
    /// by its position with `--index`, or dismiss it with `--dismiss`.
    Choose {
        group_id: String,
        id: String,
        #[arg(required_unless_present_any = ["index", "dismiss"], conflicts_with_all = ["index", "dismiss"])]
        choice: Option<String>,
        /// The choice's position among the choices, counting from 0.
        #[arg(long, conflicts_with = "dismiss")]
        index: Option<u64>,
        /// Dismiss the prompt: the tool is sent its default choice.
        #[arg(long)]
        dismiss: bool,
    },
}

#[derive(Args)]
struct Submit {
    /// The tool: `echo`, `demo.echo`, `demo.echo@1`, `demo.echo@1.0.0`.
    operation: String,
    /// The thread.
    #[arg(long, short = 'g')]
    group_id: String,
    /// The call's id in its thread (default: Ferry makes one up). Giving
    /// one makes a retry safe: the same id and body is the same call.
    #[arg(long)]
    id: Option<String>,
    /// The arguments: a JSON object, `@PATH` to read it from a file, `@-`
    /// from stdin.
    #[arg(long, short = 'a', default_value = "{}")]
    arguments: String,
    /// The model provider's id for the call, echoed back to the tool.
    #[arg(long)]
    call_id: Option<String>,
    #[arg(long)]
    user_id: Option<String>,
    /// An ancestor of the thread, root first (repeatable).
    #[arg(long = "ancestor")]
    ancestors: Vec<String>,
    /// Wait for the call's outcome (its result, or how it ended) and print
    /// the call; exit 4 when it did not succeed. A call that waits for a
    /// reviewer or the user is waited for too (no time limit), saying so
    /// on stderr.
    #[arg(long)]
    wait: bool,
}

impl Calls {
    pub async fn run(self) -> Result<(), Failure> {
        let client = Client::new(&self.connection)?;
        let answer = match &self.command {
            CallsCommand::Submit(submit) => return submit.run(&client).await,
            CallsCommand::Show { group_id, id } => {
                client.get(&call_path(group_id, id), &[]).await?
            }
            CallsCommand::List { group_id } => {
                client
                    .get(&["v1", "threads", group_id, "calls"], &[])
                    .await?
            }
            CallsCommand::Cancel { group_id, id } => {
                let path = call_path(group_id, id);
                client.send(Method::DELETE, &path, &[], None).await?
            }
            CallsCommand::Choose {
                group_id,
                id,
                choice,
                index,
                dismiss,
            } => {
                let body = match (choice, index) {
                    _ if *dismiss => json!({ "dismiss": true }),
                    (_, Some(index)) => json!({ "index": index }),
                    (choice, None) => json!({ "choice": choice }),
                };
                let [v1, threads, g, calls, id] = call_path(group_id, id);
                let path = [v1, threads, g, calls, id, "choice"];
                client.send(Method::POST, &path, &[], Some(&body)).await?
            }
        };
        print(&answer);
        Ok(())
    }
}

fn call_path<'a>(group_id: &'a str, id: &'a str) -> [&'a str; 5] {
    ["v1", "threads", group_id, "calls", id]
}

impl Submit {
    async fn run(&self, client: &Client) -> Result<(), Failure> {
        let arguments = self.arguments()?;
        let call = SubmitCall {
            operation: self.operation.clone(),
            arguments,
            group_id: self.group_id.clone(),
            id: self.id.clone(),
            call_id: self.call_id.clone(),
            user_id: self.user_id.clone(),
            thread_ancestors: (!self.ancestors.is_empty()).then(|| self.ancestors.clone()),
        };
        let body = serde_json::to_value(&call).expect("a submission serializes");
        let path = ["v1", "calls"];
        let reply = client.send(Method::POST, &path, &[], Some(&body)).await?;
        if !self.wait {
            print(&reply);
            return Ok(());
        }
        let id = reply["id"]
            .as_str()
            .ok_or_else(|| unreadable("id", &reply))?;
        let accepted = reply["seq"].as_u64().unwrap_or(0);
        let call = wait_for_outcome(client, &self.group_id, id, accepted).await?;
        print(&call);
        succeeded(&call)
    }

    /// The arguments as given, or read from the file or stdin `@` names;
    /// JSON text, checked before anything is sent (Ferry judges its shape).
    fn arguments(&self) -> Result<Value, Failure> {
        let (text, from) = match self.arguments.strip_prefix('@') {
            Some("-") => {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).map_err(|e| {
                    Failure::Usage(format!("reading the arguments from stdin: {e}"))
                })?;
                (text, "stdin".to_owned())
            }
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Failure::Usage(format!("reading the arguments from {path}: {e}"))
                })?;
                (text, path.to_owned())
            }
            None => (self.arguments.clone(), "--arguments".to_owned()),
        };
        // An editor's byte-order mark is no JSON, but is no mistake either.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        serde_json::from_str(text)
            .map_err(|e| Failure::Usage(format!("{from} is not JSON: {e}; nothing was sent")))
    }
}

/// How long one read of the thread waits for news before reading the call
/// again (Ferry bounds a long-poll at a minute).
const POLL: Duration = Duration::from_secs(30);

/// Reads the call until it has its outcome: whenever its thread has new
/// events after `after` (a long-poll), the call is read again. Nothing is
/// missed: the call is read after each page, and anything that changes it
/// later is an event past that page.
async fn wait_for_outcome(
    client: &Client,
    group_id: &str,
    id: &str,
    mut after: u64,
) -> Result<Value, Failure> {
    let mut told = None;
    loop {
        let path = call_path(group_id, id);
        let call = client
            .read_through_outages(&path, &[], Duration::ZERO)
            .await?;
        let status: CallStatus = serde_json::from_value(call["status"].clone())
            .map_err(|_| unreadable("status", &call))?;
        if !status.is_open() || status == CallStatus::Subscribed {
            return Ok(call);
        }
        if told != Some(status) {
            if let Some(why) = waiting_on_people(status, group_id, id, &call) {
                eprintln!("ferry: {why}");
            }
            told = Some(status);
        }
        let events = ["v1", "threads", group_id, "events"];
        let query = [
            ("after", after.to_string()),
            ("wait", POLL.as_secs().to_string()),
        ];
        let page = client.read_through_outages(&events, &query, POLL).await?;
        after = page["next_after"].as_u64().unwrap_or(after);
    }
}

/// What a person has to do before the call can go on, if anything. The
/// names (the agent's) are quoted for the shell, control characters
/// escaped, and an `auth_url` (the tool's) made printable: neither can
/// drive the terminal.
fn waiting_on_people(status: CallStatus, group_id: &str, id: &str, call: &Value) -> Option<String> {
    // Names that look like options need `--` before them.
    let dashes = if group_id.starts_with('-') || id.starts_with('-') {
        "-- "
    } else {
        ""
    };
    let call_ref = format!("{dashes}{} {}", shell_word(group_id), shell_word(id));
    match status {
        CallStatus::PendingApproval => Some(format!(
            "the call waits for a reviewer: ferry approvals approve {call_ref} (or reject)"
        )),
        CallStatus::AwaitingAuth => Some(format!(
            "the call waits for the user to authorize at {}",
            printable(call["auth_url"].as_str().unwrap_or("(no auth_url given)"))
        )),
        CallStatus::AwaitingUser => Some(format!(
            "the call waits for the user's choice: ferry calls choose {call_ref} CHOICE (or --dismiss)"
        )),
        _ => None,
    }
}

/// `text` as one word for a POSIX shell, quoted when it needs to be; with
/// characters [`printable`] would escape, as bash's and zsh's `$'…'`, so
/// that the word both names the call and leaves the terminal alone.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/@%+=".contains(c));
    if plain {
        text.to_owned()
    } else if !text.chars().any(unprintable) {
        format!("'{}'", text.replace('\'', r"'\''"))
    } else {
        let escaped: String = text
            .chars()
            .map(|c| match c {
                '\\' => r"\\".to_owned(),
                '\'' => r"\'".to_owned(),
                c if unprintable(c) && c.is_ascii() => format!(r"\x{:02x}", u32::from(c)),
                c if unprintable(c) => format!(r"\U{:08x}", u32::from(c)),
                c => c.to_string(),
            })
            .collect();
        format!("$'{escaped}'")
    }
}

/// Ok for a call that completed (or opened its subscription) with a result
/// that is not an error.
fn succeeded(call: &Value) -> Result<(), Failure> {
    let status = call["status"].as_str().unwrap_or("unknown");
    let is_error = call["result"]["is_error"].as_bool().unwrap_or(false);
    let how = match status {
        "completed" | "subscribed" if !is_error => return Ok(()),
        "completed" | "subscribed" => "the tool's result is an error".to_owned(),
        "failed" => "the call failed".to_owned(),
        "cancelled" | "rejected" => format!("the call was {status}"),
        other => format!("the call ended {other}"),
    };
    // The tool's (or a reviewer's) words: they may neither start a line
    // of their own nor drive the terminal.
    let text = printable(call["result"]["text"].as_str().unwrap_or(""));
    Err(Failure::Unsuccessful(if text.is_empty() {
        how
    } else {
        format!("{how}: {text}")
    }))
}

fn unreadable(field: &str, answer: &Value) -> Failure {
    Failure::NotFerry(format!(
        "Ferry's answer has no readable {field:?}: {answer}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_result_that_is_no_error_succeeds() {
        let call = |status: &str, is_error: bool| json!({"status": status, "result": {"text": "Error: no", "is_error": is_error}});
        assert!(succeeded(&call("completed", false)).is_ok());
        assert!(succeeded(&call("subscribed", false)).is_ok());
        for (status, is_error, how) in [
            ("completed", true, "the tool's result is an error"),
            ("failed", true, "the call failed"),
            ("rejected", false, "the call was rejected"),
        ] {
            let failure = succeeded(&call(status, is_error)).unwrap_err();
            assert_eq!(failure.exit_code(), 4);
            assert_eq!(failure.to_string(), format!("{how}: Error: no"));
        }
        let cancelled = succeeded(&json!({"status": "cancelled"})).unwrap_err();
        assert_eq!(cancelled.to_string(), "the call was cancelled");
        let forged = json!({"status": "rejected", "result": {"text": "Error: \u{1b}[2Jno\nferry: approved OK"}});
        assert_eq!(
            succeeded(&forged).unwrap_err().to_string(),
            "the call was rejected: Error: \\u{1b}[2Jno\\nferry: approved OK"
        );
    }

    #[test]
    fn names_are_quoted_for_the_shell_when_they_must_be() {
        assert_eq!(shell_word("thread-1"), "thread-1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("$(rm)"), "'$(rm)'");
        assert_eq!(shell_word(""), "''");
        let hint = waiting_on_people(CallStatus::PendingApproval, "-g", "c", &json!({}));
        assert!(hint.unwrap().contains("ferry approvals approve -- -g c"));
        let hint = waiting_on_people(
            CallStatus::AwaitingAuth,
            "g",
            "c",
            &json!({"auth_url": "https://a.example/\u{1b}[31m\nferry: done"}),
        );
        assert!(!hint.unwrap().contains(['\u{1b}', '\n']));
        let hint = waiting_on_people(CallStatus::AwaitingUser, "g\u{1b}[2J", "c", &json!({}));
        assert!(hint.unwrap().contains(r"$'g\x1b[2J' c"));
        assert_eq!(shell_word("a\nb'c\\"), r"$'a\x0ab\'c\\'");
        assert_eq!(shell_word("x\u{2028}"), r"$'x\U00002028'");
    }
}
