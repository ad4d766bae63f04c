//! Helpers for unit tests here and in the fronts (feature `testing`): an
//! engine on a given store, and a plain call to submit to it.

use std::sync::Arc;

use crate::bus::LocalBus;
use crate::store::{CatalogStore, Store};
use crate::thread::{Command, NewCall, Submission};
use crate::token::Capabilities;
use crate::{Acknowledgements, Config, Engine};

/// An engine on `store` with the default configuration, an in-process
/// bus, its tokens minted with the secret `secret`, and tools' 200s riding
/// with their thread's next command as in `ferry serve`.
pub fn engine<S: Store + CatalogStore>(store: Arc<S>) -> Engine {
    engine_with(store, LocalBus::new())
}

/// [`engine`], handing its work to `bus`.
pub fn engine_with<S: Store + CatalogStore>(store: Arc<S>, bus: LocalBus) -> Engine {
    Engine::new(
        Config::default(),
        store.clone(),
        store,
        Arc::new(bus),
        Capabilities::new(b"secret"),
        reqwest::Client::new(),
    )
    .with_acknowledgements(Acknowledgements::SINGLE_PROCESS)
}

/// A call `id` of the demo tool's `echo` with `text`.
pub fn call(id: &str, text: &str) -> NewCall {
    NewCall {
        id: id.into(),
        identity: crate::identity::Identity::ANONYMOUS.into(),
        user_verified: false,
        submission: Submission {
            operation: "echo".into(),
            arguments: serde_json::json!({ "text": text }),
            call_id: None,
            user_id: None,
            thread_ancestors: None,
        },
        tool: "demo.echo@1.0.0".into(),
        target: None,
        gate: None,
    }
}

/// An engine on `store` whose thread `g` holds one call `c1`, queued (no
/// worker takes it).
pub async fn queued<S: Store + CatalogStore>(store: Arc<S>) -> Arc<Engine> {
    let engine = Arc::new(engine(store));
    let submit = Command::Submit(call("c1", "x"));
    engine.execute("g", submit).await.unwrap();
    engine
}
