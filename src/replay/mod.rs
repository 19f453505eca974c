//! `poolgate replay`: the real actor subsystem on recorded observations and
//! a virtual clock (design §5).
//!
//! The gate runs on tokio's paused clock. Before the records stamped `T`
//! are fed, the clock is moved to 1 ms before `T` (everything due earlier
//! has then fired and settled, because a paused clock only moves when the
//! runtime is idle); the records are stamped `T` explicitly. So inputs at
//! `T` are applied before timers due at `T` (design §5). After the
//! last record, the clock moves on until no timer is pending.
//!
//! Events are printed in time order: each is held until no earlier one can
//! still come, then written.

use std::io;
use std::io::{BufRead, Write};
use std::time::Duration;

use poolgate_actors::core::{Command, Event, Input, Time};
use serde::Serialize;

use poolgate_actors::core::PoolId;
use poolgate_actors::replay_format::{RecordedRestore, RecordedSettings};
use poolgate_actors::GateError;
use poolgate_actors::{Accepted, Clock, EventStream, Fleet, Gate, GateSettings};
use std::collections::BTreeMap;

use crate::config::Config;

pub mod explain;
pub mod render;
pub mod scenario;
pub mod timeline;

use explain::Explainer;
use scenario::BadLine;
use scenario::{parse_record, parse_restored, parse_settings, ScenarioReader};
use timeline::Timeline;

const MILLISECOND: Duration = Duration::from_millis(1);

/// Moves of the clock longer than this jump instead of stepping.
const LONG_MOVE: Duration = Duration::from_secs(60);

/// A command or observation the gate refused, as the replay reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// The instant it happened on the gate's timeline (`at_ms`).
    #[serde(rename = "at_ms")]
    pub at: Time,
    event: &'static str,
    /// The scenario line.
    pub line: usize,
    /// A short code: `stale_epoch`, `pool_not_ready`, `invalid_identity`, …
    pub error: &'static str,
    /// The same in words.
    pub detail: String,
}

/// A readable remark (`--explain` only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// The instant it happened on the gate's timeline (`at_ms`).
    #[serde(rename = "at_ms")]
    pub at: Time,
    event: &'static str,
    /// The remark.
    pub text: String,
}

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// The state file to restore from and write to (`--state`), so two
    /// replays in a row behave as a gate restarted between them.
    pub state: Option<std::path::PathBuf>,
    /// Add the pool's state and blockers whenever they change, and a
    /// closing summary ([`ReplayEvent::Note`]).
    pub explain: bool,
    /// Draw a timeline (see `run_with_timeline`).
    pub timeline: bool,
}

/// One line of replay output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ReplayEvent {
    /// An event of the gate.
    Gate(Event),
    /// A refused record.
    Rejected(Rejection),
    /// The pool's state, or the summary (only with `explain`).
    Note(Note),
}

impl ReplayEvent {
    /// When it happened.
    pub fn at(&self) -> Time {
        match self {
            ReplayEvent::Gate(event) => event.at(),
            ReplayEvent::Rejected(rejection) => rejection.at,
            ReplayEvent::Note(note) => note.at,
        }
    }
}

