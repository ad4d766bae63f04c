//! Limits across processes: rate limits, which every runtime node takes
//! from the same buckets (KV `ferry_rate_limits`), and per-toolset
//! concurrency limits, which every node and worker keeps in the same lanes
//! (KV `ferry_lanes`).

use futures::future::join_all;
use serde_json::json;

use ferry_tests::{Api, Ferry, FerryOptions, Nats, TestTool};

/// Two nodes with `--rate-limit-identity 0.001:10` (ten calls, then one
/// every 1000 s): 40 submissions at once, half to each node, admit ten in
/// all, and the rest are 429. With one bucket per call the shared bucket
/// is exact: a write that lost a race reads again.
#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_admit_one_buckets_allowance_between_them() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let limit = ["--rate-limit-identity", "0.001:10"];
    let a = Ferry::start(
        FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::runtime(&nats.url())
        }
        .with_args(&limit),
    )
    .await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url()).with_args(&limit)).await;
    let nodes = [a.api(), b.api()];
    ferry_tests::eventually(
        "B to list the tool",
        std::time::Duration::from_secs(20),
        || async {
            let (_, tools) = nodes[1].get("/v1/tools").await;
            tools.to_string().contains("\"op\"").then_some(())
        },
    )
    .await;
    let answers = join_all((0..40).map(|i| {
        let node: &Api = &nodes[i % 2];
        let call =
            json!({"operation": "op", "arguments": {}, "group_id": format!("g{i}"), "id": "c"});
        async move { node.submit(call).await }
    }))
    .await;
    let admitted = answers.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(admitted, 10, "admitted of 40 against a burst of 10");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(body["error"]["code"], "rate_limited");
    }
    let (_, threads) = nodes[0].get("/v1/threads?limit=100").await;
    assert_eq!(threads["threads"].as_array().map(Vec::len), Some(admitted));
}

/// `max_concurrent_calls: 2` across two nodes and three workers: ten
/// calls, submitted in turn through A and B, each in its own thread. The
/// tool never has more than two in hand, they reach it in submission
/// order, and all ten complete. A worker SIGKILLed halfway loses nothing:
/// the lane is in the KV bucket `ferry_lanes`, and a call given room
/// reaches any worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_concurrency_limit_holds_across_nodes_and_workers() {
    use ferry_tests::FerryWorker;

    let nats = Nats::start().await;
    let a = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let tool = TestTool::start("slow", &["op"]).await;
    let registration = json!({"url": tool.url, "max_concurrent_calls": 2});
    let (status, body) = a.api().post("/v1/toolsets", &registration).await;
    assert_eq!(status, 201, "{body}");
    let b_api = b.api();
    ferry_tests::eventually(
        "B to know the limit",
        std::time::Duration::from_secs(20),
        || async {
            let (_, shown) = b_api.get("/v1/toolsets/slow").await;
            (shown["versions"][0]["policy"]["max_concurrent_calls"] == 2).then_some(())
        },
    )
    .await;
    // Workers load the toolsets before they take work.
    let mut workers = vec![];
    for _ in 0..3 {
        workers.push(FerryWorker::start(&nats.url(), &a.url).await);
    }
    let nodes = [a.api(), b.api()];
    for i in 0..10 {
        let call = json!({"operation": "op", "arguments": {}, "group_id": format!("g{i}"),
                          "id": format!("c{i}")});
        let (status, body) = nodes[i % 2].submit(call).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (202, Some("queued")),
            "{body}"
        );
    }
    let mut arrived = vec![];
    let mut answered = 0;
    while answered < 10 {
        if arrived.len() < 10 {
            arrived.push(tool.next_invocation().await.invocation.id);
        }
        let in_hand = tool.invocations().len() - answered;
        assert!(in_hand <= 2, "{in_hand} in flight: {arrived:?}");
        if arrived.len() < 2 {
            continue;
        }
        if answered == 4 {
            // Once the calls in hand are recorded as dispatched (their
            // work acked), a kill cannot make a tool see one twice.
            for sent in &tool.invocations()[answered..] {
                nodes[0]
                    .wait_for(&sent.group_id, &sent.id, "call_dispatched")
                    .await;
            }
            workers[0].kill9();
        }
        // Answer the oldest in hand, through either node.
        let oldest = tool.invocations()[answered].clone();
        let path = oldest.callback_url.split_once("/v1/").unwrap().1.to_owned();
        let (status, body) = nodes[answered % 2]
            .post(
                &format!("/v1/{path}"),
                &json!({"type": "tool_result", "group_id": oldest.group_id,
                        "id": oldest.id, "text": "done"}),
            )
            .await;
        assert_eq!(
            (status, body["status"].as_str()),
            (200, Some("applied")),
            "{body}"
        );
        answered += 1;
    }
    let want: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    assert_eq!(arrived, want, "dispatched in submission order");
    assert_eq!(
        tool.invocations().len(),
        10,
        "each call reached the tool once"
    );
    for i in 0..10 {
        let (_, call) = b_api.call(&format!("g{i}"), &format!("c{i}")).await;
        assert_eq!(call["status"], "completed", "{call}");
    }
}

