//! The operator commands (`ferry toolsets`, `tools`, `calls`, `approvals`,
//! `threads`, `replay`): the real `ferry` binary run as a client of a real
//! `ferry serve`, its answers checked against the native API's own. Bad
//! input exits non-zero with the reason on stderr and changes nothing.

use std::process::Stdio;

use ferry_tests::{ferry, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// What one run of the command left.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    /// Each stdout line as JSON (a replay).
    fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|line| serde_json::from_str(line).expect("a line of JSON"))
            .collect()
    }
}

async fn finish(command: &mut tokio::process::Command) -> Run {
    let output = command.output().await.expect("running ferry");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

async fn cli(ferry: &Ferry, args: &[&str]) -> Run {
    finish(&mut ferry::cli(&ferry.url, args)).await
}

/// Runs and asserts exit 0.
async fn ok(ferry: &Ferry, args: &[&str]) -> Run {
    let run = cli(ferry, args).await;
    assert_eq!(run.code, 0, "ferry {args:?}: {}", run.stderr);
    run
}

/// An unusual thread name: any text works on the command line.
const THREAD: &str = "ops/ü *.> thread";

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_submits_waits_reads_and_replays() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let submitted = ok(
        &ferry,
        &[
            "calls",
            "submit",
            "echo",
            "-g",
            THREAD,
            "--id",
            "c 1",
            "-a",
            r#"{"text": "hello"}"#,
            "--wait",
        ],
    )
    .await;
    let call = submitted.json();
    assert_eq!(call["status"], "completed");
    assert_eq!(call["result"]["text"], "hello");
    // What the commands print is what the API answers.
    let (_, shown) = api.call(THREAD, "c 1").await;
    assert_eq!(
        ok(&ferry, &["calls", "show", THREAD, "c 1"]).await.json(),
        shown
    );
    let (_, thread) = api.thread(THREAD).await;
    assert_eq!(
        ok(&ferry, &["threads", "show", THREAD]).await.json(),
        thread
    );
    let listed = ok(&ferry, &["calls", "list", THREAD]).await.json();
    assert_eq!(listed["calls"][0]["id"], "c 1", "{listed}");
    let threads = ok(&ferry, &["threads", "list", "--limit", "5"])
        .await
        .json();
    assert_eq!(threads["threads"][0]["group_id"], THREAD, "{threads}");

    // A replay is the thread's events, one per line, in order.
    // (call_accepted, then call_dispatched unless the result came first,
    // then tool_result)
    let events = api.events(THREAD, 0).await;
    assert!(events.len() >= 2, "{events:?}");
    assert_eq!(ok(&ferry, &["replay", THREAD]).await.lines(), events);
    assert_eq!(
        ok(&ferry, &["replay", THREAD, "--after", "1"])
            .await
            .lines(),
        events[1..]
    );
    let results = ok(&ferry, &["replay", THREAD, "--types", "tool_result"]).await;
    assert_eq!(results.lines(), events[events.len() - 1..]);

    // Without --wait: Ferry's answer to the submission, at once.
    let queued = ok(
        &ferry,
        &[
            "calls",
            "submit",
            "sleep",
            "-g",
            THREAD,
            "--id",
            "s",
            "-a",
            r#"{"seconds": 600}"#,
        ],
    )
    .await;
    assert_eq!(queued.json()["id"], "s");
    assert_eq!(queued.json()["seq"].as_u64(), Some(events.len() as u64 + 1));
    // Waiting on it, then cancelling it: the wait ends with exit 4.
    let mut waiting = ferry::cli(
        &ferry.url,
        &[
            "calls",
            "submit",
            "sleep",
            "-g",
            THREAD,
            "--id",
            "s",
            "-a",
            r#"{"seconds": 600}"#,
            "--wait",
        ],
    );
    let waiting = tokio::spawn(async move { finish(&mut waiting).await });
    api.wait_for(THREAD, "s", "call_dispatched").await;
    let cancelled = ok(&ferry, &["calls", "cancel", THREAD, "s"]).await;
    assert_eq!(cancelled.json()["status"], "cancelled");
    let waited = waiting.await.unwrap();
    assert_eq!(waited.code, 4, "{}", waited.stderr);
    assert!(
        waited.stderr.contains("the call was cancelled"),
        "{}",
        waited.stderr
    );
    assert_eq!(waited.json()["status"], "cancelled");

    // A tool's error result is exit 4 as well, the call still printed.
    let failed = cli(&ferry, &["calls", "submit", "fail", "-g", THREAD, "--wait"]).await;
    assert_eq!(failed.code, 4, "{}", failed.stderr);
    assert_eq!(failed.json()["result"]["is_error"], true);
    assert!(
        failed
            .stderr
            .contains("the tool's result is an error: Error: "),
        "{}",
        failed.stderr
    );

    let closed = ok(&ferry, &["threads", "close", THREAD]).await;
    assert_eq!(closed.json()["closed"], true, "{}", closed.stdout);
    let refused = cli(
        &ferry,
        &[
            "calls",
            "submit",
            "echo",
            "-g",
            THREAD,
            "-a",
            r#"{"text": "x"}"#,
        ],
    )
    .await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("409 thread_closed"),
        "{}",
        refused.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_clearly_and_changes_nothing() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let arguments_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(arguments_file.path(), "{\"text\": ").unwrap();
    let from_file = format!("@{}", arguments_file.path().display());
    let submit = |extra: &[&str]| {
        let mut args = vec!["calls", "submit"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let demo = ferry.demo_url.clone().expect("the demo tool's address");
    // (arguments, exit code, what stderr says)
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            submit(&["echo", "-g", "bad", "-a", "{not json"]),
            2,
            "--arguments is not JSON",
        ),
        (
            submit(&["echo", "-g", "bad", "-a", &from_file]),
            2,
            "is not JSON",
        ),
        (
            submit(&["echo", "-g", "bad", "-a", "@/no/such/file"]),
            2,
            "reading the arguments from /no/such/file",
        ),
        (submit(&["echo", "-a", "{}"]), 2, "--group-id"),
        (submit(&["nope", "-g", "bad"]), 1, "400 unknown_tool: "),
        (
            submit(&["echo", "-g", "bad", "-a", r#"{"text": 5}"#]),
            1,
            "422 invalid_arguments: ",
        ),
        (
            submit(&["echo", "-g", "bad", "-a", "[1]"]),
            1,
            "422 invalid_arguments: ",
        ),
        (
            submit(&["echo", "-g", ""]),
            1,
            "400 invalid_request: group_id must not be empty",
        ),
        (
            submit(&["echo", "-g", &"g".repeat(513)]),
            1,
            "the limit is 512",
        ),
        (
            submit(&["echo", "-g", "bad", "--url", "ftp://127.0.0.1"]),
            2,
            "is not an http(s) URL",
        ),
        (
            submit(&["echo", "-g", "bad", "--url", "http://127.0.0.1:1"]),
            3,
            "cannot reach Ferry at http://127.0.0.1:1",
        ),
        // Not Ferry: the demo tool's own port answers 404 without Ferry's
        // error.
        (
            submit(&["echo", "-g", "bad", "--url", &demo]),
            3,
            "without Ferry's error",
        ),
        (
            submit(&["echo", "-g", "bad", "--url", &format!("{}?x=1", ferry.url)]),
            2,
            "a query or a fragment would swallow",
        ),
        (
            submit(&["echo", "-g", "bad", "--url", "http:///v1"]),
            2,
            "no host after",
        ),
        (
            submit(&[
                "echo",
                "-g",
                "bad",
                "--url",
                &ferry.url.replace("http://", "http://u:pw@"),
            ]),
            2,
            "not how Ferry takes credentials",
        ),
        (
            submit(&[
                "echo",
                "-g",
                "bad",
                "--api-token",
                "tok\nen-0123456789abcdef",
            ]),
            2,
            "no HTTP header can carry",
        ),
        (
            submit(&["echo", "-g", "bad", "--url", &format!("{}/v1", ferry.url)]),
            1,
            "is --url Ferry's base URL",
        ),
        (
            vec!["calls".into(), "show".into(), "bad".into(), "nope".into()],
            1,
            "404 not_found: ",
        ),
        (
            vec!["calls".into(), "show".into(), ".".into(), "nope".into()],
            2,
            "cannot name",
        ),
        (
            vec!["calls".into(), "cancel".into(), "..".into(), "x".into()],
            2,
            "cannot name",
        ),
        (
            vec![
                "calls".into(),
                "choose".into(),
                "bad".into(),
                "x".into(),
                "a".into(),
                "--index".into(),
                "1".into(),
            ],
            2,
            "cannot be used with",
        ),
        (
            vec!["calls".into(), "choose".into(), "bad".into(), "x".into()],
            2,
            "required",
        ),
        (
            vec![
                "approvals".into(),
                "approve".into(),
                "bad".into(),
                "nope".into(),
            ],
            1,
            "404 ",
        ),
        (vec!["replay".into(), "bad".into()], 1, "404 not_found: "),
        (
            vec![
                "replay".into(),
                "bad".into(),
                "--types".into(),
                "nonsense".into(),
                "--follow".into(),
            ],
            1,
            "400 invalid_request: ",
        ),
        (
            vec![
                "threads".into(),
                "list".into(),
                "--limit".into(),
                "0".into(),
            ],
            1,
            "400 invalid_request: ",
        ),
        (
            vec!["toolsets".into(), "add".into(), "not a url".into()],
            2,
            "is not an http(s) URL",
        ),
        (
            vec![
                "toolsets".into(),
                "add".into(),
                "http://127.0.0.1:1/?v=2".into(),
            ],
            2,
            "has a query or a fragment",
        ),
        (
            vec!["toolsets".into(), "show".into(), "nope".into()],
            1,
            "404 ",
        ),
    ];
    for (args, code, says) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = cli(&ferry, &args).await;
        assert_eq!(run.code, *code, "ferry {args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(says),
            "ferry {args:?} said {:?}",
            run.stderr
        );
        assert!(
            run.stdout.is_empty(),
            "ferry {args:?} printed {:?}",
            run.stdout
        );
    }
    // Nothing was recorded: no thread, no call, no toolset.
    assert_eq!(api.thread("bad").await.0, 404);
    let (_, threads) = api.get("/v1/threads").await;
    assert_eq!(threads["threads"], json!([]), "{threads}");
    let (_, toolsets) = api.get("/v1/toolsets").await;
    assert_eq!(
        toolsets["toolsets"].as_array().unwrap().len(),
        1,
        "{toolsets}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reviewers_decide_and_users_choose_from_the_command_line() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let gated = ok(
        &ferry,
        &[
            "calls",
            "submit",
            "drop_table",
            "-g",
            THREAD,
            "--id",
            "d1",
            "-a",
            r#"{"table": "t"}"#,
        ],
    )
    .await;
    assert_eq!(gated.json()["status"], "pending_approval");
    let pending = ok(&ferry, &["approvals", "list"]).await.json();
    assert_eq!(pending["approvals"][0]["id"], "d1", "{pending}");
    assert_eq!(pending["approvals"][0]["group_id"], THREAD);

    // Approved once, by a named reviewer, with a reason.
    let approved = ok(
        &ferry,
        &[
            "approvals",
            "approve",
            THREAD,
            "d1",
            "--reviewer",
            "ops",
            "--reason",
            "a test table",
        ],
    )
    .await;
    assert_ne!(approved.json()["status"], "pending_approval");
    let decided = api.wait_for(THREAD, "d1", "approval_decided").await;
    assert_eq!(decided["payload"]["optionId"], "allow_once", "{decided}");
    assert_eq!(decided["payload"]["reviewer"], "ops", "{decided}");
    assert_eq!(decided["payload"]["reason"], "a test table", "{decided}");
    api.wait_for(THREAD, "d1", "tool_result").await;
    // Deciding again: Ferry's 409, and nothing more recorded.
    let events = api.events(THREAD, 0).await.len();
    let again = cli(&ferry, &["approvals", "reject", THREAD, "d1"]).await;
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("409 "), "{}", again.stderr);
    assert_eq!(api.events(THREAD, 0).await.len(), events);

    // Rejected for good, by FERRY_REVIEWER; the grant is revoked again.
    ok(
        &ferry,
        &[
            "calls",
            "submit",
            "drop_table",
            "-g",
            THREAD,
            "--id",
            "d2",
            "-a",
            r#"{"table": "t"}"#,
        ],
    )
    .await;
    let rejected = finish(
        ferry::cli(
            &ferry.url,
            &["approvals", "reject", THREAD, "d2", "--always"],
        )
        .env("FERRY_REVIEWER", "night-shift"),
    )
    .await;
    assert_eq!(rejected.code, 0, "{}", rejected.stderr);
    assert_eq!(rejected.json()["status"], "rejected");
    let decided = api.wait_for(THREAD, "d2", "approval_decided").await;
    assert_eq!(decided["payload"]["optionId"], "reject_always");
    assert_eq!(decided["payload"]["reviewer"], "night-shift");
    let (_, thread) = api.thread(THREAD).await;
    let grants = thread["grants"].as_object().expect("grants").clone();
    assert_eq!(grants.len(), 1, "{thread}");
    let tool = grants.keys().next().unwrap().clone();
    ok(&ferry, &["approvals", "revoke", THREAD, &tool]).await;
    let (_, thread) = api.thread(THREAD).await;
    assert!(
        thread["grants"].as_object().is_none_or(|g| g.is_empty()),
        "{thread}"
    );

    // A choice: the waiting submitter says what it waits for; the choice
    // made on the command line ends the wait.
    let mut waiting = ferry::cli(
        &ferry.url,
        &[
            "calls",
            "submit",
            "pick_region",
            "-g",
            THREAD,
            "--id",
            "p1",
            "--wait",
        ],
    );
    let waiting = tokio::spawn(async move { finish(&mut waiting).await });
    api.wait_for(THREAD, "p1", "user_choice").await;
    ok(&ferry, &["calls", "choose", THREAD, "p1", "--index", "1"]).await;
    let waited = waiting.await.unwrap();
    assert_eq!(waited.code, 0, "{}", waited.stderr);
    assert!(
        waited
            .stderr
            .contains("waits for the user's choice: ferry calls choose 'ops/ü *.> thread' p1"),
        "{}",
        waited.stderr
    );
    assert_eq!(waited.json()["status"], "completed");
    let chosen = api.wait_for(THREAD, "p1", "choice_made").await;
    assert_eq!(chosen["payload"]["index"], 1, "{chosen}");

    // Dismissed: the tool gets the prompt's default.
    api.submit(
        json!({"operation": "pick_region", "arguments": {}, "group_id": THREAD, "id": "p2"}),
    )
    .await;
    let asked = api.wait_for(THREAD, "p2", "user_choice").await;
    ok(&ferry, &["calls", "choose", THREAD, "p2", "--dismiss"]).await;
    let chosen = api.wait_for(THREAD, "p2", "choice_made").await;
    assert_eq!(
        (&chosen["payload"]["index"], &chosen["payload"]["dismissed"]),
        (&asked["payload"]["default"], &json!(true)),
        "{chosen}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn toolsets_are_managed_from_the_command_line() {
    let tool = TestTool::start("calc", &["add"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let added = ok(
        &ferry,
        &["toolsets", "add", &tool.url, "--version", "1.2.0"],
    )
    .await;
    assert_eq!(added.json()["name"], "calc", "{}", added.stdout);
    let listed = ok(&ferry, &["toolsets", "list"]).await.json();
    assert_eq!(listed["toolsets"][0]["name"], "calc", "{listed}");
    assert_eq!(
        ok(&ferry, &["toolsets", "show", "calc"]).await.json(),
        ferry.api().get("/v1/toolsets/calc").await.1
    );
    let tools = ok(&ferry, &["tools"]).await.json();
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "add"),
        "{tools}"
    );
    ok(
        &ferry,
        &["toolsets", "refresh", "calc", "--version", "1.2.0"],
    )
    .await;
    let wrong = cli(&ferry, &["toolsets", "remove", "calc", "--version", "one"]).await;
    assert_eq!(wrong.code, 1, "{}", wrong.stderr);
    ok(&ferry, &["toolsets", "remove", "calc"]).await;
    let (_, toolsets) = ferry.api().get("/v1/toolsets").await;
    assert_eq!(toolsets["toolsets"], json!([]), "{toolsets}");
    // A tool server that is not there: Ferry's refusal, nothing registered.
    let unreachable = cli(&ferry, &["toolsets", "add", "http://127.0.0.1:1"]).await;
    assert_eq!(unreachable.code, 1, "{}", unreachable.stderr);
    let (_, toolsets) = ferry.api().get("/v1/toolsets").await;
    assert_eq!(toolsets["toolsets"], json!([]), "{toolsets}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guarded_ferry_takes_the_token_from_the_environment() {
    const TOKEN: &str = "operators-token-0123456789";
    let ferry = Ferry::start(
        FerryOptions {
            demo: true,
            ..FerryOptions::default()
        }
        .api_token(TOKEN),
    )
    .await;
    let refused = cli(&ferry, &["calls", "submit", "echo", "-g", "g"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("401 unauthorized"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("FERRY_API_TOKEN"),
        "{}",
        refused.stderr
    );
    let wrong = finish(
        ferry::cli(&ferry.url, &["tools"]).env("FERRY_API_TOKEN", "not-the-token-0123456789"),
    )
    .await;
    assert_eq!(wrong.code, 1, "{}", wrong.stderr);
    let run = finish(
        ferry::cli(
            &ferry.url,
            &[
                "calls",
                "submit",
                "echo",
                "-g",
                "g",
                "-a",
                r#"{"text": "x"}"#,
                "--wait",
            ],
        )
        .env("FERRY_API_TOKEN", TOKEN),
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["status"], "completed");
    let flag = cli(&ferry, &["replay", "g", "--api-token", TOKEN]).await;
    assert_eq!(flag.code, 0, "{}", flag.stderr);
    let replayed = flag.lines();
    assert_eq!(
        replayed.last().unwrap()["type"],
        "tool_result",
        "{replayed:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_followed_replay_prints_events_as_they_happen() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    // Following a thread that has not begun yet.
    let mut follow = ferry::cli(
        &ferry.url,
        &[
            "replay",
            THREAD,
            "--follow",
            "--types",
            "tool_result,call_accepted",
        ],
    )
    .spawn()
    .expect("spawning ferry replay");
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    for (n, text) in ["one", "two"].into_iter().enumerate() {
        let (status, _) = api
            .submit(json!({"operation": "echo", "arguments": {"text": text}, "group_id": THREAD, "id": format!("c{n}")}))
            .await;
        assert_eq!(status, 202);
        let accepted: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(accepted["type"], "call_accepted");
        let result: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(
            (result["type"].as_str(), result["payload"]["text"].as_str()),
            (Some("tool_result"), Some(text))
        );
    }
    follow.kill().await.unwrap();
    // A reader that stops reading (a pipe closed early) ends the replay
    // quietly, with no panic.
    let mut replay = ferry::cli(&ferry.url, &["replay", THREAD]).spawn().unwrap();
    drop(replay.stdout.take());
    let status = replay.wait().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut replay.stderr.take().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.success(), "{status:?}: {stderr}");
    // Arguments from stdin.
    let mut piped = ferry::cli(
        &ferry.url,
        &[
            "calls", "submit", "echo", "-g", THREAD, "-a", "@-", "--wait",
        ],
    );
    let mut child = piped.stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(br#"{"text": "from stdin"}"#).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(output.status.success());
    let call: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(call["result"]["text"], "from stdin");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_submitter_and_a_follower_ride_out_a_kill_9() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut ferry = Ferry::with_tool(&tool).await;
    let mut waiting = ferry::cli(
        &ferry.url,
        &["calls", "submit", "op", "-g", THREAD, "--id", "c", "--wait"],
    )
    .spawn()
    .expect("spawning ferry calls submit");
    let mut waiting_said = BufReader::new(waiting.stderr.take().unwrap()).lines();
    let url = tool.next_invocation().await.invocation.callback_url;
    let mut follow = ferry::cli(&ferry.url, &["replay", THREAD, "--follow"])
        .spawn()
        .expect("spawning ferry replay");
    let mut follow_said = BufReader::new(follow.stderr.take().unwrap()).lines();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut next_type = async || {
        let line = lines.next_line().await.unwrap().expect("a line");
        let event: Value = serde_json::from_str(&line).unwrap();
        (event["type"].as_str().unwrap().to_owned(), event)
    };
    assert_eq!(next_type().await.0, "call_accepted");
    assert_eq!(next_type().await.0, "call_dispatched");

    // Ferry dies; both clients say they wait for it, and it comes back.
    ferry.kill9();
    for said in [&mut waiting_said, &mut follow_said] {
        let line = said.next_line().await.unwrap().expect("a line on stderr");
        assert!(line.contains("trying again until it answers"), "{line}");
    }
    ferry.restart().await;
    let result = json!({"type": "tool_result", "group_id": THREAD, "id": "c", "text": "done"});
    let (status, _) = ferry.api().post(&url, &result).await;
    assert_eq!(status, 200);

    let waited = waiting.wait_with_output().await.unwrap();
    assert!(waited.status.success(), "{:?}", waited.status);
    let call: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(call["result"]["text"], "done");
    // The follower goes on where it was: the result, nothing twice.
    let (kind, event) = next_type().await;
    assert_eq!(
        (kind.as_str(), event["seq"].as_u64()),
        ("tool_result", Some(3)),
        "{event}"
    );
    follow.kill().await.unwrap();
}

/// `ferry consumers`: made, shown and replayed from the command line;
/// `tail` prints each event once and acknowledges it, so a second `tail`
/// finds nothing; bad input exits non-zero and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn consumers_are_made_tailed_and_replayed_from_the_command_line() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let made = ok(
        &ferry,
        &[
            "consumers",
            "create",
            "results",
            "--type",
            "tool_result",
            "--ack-wait",
            "5",
        ],
    )
    .await;
    assert_eq!(made.json()["name"], "results");
    for g in ["a", "b"] {
        let call = json!({"operation": "op", "arguments": {}, "group_id": g, "id": "c"});
        assert_eq!(api.submit(call).await.0, 202);
        let sent = tool.next_invocation().await.invocation;
        let result = json!({"type": "tool_result", "group_id": g, "id": "c", "text": g});
        assert_eq!(api.post(&sent.callback_url, &result).await.0, 200);
    }
    let tailed = ok(
        &ferry,
        &["consumers", "tail", "results", "--wait", "1", "--once"],
    )
    .await;
    let mut threads: Vec<String> = tailed
        .lines()
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "tool_result", "{e}");
            e["group_id"].as_str().unwrap().to_owned()
        })
        .collect();
    threads.sort();
    assert_eq!(threads, ["a", "b"]);
    let again = ok(
        &ferry,
        &["consumers", "tail", "results", "--wait", "0", "--once"],
    )
    .await;
    assert_eq!(again.stdout, "", "acknowledged by the first tail");
    let shown = ok(&ferry, &["consumers", "show", "results"]).await.json();
    assert_eq!(
        (shown["pending"].as_u64(), shown["deliveries"].as_u64()),
        (Some(0), Some(2)),
        "{shown}"
    );
    let replayed = ok(
        &ferry,
        &[
            "consumers",
            "replay",
            "results",
            "--from-seq",
            "1",
            "--group-id",
            "a",
        ],
    )
    .await;
    assert_eq!(replayed.json()["threads"], 1);
    let after = ok(
        &ferry,
        &["consumers", "tail", "results", "--wait", "1", "--once"],
    )
    .await;
    assert_eq!(after.lines().len(), 1, "{}", after.stdout);
    // Bad input: a clear refusal, nothing made.
    let bad = cli(
        &ferry,
        &["consumers", "create", "x", "--type", "no_such_type"],
    )
    .await;
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("no_such_type"), "{}", bad.stderr);
    let missing = cli(&ferry, &["consumers", "show", "nope"]).await;
    assert_ne!(missing.code, 0);
    let listed = ok(&ferry, &["consumers", "list"]).await.json();
    assert_eq!(
        listed["consumers"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    ok(&ferry, &["consumers", "delete", "results"]).await;
    let listed = ok(&ferry, &["consumers", "list"]).await.json();
    assert_eq!(listed["consumers"], json!([]));
}
