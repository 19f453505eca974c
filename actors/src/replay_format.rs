//! The replay format (design §5, §9): JSON Lines, one record per line, each
//! an object with its instant (`at_ms`) and its `type`. The recording
//! writes it ([`crate::Recording`]) and `poolgate replay` reads it: each
//! record type, its fields, their checks and what they mean to the gate
//! are here once.
//!
//! ```
//! use poolgate_actors::replay_format::{self, Line};
//!
//! let (at_ms, line) = replay_format::read(r#"{"at_ms":5,"type":"available","node":"node-1"}"#)?;
//! assert_eq!(at_ms, 5);
//! assert_eq!(replay_format::write(at_ms, &line), r#"{"at_ms":5,"type":"available","node":"node-1"}"#);
//! assert!(line.into_input()?.is_ok(), "an input the gate takes");
//! # Ok::<(), String>(())
//! ```

use std::borrow::Cow;
use std::time::Duration;

use base64::Engine;
use poolgate_core::{
    AgentReport, Command, Durable, Epoch, Fingerprint, IdentityMaterial, Input, InvalidIdentity,
    MembershipUpdate, NodeId, Observation, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId,
    RegistryFact, RunId, SwimState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::GateError;

/// The latest `at_ms` accepted: 2^53 − 1, exact in any JSON reader.
pub const MAX_AT_MS: u64 = (1 << 53) - 1;

/// One record as it stands on a line, after its `at_ms`: borrowed when
/// written, owned when read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line<'a> {
    /// The gate's settings: a recording's first record. In a fleet's
    /// recording each pool's, naming it, before its first `define_pool`.
    Settings {
        /// The pool they are for (a fleet's recording).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The convergence window.
        window_ms: u64,
        /// `wait` or `abort`.
        on_readiness_lost: Cow<'a, str>,
        /// How long a suspended planning waits; `null` = forever.
        #[serde(default)]
        wait_timeout_ms: Option<u64>,
    },
    /// What a recording's gate restored, right after `settings`, once
    /// (in a fleet's recording, per pool, naming it).
    Restored {
        /// The pool it is for (a fleet's recording).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The restored state.
        durable: Cow<'a, Durable>,
        /// The restore grace.
        restore_grace_ms: u64,
    },
    /// The candidate pool (re)defined.
    DefinePool {
        /// The pool's id.
        pool: Cow<'a, str>,
        /// Its members.
        members: Vec<Cow<'a, str>>,
    },
    /// A pool of a fleet removed (its run ended first): it gates nothing
    /// more.
    RemovePool {
        /// The pool's id.
        pool: Cow<'a, str>,
    },
    /// The registry knows the node.
    Known {
        /// The node.
        node: Cow<'a, str>,
    },
    /// The registry forgot the node.
    Forgotten {
        /// The node.
        node: Cow<'a, str>,
    },
    /// A SWIM fact.
    Swim {
        /// The node.
        node: Cow<'a, str>,
        /// Its SWIM state.
        state: SwimStateName,
        /// At which incarnation.
        incarnation: u64,
    },
    /// The node's agent said `NodeAvailable`.
    Available {
        /// The node.
        node: Cow<'a, str>,
    },
    /// The node's agent withdrew.
    Unavailable {
        /// The node.
        node: Cow<'a, str>,
    },
    /// The node's data-plane identity: the material (base64, scenarios)
    /// or its fingerprint (hex, recordings), not both.
    Identity {
        /// The node.
        node: Cow<'a, str>,
        /// The material, base64.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        material: Option<Cow<'a, str>>,
        /// The fingerprint, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<Cow<'a, str>>,
    },
    /// The node's agent reported a fault.
    Faulted {
        /// The node.
        node: Cow<'a, str>,
        /// Why.
        reason: Cow<'a, str>,
    },
    /// The node's agent reported the fault cleared.
    Recovered {
        /// The node.
        node: Cow<'a, str>,
    },
    /// Planning begins.
    BeginPlanning {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The run.
        run: Cow<'a, str>,
        /// The epoch the plan is made against.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
    },
    /// The plan is committed: provisioning begins.
    CommitPlan {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The run.
        run: Cow<'a, str>,
        /// Its required nodes.
        required: Vec<Cow<'a, str>>,
        /// The epoch the plan was made against.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
    },
    /// The run finished.
    FinishRun {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The run.
        run: Cow<'a, str>,
    },
    /// The planning run was withdrawn (its requester is gone).
    AbortPlanning {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>>,
        /// The run.
        run: Cow<'a, str>,
    },
}

