//! `--record FILE`: every input the gate applied, in the replay format
//! ([`crate::replay_format`]),
//! stamped with the millisecond it was applied at (design §9), so that
//! `poolgate replay FILE` prints exactly the events the live gate
//! published.
//!
//! The pool actor writes: first a `settings` record and a `define_pool`
//! with the first pool, then each observation that changed a node's view
//! (duplicates and stale facts change nothing and are left out) and each
//! command the pool accepted (refused ones changed nothing), in the order
//! the pool applied them. Identity is recorded as its fingerprint, never
//! the bytes. Not recorded, hence not replayable: the failure of the
//! gate's own actors (`internal`) and a restart of the pool actor.
//!
//! A fleet's recording (several pools, design §14) is one file for every
//! pool: each pool starts with its own `settings`, `restored` and
//! `define_pool` records, naming it, when it starts (a pool defined later
//! too, at its instant); each command names its pool. An observation
//! never names one: the fleet numbers each observation it hands to its
//! pools, and the first pool whose view it changes writes it, once,
//! stamped with the instant that pool applied it; replayed, it reaches
//! every pool that has its node, as it did live. What the fleet told a
//! pool it defined (its members' facts) is written by that pool as it
//! applied it, and the replayed fleet tells nothing itself; to the other
//! pools those records change nothing (they hold the same facts). The
//! fleet writes what it keeps of a node no pool has (a known node's
//! facts). A command that takes only once a write is done holds its
//! place meanwhile (`Held`). A pool removed from the fleet is written
//! as a `remove_pool` record, at the instant it was removed.

use std::io::Write;
use std::sync::{Arc, Mutex};

use poolgate_core::{Command, Observation, PlanningPolicy, PoolDefinition, PoolId, Time};

use crate::messages::Fanout;
use crate::replay_format::{write_into, Line};

/// Where applied inputs are written; cheap to clone.
///
/// Lines are buffered and flushed at least every [`FLUSH_EVERY`] and
/// whenever the gate publishes an event, so a crash loses at most that
/// much of the tail.
#[derive(Clone)]
pub struct Recording {
    out: Arc<Mutex<Sink>>,
    /// The pool this handle records for, in a fleet's recording (one
    /// handle per pool, one file); `None` for one gate's.
    pool: Option<PoolId>,
    /// The number of the latest line holding an input this pool applied
    /// (a fleet's pool: one it wrote, or an observation another pool
    /// wrote first).
    last_own: Arc<std::sync::atomic::AtomicU64>,
}

/// How many of the fleet's observation numbers are remembered as written:
/// every pool that has a node applies the same observation within a few
/// turns of the others, far fewer than this many observations apart.
const WRITTEN_KEPT: usize = 4096;

/// How long a recorded line may wait in the buffer.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a fleet's recording keeps a held line's place (a commit's
/// durable write under way, see [`Held`]) before the lines behind it are
/// written without it; and how many lines may wait behind it.
const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(1);
const WAITING_AT_MOST: usize = 4096;

/// A line of a fleet's recording, in file order, while a place is held.
enum Queued {
    Line(Vec<u8>),
    Held { id: u64, since: std::time::Instant },
}

struct Sink {
    out: Box<dyn Write + Send>,
    flushed: std::time::Instant,
    closed: bool,
    /// The line being written, kept from line to line.
    scratch: Vec<u8>,
    /// The fleet's observation numbers written lately (a fleet's
    /// recording): each is written by the first pool it changed, once;
    /// with the number of its line and its `at_ms`.
    written: std::collections::BTreeMap<u64, (u64, u64)>,
    /// Lines written so far.
    lines: u64,
    /// The latest `at_ms` written.
    latest: u64,
    /// What the file cannot replay as it was (see [`Recording::inexact`]).
    inexact: u64,
    /// The lines written after a held place, waiting for it (empty but
    /// while a place is held, see [`Held`]).
    queue: std::collections::VecDeque<Queued>,
    /// The number of the next place held.
    next_hold: u64,
}

/// The place in a fleet's recording of a command one pool applied at an
/// instant but that takes only once a write is done (a commit made
/// durable, a run's end stored): the lines other pools write meanwhile
/// wait behind it, so the file holds the inputs in the order and at the
/// instants they were applied. Filled with [`Held::command`]; dropped
/// unfilled (the write failed: the command changed nothing), the place
/// goes and the lines behind it are written. A place held longer than a
/// second, or with more than 4,096 lines behind it, is given up: its
/// line is then written where it comes (and counted by
/// [`Recording::inexact`]).
pub(crate) struct Held {
    recording: Recording,
    /// 0: nothing held (one gate's recording, which nothing else writes
    /// meanwhile, or a closed one).
    id: u64,
    at_ms: u64,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recording")
    }
}

