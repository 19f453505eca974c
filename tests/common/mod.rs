//! Helpers shared by the integration tests: a paused-clock actix system, a
//! config builder, and ways to feed a gate and read its events.

#![allow(dead_code)]

pub mod live;
pub mod procs;

use std::future::Future;
use std::time::Duration;

use poolgate::core::MembershipUpdate;
use poolgate::Config;
use poolgate::{EventStream, Gate};
use poolgate_actors::core::{Event, NodeId, OnReadinessLost, SwimState, Time};

/// Runs `test` inside an actix system on tokio's paused clock: time only
/// moves when every task is idle, so timers fire at exact virtual instants.
/// The testing module's, as an embedder's tests would use it.
pub fn on_virtual_time<F: Future<Output = ()>>(test: F) {
    poolgate_actors::testing::on_virtual_time(test)
}

/// A config over `members` with the given window and policy.
pub fn config(
    members: &[&str],
    window_ms: u64,
    policy: OnReadinessLost,
    wait_timeout_ms: Option<u64>,
) -> Config {
    let policy = match policy {
        OnReadinessLost::Wait => "wait",
        OnReadinessLost::Abort => "abort",
    };
    let timeout = wait_timeout_ms
        .map(|ms| format!("wait_timeout = \"{ms}ms\"\n"))
        .unwrap_or_default();
    let members: Vec<String> = members.iter().map(|m| format!("\"{m}\"")).collect();
    let text = format!(
        "[pool]\nid = \"pool-t\"\nmembers = [{}]\n[readiness]\nconvergence_window = \"{window_ms}ms\"\n[planning]\non_readiness_lost = \"{policy}\"\n{timeout}",
        members.join(", ")
    );
    Config::parse(&text, "test").expect("a valid test config")
}

pub fn node(name: &str) -> NodeId {
    NodeId::new(name).expect("a valid node id")
}

/// Moves virtual time to `ms` after the gate's start; everything due
/// strictly before has fired and settled.
pub async fn advance_to(gate: &Gate, ms: u64) {
    tokio::time::sleep_until(gate.clock().instant(Time::from_millis(ms))).await;
}

/// The gate's current virtual time in milliseconds.
pub fn now_ms(gate: &Gate) -> u64 {
    gate.clock().now().as_millis()
}

/// Drains every event published so far.
pub fn drain(events: &mut EventStream) -> Vec<Event> {
    let mut all = Vec::new();
    while let Ok(event) = events.try_recv() {
        all.push(event);
    }
    all
}

/// The names of events, for compact assertions.
pub fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::name).collect()
}

/// Feeds the four facts that make a node ready (it is known, alive at
/// incarnation 1, available, and has identity material), through the
/// testing module, as an embedder's tests would.
pub async fn make_ready(gate: &Gate, name: &str) {
    let identity = format!("key-of-{name}").into_bytes();
    poolgate_actors::testing::make_ready(gate, &node(name), &identity)
        .await
        .unwrap();
}

/// Sends a SWIM observation.
pub async fn swim(gate: &Gate, name: &str, state: SwimState, incarnation: u64) {
    gate.membership(MembershipUpdate {
        node: node(name),
        state,
        incarnation,
    })
    .await
    .unwrap();
}

pub const WINDOW: Duration = Duration::from_millis(5000);

/// An embedder's metrics recorder that panics when a metric is counted
/// and `panics(key)` says so (otherwise it records nothing).
pub struct PanickingRecorder<F: Fn(&metrics::Key) -> bool + Send + Sync>(pub F);

impl<F: Fn(&metrics::Key) -> bool + Send + Sync> PanickingRecorder<F> {
    fn check(&self, key: &metrics::Key) {
        if (self.0)(key) {
            panic!("the embedder's metrics recorder panicked");
        }
    }
}

impl<F: Fn(&metrics::Key) -> bool + Send + Sync> metrics::Recorder for PanickingRecorder<F> {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.check(key);
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.check(key);
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.check(key);
        metrics::Histogram::noop()
    }
}
