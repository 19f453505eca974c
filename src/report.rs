//! The gate's readiness report in words, one line: what `watch --explain`
//! and `replay --explain` print when the pool's state changes, what
//! `watch --timeout` says when it gives up, and what the leader among
//! replicas publishes for every replica and requester to tell.

use std::collections::BTreeMap;

use poolgate_actors::core::{NodeId, PoolPhase, PoolReport, Time};
use poolgate_actors::Clock;

/// The pool's state in words: forming with its blockers, converging with
/// its deadline, or ready with its epoch; its instants on the gate's
/// timeline, as the explain view's timelines say them.
pub fn state_line(report: &PoolReport) -> String {
    state_line_with(report, |at| at.to_string())
}

/// The pool's state in words, its instants as UTC times by `clock`'s wall
/// mapping: what a running orchestrator publishes (`status`) and says to a
/// requester that gives up, where the gate's timeline ("since 92.233s")
/// would read as a duration (an operator's trial).
pub fn state_line_live(report: &PoolReport, clock: &Clock) -> String {
    state_line_with(report, |at| {
        humantime::format_rfc3339_millis(clock.wall(at)).to_string()
    })
}

/// The pool's state in words, `at` saying each instant.
fn state_line_with(report: &PoolReport, at: impl Fn(Time) -> String) -> String {
    match report.phase {
        PoolPhase::Ready { epoch } => format!("{} ready, epoch {epoch}", report.pool),
        PoolPhase::Converging { deadline } => format!(
            "{} converging: every candidate ready, PoolReady due at {} (window started by {})",
            report.pool,
            at(deadline),
            match &report.last_change.node {
                Some(node) => format!("{node} {}", report.last_change.reason),
                None => report.last_change.reason.to_string(),
            }
        ),
        PoolPhase::Forming => {
            let blocked: Vec<_> = report
                .candidates
                .iter()
                .filter(|c| !c.verdict.is_ready())
                .collect();
            if blocked.len() <= SPELLED_OUT {
                let each: Vec<String> = blocked
                    .iter()
                    .map(|c| {
                        format!(
                            "{} {} (since {})",
                            c.node,
                            c.blockers_in_words(),
                            at(c.since)
                        )
                    })
                    .collect();
                return format!("{} forming: {}", report.pool, each.join(", "));
            }
            // Many: by what blocks them, a few names each.
            let mut by_blockers: BTreeMap<String, Vec<&NodeId>> = BTreeMap::new();
            for c in &blocked {
                let names: Vec<&str> = c.verdict.blockers().map(|b| b.as_str()).collect();
                by_blockers
                    .entry(names.join(" + "))
                    .or_default()
                    .push(&c.node);
            }
            let mut groups: Vec<(String, Vec<&NodeId>)> = by_blockers.into_iter().collect();
            groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
            let groups: Vec<String> = groups
                .iter()
                .map(|(blockers, nodes)| {
                    let named: Vec<String> =
                        nodes.iter().take(NAMED).map(|n| n.to_string()).collect();
                    let more = match nodes.len().saturating_sub(NAMED) {
                        0 => String::new(),
                        more => format!(" and {more} more"),
                    };
                    format!("{} {blockers} ({}{more})", nodes.len(), named.join(", "))
                })
                .collect();
            format!(
                "{} forming: {} of {} not ready: {}",
                report.pool,
                blocked.len(),
                report.candidates.len(),
                groups.join("; ")
            )
        }
    }
}

/// Up to this many blocked candidates, the forming line names each with
/// its blockers; beyond, it groups them by what blocks them.
pub(crate) const SPELLED_OUT: usize = 8;

/// How many nodes a group of the forming line names.
const NAMED: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_actors::core::{
        CandidateSummary, LastChange, NodeDetail, PoolId, Reason, Verdict,
    };

    fn forming(since_ms: u64) -> PoolReport {
        PoolReport {
            pool: PoolId::new("pool-a").unwrap(),
            phase: PoolPhase::Forming,
            candidates: vec![CandidateSummary {
                node: NodeId::new("node-2").unwrap(),
                verdict: Verdict::NOTHING_KNOWN,
                fingerprint: None,
                since: Time::from_millis(since_ms),
                detail: NodeDetail::default(),
            }],
            last_change: LastChange {
                at: Time::from_millis(since_ms),
                node: None,
                reason: Reason::Unknown,
                restarted_window: false,
            },
            run: None,
            ignored_stale: 0,
            ignored_non_candidate: 0,
        }
    }

    #[test]
    fn a_running_gate_says_its_instants_as_utc_times_the_explain_view_on_its_timeline() {
        let report = forming(92_233);
        assert!(
            state_line(&report).contains("(since 92.233s)"),
            "{}",
            state_line(&report)
        );
        let clock = Clock::start();
        let live = state_line_live(&report, &clock);
        let expected = humantime::format_rfc3339_millis(
            clock.wall(Time::ZERO) + std::time::Duration::from_millis(92_233),
        );
        assert!(live.contains(&format!("(since {expected})")), "{live}");
        // The same instant reads the same each time (what the leader
        // publishes is written only when it changes).
        assert_eq!(live, state_line_live(&report, &clock));
        let converging = PoolReport {
            phase: PoolPhase::Converging {
                deadline: Time::from_millis(95_000),
            },
            ..forming(92_233)
        };
        let due = humantime::format_rfc3339_millis(clock.wall(Time::from_millis(95_000)));
        assert!(
            state_line_live(&converging, &clock).contains(&format!("due at {due}")),
            "{}",
            state_line_live(&converging, &clock)
        );
    }
}
