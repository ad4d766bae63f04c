//! The HTTP listener's bounds on a real `ferry serve`, probed as a peer on
//! the same host could: connections that send half a header and nothing
//! more, a body sent a byte a second, idle connections, more connections
//! than the process has descriptors for. Each is closed by its clock while
//! other clients are served, and streams and long-polls outlast every
//! clock.

use std::time::Duration;

use ferry_tests::sse::SseReader;
use ferry_tests::{Ferry, FerryOptions};
use futures::future::join_all;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// A connection that sends the start of a request's header, and no more.
async fn half_sent(port: u16) -> TcpStream {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"GET /v1/threads HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc")
        .await
        .unwrap();
    tcp
}

/// Reads until the server closes the connection (an end or a reset):
/// what it sent, and when it first sent anything and when it closed.
async fn until_closed(mut from: impl AsyncRead + Unpin) -> (String, Option<Instant>, Instant) {
    let (mut got, mut first) = (vec![], None);
    let mut buf = [0; 4096];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&got).into(), first, Instant::now()),
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                got.extend_from_slice(&buf[..n]);
            }
        }
    }
}

#[tokio::test]
async fn half_sent_headers_and_a_dripping_body_are_cut_off_while_clients_are_served() {
    const HEADER: Duration = Duration::from_secs(4);
    const BODY: Duration = Duration::from_secs(3);
    let ferry = Ferry::start(FerryOptions::demo_with(&[
        "--header-timeout-ms",
        "4000",
        "--body-timeout-ms",
        "3000",
        "--max-connections",
        "1000",
    ]))
    .await;
    let api = ferry.api();
    let opened = Instant::now();
    let flood = join_all((0..250).map(|_| half_sent(ferry.port))).await;

    // A call whose body comes a byte a second.
    let mut drip = TcpStream::connect(("127.0.0.1", ferry.port)).await.unwrap();
    let body =
        br#"{"operation": "echo", "arguments": {"text": "slow"}, "group_id": "drip", "id": "c1"}"#;
    let head = format!(
        "POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        ferry.port,
        body.len()
    );
    drip.write_all(head.as_bytes()).await.unwrap();
    let head_sent = Instant::now();
    let (answer, mut sending) = drip.into_split();
    let dripping = tokio::spawn(async move {
        let mut second = tokio::time::interval(Duration::from_secs(1));
        for byte in body {
            second.tick().await;
            if sending.write_all(&[*byte]).await.is_err() {
                break;
            }
        }
    });

    // Meanwhile other clients are served at once.
    let (status, health) = api.get("/healthz").await;
    assert_eq!(status, 200, "{health}");
    let (status, reply) = api
        .submit(json!({"operation": "echo", "arguments": {"text": "hi"}, "group_id": "served", "id": "c1"}))
        .await;
    assert_eq!(status, 202, "{reply}");
    let (status, threads) = api.get("/v1/threads").await;
    assert_eq!(status, 200, "{threads}");
    assert!(
        opened.elapsed() < HEADER,
        "served only after {:?}, once the flood was cut",
        opened.elapsed()
    );
    api.wait_for("served", "c1", "tool_result").await;

    // The body is cut off at its deadline with a clear error, the call
    // never made.
    let (answer, _, cut) = timeout(BODY * 4, until_closed(answer))
        .await
        .expect("the dripping body was never cut off");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(cut - head_sent >= BODY, "cut after {:?}", cut - head_sent);
    dripping.abort();
    let (status, thread) = api.get("/v1/threads/drip").await;
    assert_eq!(status, 404, "{thread}");

    // Every half-sent header is closed, once its clock ran out: none was
    // answered.
    let closed = timeout(HEADER * 4, join_all(flood.into_iter().map(until_closed)))
        .await
        .expect("half-sent headers were left open");
    for (got, _, at) in closed {
        assert!(at - opened >= HEADER, "closed after {:?}", at - opened);
        assert!(got.is_empty(), "{got}");
    }
}

#[tokio::test]
async fn an_idle_connection_is_closed_on_its_own_clock_while_streams_outlast_every_clock() {
    const IDLE: Duration = Duration::from_millis(2500);
    let ferry = Ferry::start(FerryOptions::demo_with(&[
        "--header-timeout-ms",
        "1000",
        "--body-timeout-ms",
        "1000",
        "--idle-timeout-ms",
        "2500",
    ]))
    .await;
    let api = ferry.api();
    // A stream and a long-poll, opened before anything happens.
    let mut stream = SseReader::open(&api, "/v1/threads/long/stream", None).await;
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move { api.get("/v1/threads/long/events?after=0&wait=30").await })
    };

    // A keep-alive connection that made one request and sends no other
    // is kept for the idle clock, not the shorter header one.
    let mut tcp = TcpStream::connect(("127.0.0.1", ferry.port)).await.unwrap();
    let request = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        ferry.port
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let (got, answered, closed) = timeout(IDLE * 4, until_closed(tcp))
        .await
        .expect("an idle connection was left open");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // The server's clock starts as it writes the answer's last byte, a
    // moment before the client reads it; well past the 1 s header clock
    // either way.
    let idle = closed - answered.expect("answered");
    let early = Duration::from_millis(200);
    assert!(idle >= IDLE - early, "closed after {idle:?} idle");

    // The stream and the long-poll, older than every clock, still work.
    let (status, reply) = api
        .submit(json!({"operation": "echo", "arguments": {"text": "late"}, "group_id": "long", "id": "c1"}))
        .await;
    assert_eq!(status, 202, "{reply}");
    let event = stream.next().await;
    assert_eq!(event.data["type"], "call_accepted", "{:?}", event.data);
    let (status, events) = timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the long-poll never answered")
        .unwrap();
    assert_eq!(status, 200, "{events}");
    assert_eq!(events["events"][0]["type"], "call_accepted", "{events}");
}

/// Without a cap, a few hundred half-sent requests took every descriptor
/// of a process limited to 300, and no client was served again.
#[tokio::test]
async fn more_half_sent_requests_than_descriptors_only_delay_a_client() {
    const HEADER: Duration = Duration::from_millis(1500);
    let ferry = Ferry::start(FerryOptions {
        open_files: Some(300),
        ..FerryOptions::demo_with(&["--header-timeout-ms", "1500"])
    })
    .await;
    let api = ferry.api();
    let opened = Instant::now();
    // With 300 descriptors the cap is 118: most of these wait to be
    // accepted, and are, as the clock closes those before them.
    let flood = join_all((0..320).map(|_| half_sent(ferry.port))).await;
    let (status, health) = timeout(Duration::from_secs(30), api.get("/healthz"))
        .await
        .expect("/healthz was never answered");
    assert_eq!(status, 200, "{health}");
    assert!(
        opened.elapsed() >= HEADER,
        "answered after {:?}: the flood was not held back",
        opened.elapsed()
    );
    // Ferry still reaches its tool: descriptors were left for that.
    let (status, reply) = api
        .submit(
            json!({"operation": "echo", "arguments": {"text": "hi"}, "group_id": "g", "id": "c1"}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    api.wait_for("g", "c1", "tool_result").await;
    let closed = timeout(
        Duration::from_secs(30),
        join_all(flood.into_iter().map(until_closed)),
    )
    .await
    .expect("half-sent headers were left open");
    assert!(closed.iter().all(|(got, _, _)| got.is_empty()));
}
