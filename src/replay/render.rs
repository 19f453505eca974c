//! Replay output: one JSON object per line (design §5), or a readable line
//! for a person.

use poolgate_actors::core::{Event, NodeId};

use super::ReplayEvent;

/// The event as one line of JSON, as design §5 specifies.
pub fn json_line(event: &ReplayEvent) -> String {
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_string(event).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The event as a readable line: time, then what happened.
pub fn human_line(event: &ReplayEvent) -> String {
    let what = match event {
        ReplayEvent::Rejected(r) => format!("rejected line {}: {} ({})", r.line, r.error, r.detail),
        ReplayEvent::Note(note) => format!("· {}", note.text),
        ReplayEvent::Gate(event) => describe_event(event),
    };
    timed(event.at(), &what)
}

/// A line of readable output: the instant, right-aligned, then the text.
pub fn timed(at: poolgate_actors::core::Time, what: &str) -> String {
    format!("{:>10}  {what}", at.to_string())
}

/// A gate event in words.
pub fn describe_event(event: &Event) -> String {
    match event {
        Event::PoolReady {
            pool,
            epoch,
            members,
            ..
        } => format!("pool {pool} READY, epoch {epoch}: {}", list(members)),
        Event::ReadinessLost {
            pool,
            epoch,
            node,
            reason,
            ..
        } => match node {
            Some(node) => {
                format!("pool {pool} lost readiness (epoch {epoch}): {node} {reason}")
            }
            None => format!("pool {pool} lost readiness (epoch {epoch}): {reason}"),
        },
        Event::PlanningStarted { run, epoch, .. } => {
            format!("run {run} planning on epoch {epoch}")
        }
        Event::PlanningSuspended { run, .. } => {
            format!("run {run} planning suspended until the pool is ready again")
        }
        Event::PlanningResumed { run, epoch, .. } => {
            format!("run {run} planning resumed on epoch {epoch}")
        }
        Event::PlanningAborted { run, reason, .. } => {
            format!("run {run} planning ABORTED: {}", serde_name(reason))
        }
        Event::RunCommitted {
            run,
            epoch,
            required,
            ..
        } => format!(
            "run {run} committed on epoch {epoch}; requires {}",
            list(required)
        ),
        Event::RunFaulted {
            run, node, reason, ..
        } => format!("run {run} FAULTED: required node {node} {reason}"),
        Event::RunFinished { run, .. } => format!("run {run} finished"),
        // `Event` is non-exhaustive: a newer core's event by its name.
        _ => event.name().replace('_', " "),
    }
}

fn list(nodes: &[NodeId]) -> String {
    nodes
        .iter()
        .map(NodeId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn serde_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
