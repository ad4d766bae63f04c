//! The reviewer's dashboard in a real browser: headless Chromium (Debian's
//! `chromium`, driven by its `chromedriver`, both installed by
//! `ops/scripts/test.sh`) opens `/ui`, clicks
//! "Allow once" on a pending call, and sees the call complete. The page's
//! screenshot is kept as `target/ferry-dashboard.png`.

use std::path::PathBuf;

use ferry_tests::browser::Browser;
use ferry_tests::{Ferry, FerryOptions, TestTool};
use futures::StreamExt;
use serde_json::json;

/// Where the screenshot goes: `target/`, beside the test binaries.
fn artifact() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().join("ferry-dashboard.png")
}

/// On a Ferry that asks for an API token (`--api-token`), opened as
/// `/ui#token=…`: the page's requests carry the token, and the address
/// bar no longer shows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_allows_a_call_from_the_dashboard_and_sees_it_complete() {
    let tool = TestTool::with_manifest(json!({"name": "db", "tools": [{
        "name": "drop_table", "description": "drops a table", "inputSchema": {"type": "object"},
        "annotations": {"destructive": true}}]}))
    .await;
    let token = "reviewers-token-0123456789";
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    let ferry = Ferry::start(options.api_token(token)).await;
    let api = ferry_tests::Api::with_token(&ferry.url, token);
    let (status, reply) = api
        .submit(json!({"operation": "drop_table", "arguments": {"table": "users"}, "group_id": "g", "id": "c", "user_id": "ana"}))
        .await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("pending_approval"))
    );

    let page = format!("{}/ui#token={token}", ferry.url);
    let mut browser_side = tokio::spawn(async move {
        let tab = Browser::start().await?;
        // A fragment that is not percent-encoding, or a token no header
        // can carry: the page says it needs the token, and the address
        // bar is cleared all the same (the first must not stop the page's
        // script and leave the token in the address bar).
        let base = page.split('#').next().unwrap_or_default().to_owned();
        for bad in ["/#token=%", "?other#token=%E2%82%AC"] {
            tab.navigate(&format!("{base}{bad}")).await?;
            let asks = "document.getElementById('live').textContent.includes('API token') \
                        && !document.getElementById('signin').hidden \
                        && !location.href.includes('token')";
            let shown = tab.shows(asks, &serde_json::Value::Bool(true)).await;
            anyhow::ensure!(shown == serde_json::Value::Bool(true), "{bad}: {shown}");
        }
        tab.navigate(&page).await?;
        let row = r#"#approvals tr[data-call="g/c"]"#;
        let shown = tab.text(&tab.find(row).await?).await?;
        anyhow::ensure!(
            shown.contains("db.drop_table") && shown.contains("users"),
            "approval row: {shown}"
        );
        let address = tab.evaluate("location.href").await?;
        anyhow::ensure!(
            address.as_str().is_some_and(|a| !a.contains("token")),
            "the token stayed in the address bar: {address:?}"
        );
        let allow = tab
            .find(&format!(r#"{row} button[data-option="allow_once"]"#))
            .await?;
        tab.click(&allow).await?;
        // The page updates live: the call reaches `completed` once the tool
        // answers (the test plays the tool below).
        tab.find(r#"#calls tr[data-call="g/c"] .status.completed"#)
            .await?;
        tab.screenshot().await
    });

    // Allowed from the page: the tool gets the invocation; it answers. No
    // deadline of its own: the browser's steps each have one, and a
    // browser slow to start is no failure.
    let invocation = tokio::select! {
        invoked = tool.await_invocation() => invoked.expect("tool stopped").invocation,
        ended = &mut browser_side => panic!("the browser side ended before the call was allowed: {ended:?}"),
    };
    assert_eq!(invocation.arguments, json!({"table": "users"}));
    let decided = api.wait_for("g", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["optionId"], "allow_once");
    assert_eq!(decided["payload"]["reviewer"], "dashboard");
    let (status, _) = api
        .post(
            &invocation.callback_url,
            &json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "dropped users"}),
        )
        .await;
    assert_eq!(status, 200);

    let png = browser_side
        .await
        .unwrap()
        .expect("the browser saw the call complete");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    std::fs::write(artifact(), &png).unwrap();
    assert_eq!(api.call("g", "c").await.1["status"], "completed");
}