/// What a `restored` record anywhere but right after `settings` is told.
pub const RESTORED_OUT_OF_PLACE: &str = "a `restored` record comes right after `settings`, once";

/// Every record type, as `type` spells it.
pub const TYPES: &[&str] = &[
    "settings",
    "restored",
    "define_pool",
    "remove_pool",
    "known",
    "forgotten",
    "swim",
    "available",
    "unavailable",
    "identity",
    "faulted",
    "recovered",
    "begin_planning",
    "commit_plan",
    "finish_run",
    "abort_planning",
];

/// A SWIM state as the format spells it (`alive`, `suspect`, `dead`,
/// `left`); any other word is named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwimStateName(pub SwimState);

impl Serialize for SwimStateName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for SwimStateName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        [
            SwimState::Alive,
            SwimState::Suspect,
            SwimState::Dead,
            SwimState::Left,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
        .map(SwimStateName)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown SWIM state `{text}` (expected alive, suspect, dead or left)"
            ))
        })
    }
}

/// A record with its instant, as one line of JSON (`at_ms` first).
pub fn write(at_ms: u64, line: &Line<'_>) -> String {
    let mut out = Vec::with_capacity(96);
    write_into(&mut out, at_ms, line);
    // JSON from strings is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// As [`write()`], appended to `out` (a buffer kept from line to line).
pub fn write_into(out: &mut Vec<u8>, at_ms: u64, line: &Line<'_>) {
    use std::io::Write as _;
    // `{"at_ms":N` and then the record's own object, whose opening brace
    // becomes the comma: no intermediate map.
    let start = out.len();
    // Writing into memory cannot fail.
    let _ = write!(out, r#"{{"at_ms":{at_ms}"#);
    let brace = out.len();
    if serde_json::to_writer(&mut *out, line).is_err() || out.get(brace) != Some(&b'{') {
        out.truncate(start);
        return;
    }
    out[brace] = b',';
}

/// Reads one line: its instant and its record, or what is wrong with it
/// (the field and why).
pub fn read(text: &str) -> Result<(u64, Line<'static>), String> {
    if let Ok(flat) = serde_json::from_str::<FlatLine>(text) {
        let at_ms = checked_at_ms(flat.at_ms)?;
        if let Some(line) = flat.into_line() {
            return Ok((at_ms, line));
        }
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let message = e.to_string();
        let message = message
            .rfind(" at line ")
            .map_or(message.as_str(), |end| &message[..end]);
        format!("not valid JSON at column {}: {message}", e.column())
    })?;
    let Value::Object(object) = &value else {
        return Err("a record must be a JSON object".into());
    };
    let at_ms = match object.get("at_ms") {
        None => return Err("missing field `at_ms`".into()),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("`at_ms` must be a whole number of milliseconds ≥ 0, not {v}"))
            .and_then(checked_at_ms)?,
    };
    match object.get("type") {
        None => return Err("missing field `type`".into()),
        Some(Value::String(kind)) if !TYPES.contains(&kind.as_str()) => {
            return Err(format!("unknown record type `{kind}`"))
        }
        Some(Value::String(_)) => {}
        Some(other) => return Err(format!("`type` must be a string, not {other}")),
    }
    check_field_types(object)?;
    let line = Line::deserialize(value).map_err(|e| e.to_string())?;
    Ok((at_ms, line))
}

fn checked_at_ms(at_ms: u64) -> Result<u64, String> {
    if at_ms > MAX_AT_MS {
        return Err(format!(
            "`at_ms` must be at most {MAX_AT_MS} (2^53 − 1), not {at_ms}"
        ));
    }
    Ok(at_ms)
}

