//! The networks Ferry's own requests may reach (`--allow-network`,
//! `--deny-network`): a tool server in a closed network is refused at
//! registration, a call to one registered before its network closed fails
//! at once without reaching it, and a bad network stops the start.

use ferry_tests::{Api, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

/// Ferry with the harness's options and `args`.
async fn ferry_with(args: &[&str]) -> Ferry {
    Ferry::start(FerryOptions::default().with_args(args)).await
}

/// Asserts a registration of `url` is refused as a closed network, without
/// naming the address or the networks, and that nothing was registered.
async fn refused_as_closed(api: &Api, url: &str) {
    let (status, body) = api.register(url).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("in a network Ferry may not reach"),
        "{message}"
    );
    assert!(!message.contains("127.0.0.0"), "{message}");
    let (_, listed) = api.get("/v1/toolsets").await;
    assert_eq!(listed["toolsets"], json!([]), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_server_in_a_denied_network_is_refused_at_registration() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let ferry = ferry_with(&["--deny-network", "127.0.0.0/8", "--deny-network", "::1"]).await;
    let api = ferry.api();
    // An IP literal, and a name the resolver finds in the network.
    refused_as_closed(&api, &tool.url).await;
    let by_name = tool.url.replace("127.0.0.1", "localhost");
    refused_as_closed(&api, &by_name).await;
    assert_eq!(tool.manifest_fetches(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allow_list_closes_every_other_network() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let ferry = ferry_with(&["--allow-network", "10.0.0.0/8"]).await;
    refused_as_closed(&ferry.api(), &tool.url).await;
    assert_eq!(tool.manifest_fetches(), 0);

    // An allow list that holds the tool's network lets it in.
    let open = ferry_with(&["--allow-network", "127.0.0.1/32"]).await;
    let (status, body) = open.api().register(&tool.url).await;
    assert_eq!(status, 201, "{body}");
}

/// A call to a tool server registered while its network was open, then
/// closed (a restart with `--deny-network`), fails at once: the tool gets
/// nothing, the agent a result saying why, and it is not retried.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_to_a_tool_in_a_network_closed_since_fails_without_reaching_it() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let mut ferry = ferry_with(&[]).await;
    let api = ferry.api();
    let (status, body) = api.register(&tool.url).await;
    assert_eq!(status, 201, "{body}");
    ferry.set_option("--deny-network", "127.0.0.0/8");
    ferry.restart().await;

    let (status, reply) = api
        .submit(
            json!({"operation": "op", "arguments": {"text": "hi"}, "group_id": "g", "id": "c1"}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let result: Value = api.wait_for("g", "c1", "tool_result").await;
    assert_eq!(result["payload"]["origin"], "ferry", "{result}");
    assert_eq!(result["payload"]["is_error"], true, "{result}");
    let text = result["payload"]["text"].as_str().unwrap();
    assert!(text.contains("in a network Ferry may not reach"), "{text}");
    assert_eq!(api.count("g", "c1", "dispatch_retrying").await, 0);
    // The thread's close is owed to the tool server, and not sent there.
    let (status, closed) = api.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{closed}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(tool.invocations().is_empty());
    let heard: Vec<String> = tool.authorizations().into_iter().map(|(r, _)| r).collect();
    assert_eq!(heard, ["manifest"], "only the registration reached it");
}

#[test]
fn a_network_that_is_no_cidr_stops_the_start_naming_its_flag() {
    for flag in ["--deny-network", "--allow-network"] {
        for command in ["serve", "runtime", "worker"] {
            let (status, stderr) = ferry_tests::ferry::refused(&[command, flag, "not-a-cidr"]);
            assert!(!status.success(), "{command} {flag} started");
            assert!(stderr.contains(flag), "{command} {flag}: {stderr}");
            assert!(stderr.contains("not-a-cidr"), "{stderr}");
        }
    }
}