#[tokio::test]
async fn the_dashboard_is_served_from_the_binary() {
    let ferry = Ferry::start(FerryOptions::default()).await;
    // With the trailing slash a browser may add, too.
    let slashed = reqwest::get(format!("{}/ui/", ferry.url)).await.unwrap();
    assert_eq!(slashed.status(), 200);
    let slashed = slashed.text().await.unwrap();
    let response = reqwest::get(format!("{}/ui", ferry.url)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    // No other site may frame it (clickjacking onto "Always allow").
    assert_eq!(response.headers()["x-frame-options"], "DENY");
    assert_eq!(
        response.headers()["content-security-policy"],
        "frame-ancestors 'none'"
    );
    let html = response.text().await.unwrap();
    assert_eq!(html, slashed);
    // Nothing loaded from elsewhere: it must work with no network but Ferry.
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page loads something external"
    );
    for endpoint in ["/v1/whoami", "/v1/approvals", "/v1/threads"] {
        assert!(html.contains(endpoint), "{endpoint}");
    }
}

/// Two pending approvals whose ids would join to the same text, ("a/b",
/// "c") and ("a", "b/c"), are two rows, and the one decided elsewhere
/// leaves the page (rather than stay, its buttons answering 409); and
/// in a thread of more than a page of events (1 000), a later call's
/// events still show (rather than "No events.").
#[tokio::test(flavor = "multi_thread")]
async fn rows_never_collide_and_a_long_threads_later_events_show() {
    let tool = TestTool::with_manifest(json!({"name": "db", "tools": [
        {"name": "drop_table", "description": "drops a table", "inputSchema": {"type": "object"},
         "annotations": {"destructive": true}},
        {"name": "watch", "description": "ticks", "inputSchema": {"type": "object"}}]}))
    .await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    for (g, id) in [("a/b", "c"), ("a", "b/c")] {
        let body = json!({"operation": "drop_table", "arguments": {}, "group_id": g, "id": id});
        assert_eq!(api.submit(body).await.1["status"], "pending_approval");
    }
    // A subscription with 1 000 events, then a call that completes.
    let body = json!({"operation": "watch", "arguments": {}, "group_id": "long", "id": "s"});
    assert_eq!(api.submit(body).await.0, 202);
    let url = tool.next_invocation().await.invocation.callback_url;
    let opened = json!({"type": "tool_result", "group_id": "long", "id": "s", "text": "on", "subscription": true});
    assert_eq!(api.post(&url, &opened).await.0, 200);
    let ticks = futures::stream::iter(0..1000).map(|i| {
        let (api, url) = (api.clone(), url.clone());
        async move {
            let tick = json!({"type": "subscription_event", "group_id": "long", "tool_call_id": "s", "text": format!("tick {i}")});
            api.post(&url, &tick).await.0
        }
    });
    let statuses: Vec<u16> = ticks.buffer_unordered(16).collect().await;
    assert!(statuses.iter().all(|s| *s == 200));
    let body = json!({"operation": "watch", "arguments": {}, "group_id": "long", "id": "late"});
    assert_eq!(api.submit(body).await.0, 202);
    let url = tool.next_invocation().await.invocation.callback_url;
    let done = json!({"type": "tool_result", "group_id": "long", "id": "late", "text": "done"});
    assert_eq!(api.post(&url, &done).await.0, 200);

    let (page, decider) = (format!("{}/ui", ferry.url), api.clone());
    let tab = Browser::start().await.unwrap();
    tab.navigate(&page).await.unwrap();
    let count = r##"document.querySelectorAll("#approvals tr[data-call]").length"##;
    let before = tab.shows(count, &json!(2)).await;
    let decision = json!({"optionId": "reject_once", "reviewer": "ana"});
    let (status, _) = decider.post("/v1/approvals/a/b%2Fc", &decision).await;
    assert_eq!(status, 200);
    let after = tab.shows(count, &json!(1)).await;
    for row in [
        r#"#threads tr[data-thread="long"]"#,
        r#"#calls tr[data-call="long/late"]"#,
    ] {
        tab.click(&tab.find(row).await.unwrap()).await.unwrap();
    }
    let types = r##"[...document.querySelectorAll("#events tbody tr")].map(r => r.cells[1]?.innerText).includes("tool_result")"##;
    let events = tab.shows(types, &json!(true)).await;
    let rows = (before, after);
    assert_eq!(
        rows,
        (json!(2), json!(1)),
        "approval rows before and after one was decided"
    );
    assert_eq!(
        events,
        json!(true),
        "the late call's tool_result on the page"
    );
}