/// What a field of a record holds.
#[derive(Clone, Copy)]
enum Holds {
    /// A string: an id, a name, base64 or hex.
    Text,
    /// A whole number ≥ 0.
    Count,
    /// A whole number ≥ 0, or `null` for none.
    CountOrNull,
    /// A list of ids.
    Ids,
}

impl Holds {
    fn fits(self, value: &Value) -> bool {
        match self {
            Holds::Text => value.is_string(),
            Holds::Count => value.is_u64(),
            Holds::CountOrNull => value.is_u64() || value.is_null(),
            Holds::Ids => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Holds::Text => "a string",
            Holds::Count | Holds::CountOrNull => "a whole number ≥ 0",
            Holds::Ids => "a list of ids",
        }
    }
}

/// The fields of the records that are gate inputs or settings, and what
/// each holds: the one list a line's fields are checked against (a
/// `restored` record's fields are read by [`read_restored`]).
const FIELDS: &[(&str, Holds)] = &[
    ("node", Holds::Text),
    ("run", Holds::Text),
    ("pool", Holds::Text),
    ("material", Holds::Text),
    ("fingerprint", Holds::Text),
    ("reason", Holds::Text),
    ("state", Holds::Text),
    ("on_readiness_lost", Holds::Text),
    ("window_ms", Holds::Count),
    ("incarnation", Holds::Count),
    ("wait_timeout_ms", Holds::CountOrNull),
    ("epoch", Holds::CountOrNull),
    ("members", Holds::Ids),
    ("required", Holds::Ids),
];

/// Names the field of a mistyped value (serde's own message does not).
fn check_field_types(object: &serde_json::Map<String, Value>) -> Result<(), String> {
    for (name, value) in object {
        let Some((_, holds)) = FIELDS.iter().find(|(field, _)| field == name) else {
            continue;
        };
        if !holds.fits(value) {
            return Err(format!(
                "field `{name}` must be {}, not {value}",
                holds.expected()
            ));
        }
    }
    Ok(())
}

/// The object of a line whose `type` is `kind`; `None` for any other line
/// (which [`read`] reports on, if it is wrong).
fn object_of_type(text: &str, kind: &str) -> Option<serde_json::Map<String, Value>> {
    if !may_be_of_type(text, kind) {
        return None;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) if object.get("type").and_then(Value::as_str) == Some(kind) => {
            Some(object)
        }
        _ => None,
    }
}

/// A recording's `settings` record: one gate's, or one pool's of a
/// fleet's recording (naming it).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSettings {
    /// The pool they are for; `None` for one gate's recording.
    pub pool: Option<PoolId>,
    /// The convergence window.
    pub window: Duration,
    /// The planning policy.
    pub policy: PlanningPolicy,
}

/// A recording's `restored` record: what a gate (or one pool of a fleet,
/// named) restored at its start.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRestore {
    /// The pool it is for; `None` for one gate's recording.
    pub pool: Option<PoolId>,
    /// The restored state.
    pub durable: Durable,
    /// The restore grace.
    pub grace: Duration,
}

/// The pool a header record names, checked.
fn header_pool(object: &serde_json::Map<String, Value>) -> Result<Option<PoolId>, String> {
    match object.get("pool") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(pool)) => PoolId::new(pool)
            .map(Some)
            .map_err(|e| format!("field `pool`: {e}")),
        Some(other) => Err(format!("field `pool` must be a string, not {other}")),
    }
}

/// The settings, if `text` is a `settings` record (a recording's first
/// line, or in a fleet's recording any pool's; its `at_ms` is not read);
/// `Ok(None)` for any other line.
pub fn read_settings(text: &str) -> Result<Option<RecordedSettings>, String> {
    let Some(object) = object_of_type(text, "settings") else {
        return Ok(None);
    };
    check_field_types(&object)?;
    let pool = header_pool(&object)?;
    let line = Line::deserialize(Value::Object(object)).map_err(|e| e.to_string())?;
    let Some(settings) = line.as_settings() else {
        return Ok(None);
    };
    let (window, policy) = settings?;
    Ok(Some(RecordedSettings {
        pool,
        window,
        policy,
    }))
}

