//! The replay format (design §5, §9): JSON Lines, one record per line, each
//! an object with its instant (`at_ms`) and its `type`. The recording
//! writes it ([`crate::Recording`]) and `poolgate replay` reads it. Each
//! record type and its fields are declared once, in one table (the
//! `schema` module: [`Line`], [`TYPES`], the field checks and the one-pass
//! reader come from it); what each record means to the gate is here.
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
    RegistryFact, RunId,
};
use serde::Deserialize;
use serde_json::Value;

use crate::GateError;

mod schema;

use schema::{read_whole, FIELDS};
pub use schema::{Line, SwimStateName, TYPES};

/// The latest `at_ms` accepted: 2^53 − 1, exact in any JSON reader.
pub const MAX_AT_MS: u64 = (1 << 53) - 1;

/// What a `restored` record anywhere but right after `settings` is told.
pub const RESTORED_OUT_OF_PLACE: &str = "a `restored` record comes right after `settings`, once";

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
    if let Some((at_ms, line)) = type_spelled(text).and_then(|kind| read_whole(kind, text)) {
        return Ok((checked_at_ms(at_ms)?, line));
    }
    read_slowly(text)
}

/// As [`read`], through a JSON value: slower, and it names what is wrong.
fn read_slowly(text: &str) -> Result<(u64, Line<'static>), String> {
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

/// The record type `text` spells out plainly (`"type":"swim"`, spaces
/// allowed); `None` when it escapes a character or has no `type`. A guess
/// only: the record read is checked to be of that type.
fn type_spelled(text: &str) -> Option<&str> {
    let after = &text[text.find("\"type\"")? + 6..];
    let after = after.trim_start().strip_prefix(':')?.trim_start();
    let name = after.strip_prefix('"')?;
    let end = name.find(['"', '\\'])?;
    (name.as_bytes().get(end) == Some(&b'"')).then(|| &name[..end])
}

fn checked_at_ms(at_ms: u64) -> Result<u64, String> {
    if at_ms > MAX_AT_MS {
        return Err(format!(
            "`at_ms` must be at most {MAX_AT_MS} (2^53 − 1), not {at_ms}"
        ));
    }
    Ok(at_ms)
}

/// Names the field of a mistyped value (serde's own message does not),
/// among the fields of the record's type.
fn check_field_types(object: &serde_json::Map<String, Value>) -> Result<(), String> {
    let kind = object.get("type").and_then(Value::as_str);
    let Some((_, fields)) = FIELDS.iter().find(|(k, _)| Some(*k) == kind) else {
        return Ok(());
    };
    for (name, value) in object {
        let Some((_, holds)) = fields.iter().find(|(field, _)| field == name) else {
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
mod tests;
