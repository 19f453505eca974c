//! `poolgate replay --explain`: a readable account of why the pool is or is
//! not ready, from the gate's own readiness report.
//!
//! After each record the replay asks for the report; whenever the pool's
//! state or its blockers change, [`Explainer`] writes a line such as
//! `pool-a forming: node-3 no_identity (since 2.100s), node-5 suspect (inc 4,
//! since 11.000s)`. At the end it sums up: time to the first `PoolReady`,
//! window restarts by cause, the longest blocker.

use std::collections::BTreeMap;
use std::time::Duration;

use poolgate_actors::core::{Event, LastChange, NodeId, PoolReport, Reason, Time};

/// Follows the reports and events of one replay.
#[derive(Debug, Default)]
pub struct Explainer {
    last_line: Option<String>,
    last_change: Option<LastChange>,
    restarts: BTreeMap<Reason, u32>,
    first_ready: Option<Time>,
    latest: Time,
    /// Candidates blocked at the last report: since when, and by what.
    blocked: BTreeMap<NodeId, (Time, String)>,
    longest: Option<(NodeId, String, Duration)>,
}

impl Explainer {
    /// The report after an input at `at`; a line when something changed.
    pub fn after_input(&mut self, at: Time, report: &PoolReport) -> Option<String> {
        let change = &report.last_change;
        if self.last_change.as_ref() != Some(change) {
            if change.restarted_window {
                *self.restarts.entry(change.reason).or_default() += 1;
            }
            self.last_change = Some(change.clone());
        }
        self.latest = self.latest.max(at);
        let mut still = BTreeMap::new();
        for candidate in report.candidates.iter().filter(|c| !c.verdict.is_ready()) {
            still.insert(
                candidate.node.clone(),
                (candidate.since, candidate.blockers_in_words()),
            );
        }
        // Those no longer blocked (ready, or no longer candidates) end here.
        let ended: Vec<(NodeId, (Time, String))> = std::mem::replace(&mut self.blocked, still)
            .into_iter()
            .filter(|(node, _)| !self.blocked.contains_key(node))
            .collect();
        for (node, (since, what)) in ended {
            self.consider(node, what, at - since);
        }
        let line = state_line(report);
        if self.last_line.as_ref() == Some(&line) {
            return None;
        }
        self.last_line = Some(line.clone());
        Some(line)
    }

    fn consider(&mut self, node: NodeId, what: String, blocked: Duration) {
        if self.longest.as_ref().is_none_or(|(_, _, d)| blocked > *d) {
            self.longest = Some((node, what, blocked));
        }
    }

    /// The last instant anything happened at (where the summary goes).
    pub fn latest(&self) -> Time {
        self.latest
    }

    /// An event of the gate, in time order.
    pub fn saw(&mut self, event: &Event) {
        self.latest = self.latest.max(event.at());
        if let Event::PoolReady { at, .. } = event {
            self.first_ready.get_or_insert(*at);
        }
    }

    /// The closing summary; blockers still holding count up to `end`.
    pub fn summary(&mut self, end: Time) -> Vec<String> {
        for (node, (since, what)) in std::mem::take(&mut self.blocked) {
            self.consider(node, what, end - since);
        }
        let mut lines = vec!["summary:".to_string()];
        lines.push(match self.first_ready {
            Some(at) => format!("  first PoolReady after {at}"),
            None => "  no PoolReady".to_string(),
        });
        if self.restarts.is_empty() {
            lines.push("  window restarts: none".to_string());
        } else {
            let by_cause: Vec<String> = self
                .restarts
                .iter()
                .map(|(reason, count)| format!("{reason} ×{count}"))
                .collect();
            let total: u32 = self.restarts.values().sum();
            lines.push(format!(
                "  window restarts: {total} ({})",
                by_cause.join(", ")
            ));
        }
        if let Some((node, what, blocked)) = &self.longest {
            lines.push(format!(
                "  longest blocker: {node} {what}, {:.3}s",
                blocked.as_secs_f64()
            ));
        }
        lines
    }
}

pub use crate::report::state_line;
