//! The scenario format of `poolgate replay` (SPEC §5): JSON Lines, one
//! record per line, `at_ms` non-decreasing.
//!
//! [`ScenarioReader`] reads one line at a time with a bounded buffer, so a
//! huge line is reported, not loaded. [`parse_record`] turns a line into a
//! [`Record`] or says what is wrong with it.

use std::io::BufRead;

use base64::Engine;
use poolgate_actors::core::{
    AgentReport, Command, Epoch, Fingerprint, IdentityMaterial, Input, InvalidIdentity,
    MembershipUpdate, NodeId, Observation, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId,
    RegistryFact, RunId, SwimState,
};
use poolgate_actors::GateError;
use serde::Deserialize;
use serde_json::Value;

/// The latest `at_ms` accepted: 2^53 − 1, exact in any JSON reader.
pub const MAX_AT_MS: u64 = (1 << 53) - 1;

/// The longest line accepted, in bytes (without the newline).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A scenario line that is not a valid record: the replay stops here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct BadLine {
    /// The line number (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One record: when, and what.
#[derive(Debug)]
pub struct Record {
    /// The record's instant, in milliseconds.
    pub at_ms: u64,
    /// The input, or why the gate refuses it: a well-formed line whose
    /// content is invalid (identity material, a pool definition) is
    /// `rejected`, not a bad line.
    pub input: Result<Input, GateError>,
}

/// Reads a scenario line by line, never holding more than
/// [`MAX_LINE_BYTES`] + 1 bytes of one line.
pub struct ScenarioReader<R> {
    inner: R,
    line: usize,
    buffer: Vec<u8>,
}

impl<R: BufRead> ScenarioReader<R> {
    /// Reads from `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            line: 0,
            buffer: Vec::new(),
        }
    }

    /// The next non-blank line with its number, `None` at the end.
    pub fn next_line(&mut self) -> Option<Result<(usize, String), BadLine>> {
        loop {
            self.line += 1;
            self.buffer.clear();
            let limit = MAX_LINE_BYTES as u64 + 2;
            let mut limited = std::io::Read::take(&mut self.inner, limit);
            match limited.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(Err(self.bad(format!("cannot read: {e}")))),
            };
            if self.buffer.last() == Some(&b'\n') {
                self.buffer.pop();
                if self.buffer.last() == Some(&b'\r') {
                    self.buffer.pop();
                }
            }
            if self.buffer.len() > MAX_LINE_BYTES {
                return Some(Err(
                    self.bad(format!("line is longer than {MAX_LINE_BYTES} bytes"))
                ));
            }
            let text = match std::str::from_utf8(&self.buffer) {
                Ok(text) => text,
                Err(e) => {
                    return Some(Err(self.bad(format!(
                        "not UTF-8 (invalid byte at column {})",
                        e.valid_up_to() + 1
                    ))))
                }
            };
            if text.trim().is_empty() {
                continue;
            }
            return Some(Ok((self.line, text.to_string())));
        }
    }

    fn bad(&self, message: String) -> BadLine {
        BadLine {
            line: self.line,
            message,
        }
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum RawRecord {
    DefinePool {
        pool: String,
        members: Vec<String>,
    },
    Known {
        node: String,
    },
    Forgotten {
        node: String,
    },
    Swim {
        node: String,
        state: SwimStateName,
        incarnation: u64,
    },
    Available {
        node: String,
    },
    Unavailable {
        node: String,
    },
    Identity {
        node: String,
        #[serde(default)]
        material: Option<String>,
        #[serde(default)]
        fingerprint: Option<String>,
    },
    Settings {
        window_ms: u64,
        on_readiness_lost: String,
        #[serde(default)]
        wait_timeout_ms: Option<u64>,
    },
    Faulted {
        node: String,
        reason: String,
    },
    Recovered {
        node: String,
    },
    BeginPlanning {
        run: String,
        #[serde(default)]
        epoch: Option<u64>,
    },
    CommitPlan {
        run: String,
        required: Vec<String>,
        #[serde(default)]
        epoch: Option<u64>,
    },
    FinishRun {
        run: String,
    },
}

const RECORD_TYPES: &[&str] = &[
    "define_pool",
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
    "settings",
];

impl<'de> Deserialize<'de> for SwimStateName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "alive" => Ok(SwimStateName(SwimState::Alive)),
            "suspect" => Ok(SwimStateName(SwimState::Suspect)),
            "dead" => Ok(SwimStateName(SwimState::Dead)),
            "left" => Ok(SwimStateName(SwimState::Left)),
            other => Err(serde::de::Error::custom(format!(
                "unknown SWIM state `{other}` (expected alive, suspect, dead or left)"
            ))),
        }
    }
}

