//! Following a thread (streams, long polls, watched tips): woken by stored
//! commits only, and caught up after NATS was lost or messages were dropped.

use std::sync::Arc;
use std::time::Duration;

use ferry_nats::cluster::subjects::Layout;
use ferry_tests::sse::SseReader;
use ferry_tests::{eventually, Api, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use futures::future::join_all;
use serde_json::json;

use super::{path_of, result, Cluster, WORK_STREAM};

/// Posts the tool's result for call `id` to `node` at `path`: applied,
/// and so in the thread when the answer comes.
async fn answer(node: &Api, path: &str, g: &str, id: &str, text: &str) {
    let (status, body) = node.post(path, &result(g, id, text)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    assert_eq!(node.count(g, id, "tool_result").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_the_stream_refused_never_wakes_a_reader() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    answer(&a, &url, "g", "c1", "done").await;
    // B follows the thread: its stream has shown every event so far.
    let events = a.events("g", 0).await;
    let mut stream = SseReader::open(&b, "/v1/threads/g/stream", None).await;
    for expected in &events {
        assert_eq!(&stream.next().await.data, expected);
    }
    let last = events.last().unwrap()["seq"].as_u64().unwrap();
    // A writer that lost its compare-and-set: the stream refuses the
    // commit, but a JetStream publish is also a core NATS message, and
    // reaches any core subscriber of its subject all the same.
    let nats = async_nats::connect(c.nats.url()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Last-Subject-Sequence", "1");
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence-Subject",
        Layout::new(1).log("g").as_str(),
    );
    headers.insert("Ferry-Last-Seq", (last + 5).to_string().as_str());
    let subject = Layout::new(1).commit("g", false);
    let refused = async_nats::jetstream::new(nats)
        .publish_with_headers(subject, headers, "lost".into())
        .await
        .unwrap()
        .await;
    assert!(refused.is_err(), "the stream stored a stale commit");
    // So a long poll after the last real event finds nothing and waits
    // its whole time instead of answering at once.
    let started = std::time::Instant::now();
    let (status, body) = b
        .get(&format!("/v1/threads/g/events?after={last}&wait=2"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"], json!([]), "{body}");
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "woken by a commit that was never stored, after {:?}",
        started.elapsed()
    );
    // And a real commit still wakes B's stream.
    let url = path_of(&c.dispatched(&a, "g", "c2").await);
    answer(&a, &url, "g", "c2", "again").await;
    let (_, call) = b.call("g", "c2").await;
    assert_eq!(call["status"], "completed");
    loop {
        let event = stream.next().await.data;
        if event["type"] == "tool_result" && event["id"] == "c2" {
            break;
        }
    }
}

/// Core NATS delivers what the stream republishes at most once: a commit
/// made while a node is reconnecting never reaches that node that way. A
/// stream open on the node still delivers it once the node is back (before,
/// it waited for the thread's next event, here forever).
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_on_a_node_that_lost_nats_for_a_while_delivers_what_it_missed() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let proxy = ferry_tests::proxy::Proxy::start(&format!("127.0.0.1:{}", nats.port)).await;
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let b = Ferry::start(FerryOptions::runtime(&proxy.nats_url())).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let (a_api, b_api) = (a.api(), b.api());
    let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c1"});
    let (status, body) = a_api.submit(call).await;
    assert_eq!(status, 202, "{body}");
    let sent = tool.next_invocation().await.invocation;
    a_api.wait_for("g", "c1", "call_dispatched").await;
    let mut stream = SseReader::open(&b_api, "/v1/threads/g/stream", None).await;
    for kind in ["call_accepted", "call_dispatched"] {
        assert_eq!(stream.next().await.data["type"], kind);
    }

    proxy.cut();
    eventually("B to lose NATS", Duration::from_secs(20), || async {
        (b_api.get("/v1/threads/g").await.0 == 503).then_some(())
    })
    .await;
    let (status, body) = a_api
        .post(&path_of(&sent.callback_url), &result("g", "c1", "done"))
        .await;
    assert_eq!(status, 200, "{body}");
    a_api.wait_for("g", "c1", "tool_result").await;
    proxy.restore();

    let missed = stream.next().await.data;
    assert_eq!(
        (&missed["type"], &missed["seq"]),
        (&json!("tool_result"), &json!(3))
    );
}

/// A stream opened on a node that has not reached NATS since it started
/// waits it out, then delivers the thread's events, those stored after it
/// caught up too. Before, once caught up it waited on the watch it took
/// before the store was there, which never moves: the `tool_result`
/// never came. The node is given an `--api-token`: until it reaches NATS
/// it cannot know whether named tokens exist, so it lets in only the
/// credentials it can check alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_opened_before_its_node_reached_nats_follows_the_thread() {
    const TOKEN: &str = "cluster-operator-0123456789";
    let mut c = Cluster::start(1).await;
    let callback = c.dispatched(&c.a.api(), "g", "c1").await;
    c.a.kill9();
    c.nats.kill9();
    c.a.set_option("--api-token", TOKEN);
    c.a.restart().await;
    assert_eq!(c.a.api().get("/v1/threads/g").await.0, 503, "anonymous");
    let a = Api::with_token(&c.a.url, TOKEN);
    assert_eq!(a.get("/v1/threads/g").await.0, 503);
    let mut stream = SseReader::open(&a, "/v1/threads/g/stream", None).await;
    c.nats.restart().await;
    for kind in ["call_accepted", "call_dispatched"] {
        assert_eq!(stream.next().await.data["type"], kind);
    }
    let (status, body) = a
        .post(&path_of(&callback), &result("g", "c1", "done"))
        .await;
    assert_eq!(status, 200, "{body}");
    let answered = stream.next().await.data;
    assert_eq!(
        (&answered["type"], &answered["seq"]),
        (&json!("tool_result"), &json!(3))
    );
}

/// Core NATS drops the messages of a subscription whose reader fell
/// behind (a slow consumer) and never sends them again. When the
/// subscription a runtime node follows commits by drops some, the node
/// reads its watched threads' tips again, so no stream waits for a commit
/// it missed. Here the observing store's client holds one message per
/// subscription, on a single-threaded runtime: a burst of commits
/// overflows it.
#[tokio::test]
async fn watched_tips_catch_up_after_a_slow_subscription_dropped_commits() {
    use ferry_engine::store::Store;
    use ferry_nats::jetstream::{ClientEvents, JetStreamStore};

    let nats = Nats::start().await;
    let events = Arc::new(ClientEvents::default());
    let seen = events.clone();
    let observer = async_nats::ConnectOptions::new()
        .subscription_capacity(1)
        .event_callback(move |event| {
            seen.record(&event);
            std::future::ready(())
        })
        .connect(nats.url())
        .await
        .unwrap();
    let store = JetStreamStore::connect(observer, events.clone(), 1, Layout::new(1), true)
        .await
        .unwrap();
    // Another process's commits, as the stream stores them.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let commit = |group_id: String, seq: u64| {
        let js = js.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Ferry-Last-Seq", seq.to_string().as_str());
            let subject = Layout::new(1).commit(&group_id, false);
            js.publish_with_headers(subject, headers, "commit".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let groups: Vec<String> = (0..200).map(|i| format!("g{i}")).collect();
    for group_id in &groups {
        commit(group_id.clone(), 1).await;
    }
    let mut watches: Vec<_> = groups.iter().map(|g| store.watch(g)).collect();
    for watch in &mut watches {
        let read = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= 1));
        assert!(
            matches!(read.await, Ok(Ok(_))),
            "a watch never read its tip"
        );
    }
    // Bursts until one overflowed the subscription (the first, in every
    // run seen), each committing the next sequence number to every thread.
    let before = events.slow_consumer_drops();
    let mut tip = 1;
    while events.slow_consumer_drops() == before {
        assert!(tip < 10, "nine bursts never overflowed the subscription");
        tip += 1;
        join_all(groups.iter().map(|g| commit(g.clone(), tip))).await;
        // The client reports a drop from its own task: poll for a while.
        let overflowed = async {
            while events.slow_consumer_drops() == before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), overflowed).await;
    }
    for (group_id, watch) in groups.iter().zip(&mut watches) {
        let moved = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= tip));
        assert!(
            matches!(moved.await, Ok(Ok(_))),
            "{group_id}: its stored commit {tip} never reached the watch (tip {})",
            *watch.borrow()
        );
    }
}

