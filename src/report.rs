//! The gate's readiness report in words, one line: what `watch --explain`
//! and `replay --explain` print when the pool's state changes, what
//! `watch --timeout` says when it gives up, and what the leader among
//! replicas publishes for every replica and requester to tell.

use std::collections::BTreeMap;

use poolgate_actors::core::{NodeId, PoolPhase, PoolReport};

/// The pool's state in words: forming with its blockers, converging with
/// its deadline, or ready with its epoch.
pub fn state_line(report: &PoolReport) -> String {
    match report.phase {
        PoolPhase::Ready { epoch } => format!("{} ready, epoch {epoch}", report.pool),
        PoolPhase::Converging { deadline } => format!(
            "{} converging: every candidate ready, PoolReady due at {deadline} (window started by {})",
            report.pool,
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
                    .map(|c| format!("{} {} (since {})", c.node, c.blockers_in_words(), c.since))
                    .collect();
                return format!("{} forming: {}", report.pool, each.join(", "));
            }
            // Many: by what blocks them, a few names each.
            let mut by_blockers: BTreeMap<String, Vec<&NodeId>> = BTreeMap::new();
            for c in &blocked {
                let names: Vec<&str> = c.verdict.blockers().map(|b| b.as_str()).collect();
                by_blockers.entry(names.join(" + ")).or_default().push(&c.node);
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