struct SwimStateName(SwimState);

/// Every field a record may have, typed: the fast path for well-formed
/// lines. Anything it cannot take goes through the slow path, which names
/// what is wrong.
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
    fn into_raw(self) -> Option<RawRecord> {
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
        Some(match self.kind.as_str() {
            "define_pool" => RawRecord::DefinePool {
                pool: pool?,
                members: members?,
            },
            "known" => RawRecord::Known { node: node? },
            "forgotten" => RawRecord::Forgotten { node: node? },
            "swim" => RawRecord::Swim {
                node: node?,
                state: state?,
                incarnation: incarnation?,
            },
            "available" => RawRecord::Available { node: node? },
            "unavailable" => RawRecord::Unavailable { node: node? },
            "identity" => RawRecord::Identity {
                node: node?,
                material,
                fingerprint,
            },
            "faulted" => RawRecord::Faulted {
                node: node?,
                reason: reason?,
            },
            "recovered" => RawRecord::Recovered { node: node? },
            "begin_planning" => RawRecord::BeginPlanning { run: run?, epoch },
            "commit_plan" => RawRecord::CommitPlan {
                run: run?,
                required: required?,
                epoch,
            },
            "finish_run" => RawRecord::FinishRun { run: run? },
            _ => return None,
        })
    }
}

