//! Helpers for the tests of real node processes on 127.0.0.1.

use std::path::PathBuf;
use std::time::Duration;

use poolgate::cli::cluster::ClusterPlan;
use poolgate::core::{Epoch, Event};
use poolgate::{Config, EventStream};

/// A cluster of `nodes` node processes of the built binary, with the
/// orchestrator settings of `base` (config text) and every option off.
pub fn plan(base: &str, nodes: u32) -> ClusterPlan {
    ClusterPlan {
        binary: PathBuf::from(env!("CARGO_BIN_EXE_poolgate")),
        nodes,
        base: Config::parse(base, "live-test").expect("a valid test config"),
        seed: 42,
        health_check: None,
        health_interval: Duration::from_millis(200),
        external_orchestrator: false,
        node_log: None,
        insecure: false,
        record: None,
    }
}

/// Runs `test` in an actix system on the real clock, bounded by `limit`.
/// With `POOLGATE_TEST_LOG` set (a `RUST_LOG`-style filter), what the
/// in-process replicas and orchestrators log goes to the test's output.
pub fn live_for<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    if let Ok(filter) = std::env::var("POOLGATE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    actix::System::new().block_on(async {
        tokio::time::timeout(limit, test)
            .await
            .expect("the live test finished in time");
    });
}

/// Waits for the first event `pick` accepts.
pub async fn until<T>(events: &mut EventStream, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
    loop {
        let event = events.recv().await.expect("the gate is running");
        if let Some(found) = pick(&event) {
            return found;
        }
    }
}

/// Waits for the next `PoolReady`; its epoch.
pub async fn ready(events: &mut EventStream) -> Epoch {
    until(events, |e| match e {
        Event::PoolReady { epoch, .. } => Some(*epoch),
        _ => None,
    })
    .await
}
