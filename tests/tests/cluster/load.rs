//! Load with processes killed: a worker, a runtime node, NATS or one of
//! three NATS servers goes down, and every call still has one outcome.

use std::sync::Arc;
use std::time::Duration;

use ferry_tests::{eventually, Ferry, FerryOptions, FerryWorker, TestTool};

use super::{answer_everything, every_call_has_one_outcome, submit_load, Cluster, WORK_STREAM};

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_under_load_loses_nothing() {
    let mut c = Cluster::start(3).await;
    let tool = c.tool.clone();
    let answering = answer_everything(tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let load = submit_load(&nodes, 50, 500);
    let killer = async {
        // Kill a worker once the load is well under way, restart it later.
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 100).then_some(())
        })
        .await;
        c.workers[0].kill9();
        eventually("more dispatches", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 250).then_some(())
        })
        .await;
        c.workers[0].restart().await;
    };
    let (calls, ()) = tokio::join!(load, killer);
    every_call_has_one_outcome(&c.b.api(), &calls).await;
    answering.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_down_for_five_seconds_under_load_loses_nothing() {
    let mut c = Cluster::start(2).await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let tool = c.tool.clone();
    let load = submit_load(&nodes, 20, 200);
    let outage = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        c.nats.kill9();
        // The outage itself: submissions and results are refused (503)
        // and retried until NATS is back.
        tokio::time::sleep(Duration::from_secs(5)).await;
        c.nats.restart().await;
    };
    let (calls, ()) = tokio::join!(load, outage);
    every_call_has_one_outcome(&c.a.api(), &calls).await;
    answering.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_node_killed_mid_load_is_covered_by_the_other() {
    let mut c = Cluster::start(2).await;
    let answering = answer_everything(c.tool.clone(), vec![c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let tool = c.tool.clone();
    let load = submit_load(&nodes, 20, 200);
    let kill = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        c.a.kill9();
    };
    let (calls, ()) = tokio::join!(load, kill);
    // B serves every thread, including those A accepted.
    every_call_has_one_outcome(&c.b.api(), &calls).await;
    c.a.restart().await;
    every_call_has_one_outcome(&c.a.api(), &calls).await;
    answering.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_three_node_nats_cluster_loses_a_node_under_load_and_nothing() {
    let mut nats = ferry_tests::NatsCluster::start().await;
    let urls = nats.urls();
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let replicated = |mut options: FerryOptions| {
        options
            .args
            .extend(["--replicas".to_owned(), "3".to_owned()]);
        options
    };
    let a = Ferry::start(replicated(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&urls)
    }))
    .await;
    let b = Ferry::start(replicated(FerryOptions::runtime(&urls))).await;
    let _workers = [
        FerryWorker::start(&urls, &a.url).await,
        FerryWorker::start(&urls, &b.url).await,
    ];
    // The streams really are replicated on all three servers.
    let servers: Vec<async_nats::ServerAddr> =
        urls.split(',').map(|u| u.parse().unwrap()).collect();
    let js = async_nats::jetstream::new(async_nats::connect(servers).await.unwrap());
    for name in [WORK_STREAM] {
        let mut stream = js.get_stream(name).await.unwrap();
        let replicas = stream.info().await.unwrap().config.num_replicas;
        assert_eq!(replicas, 3, "{name}");
    }
    let answering = answer_everything(tool.clone(), vec![a.url.clone(), b.url.clone()]);
    let nodes = [a.api(), b.api()];
    let load = submit_load(&nodes, 20, 200);
    let kill = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        nats.nodes[0].kill9();
    };
    let (calls, ()) = tokio::join!(load, kill);
    every_call_has_one_outcome(&b.api(), &calls).await;
    answering.abort();
}