/// Refreshes overlap (the page's timer, a click, a decision): each event
/// of the selected call is still shown once (overlapping paged reads must
/// not show every row twice).
#[tokio::test(flavor = "multi_thread")]
async fn overlapping_refreshes_show_each_event_once() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let body = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"});
    assert_eq!(api.submit(body).await.0, 202);
    let url = tool.next_invocation().await.invocation.callback_url;
    let done = json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "done"});
    assert_eq!(api.post(&url, &done).await.0, 200);
    let seqs: Vec<String> = api
        .events("g", 0)
        .await
        .iter()
        .map(|e| e["seq"].to_string())
        .collect();
    let page = format!("{}/ui", ferry.url);
    let tab = Browser::start().await.unwrap();
    tab.navigate(&page).await.unwrap();
    tab.find(r#"#threads tr[data-thread="g"]"#).await.unwrap();
    let js = r##"(async () => {
        selectedThread = "g"; selectedCall = "c";
        await Promise.all([refresh(), refresh()]);
        await refresh();
        return [...document.querySelectorAll("#events tbody tr")].map(r => r.cells[0].innerText).join(",");
    })()"##;
    let shown = tab.evaluate(js).await.unwrap();
    assert_eq!(shown, json!(seqs.join(",")), "event rows on the page");
}

/// Types `token` into the sign-in form and submits it.
async fn sign_in(tab: &Browser, token: &str) {
    let input = tab.find("#token").await.unwrap();
    tab.type_text(&input, token).await.unwrap();
    tab.click(&tab.find("#signin-button").await.unwrap())
        .await
        .unwrap();
}

/// Whether the page shows its sign-in form (and nothing of the API).
const FORM: &str =
    "!document.getElementById('signin').hidden && document.getElementById('main').hidden";
/// The header's sign-in line.
const WHO: &str = "document.getElementById('who').textContent";