impl Recording {
    /// Records into `out` (a file, usually).
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Recording {
            out: Arc::new(Mutex::new(Sink {
                out,
                flushed: std::time::Instant::now(),
                closed: false,
                scratch: Vec::with_capacity(256),
                written: std::collections::BTreeMap::new(),
                lines: 0,
                latest: 0,
                inexact: 0,
                queue: std::collections::VecDeque::new(),
                next_hold: 1,
            })),
            pool: None,
            last_own: Arc::default(),
        }
    }

    /// How many times this recording could not hold what happened as it
    /// happened (a fleet's recording only; zero for one gate's): an
    /// observation two pools applied at different instants, or one of
    /// them after a command of its own that the file has after it (two
    /// inputs raced to two pools within a millisecond), or a line whose
    /// `at_ms` came earlier than the line before it (written at that
    /// line's instant). Counted too as `poolgate_record_inexact_total`
    /// and said once at `WARN`: such a recording replays, but its replay
    /// may differ from what the pools published around those inputs.
    pub fn inexact(&self) -> u64 {
        self.sink().inexact
    }

    /// The handle one pool of a fleet records through: its header and its
    /// commands name it; its closing only flushes (the fleet closes the
    /// file).
    pub(crate) fn for_pool(&self, pool: PoolId) -> Recording {
        Recording {
            out: Arc::clone(&self.out),
            pool: Some(pool),
            last_own: Arc::default(),
        }
    }

    /// The opening records: the settings, what the gate restored (if it
    /// restored anything: a `restored` record, so the recording replays
    /// from the same state), then the first pool. One gate's at 0; a
    /// fleet's pool's at `at`, its start, naming the pool.
    pub(crate) fn start(
        &self,
        at: Time,
        window: std::time::Duration,
        policy: PlanningPolicy,
        pool: &PoolDefinition,
        restored: Option<(&poolgate_core::Durable, std::time::Duration)>,
    ) {
        let named = self.pool.as_ref().map(PoolId::as_str);
        let at = if named.is_some() { at } else { Time::ZERO };
        let at_ms = at.as_millis();
        self.record(at_ms, Some(&Line::settings(window, policy, named)), true);
        if let Some((durable, grace)) = restored {
            if *durable != poolgate_core::Durable::default() {
                self.record(at_ms, Some(&Line::restored(durable, grace, named)), true);
            }
        }
        self.command(at, &Command::DefinePool(pool.clone()));
    }

    /// An observation that changed `node`'s view, applied at `at`; in a
    /// fleet's recording, one the fleet handed to every pool that has the
    /// node is written by the first pool it changed (`fanout`).
    pub(crate) fn observation(
        &self,
        at: Time,
        node: &str,
        observation: &Observation,
        fanout: Fanout,
    ) {
        let at_ms = at.as_millis();
        if let (Some(_), Fanout::Fleet(number)) = (&self.pool, fanout) {
            let mut sink = self.sink();
            if let Some(&(line, written_at)) = sink.written.get(&number) {
                // This pool's inputs must stand in the file in the order
                // and at the instants it applied them.
                let latest = self
                    .last_own
                    .fetch_max(line, std::sync::atomic::Ordering::Relaxed);
                if written_at != at_ms || latest > line {
                    inexact(&mut sink);
                }
                return;
            }
            let line = sink.lines;
            sink.written.insert(number, (line, at_ms));
            while sink.written.len() > WRITTEN_KEPT {
                sink.written.pop_first();
            }
        }
        let line = Line::observation(node, observation);
        self.record(at_ms, Some(&line), false);
    }

    /// A command the pool accepted at `at`.
    pub(crate) fn command(&self, at: Time, command: &Command) {
        let pool = self.pool.as_ref().map(PoolId::as_str);
        // Commands are rare and worth seeing at once.
        self.record(at.as_millis(), Some(&Line::command(command, pool)), true);
    }

    /// A pool removed from the fleet at `at` (a fleet's recording).
    pub(crate) fn pool_removed(&self, at: Time, pool: &PoolId) {
        let line = Line::RemovePool {
            pool: std::borrow::Cow::Borrowed(pool.as_str()),
        };
        self.record(at.as_millis(), Some(&line), true);
    }

    /// Holds the place of a command applied at `at` whose line is known
    /// only once a write is done (see [`Held`]).
    pub(crate) fn hold(&self, at: Time) -> Held {
        let mut held = Held {
            recording: self.clone(),
            id: 0,
            at_ms: at.as_millis(),
        };
        if self.pool.is_none() {
            return held;
        }
        let mut sink = self.sink();
        if sink.closed {
            return held;
        }
        held.at_ms = stamp(&mut sink, held.at_ms);
        self.last_own
            .store(sink.lines, std::sync::atomic::Ordering::Relaxed);
        sink.lines += 1;
        held.id = sink.next_hold;
        sink.next_hold += 1;
        sink.queue.push_back(Queued::Held {
            id: held.id,
            since: std::time::Instant::now(),
        });
        held
    }

    /// Flushes what is buffered (the gate published an event).
    pub(crate) fn flush(&self) {
        self.record(0, None, true);
    }

    /// Flushes and records nothing more (the gate stopped acting). A
    /// fleet's pool only flushes: the others record on.
    pub(crate) fn close(&self) {
        self.record(0, None, true);
        if self.pool.is_none() {
            self.sink().closed = true;
        }
    }

    /// Flushes and records nothing more, for every pool (the fleet
    /// stopped).
    pub(crate) fn close_all(&self) {
        self.record(0, None, true);
        let mut sink = self.sink();
        give_up_holding(&mut sink);
        let _ = sink.out.flush();
        sink.closed = true;
    }

    fn sink(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `line` stamped `at_ms` (none: only flushes, if due).
    fn record(&self, at_ms: u64, line: Option<&Line<'_>>, flush_now: bool) {
        let mut sink = self.sink();
        if sink.closed {
            return;
        }
        let sink = &mut *sink;
        let mut written = Ok(());
        if let Some(line) = line {
            let at_ms = stamp(sink, at_ms);
            if self.pool.is_some() {
                self.last_own
                    .store(sink.lines, std::sync::atomic::Ordering::Relaxed);
            }
            sink.lines += 1;
            sink.scratch.clear();
            write_into(&mut sink.scratch, at_ms, line);
            sink.scratch.push(b'\n');
            match sink.queue.is_empty() {
                true => written = sink.out.write_all(&sink.scratch),
                false => sink.queue.push_back(Queued::Line(sink.scratch.clone())),
            }
        }
        written = written.and_then(|()| write_waiting(sink));
        if flush_now || sink.flushed.elapsed() >= FLUSH_EVERY {
            written = written.and_then(|()| sink.out.flush());
            sink.flushed = std::time::Instant::now();
        }
        if let Err(e) = written {
            crate::telemetry::guarded(|| {
                metrics::counter!("poolgate_record_errors_total").increment(1)
            });
            crate::telemetry::said!(error, error = %e, "recording: a record could not be written");
        }
    }
}