/// With `max_concurrent_calls: 1`, a call cancelled (through the other
/// node) while it waits is never sent, and the next one takes its place.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_call_cancelled_on_another_node_gives_up_its_place() {
    use ferry_tests::FerryWorker;

    let nats = Nats::start().await;
    let a = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let tool = TestTool::start("slow", &["op"]).await;
    let registration = json!({"url": tool.url, "max_concurrent_calls": 1});
    assert_eq!(a.api().post("/v1/toolsets", &registration).await.0, 201);
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let (a_api, b_api) = (a.api(), b.api());
    for id in ["a", "b", "c"] {
        let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": id});
        assert_eq!(a_api.submit(call).await.0, 202);
    }
    let first = tool.next_invocation().await.invocation;
    assert_eq!(first.id, "a");
    let (status, body) = b_api.delete("/v1/threads/g/calls/b").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let done = json!({"type": "tool_result", "group_id": "g", "id": "a", "text": "done"});
    let path = first.callback_url.split_once("/v1/").unwrap().1.to_owned();
    assert_eq!(b_api.post(&format!("/v1/{path}"), &done).await.0, 200);
    let next = tool.next_invocation().await.invocation;
    assert_eq!(next.id, "c");
    assert_eq!(tool.invocations().len(), 2, "b never reached the tool");
}

/// Room held by a call that ended without leaving its lane (its process
/// died between the two) is taken back by a worker's sweep, which also
/// runs when a worker starts: the next call is not kept waiting for good.
#[tokio::test(flavor = "multi_thread")]
async fn room_held_by_a_call_that_is_gone_is_taken_back_by_the_sweep() {
    use ferry_engine::shared_lanes::{Entered, Order, SharedLanes};
    use ferry_nats::cluster::{lanes::KvLanes, subjects::Layout};
    use ferry_tests::FerryWorker;

    let nats = Nats::start().await;
    let a = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let tool = TestTool::start("slow", &["op"]).await;
    let registration = json!({"url": tool.url, "max_concurrent_calls": 1});
    assert_eq!(a.api().post("/v1/toolsets", &registration).await.0, 201);
    // A call no store knows holds the lane's only room.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let lanes = KvLanes::new(Layout::new(1));
    lanes
        .attach(&async_nats::jetstream::new(client), 1)
        .await
        .unwrap();
    let ghost = ("gone".to_owned(), "ghost".to_owned());
    let order = Order {
        accepted_ms: 1,
        seq: 1,
    };
    let entered = lanes.enter("slow@1.0.0", 1, &ghost, order).await.unwrap();
    assert_eq!(entered, Entered::Runs);
    let api = a.api();
    let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"});
    assert_eq!(api.submit(call).await.0, 202);
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let sent = tool.next_invocation().await.invocation;
    assert_eq!(sent.id, "c");
    let remaining = lanes.lanes().await.unwrap();
    assert!(
        remaining.iter().all(|(_, lane)| !lane.runs(&ghost)),
        "{remaining:?}"
    );
}