/// Opened with no token, the page asks for one; signed in, it says as
/// whom and shows what waits; signed out, it asks again and keeps no
/// token; a wrong token is refused in the API's words. An identity
/// without `review` cannot decide from the page, and one with it decides
/// under its own name.
#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_signs_in_and_out_and_decides_under_their_own_name() {
    let tool = TestTool::with_manifest(json!({"name": "db", "tools": [{
        "name": "drop_table", "description": "drops a table", "inputSchema": {"type": "object"},
        "annotations": {"destructive": true}}]}))
    .await;
    let token = "operators-token-0123456789";
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    let ferry = Ferry::start(options.api_token(token)).await;
    let api = ferry_tests::Api::with_token(&ferry.url, token);
    let gated = json!({"operation": "drop_table", "arguments": {"table": "users"}, "group_id": "g", "id": "c"});
    assert_eq!(api.submit(gated).await.1["status"], "pending_approval");
    let watcher = api
        .make_token(json!({"name": "watcher", "scopes": ["read"]}))
        .await;
    let ana = api
        .make_token(json!({"name": "ana", "scopes": ["read", "review"]}))
        .await;

    let tab = Browser::start().await.unwrap();
    tab.navigate(&format!("{}/ui", ferry.url)).await.unwrap();
    assert_eq!(tab.shows(FORM, &json!(true)).await, json!(true), "the form");
    let error = "document.getElementById('signin-error').hidden";
    assert_eq!(
        tab.evaluate(error).await.unwrap(),
        json!(true),
        "an error before any token"
    );

    sign_in(&tab, token).await;
    let signed_in = json!("Signed in as api-token (submit, read, review, admin)");
    assert_eq!(tab.shows(WHO, &signed_in).await, signed_in);
    let row = r#"#approvals tr[data-call="g/c"]"#;
    let shown = tab.text(&tab.find(row).await.unwrap()).await.unwrap();
    assert!(shown.contains("db.drop_table"), "approval row: {shown}");

    tab.click(&tab.find("#signout").await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        tab.shows(FORM, &json!(true)).await,
        json!(true),
        "the form again"
    );
    let kept = "sessionStorage.getItem('ferry-api-token')";
    assert_eq!(
        tab.evaluate(kept).await.unwrap(),
        json!(null),
        "a token kept"
    );
    assert_eq!(tab.evaluate(WHO).await.unwrap(), json!(""));

    sign_in(&tab, "not-this-ferrys-token-0123").await;
    let refusal = "document.getElementById('signin').hidden ? '' : document.getElementById('signin-error').textContent";
    let said = tab
        .shows(
            &format!("{refusal}.includes('Authorization: Bearer')"),
            &json!(true),
        )
        .await;
    assert_eq!(
        said,
        json!(true),
        "{}",
        tab.evaluate(refusal).await.unwrap()
    );
    assert_eq!(tab.evaluate(FORM).await.unwrap(), json!(true));
    assert_eq!(
        tab.evaluate(kept).await.unwrap(),
        json!(null),
        "a wrong token kept"
    );

    // Read only: the row, with its buttons disabled and a note.
    sign_in(&tab, &watcher).await;
    let reader = json!("Signed in as watcher (read)");
    assert_eq!(tab.shows(WHO, &reader).await, reader);
    let reject = format!(r#"{row} button[data-option="reject_once"]"#);
    tab.find(&reject).await.unwrap();
    let disabled = format!("document.querySelector('{reject}').disabled");
    assert_eq!(tab.evaluate(&disabled).await.unwrap(), json!(true));
    let note = tab
        .text(&tab.find("#review-note").await.unwrap())
        .await
        .unwrap();
    assert!(note.contains("lacks the review scope"), "{note}");

    tab.click(&tab.find("#signout").await.unwrap())
        .await
        .unwrap();
    assert_eq!(tab.shows(FORM, &json!(true)).await, json!(true));
    sign_in(&tab, &ana).await;
    let reviewer = json!("Signed in as ana (read, review)");
    assert_eq!(tab.shows(WHO, &reviewer).await, reviewer);
    tab.find(&reject).await.unwrap();
    assert_eq!(tab.shows(&disabled, &json!(false)).await, json!(false));
    let hidden = "document.getElementById('review-note').hidden && document.getElementById('reviewer-label').hidden";
    assert_eq!(tab.evaluate(hidden).await.unwrap(), json!(true));
    tab.click(&tab.find(&reject).await.unwrap()).await.unwrap();
    let decided = api.wait_for("g", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["optionId"], "reject_once");
    assert_eq!(decided["payload"]["reviewer"], "ana");
    assert_eq!(api.call("g", "c").await.1["status"], "rejected");
}

/// The dashboard shows each consumer's lag: its pending results while no
/// agent took them, and none once one acknowledged them.
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_each_consumers_lag() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let spec = json!({"name": "results", "filter": {"types": ["tool_result"]}});
    assert_eq!(api.post("/v1/consumers", &spec).await.0, 201);
    for g in ["a", "b"] {
        let call = json!({"operation": "op", "arguments": {}, "group_id": g, "id": "c"});
        assert_eq!(api.submit(call).await.0, 202);
        let url = tool.next_invocation().await.invocation.callback_url;
        let done = json!({"type": "tool_result", "group_id": g, "id": "c", "text": "done"});
        assert_eq!(api.post(&url, &done).await.0, 200);
    }
    let tab = Browser::start().await.unwrap();
    tab.navigate(&format!("{}/ui", ferry.url)).await.unwrap();
    let pending = r##"document.querySelector('#consumers tr[data-consumer="results"] .pending')?.textContent"##;
    let before = tab.shows(pending, &json!("2")).await;
    let (_, pulled) = api.get("/v1/consumers/results/next?max=10").await;
    let acks: Vec<_> = pulled["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!({"group_id": e["group_id"], "seq": e["seq"]}))
        .collect();
    let (status, _) = api
        .post("/v1/consumers/results/ack", &json!({"acks": acks}))
        .await;
    assert_eq!(status, 200);
    let after = tab.shows(pending, &json!("0")).await;
    assert_eq!((before, after), (json!("2"), json!("0")));
}