impl Held {
    /// Writes `command` in its place: the lines behind it follow.
    pub(crate) fn command(mut self, command: &Command) {
        let id = std::mem::take(&mut self.id);
        let recording = &self.recording;
        let pool = recording.pool.as_ref().map(PoolId::as_str);
        let line = Line::command(command, pool);
        let mut sink = recording.sink();
        let place = sink
            .queue
            .iter()
            .position(|q| matches!(q, Queued::Held { id: held, .. } if *held == id));
        let (Some(place), false) = (place.filter(|_| id != 0), sink.closed) else {
            // Nothing held, or the place was given up: where it comes.
            drop(sink);
            recording.record(self.at_ms, Some(&line), true);
            return;
        };
        let mut bytes = Vec::with_capacity(128);
        write_into(&mut bytes, self.at_ms, &line);
        bytes.push(b'\n');
        sink.queue[place] = Queued::Line(bytes);
        drop(sink);
        // Commands are rare and worth seeing at once.
        recording.record(0, None, true);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.id == 0 {
            return;
        }
        let mut sink = self.recording.sink();
        let id = self.id;
        sink.queue
            .retain(|q| !matches!(q, Queued::Held { id: held, .. } if *held == id));
        drop(sink);
        self.recording.record(0, None, false);
    }
}

/// The instant a line applied at `at_ms` is written at: never before the
/// line above it (the file would not replay at all), which is counted.
fn stamp(sink: &mut Sink, at_ms: u64) -> u64 {
    if at_ms < sink.latest {
        inexact(sink);
    }
    sink.latest = at_ms.max(sink.latest);
    sink.latest
}

/// Writes the lines waiting that no held place stands before, after
/// giving up a place held too long or with too many lines behind it.
fn write_waiting(sink: &mut Sink) -> std::io::Result<()> {
    loop {
        match sink.queue.front() {
            None => return Ok(()),
            Some(Queued::Line(_)) => {
                if let Some(Queued::Line(bytes)) = sink.queue.pop_front() {
                    sink.out.write_all(&bytes)?;
                }
            }
            Some(Queued::Held { since, .. }) => {
                if since.elapsed() < HOLD_AT_MOST && sink.queue.len() <= WAITING_AT_MOST {
                    return Ok(());
                }
                sink.queue.pop_front();
            }
        }
    }
}

/// Writes every line waiting, giving up every place held (the recording
/// closes).
fn give_up_holding(sink: &mut Sink) {
    for queued in std::mem::take(&mut sink.queue) {
        if let Queued::Line(bytes) = queued {
            let _ = sink.out.write_all(&bytes);
        }
    }
}