/// Why a replay stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A line is not a valid record; the events before it were written.
    #[error(transparent)]
    BadLine(#[from] BadLine),
    /// Output could not be written, or the runtime could not start.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The gate stopped under the replay.
    #[error(transparent)]
    Gate(#[from] GateError),
    /// The state file cannot be used.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// What the replay cannot do with this configuration.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// What the records are replayed on: one gate (`[pool]`, or a recording),
/// or a fleet of pools (`[pools.<id>]`, design §14).
enum Target {
    One(Gate),
    Fleet(Fleet),
}

impl Target {
    fn clock(&self) -> Clock {
        match self {
            Target::One(gate) => gate.clock(),
            Target::Fleet(fleet) => fleet.clock(),
        }
    }

    fn subscribe(&self) -> EventStream {
        match self {
            Target::One(gate) => gate.subscribe(),
            Target::Fleet(fleet) => fleet.subscribe(),
        }
    }

    async fn submit(
        &self,
        at: Time,
        pool: Option<&PoolId>,
        input: Input,
    ) -> Result<Accepted, GateError> {
        match self {
            Target::One(gate) => {
                if let Some(pool) = pool {
                    if gate.report().await?.pool != *pool {
                        return Err(GateError::UnknownPool(pool.clone()));
                    }
                }
                gate.submit(at, input).await
            }
            Target::Fleet(fleet) => fleet.submit(at, pool, input).await,
        }
    }

    async fn pending_deadline(&self) -> Result<Option<Time>, GateError> {
        match self {
            Target::One(gate) => gate.pending_deadline().await,
            Target::Fleet(fleet) => fleet.pending_deadline().await,
        }
    }

    /// The one gate's report (`--explain`, `--timeline` are one pool's).
    async fn report(&self) -> Result<Option<poolgate_actors::core::PoolReport>, GateError> {
        match self {
            Target::One(gate) => gate.report().await.map(Some),
            Target::Fleet(_) => Ok(None),
        }
    }
}

/// Replays `input` and writes each event to `out` as a line: JSON (design
/// §5), or readable text (`human`). Returns the timeline when
/// `options.timeline` is set.
pub fn to_writer<R: BufRead, W: Write>(
    config: &Config,
    input: R,
    human: bool,
    options: ReplayOptions,
    mut out: W,
) -> Result<Option<Timeline>, ReplayError> {
    let timeline = run_with_timeline(config, input, options, |event| {
        let line = if human {
            render::human_line(event)
        } else {
            render::json_line(event)
        };
        writeln!(out, "{line}")
    });
    out.flush()?;
    timeline
}

/// Replays `input` through a fresh gate built from `config`, on a virtual
/// clock, handing each event to `sink` in time order.
pub fn run<R, S>(config: &Config, input: R, sink: S) -> Result<(), ReplayError>
where
    R: BufRead,
    S: FnMut(&ReplayEvent) -> io::Result<()>,
{
    run_with(config, input, ReplayOptions::default(), sink)
}

/// As [`run`], with options.
pub fn run_with<R, S>(
    config: &Config,
    input: R,
    options: ReplayOptions,
    sink: S,
) -> Result<(), ReplayError>
where
    R: BufRead,
    S: FnMut(&ReplayEvent) -> io::Result<()>,
{
    run_with_timeline(config, input, options, sink).map(drop)
}

/// As [`run_with`]; returns the timeline when `options.timeline` is set.
pub fn run_with_timeline<R, S>(
    config: &Config,
    input: R,
    options: ReplayOptions,
    sink: S,
) -> Result<Option<Timeline>, ReplayError>
where
    R: BufRead,
    S: FnMut(&ReplayEvent) -> io::Result<()>,
{
    let mut reader = ScenarioReader::new(input);
    let mut first = reader.next_line();
    // A recording starts with the live gate's settings: they win over the
    // config's. A fleet's recording starts with its first pool's, naming
    // it: each pool's settings come with the pool, as the records go.
    let mut config = config.clone();
    let mut from_recording = false;
    let mut pools_recorded = false;
    if let Some(Ok((number, text))) = &first {
        let settings = parse_settings(text).map_err(|message| BadLine {
            line: *number,
            message,
        })?;
        if let Some(settings) = settings {
            config.pools.clear();
            from_recording = true;
            if settings.pool.is_some() {
                pools_recorded = true;
            } else {
                config.convergence_window = settings.window;
                config.planning = settings.policy;
                first = None;
            }
        }
    }
    // Then what the live gate restored, if it restored anything.
    let mut restored = None;
    if first.is_none() {
        first = reader.next_line();
        if let Some(Ok((number, text))) = &first {
            restored = parse_restored(text)
                .and_then(|r| match r {
                    Some(r) if r.pool.is_some() => Err(
                        "a `restored` record naming a pool follows that pool's `settings`".into(),
                    ),
                    r => Ok(r),
                })
                .map_err(|message| BadLine {
                    line: *number,
                    message,
                })?;
            if restored.is_some() {
                if options.state.is_some() {
                    return Err(BadLine {
                        line: *number,
                        message:
                            "a recording that starts from a restored state replays without --state"
                                .into(),
                    }
                    .into());
                }
                // The live gate started on the recording's first pool and
                // then restored; replayed as such (a `define_pool` after
                // the restore of a committed run would be refused).
                first = reader.next_line();
                if let Some(Ok((_, text))) = &first {
                    if let Ok(scenario::Record {
                        input: Ok(Input::Command(Command::DefinePool(definition))),
                        ..
                    }) = parse_record(text)
                    {
                        config.pool = definition;
                        config.pools.clear();
                        first = None;
                    }
                }
            }
        }
    }
    // Only `--state` (design §9): a replay of a configuration that names a
    // state file for its live gate must not continue that gate's epochs.
    let mut config = config.clone();
    config.state.path = None;
    let mut settings = config.gate_settings_with_state(options.state.as_deref())?;
    if let Some(recorded) = restored {
        settings.durable = Some(poolgate_actors::DurableSettings {
            store: std::sync::Arc::new(crate::state::MemoryStore::default()),
            restored: recorded.durable,
            restore_grace: recorded.grace,
        });
    }
    // A fleet's pools (`[pools.<id>]`), unless the records are one gate's
    // recording (it starts with its settings); a fleet's recording starts
    // its pools as its records say.
    let fleet = match (&config.pools[..], from_recording, pools_recorded) {
        (_, _, true) => Some(None),
        ([], _, _) | (_, true, _) => None,
        (_, false, _) => Some(Some(config.pool_settings()?)),
    };
    if fleet.is_some() && (options.state.is_some() || options.explain || options.timeline) {
        return Err(ReplayError::Unsupported(
            "--state, --explain and --timeline replay one pool ([pool]), not [pools.<id>] nor a recording of several pools",
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let system = actix::System::with_tokio_rt(move || runtime);
    let result = system.block_on(async {
        let gate = match fleet {
            Some(Some(pools)) => Target::Fleet(Fleet::try_start(pools)?),
            // A fleet's recording: its records define its pools.
            Some(None) => Target::Fleet(Fleet::try_start_replaying()?),
            None => Target::One(Gate::start(settings)),
        };
        let mut replay = Replay {
            events: gate.subscribe(),
            gate,
            recorded_pools: pools_recorded.then(BTreeMap::new),
            held: Vec::new(),
            explainer: options.explain.then(Explainer::default),
            timeline: options.timeline.then(Timeline::default),
            sink,
        };
        let driven = replay.drive(reader, first).await;
        // The actors start inside the runtime, whatever the outcome: a
        // restored run's pool actor sets its timer when it starts, which
        // it cannot do once the runtime is gone.
        let _ = replay.gate.report().await;
        driven?;
        Ok(replay.timeline.take())
    });
    result
}

struct Replay<S> {
    gate: Target,
    /// A fleet's recording: each pool's recorded settings and restored
    /// state, until its `define_pool` starts it.
    recorded_pools: Option<BTreeMap<PoolId, RecordedPool>>,
    events: EventStream,
    held: Vec<ReplayEvent>,
    explainer: Option<Explainer>,
    timeline: Option<Timeline>,
    sink: S,
}

/// A pool of a fleet's recording, from its `settings` (and `restored`)
/// record to its `define_pool`.
struct RecordedPool {
    settings: RecordedSettings,
    restored: Option<RecordedRestore>,
}

impl<S: FnMut(&ReplayEvent) -> io::Result<()>> Replay<S> {
    /// In a fleet's recording, a pool's `settings` or `restored` record,
    /// held for its `define_pool`: `Ok(true)` when `text` was one.
    fn recorded_header(&mut self, text: &str) -> Result<bool, String> {
        let Some(pools) = self.recorded_pools.as_mut() else {
            return Ok(false);
        };
        if let Some(settings) = parse_settings(text)? {
            let pool = settings
                .pool
                .clone()
                .ok_or("a `settings` record of a recording of several pools names its pool")?;
            pools.insert(
                pool,
                RecordedPool {
                    settings,
                    restored: None,
                },
            );
            return Ok(true);
        }
        if let Some(restored) = parse_restored(text)? {
            let held = restored
                .pool
                .as_ref()
                .and_then(|pool| pools.get_mut(pool))
                .filter(|held| held.restored.is_none())
                .ok_or("a `restored` record comes right after its pool's `settings`, once")?;
            held.restored = Some(restored);
            return Ok(true);
        }
        Ok(false)
    }

    /// Applies one record's input; in a fleet's recording, the
    /// `define_pool` of a pool whose settings were recorded starts it with
    /// them.
    async fn apply(
        &mut self,
        at: Time,
        pool: Option<&PoolId>,
        input: Input,
    ) -> Result<Accepted, GateError> {
        if let (Input::Command(Command::DefinePool(definition)), Target::Fleet(fleet)) =
            (&input, &self.gate)
        {
            let recorded = self
                .recorded_pools
                .as_mut()
                .and_then(|pools| pools.remove(definition.id()));
            if let Some(RecordedPool { settings, restored }) = recorded {
                let mut gate_settings =
                    GateSettings::new(definition.clone(), settings.window, settings.policy)?;
                gate_settings.durable = restored.map(|r| poolgate_actors::DurableSettings {
                    store: std::sync::Arc::new(crate::state::MemoryStore::default()),
                    restored: r.durable,
                    restore_grace: r.grace,
                });
                return fleet
                    .define_pool_at(at, gate_settings)
                    .await
                    .map(|_| Accepted::Done);
            }
        }
        self.gate.submit(at, pool, input).await
    }

    /// A `remove_pool` record at `at` (line `number`): the fleet's pool
    /// removed, or `rejected` as the live fleet refused it; a bad line
    /// where one pool is replayed.
    async fn remove_pool(
        &mut self,
        at: Time,
        number: usize,
        pool: &PoolId,
    ) -> Result<(), ReplayError> {
        let Target::Fleet(fleet) = &self.gate else {
            self.settle_through(at).await?;
            return Err(BadLine {
                line: number,
                message: "a `remove_pool` record removes a pool of several: it stands in a recording of several pools, not in one pool's".into(),
            }
            .into());
        };
        if let Err(error) = fleet.remove_pool(pool).await {
            poolgate_actors::telemetry::rejected(error.code());
            self.rejected(at, number, &error);
        }
        Ok(())
    }

    /// A `rejected` event for line `number`, refused at `at` with `error`.
    fn rejected(&mut self, at: Time, number: usize, error: &GateError) {
        self.held.push(ReplayEvent::Rejected(Rejection {
            at,
            event: "rejected",
            line: number,
            error: error.code(),
            detail: error.to_string(),
        }));
    }

    async fn drive<R: BufRead>(
        &mut self,
        mut reader: ScenarioReader<R>,
        mut first: Option<Result<(usize, String), BadLine>>,
    ) -> Result<(), ReplayError> {
        let mut last: Option<u64> = None;
        let mut records = 0usize;
        while let Some(line) = first.take().or_else(|| reader.next_line()) {
            records += 1;
            let line = match line {
                Ok((number, text)) => match self.recorded_header(&text) {
                    Ok(true) => continue,
                    Ok(false) => Ok((number, text)),
                    Err(message) => Err(BadLine {
                        line: number,
                        message,
                    }),
                },
                Err(bad) => Err(bad),
            };
            // A pool of a fleet's recording removed at its instant.
            let line = match line {
                Ok((number, text)) => match poolgate_actors::replay_format::read_removal(&text) {
                    Ok(Some((at_ms, pool))) => {
                        if let Some(previous) = last.filter(|previous| at_ms < *previous) {
                            self.settle_through(Time::from_millis(previous)).await?;
                            return Err(BadLine {
                                line: number,
                                message: format!(
                                    "at_ms {at_ms} is before the previous record's {previous}"
                                ),
                            }
                            .into());
                        }
                        let at = Time::from_millis(at_ms);
                        if last != Some(at_ms) {
                            if let Some(previous) = last {
                                self.explain(Time::from_millis(previous)).await?;
                            }
                            self.advance_before(at).await?;
                        }
                        last = Some(at_ms);
                        self.remove_pool(at, number, &pool).await?;
                        continue;
                    }
                    Ok(None) => Ok((number, text)),
                    Err(message) => Err(BadLine {
                        line: number,
                        message,
                    }),
                },
                Err(bad) => Err(bad),
            };
            let record = line.and_then(|(number, text)| {
                let record = parse_record(&text).map_err(|message| BadLine {
                    line: number,
                    message,
                })?;
                match last {
                    Some(previous) if record.at_ms < previous => Err(BadLine {
                        line: number,
                        message: format!(
                            "at_ms {} is before the previous record's {previous}",
                            record.at_ms
                        ),
                    }),
                    _ => Ok((number, record)),
                }
            });
            let (number, record) = match record {
                Ok(ok) => ok,
                Err(bad) => {
                    if let Some(previous) = last {
                        self.settle_through(Time::from_millis(previous)).await?;
                    }
                    return Err(bad.into());
                }
            };
            let at = Time::from_millis(record.at_ms);
            if last != Some(record.at_ms) {
                if let Some(previous) = last {
                    self.explain(Time::from_millis(previous)).await?;
                }
                self.advance_before(at).await?;
            }
            last = Some(record.at_ms);
            let refused = match record.input {
                Ok(input) => self.apply(at, record.pool.as_ref(), input).await.err(),
                Err(refusal) => {
                    poolgate_actors::telemetry::rejected(refusal.code());
                    Some(refusal)
                }
            };
            if let Some(error) = refused {
                if matches!(error, GateError::Stopped) {
                    return Err(error.into());
                }
                if matches!(error, GateError::PoolRequired) {
                    self.settle_through(at).await?;
                    return Err(BadLine {
                        line: number,
                        message: "missing field `pool` (several pools are defined)".into(),
                    }
                    .into());
                }
                self.rejected(at, number, &error);
            }
        }
        if records == 0 {
            return Err(BadLine {
                line: 1,
                message: "the scenario has no records".into(),
            }
            .into());
        }
        if let Some(previous) = last {
            self.explain(Time::from_millis(previous)).await?;
        }
        while let Some(deadline) = self.gate.pending_deadline().await? {
            self.settle_through(deadline).await?;
        }
        self.collect();
        if let Some(explainer) = self.explainer.as_mut() {
            let end = explainer.latest();
            for text in explainer.summary(end) {
                self.note(end, text);
            }
        }
        self.write_through(None)
    }

    /// With `--explain`: once every record of instant `at` is in, a line
    /// when the pool's state or blockers changed.
    async fn explain(&mut self, at: Time) -> Result<(), ReplayError> {
        if self.explainer.is_none() && self.timeline.is_none() {
            return Ok(());
        }
        let Some(report) = self.gate.report().await? else {
            return Ok(());
        };
        if let Some(timeline) = self.timeline.as_mut() {
            timeline.sample(at, &report);
        }
        if let Some(text) = self
            .explainer
            .as_mut()
            .and_then(|e| e.after_input(at, &report))
        {
            self.note(at, text);
        }
        Ok(())
    }

    fn note(&mut self, at: Time, text: String) {
        self.held.push(ReplayEvent::Note(Note {
            at,
            event: "note",
            text,
        }));
    }

    /// Moves the clock to 1 ms before `at` and writes what can no longer be
    /// preceded by anything.
    async fn advance_before(&mut self, at: Time) -> Result<(), ReplayError> {
        let target = Time::from_offset(at.offset().saturating_sub(MILLISECOND));
        self.clock_to(target).await?;
        self.collect();
        self.write_through(Some(target))
    }

    /// Moves the clock past `at`, so everything due at `at` has happened,
    /// and writes it.
    async fn settle_through(&mut self, at: Time) -> Result<(), ReplayError> {
        let target = at + MILLISECOND;
        self.clock_to(target).await?;
        self.collect();
        self.write_through(Some(target))
    }

    /// Moves the paused clock to `target`, firing every timer due before it
    /// in order.
    ///
    /// A short move is left to the paused clock, which only moves on when
    /// the runtime is idle, so each timer's consequences settle before the
    /// next one fires. A long one would make tokio's timer wheel step
    /// through the gap (its cost grew with the gap's length), so it jumps:
    /// straight to the gate's next pending deadline (nothing is due before
    /// it), from where the paused clock takes the last millisecond. A jump
    /// of 10^15 ms thus costs what a jump of 1 ms costs.
    async fn clock_to(&mut self, target: Time) -> Result<(), ReplayError> {
        loop {
            let now = self.gate.clock().now();
            if target <= now {
                return Ok(());
            }
            if target - now > LONG_MOVE {
                let stop = match self.gate.pending_deadline().await? {
                    Some(deadline) if deadline < target => deadline + MILLISECOND,
                    _ => target,
                };
                let jump = Time::from_offset(stop.offset().saturating_sub(MILLISECOND)) - now;
                if !jump.is_zero() {
                    tokio::time::advance(jump).await;
                }
                tokio::time::sleep_until(self.gate.clock().instant(stop)).await;
            } else {
                tokio::time::sleep_until(self.gate.clock().instant(target)).await;
            }
        }
    }

    fn collect(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            if let Some(explainer) = self.explainer.as_mut() {
                explainer.saw(&event);
            }
            if let Some(timeline) = self.timeline.as_mut() {
                timeline.saw(&event);
            }
            self.held.push(ReplayEvent::Gate(event));
        }
    }

    /// Writes, in time order, the held events stamped before `bound` (all of
    /// them when `bound` is `None`).
    fn write_through(&mut self, bound: Option<Time>) -> Result<(), ReplayError> {
        self.held.sort_by_key(ReplayEvent::at);
        let split = match bound {
            Some(bound) => self.held.partition_point(|e| e.at() < bound),
            None => self.held.len(),
        };
        for event in self.held.drain(..split) {
            (self.sink)(&event)?;
        }
        Ok(())
    }
}

impl From<crate::config::SettingsError> for ReplayError {
    fn from(e: crate::config::SettingsError) -> Self {
        match e {
            crate::config::SettingsError::Gate(e) => e.into(),
            crate::config::SettingsError::State(e) => e.into(),
        }
    }
}
