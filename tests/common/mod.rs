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

/// `poolgate replay RECORD` (with `--config CONFIG` if given; without,
/// from RECORD's folder) by the binary under test, its exit checked 0:
/// the lines it printed.
pub fn replayed(record: &std::path::Path, config: Option<&std::path::Path>) -> Vec<String> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
    command.arg("replay").arg(record);
    match (config, record.parent()) {
        (Some(config), _) => {
            command.arg("--config").arg(config);
        }
        (None, Some(folder)) => {
            command.current_dir(folder);
        }
        (None, None) => {}
    }
    let replay = command.output().unwrap();
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    String::from_utf8(replay.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
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

/// What [`panicking_layer`] installs on a thread: called with each event's
/// level, target and message.
type OnEvent = std::sync::Arc<dyn Fn(&tracing::Level, &str, &str) + Send + Sync>;

thread_local! {
    static ON_EVENT: std::cell::RefCell<Option<OnEvent>> = const { std::cell::RefCell::new(None) };
}

/// The process's subscriber in the tests that take a panicking layer: it
/// hands each event to the layer of the thread it happens on, if any. A
/// global one, so that tracing never caches a callsite as uninteresting
/// because another test's thread had no subscriber when it first ran.
struct Forward;

/// A thread's panicking layer, taken off when dropped.
pub struct LayerGuard;

impl Drop for LayerGuard {
    fn drop(&mut self) {
        ON_EVENT.with(|on| on.borrow_mut().take());
    }
}

/// An embedder's tracing layer on this thread (the actors' thread on
/// virtual time) that panics on the events `when` picks (level, target,
/// message), on the next `armed` of them (`u32::MAX`: on every one),
/// disarmed at first; it keeps every message it sees.
pub fn panicking_layer(
    when: impl Fn(&tracing::Level, &str, &str) -> bool + Send + Sync + 'static,
) -> (
    LayerGuard,
    std::sync::Arc<std::sync::atomic::AtomicU32>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Forward);
    });
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, s) = (armed.clone(), seen.clone());
    let on: OnEvent = std::sync::Arc::new(move |level, target, message| {
        s.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("{level}{message}"));
        if when(level, target, message) && take_one(&a) {
            panic!("the embedder's tracing layer panicked");
        }
    });
    ON_EVENT.with(|slot| *slot.borrow_mut() = Some(on));
    (LayerGuard, armed, seen)
}

/// Counts one down from `armed`; whether it was armed.
pub fn take_one(armed: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering;
    armed
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            0 => None,
            u32::MAX => Some(u32::MAX),
            n => Some(n - 1),
        })
        .is_ok()
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Forward {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let Some(on) = ON_EVENT.with(|on| on.borrow().clone()) else {
            return;
        };
        let mut message = Message(String::new());
        event.record(&mut message);
        on(
            event.metadata().level(),
            event.metadata().target(),
            &message.0,
        );
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