/// A node reads a thread's tip from the stream when a reader starts to
/// watch it. If that read fails (here the stream refuses direct gets for
/// a while), it is tried again until it succeeds: a thread written to no
/// more would otherwise keep its reader waiting for good.
#[tokio::test]
async fn a_failed_read_of_a_watched_tip_is_tried_again() {
    use ferry_engine::store::Store;
    use ferry_nats::jetstream::JetStreamStore;

    let nats = Nats::start().await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let store = JetStreamStore::connect(client.clone(), Arc::default(), 1, Layout::new(1), true)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let groups: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
    for group_id in &groups {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Ferry-Last-Seq", "1");
        let subject = Layout::new(1).commit(group_id, false);
        js.publish_with_headers(subject, headers, "commit".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let direct = |allow: bool| {
        let js = js.clone();
        async move {
            let mut config = js
                .get_stream(WORK_STREAM)
                .await
                .unwrap()
                .cached_info()
                .config
                .clone();
            config.allow_direct = allow;
            js.update_stream(config).await.unwrap();
        }
    };
    direct(false).await;
    let mut watches: Vec<_> = groups.iter().map(|g| store.watch(g)).collect();
    eventually(
        "a read of a tip to fail",
        Duration::from_secs(10),
        || async { store.tips_unread().then_some(()) },
    )
    .await;
    direct(true).await;
    for (group_id, watch) in groups.iter().zip(&mut watches) {
        let read = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= 1));
        assert!(
            matches!(read.await, Ok(Ok(_))),
            "{group_id}: its tip was never read again"
        );
    }
    assert!(!store.tips_unread());
}