/// What a recording's gate (or a fleet's pool) restored, if `text` is a
/// `restored` record (right after its `settings`; its `at_ms` is not
/// read): the state and the restore grace; `Ok(None)` for any other line.
pub fn read_restored(text: &str) -> Result<Option<RecordedRestore>, String> {
    let Some(object) = object_of_type(text, "restored") else {
        return Ok(None);
    };
    let durable = object
        .get("durable")
        .ok_or("missing field `durable`")
        .and_then(|d| {
            serde_json::from_value(d.clone()).map_err(|_| "field `durable` is not a restored state")
        })?;
    let grace = object
        .get("restore_grace_ms")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .ok_or("field `restore_grace_ms` must be a whole number ≥ 0")?;
    if let Some(problem) = crate::duration_problem(grace) {
        return Err(format!("field `restore_grace_ms` {problem}"));
    }
    Ok(Some(RecordedRestore {
        pool: header_pool(&object)?,
        durable,
        grace,
    }))
}

/// The pool a `remove_pool` record removes, and its instant; `Ok(None)`
/// for any other record.
pub fn read_removal(text: &str) -> Result<Option<(u64, PoolId)>, String> {
    if !is_of_type(text, "remove_pool") {
        return Ok(None);
    }
    match read(text)? {
        (at_ms, Line::RemovePool { pool }) => PoolId::new(&pool)
            .map(|pool| Some((at_ms, pool)))
            .map_err(|e| format!("field `pool`: {e}")),
        _ => Ok(None),
    }
}

/// Whether `text` is an object of record type `kind`, however wrong the
/// rest of it.
pub fn is_of_type(text: &str, kind: &str) -> bool {
    if !may_be_of_type(text, kind) {
        return false;
    }
    #[derive(Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
    }
    serde_json::from_str::<Kind<'_>>(text).is_ok_and(|k| k.kind == kind)
}

/// Whether `text` may be a record of type `kind` (letters and `_`): it
/// spells `kind` out, or it escapes characters (`\u…`, which may spell
/// any of them) and must be read to tell. Checked before a line is parsed
/// to look at its type, so a record of another type costs one parse, not
/// one more per look (the replay looks for a fleet's removals and headers
/// on every line).
fn may_be_of_type(text: &str, kind: &str) -> bool {
    text.contains(kind) || text.contains("\\u")
}

/// Every field a gate input's record may have, typed: the fast path for
/// well-formed lines (an internally tagged enum buffers each line first).
/// Anything it cannot take goes through the slow path, which names what
/// is wrong.
#[derive(Deserialize)]
struct FlatLine {
    at_ms: u64,
    #[serde(rename = "type")]
    kind: String,
    node: Option<String>,
    state: Option<SwimStateName>,
    incarnation: Option<u64>,
    material: Option<String>,
    fingerprint: Option<String>,
    reason: Option<String>,
    run: Option<String>,
    epoch: Option<u64>,
    required: Option<Vec<String>>,
    pool: Option<String>,
    members: Option<Vec<String>>,
}

impl FlatLine {
    /// The record, if every field its type needs is there.
    fn into_line(self) -> Option<Line<'static>> {
        let owned = |list: Vec<String>| list.into_iter().map(Cow::Owned).collect();
        let FlatLine {
            node,
            state,
            incarnation,
            material,
            fingerprint,
            reason,
            run,
            epoch,
            required,
            pool,
            members,
            ..
        } = self;
        let node = node.map(Cow::Owned);
        let run = run.map(Cow::Owned);
        Some(match self.kind.as_str() {
            "define_pool" => Line::DefinePool {
                pool: Cow::Owned(pool?),
                members: owned(members?),
            },
            "remove_pool" => Line::RemovePool {
                pool: Cow::Owned(pool?),
            },
            "known" => Line::Known { node: node? },
            "forgotten" => Line::Forgotten { node: node? },
            "swim" => Line::Swim {
                node: node?,
                state: state?,
                incarnation: incarnation?,
            },
            "available" => Line::Available { node: node? },
            "unavailable" => Line::Unavailable { node: node? },
            "identity" => Line::Identity {
                node: node?,
                material: material.map(Cow::Owned),
                fingerprint: fingerprint.map(Cow::Owned),
            },
            "faulted" => Line::Faulted {
                node: node?,
                reason: Cow::Owned(reason?),
            },
            "recovered" => Line::Recovered { node: node? },
            "begin_planning" => Line::BeginPlanning {
                pool: pool.map(Cow::Owned),
                run: run?,
                epoch,
            },
            "commit_plan" => Line::CommitPlan {
                pool: pool.map(Cow::Owned),
                run: run?,
                required: owned(required?),
                epoch,
            },
            "finish_run" => Line::FinishRun {
                pool: pool.map(Cow::Owned),
                run: run?,
            },
            "abort_planning" => Line::AbortPlanning {
                pool: pool.map(Cow::Owned),
                run: run?,
            },
            _ => return None,
        })
    }
}