/// Counts (and says, the first time) what a fleet's recording could not
/// hold as it happened.
fn inexact(sink: &mut Sink) {
    sink.inexact += 1;
    crate::telemetry::guarded(|| metrics::counter!("poolgate_record_inexact_total").increment(1));
    if sink.inexact == 1 {
        crate::telemetry::said!(warn, "recording: two pools applied one input at different instants or in a different order (inputs raced within a millisecond); the replay of this recording may differ there (poolgate_record_inexact_total)");
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        give_up_holding(self);
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_core::RunId;

    #[derive(Clone, Default)]
    struct Memory(Arc<Mutex<Vec<u8>>>);

    impl Write for Memory {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Memory {
        /// Each line's type, pool and instant.
        fn lines(&self) -> Vec<(String, String, u64)> {
            let text = self.0.lock().unwrap().clone();
            String::from_utf8_lossy(&text)
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    (
                        v["type"].as_str().unwrap().to_string(),
                        v["pool"].as_str().unwrap_or_default().to_string(),
                        v["at_ms"].as_u64().unwrap(),
                    )
                })
                .collect()
        }
    }

    fn fleet_of_two() -> (Memory, Recording, Recording, Recording) {
        let memory = Memory::default();
        let fleet = Recording::new(Box::new(memory.clone()));
        let a = fleet.for_pool(PoolId::new("a").unwrap());
        let b = fleet.for_pool(PoolId::new("b").unwrap());
        (memory, fleet, a, b)
    }

    fn planning(run: &str) -> Command {
        Command::BeginPlanning {
            run: RunId::new(run).unwrap(),
            epoch: None,
        }
    }

    fn finish(run: &str) -> Command {
        Command::FinishRun {
            run: RunId::new(run).unwrap(),
        }
    }

    fn line(kind: &str, pool: &str, at: u64) -> (String, String, u64) {
        (kind.into(), pool.into(), at)
    }

    #[test]
    fn a_held_place_keeps_its_instant_and_the_lines_written_meanwhile_wait_behind_it() {
        let (memory, fleet, a, b) = fleet_of_two();
        let held = a.hold(Time::from_millis(10));
        b.command(Time::from_millis(20), &planning("rb"));
        b.command(Time::from_millis(30), &finish("rb"));
        assert!(memory.lines().is_empty(), "nothing passes a held place");
        held.command(&finish("ra"));
        assert_eq!(
            memory.lines(),
            [
                line("finish_run", "a", 10),
                line("begin_planning", "b", 20),
                line("finish_run", "b", 30),
            ]
        );
        assert_eq!(fleet.inexact(), 0);
    }

    #[test]
    fn a_place_let_go_leaves_no_line_and_the_lines_behind_it_go_out() {
        let (memory, fleet, a, b) = fleet_of_two();
        let held = a.hold(Time::from_millis(10));
        b.command(Time::from_millis(20), &planning("rb"));
        drop(held);
        assert_eq!(memory.lines(), [line("begin_planning", "b", 20)]);
        assert_eq!(fleet.inexact(), 0);
    }

    #[test]
    fn a_place_held_too_long_is_given_up_and_its_line_counted_where_it_comes() {
        let (memory, fleet, a, b) = fleet_of_two();
        let held = a.hold(Time::from_millis(10));
        for i in 0..=WAITING_AT_MOST as u64 {
            b.command(Time::from_millis(20 + i), &finish("rb"));
        }
        // Bounded: given up, the lines behind it went out.
        assert_eq!(memory.lines().len(), WAITING_AT_MOST + 1);
        held.command(&finish("ra"));
        let last = memory.lines().pop().unwrap();
        assert_eq!((last.0.as_str(), last.1.as_str()), ("finish_run", "a"));
        assert_eq!(fleet.inexact(), 1, "written after later lines: counted");
    }

    #[test]
    fn one_gates_recording_holds_nothing() {
        let memory = Memory::default();
        let gate = Recording::new(Box::new(memory.clone()));
        let held = gate.hold(Time::from_millis(10));
        assert_eq!(held.id, 0);
        held.command(&finish("r"));
        assert_eq!(memory.lines(), [line("finish_run", "", 10)]);
    }

    #[test]
    fn closing_writes_what_waits_behind_a_held_place() {
        let (memory, fleet, a, b) = fleet_of_two();
        let held = a.hold(Time::from_millis(10));
        b.command(Time::from_millis(20), &planning("rb"));
        fleet.close_all();
        assert_eq!(memory.lines(), [line("begin_planning", "b", 20)]);
        held.command(&finish("ra"));
        assert_eq!(memory.lines().len(), 1, "closed: nothing more");
    }
}
