//! Rate limits: token buckets per identity, per `user_id` and per tool,
//! set for every call (`--rate-limit-*`) and per toolset (its policy's
//! `rate_limits`). Over a limit a submission is refused 429 with
//! `Retry-After`, and nothing is recorded.

use std::time::Instant;

use ferry_tests::{Api, Ferry, FerryOptions, TestTool};
use futures::future::join_all;
use serde_json::{json, Value};

/// Submits `n` calls of `op` at once in thread `g`; returns each answer's
/// status and `Retry-After`, and how long the burst took.
async fn burst(api: &Api, g: &str, n: usize, user: &str) -> (Vec<(u16, Option<String>)>, f64) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let started = Instant::now();
    let answers = join_all((0..n).map(|i| {
        let client = client.clone();
        let body = json!({"operation": "op", "arguments": {}, "group_id": g, "id": format!("c{i}"), "user_id": user});
        let url = format!("{}/v1/calls", api.base);
        async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let retry = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status().as_u16(), retry)
        }
    }))
    .await;
    (answers, started.elapsed().as_secs_f64())
}

/// The count a bucket of `rate` a second and `burst` admits over
/// `elapsed` seconds: the burst, and what refilled meanwhile.
fn allowance(rate: f64, burst: usize, elapsed: f64) -> std::ops::RangeInclusive<usize> {
    burst..=burst + (rate * elapsed).floor() as usize + 1
}

/// The figure: 100 submissions against 10/s with a burst of 20.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_over_an_identitys_limit_admits_the_buckets_allowance_and_refuses_the_rest() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::start(
        FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::default()
        }
        .with_args(&["--rate-limit-identity", "10:20"]),
    )
    .await;
    let api = ferry.api();
    let (answers, elapsed) = burst(&api, "g", 100, "u1").await;
    let admitted = answers.iter().filter(|(s, _)| *s == 202).count();
    assert!(
        allowance(10.0, 20, elapsed).contains(&admitted),
        "{admitted} admitted in {elapsed:.3} s"
    );
    for (status, retry) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*status, 429);
        let secs: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
        assert_eq!(
            secs, 1,
            "Retry-After: the next token is under a second away"
        );
    }
    // The refused calls left nothing: the thread holds the admitted ones.
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["calls"], admitted as u64, "{thread}");
    let (_, refused) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g2", "id": "late"}))
        .await;
    assert_eq!(refused["error"]["code"], "rate_limited", "{refused}");
    // A retry of an accepted call is answered by it, limit or not.
    let (status, again) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": first_admitted(&api).await, "user_id": "u1"}))
        .await;
    assert_eq!(status, 200, "{again}");
}

async fn first_admitted(api: &Api) -> String {
    let (_, calls) = api.get("/v1/threads/g/calls").await;
    calls["calls"][0]["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_toolsets_limit_per_user_holds_each_user_to_it_and_can_be_changed() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let limits = json!({"rate_limits": {"user": {"rate": 0.001, "burst": 2}}});
    let (status, set) = patch(&api, "/v1/toolsets/t", &limits).await;
    assert_eq!(status, 200, "{set}");
    let call = |g: &str, id: &str, user: &str| json!({"operation": "op", "arguments": {}, "group_id": g, "id": id, "user_id": user});
    for id in ["a", "b"] {
        assert_eq!(api.submit(call("u1", id, "u1")).await.0, 202);
    }
    let (status, refused) = api.submit(call("u1", "c", "u1")).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (429, Some("rate_limited"))
    );
    // Another user has a bucket of their own.
    assert_eq!(api.submit(call("u2", "a", "u2")).await.0, 202);
    // Bad limits are refused and change nothing.
    for bad in [
        json!({"rate_limits": {"user": {"rate": 0, "burst": 2}}}),
        json!({"rate_limits": {"user": {"rate": 1, "burst": 0}}}),
        json!({"rate_limits": {"users": {"rate": 1, "burst": 1}}}),
        json!({"rate_limits": {"user": {"rate": 1}}}),
        json!({"rate_limits": {"user": {"rate": -1, "burst": 1}}}),
    ] {
        let (status, answer) = patch(&api, "/v1/toolsets/t", &bad).await;
        assert!([400, 422].contains(&status), "{bad} -> {status} {answer}");
    }
    assert_eq!(
        api.submit(call("u1", "d", "u1")).await.0,
        429,
        "a refused patch lifted the limit"
    );
    // `null` lifts the toolset's limits.
    assert_eq!(
        patch(&api, "/v1/toolsets/t", &json!({"rate_limits": null}))
            .await
            .0,
        200
    );
    assert_eq!(api.submit(call("u1", "d", "u1")).await.0, 202);
}

async fn patch(api: &Api, path: &str, body: &Value) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let response = client
        .patch(format!("{}{path}", api.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[test]
fn a_malformed_limit_stops_ferry_at_start() {
    for bad in ["10", "0:5", "10:0", "ten:5"] {
        let (status, said) = ferry_tests::ferry::refused(&["serve", "--rate-limit-identity", bad]);
        assert!(!status.success(), "{bad}");
        assert!(said.contains("--rate-limit-identity"), "{bad}: {said}");
    }
}