impl<'a> Line<'a> {
    /// The gate's settings; `pool` names the pool in a fleet's recording.
    pub fn settings(window: Duration, policy: PlanningPolicy, pool: Option<&'a str>) -> Line<'a> {
        Line::Settings {
            pool: pool.map(Cow::Borrowed),
            window_ms: window.as_millis() as u64,
            on_readiness_lost: Cow::Borrowed(policy.on_readiness_lost.name()),
            wait_timeout_ms: policy.wait_timeout.map(|t| t.as_millis() as u64),
        }
    }

    /// What the gate restored; `pool` names the pool in a fleet's
    /// recording.
    pub fn restored(durable: &'a Durable, grace: Duration, pool: Option<&'a str>) -> Line<'a> {
        Line::Restored {
            pool: pool.map(Cow::Borrowed),
            durable: Cow::Borrowed(durable),
            restore_grace_ms: grace.as_millis() as u64,
        }
    }

    /// An observation of `node`; identity as its fingerprint, never the
    /// bytes.
    pub fn observation(node: &'a str, observation: &'a Observation) -> Line<'a> {
        let node = Cow::Borrowed(node);
        match observation {
            Observation::Known => Line::Known { node },
            Observation::Forgotten => Line::Forgotten { node },
            Observation::Swim { state, incarnation } => Line::Swim {
                node,
                state: SwimStateName(*state),
                incarnation: *incarnation,
            },
            Observation::Available => Line::Available { node },
            Observation::Unavailable => Line::Unavailable { node },
            Observation::Identity(fingerprint) => Line::Identity {
                node,
                material: None,
                fingerprint: Some(Cow::Owned(hex::encode(fingerprint.as_bytes()))),
            },
            Observation::Faulted { reason } => Line::Faulted {
                node,
                reason: Cow::Borrowed(reason.as_str()),
            },
            Observation::Recovered => Line::Recovered { node },
        }
    }

    /// A command, naming `pool` if given (a fleet's recording).
    pub fn command(command: &'a Command, pool: Option<&'a str>) -> Line<'a> {
        let pool = pool.map(Cow::Borrowed);
        let ids = |nodes: &'a [NodeId]| nodes.iter().map(|n| Cow::Borrowed(n.as_str())).collect();
        match command {
            Command::DefinePool(definition) => Line::DefinePool {
                pool: Cow::Borrowed(definition.id().as_str()),
                members: ids(definition.members()),
            },
            Command::BeginPlanning { run, epoch } => Line::BeginPlanning {
                pool,
                run: Cow::Borrowed(run.as_str()),
                epoch: epoch.map(|e| e.0),
            },
            Command::CommitPlan {
                run,
                required,
                epoch,
            } => Line::CommitPlan {
                pool,
                run: Cow::Borrowed(run.as_str()),
                required: ids(required),
                epoch: epoch.map(|e| e.0),
            },
            Command::FinishRun { run } => Line::FinishRun {
                pool,
                run: Cow::Borrowed(run.as_str()),
            },
            Command::AbortPlanning { run } => Line::AbortPlanning {
                pool,
                run: Cow::Borrowed(run.as_str()),
            },
        }
    }

    /// The pool a command names, checked; `None` when it names none (or
    /// the record is not a command).
    pub fn commanded_pool(&self) -> Result<Option<PoolId>, String> {
        match self {
            Line::BeginPlanning { pool, .. }
            | Line::CommitPlan { pool, .. }
            | Line::FinishRun { pool, .. }
            | Line::AbortPlanning { pool, .. } => pool
                .as_deref()
                .map(|p| PoolId::new(p).map_err(|e| format!("field `pool`: {e}")))
                .transpose(),
            _ => Ok(None),
        }
    }

    /// The settings a `settings` record gives; `None` for any other.
    pub fn as_settings(&self) -> Option<Result<(Duration, PlanningPolicy), String>> {
        let Line::Settings {
            window_ms,
            on_readiness_lost,
            wait_timeout_ms,
            ..
        } = self
        else {
            return None;
        };
        Some((|| {
            let window = Duration::from_millis(*window_ms);
            if let Some(problem) = crate::duration_problem(window) {
                return Err(format!("`window_ms` {problem}"));
            }
            let wait_timeout = wait_timeout_ms.map(Duration::from_millis);
            if let Some(problem) = wait_timeout.and_then(crate::duration_problem) {
                return Err(format!("`wait_timeout_ms` {problem}"));
            }
            let policy = PlanningPolicy {
                on_readiness_lost: OnReadinessLost::from_name(on_readiness_lost)?,
                wait_timeout,
            };
            Ok((window, policy))
        })())
    }

    /// The gate input the record is, or why the gate refuses it (a
    /// well-formed record whose content is invalid: identity material, a
    /// pool definition); `Err` for a record that is not an input where
    /// it stands (`settings`, `restored`) or an invalid id.
    pub fn into_input(self) -> Result<Result<Input, GateError>, String> {
        let node = |text: &str| NodeId::new(text).map_err(|e| format!("field `node`: {e}"));
        let run = |text: &str| RunId::new(text).map_err(|e| format!("field `run`: {e}"));
        let nodes = |field: &str, list: &[Cow<'_, str>]| {
            list.iter()
                .map(|n| NodeId::new(n).map_err(|e| format!("field `{field}`: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        let input: Input = match self {
            Line::Settings { .. } => {
                return Err("a settings record may only be the first record".into())
            }
            Line::Restored { .. } => return Err(RESTORED_OUT_OF_PLACE.into()),
            Line::DefinePool { pool, members } => {
                let pool = PoolId::new(&pool).map_err(|e| format!("field `pool`: {e}"))?;
                let members = nodes("members", &members)?;
                return Ok(PoolDefinition::new(pool, members)
                    .map(|definition| Command::DefinePool(definition).into())
                    .map_err(GateError::from));
            }
            Line::RemovePool { .. } => {
                return Err("a `remove_pool` record removes a pool of several: it stands in a recording of several pools, not in one pool's".into())
            }
            Line::Known { node: n } => RegistryFact::Known { node: node(&n)? }.into(),
            Line::Forgotten { node: n } => RegistryFact::Forgotten { node: node(&n)? }.into(),
            Line::Swim {
                node: n,
                state,
                incarnation,
            } => MembershipUpdate {
                node: node(&n)?,
                state: state.0,
                incarnation,
            }
            .into(),
            Line::Available { node: n } => AgentReport::Available { node: node(&n)? }.into(),
            Line::Unavailable { node: n } => AgentReport::Unavailable { node: node(&n)? }.into(),
            Line::Identity {
                node: n,
                material,
                fingerprint,
            } => {
                let node = node(&n)?;
                let observed = match (material, fingerprint) {
                    (Some(material), None) => base64::engine::general_purpose::STANDARD
                        .decode(material.as_bytes())
                        .map_err(|_| InvalidIdentity::NotBase64)
                        .and_then(IdentityMaterial::new)
                        .map(|material| material.fingerprint()),
                    // A recording's form: the fingerprint alone, never the bytes.
                    (None, Some(hex)) => {
                        Fingerprint::from_hex(&hex).ok_or(InvalidIdentity::NotFingerprint)
                    }
                    (Some(_), Some(_)) => {
                        return Err(
                            "an identity record has `material` or `fingerprint`, not both".into(),
                        )
                    }
                    (None, None) => {
                        return Err("missing field `material` (or `fingerprint`)".into())
                    }
                };
                return Ok(observed
                    .map(|fingerprint| Input::Observation {
                        node,
                        observation: Observation::Identity(fingerprint),
                    })
                    .map_err(GateError::from));
            }
            Line::Faulted { node: n, reason } => AgentReport::Faulted {
                node: node(&n)?,
                reason: reason.into_owned(),
            }
            .into(),
            Line::Recovered { node: n } => AgentReport::Recovered { node: node(&n)? }.into(),
            Line::BeginPlanning { run: r, epoch, .. } => Command::BeginPlanning {
                run: run(&r)?,
                epoch: epoch.map(Epoch),
            }
            .into(),
            Line::CommitPlan {
                run: r,
                required,
                epoch,
                ..
            } => Command::CommitPlan {
                run: run(&r)?,
                required: nodes("required", &required)?,
                epoch: epoch.map(Epoch),
            }
            .into(),
            Line::FinishRun { run: r, .. } => Command::FinishRun { run: run(&r)? }.into(),
            Line::AbortPlanning { run: r, .. } => Command::AbortPlanning { run: run(&r)? }.into(),
        };
        Ok(Ok(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_type_is_told_however_it_is_spelled_and_only_its_own() {
        for (text, kind, is) in [
            (
                r#"{"at_ms":1,"type":"remove_pool","pool":"a"}"#,
                "remove_pool",
                true,
            ),
            // Escaped, its type spells `remove_pool` all the same.
            (
                r#"{"at_ms":1,"type":"remove\u005fpool","pool":"a"}"#,
                "remove_pool",
                true,
            ),
            (
                r#"{"at_ms":1,"type":"\u0072emove_pool","pool":"a"}"#,
                "remove_pool",
                true,
            ),
            (
                r#"{"at_ms":0,"type":"s\u0065ttings","window_ms":5}"#,
                "settings",
                true,
            ),
            // Another type, or the word in another field.
            (
                r#"{"at_ms":1,"type":"swim","node":"n","state":"alive","incarnation":1}"#,
                "remove_pool",
                false,
            ),
            (
                r#"{"at_ms":1,"type":"available","node":"remove_pool"}"#,
                "remove_pool",
                false,
            ),
            (
                r#"{"at_ms":1,"type":"avail\u0061ble","node":"n"}"#,
                "remove_pool",
                false,
            ),
        ] {
            assert_eq!(is_of_type(text, kind), is, "{text}");
            assert_eq!(object_of_type(text, kind).is_some(), is, "{text}");
        }
        assert_eq!(
            read_removal(r#"{"at_ms":7,"type":"remove\u005fpool","pool":"a"}"#),
            Ok(Some((7, PoolId::new("a").unwrap())))
        );
    }

    /// One record of every type, as the recording or a scenario has it.
    fn one_of_each() -> Vec<Line<'static>> {
        let o = |s: &'static str| Cow::Borrowed(s);
        vec![
            Line::settings(
                Duration::from_secs(5),
                PlanningPolicy {
                    on_readiness_lost: OnReadinessLost::Abort,
                    wait_timeout: None,
                },
                None,
            ),
            Line::Restored {
                pool: None,
                durable: Cow::Owned(Durable::default()),
                restore_grace_ms: 30_000,
            },
            Line::DefinePool {
                pool: o("pool-a"),
                members: vec![o("node-1"), o("node-2")],
            },
            Line::RemovePool { pool: o("pool-a") },
            Line::Known { node: o("node-1") },
            Line::Forgotten { node: o("node-1") },
            Line::Swim {
                node: o("node-1"),
                state: SwimStateName(SwimState::Suspect),
                incarnation: 3,
            },
            Line::Available { node: o("node-1") },
            Line::Unavailable { node: o("node-1") },
            Line::Identity {
                node: o("node-1"),
                material: Some(o("a2V5")),
                fingerprint: None,
            },
            Line::Faulted {
                node: o("node-1"),
                reason: o("disk \"full\""),
            },
            Line::Recovered { node: o("node-1") },
            Line::BeginPlanning {
                pool: Some(o("pool-a")),
                run: o("run-1"),
                epoch: Some(2),
            },
            Line::CommitPlan {
                pool: None,
                run: o("run-1"),
                required: vec![o("node-1")],
                epoch: None,
            },
            Line::FinishRun {
                pool: Some(o("pool-a")),
                run: o("run-1"),
            },
            Line::AbortPlanning {
                pool: None,
                run: o("run-2"),
            },
        ]
    }

    #[test]
    fn every_type_is_written_as_it_is_read_and_listed_once() {
        let mut seen = Vec::new();
        for line in one_of_each() {
            let text = write(7, &line);
            assert!(text.starts_with(r#"{"at_ms":7,"type":""#), "{text}");
            let (at_ms, back) = read(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((at_ms, &back), (7, &line), "{text}");
            let object: Value = serde_json::from_str(&text).unwrap();
            for name in object.as_object().unwrap().keys() {
                let own = ["at_ms", "type", "durable", "restore_grace_ms"];
                assert!(
                    own.contains(&name.as_str()) || FIELDS.iter().any(|(f, _)| f == name),
                    "FIELDS says what `{name}` holds ({text})"
                );
            }
            seen.push(object["type"].as_str().unwrap().to_string());
        }
        assert_eq!(seen, TYPES, "TYPES lists every record type, in order");
    }

    #[test]
    fn a_mistyped_field_and_an_unknown_type_are_named() {
        let e = read(r#"{"at_ms":1,"type":"swim","node":"n","state":"alive","incarnation":"1"}"#)
            .unwrap_err();
        assert_eq!(
            e,
            r#"field `incarnation` must be a whole number ≥ 0, not "1""#
        );
        let e = read(r#"{"at_ms":1,"type":"reboot"}"#).unwrap_err();
        assert_eq!(e, "unknown record type `reboot`");
        let e = read(r#"{"at_ms":1,"type":"swim","node":"n","state":"zombie","incarnation":1}"#)
            .unwrap_err();
        assert!(e.contains("unknown SWIM state `zombie`"), "{e}");
        let restored =
            |rest: &str| read_restored(&format!(r#"{{"at_ms":0,"type":"restored"{rest}}}"#));
        assert_eq!(restored("").unwrap_err(), "missing field `durable`");
        let e = restored(r#","durable":{"last_epoch":"x","run":null},"restore_grace_ms":5"#);
        assert_eq!(e.unwrap_err(), "field `durable` is not a restored state");
        let e = restored(r#","durable":{"last_epoch":1,"run":null}"#);
        assert_eq!(
            e.unwrap_err(),
            "field `restore_grace_ms` must be a whole number ≥ 0"
        );
        let e = restored(
            r#","durable":{"last_epoch":1,"run":null},"restore_grace_ms":18446744073709551615"#,
        );
        assert!(
            e.unwrap_err().contains("365 days"),
            "no timer waits that long"
        );
        let ok =
            restored(r#","durable":{"last_epoch":1,"run":null},"restore_grace_ms":5,"node":1"#);
        assert_eq!(
            ok.unwrap().map(|r| (r.durable.last_epoch, r.grace)),
            Some((1, Duration::from_millis(5)))
        );
        // An ordinary record's error is not hidden by a restored-only field.
        let e = read(r#"{"at_ms":1,"type":"known","restore_grace_ms":"x"}"#).unwrap_err();
        assert_eq!(e, "missing field `node`");
        // A recording's first line: its `at_ms` is not read.
        let settings = read_settings(
            r#"{"type":"settings","window_ms":5000,"on_readiness_lost":"wait","wait_timeout_ms":null}"#,
        );
        assert_eq!(
            settings.unwrap().map(|s| s.window),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn the_recorded_identity_is_the_fingerprint_never_the_bytes() {
        let material = IdentityMaterial::new(b"secret bytes".to_vec()).unwrap();
        let observation = Observation::Identity(material.fingerprint());
        let text = write(1, &Line::observation("node-1", &observation));
        assert!(!text.contains("c2VjcmV0"), "{text}");
        let (_, line) = read(&text).unwrap();
        let input = line.into_input().unwrap().unwrap();
        let Input::Observation {
            node,
            observation: back,
        } = input
        else {
            panic!("an observation, not {input:?}");
        };
        assert_eq!((node.as_str(), back), ("node-1", observation));
    }
}
