//! The reviewer's dashboard in a real browser: headless Chromium (Debian's
//! `chromium`, installed by `ops/scripts/test.sh`) opens `/ui`, clicks
//! "Allow once" on a pending call, and sees the call complete. The page's
//! screenshot is kept as `target/ferry-dashboard.png`.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

use ferry_tests::{Ferry, FerryOptions, TestTool};
use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions};
use serde_json::json;

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: ops/scripts/test.sh installs Debian's chromium",
        path.display()
    );
    path
}

/// Where the screenshot goes: `target/`, beside the test binaries.
fn artifact() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().join("ferry-dashboard.png")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_allows_a_call_from_the_dashboard_and_sees_it_complete() {
    let tool = TestTool::with_manifest(json!({"name": "db", "tools": [{
        "name": "drop_table", "description": "drops a table", "inputSchema": {"type": "object"},
        "annotations": {"destructive": true}}]}))
    .await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    let (status, reply) = api
        .submit(json!({"operation": "drop_table", "arguments": {"table": "users"}, "group_id": "g", "id": "c", "user_id": "ana"}))
        .await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("pending_approval"))
    );

    let page = format!("{}/ui", ferry.url);
    let mut browser_side = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u8>> {
        let args: Vec<&OsStr> = [
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
        ]
        .iter()
        .map(OsStr::new)
        .collect();
        let options = LaunchOptions::default_builder()
            .path(Some(chromium()))
            .headless(true)
            .sandbox(false)
            .window_size(Some((1280, 900)))
            .args(args)
            .build()?;
        let browser = Browser::new(options)?;
        let tab = browser.new_tab()?;
        tab.set_default_timeout(Duration::from_secs(30));
        tab.navigate_to(&page)?.wait_until_navigated()?;
        let row = r#"#approvals tr[data-call="g/c"]"#;
        let shown = tab.wait_for_element(row)?.get_inner_text()?;
        anyhow::ensure!(
            shown.contains("db.drop_table") && shown.contains("users"),
            "approval row: {shown}"
        );
        tab.wait_for_element(&format!(r#"{row} button[data-option="allow_once"]"#))?
            .click()?;
        // The page updates live: the call reaches `completed` once the tool
        // answers (the test plays the tool below).
        tab.wait_for_element(r#"#calls tr[data-call="g/c"] .status.completed"#)?;
        tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
    });

    // Allowed from the page: the tool gets the invocation; it answers.
    let invocation = tokio::select! {
        invoked = tool.next_invocation() => invoked.invocation,
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
    let response = reqwest::get(format!("{}/ui", ferry.url)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = response.text().await.unwrap();
    // Nothing loaded from elsewhere: it must work with no network but Ferry.
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page loads something external"
    );
    for endpoint in ["/v1/approvals", "/v1/threads"] {
        assert!(html.contains(endpoint), "{endpoint}");
    }
}