/// Parses one scenario line.
pub fn parse_record(text: &str) -> Result<Record, String> {
    if let Ok(line) = serde_json::from_str::<FlatLine>(text) {
        let at_ms = checked_at_ms(line.at_ms)?;
        if let Some(raw) = line.into_raw() {
            return Ok(Record {
                at_ms,
                input: input_of(raw)?,
            });
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
        Some(Value::String(kind)) if kind == "restored" => {
            return Err("a `restored` record comes right after `settings`, once".into())
        }
        Some(Value::String(kind)) if !RECORD_TYPES.contains(&kind.as_str()) => {
            return Err(format!("unknown record type `{kind}`"))
        }
        Some(Value::String(_)) => {}
        Some(other) => return Err(format!("`type` must be a string, not {other}")),
    }
    check_field_types(object)?;
    let raw = RawRecord::deserialize(&value).map_err(|e| e.to_string())?;
    Ok(Record {
        at_ms,
        input: input_of(raw)?,
    })
}

fn checked_at_ms(at_ms: u64) -> Result<u64, String> {
    if at_ms > MAX_AT_MS {
        return Err(format!(
            "`at_ms` must be at most {MAX_AT_MS} (2^53 − 1), not {at_ms}"
        ));
    }
    Ok(at_ms)
}

/// The gate's settings as a recording's first record gives them
/// (`{"at_ms":0,"type":"settings","window_ms":…,"on_readiness_lost":…,
/// "wait_timeout_ms":…|null}`, SPEC §9); `Ok(None)` for any other record.
pub fn parse_settings(text: &str) -> Result<Option<(std::time::Duration, PlanningPolicy)>, String> {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(text) else {
        return Ok(None);
    };
    if object.get("type").and_then(Value::as_str) != Some("settings") {
        return Ok(None);
    }
    check_field_types(&object)?;
    let raw = RawRecord::deserialize(&Value::Object(object)).map_err(|e| e.to_string())?;
    let RawRecord::Settings {
        window_ms,
        on_readiness_lost,
        wait_timeout_ms,
    } = raw
    else {
        return Ok(None);
    };
    if window_ms == 0 {
        return Err("`window_ms` must be longer than zero".into());
    }
    let on_readiness_lost = match on_readiness_lost.as_str() {
        "wait" => OnReadinessLost::Wait,
        "abort" => OnReadinessLost::Abort,
        other => {
            return Err(format!(
                "`{other}` is not a policy; use \"wait\" or \"abort\""
            ))
        }
    };
    let policy = PlanningPolicy {
        on_readiness_lost,
        wait_timeout: wait_timeout_ms.map(std::time::Duration::from_millis),
    };
    Ok(Some((std::time::Duration::from_millis(window_ms), policy)))
}

/// What a recording's gate restored (`{"at_ms":0,"type":"restored",
/// "durable":{…},"restore_grace_ms":…}`, right after `settings`): the
/// state and the restore grace; `Ok(None)` for any other record.
pub fn parse_restored(
    text: &str,
) -> Result<Option<(poolgate_actors::core::Durable, std::time::Duration)>, String> {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(text) else {
        return Ok(None);
    };
    if object.get("type").and_then(Value::as_str) != Some("restored") {
        return Ok(None);
    }
    let durable = object
        .get("durable")
        .ok_or("missing field `durable`")
        .and_then(|d| {
            serde_json::from_value(d.clone()).map_err(|_| "field `durable` is not a restored state")
        })?;
    let grace = object
        .get("restore_grace_ms")
        .and_then(Value::as_u64)
        .ok_or("field `restore_grace_ms` must be a whole number ≥ 0")?;
    Ok(Some((durable, std::time::Duration::from_millis(grace))))
}

/// Names the field of a mistyped value (serde's own message does not).
fn check_field_types(object: &serde_json::Map<String, Value>) -> Result<(), String> {
    for (name, value) in object {
        let fits = match name.as_str() {
            "node" | "run" | "pool" | "material" | "fingerprint" | "reason" | "state"
            | "on_readiness_lost" => value.is_string(),
            "window_ms" => value.is_u64(),
            "wait_timeout_ms" => value.is_u64() || value.is_null(),
            "incarnation" => value.is_u64(),
            "epoch" => value.is_u64() || value.is_null(),
            "members" | "required" => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            _ => true,
        };
        if !fits {
            let expected = match name.as_str() {
                "incarnation" | "epoch" => "a whole number ≥ 0",
                "members" | "required" => "a list of ids",
                _ => "a string",
            };
            return Err(format!("field `{name}` must be {expected}, not {value}"));
        }
    }
    Ok(())
}

fn input_of(raw: RawRecord) -> Result<Result<Input, GateError>, String> {
    let node = |text: &str| NodeId::new(text).map_err(|e| format!("field `node`: {e}"));
    let run = |text: &str| RunId::new(text).map_err(|e| format!("field `run`: {e}"));
    let nodes = |field: &str, list: &[String]| {
        list.iter()
            .map(|n| NodeId::new(n).map_err(|e| format!("field `{field}`: {e}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let input: Input = match raw {
        RawRecord::DefinePool { pool, members } => {
            let pool = PoolId::new(&pool).map_err(|e| format!("field `pool`: {e}"))?;
            let members = nodes("members", &members)?;
            return Ok(PoolDefinition::new(pool, members)
                .map(|definition| Command::DefinePool(definition).into())
                .map_err(GateError::from));
        }
        RawRecord::Known { node: n } => RegistryFact::Known { node: node(&n)? }.into(),
        RawRecord::Forgotten { node: n } => RegistryFact::Forgotten { node: node(&n)? }.into(),
        RawRecord::Swim {
            node: n,
            state,
            incarnation,
        } => MembershipUpdate {
            node: node(&n)?,
            state: state.0,
            incarnation,
        }
        .into(),
        RawRecord::Available { node: n } => AgentReport::Available { node: node(&n)? }.into(),
        RawRecord::Unavailable { node: n } => AgentReport::Unavailable { node: node(&n)? }.into(),
        RawRecord::Identity {
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
                (None, None) => return Err("missing field `material` (or `fingerprint`)".into()),
            };
            return Ok(observed
                .map(|fingerprint| Input::Observation {
                    node,
                    observation: Observation::Identity(fingerprint),
                })
                .map_err(GateError::from));
        }
        RawRecord::Settings { .. } => {
            return Err("a settings record may only be the first record".into())
        }
        RawRecord::Faulted { node: n, reason } => AgentReport::Faulted {
            node: node(&n)?,
            reason,
        }
        .into(),
        RawRecord::Recovered { node: n } => AgentReport::Recovered { node: node(&n)? }.into(),
        RawRecord::BeginPlanning { run: r, epoch } => Command::BeginPlanning {
            run: run(&r)?,
            epoch: epoch.map(Epoch),
        }
        .into(),
        RawRecord::CommitPlan {
            run: r,
            required,
            epoch,
        } => Command::CommitPlan {
            run: run(&r)?,
            required: nodes("required", &required)?,
            epoch: epoch.map(Epoch),
        }
        .into(),
        RawRecord::FinishRun { run: r } => Command::FinishRun { run: run(&r)? }.into(),
    };
    Ok(Ok(input))
}
