//! `watch --until-ready` among replicas in a process that does not lead:
//! a follower, or a `watch` beside the replica that holds this host's
//! sockets. Only the leader's gate sees `PoolReady`; what it publishes of
//! each pool (design §12, the record a follower's `status` reads) is read
//! from etcd instead, and taken as ready only while the leader that
//! wrote it renews its lease.

use std::cell::RefCell;
use std::time::Duration;

use crate::ha::requests::{Requests, LEADER_SAID_WITHIN};

/// How often a process that does not lead reads what the leader
/// published.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Whether a leader whose lease has `left` of its `granted` TTL renewed
/// it lately: it renews every tenth of the TTL, so three renewals missed
/// (and etcd's whole seconds) mean it is frozen or cut off, and its last
/// record (written only when the pool changes) may be stale.
fn renewed_lately(left: Duration, granted: Duration) -> bool {
    granted.saturating_sub(left) <= granted * 3 / 10 + Duration::from_secs(1)
}

/// Every pool ready, as the leader last published it: each with its
/// epoch; otherwise what it published of each pool that is not, or why
/// it is not taken as said.
async fn read(pools: &[(String, Requests)]) -> Result<Vec<(String, u64)>, Vec<String>> {
    let mut ready = Vec::with_capacity(pools.len());
    let mut not = Vec::new();
    for (pool, requests) in pools {
        match tokio::time::timeout(LEADER_SAID_WITHIN, requests.leader_said()).await {
            Ok(Ok(Some(said))) => match (said["phase"].as_str(), said["epoch"].as_u64()) {
                (Some("ready"), Some(epoch)) => ready.push((pool.clone(), epoch)),
                _ => not.push(
                    said["state"]
                        .as_str()
                        .map_or_else(|| format!("{pool}: {}", said["phase"]), str::to_string),
                ),
            },
            Ok(Ok(None)) => not.push(format!("{pool}: nothing published by a leader yet")),
            Ok(Err(e)) => not.push(format!("{pool}: etcd: {e}")),
            Err(_) => not.push(format!(
                "{pool}: etcd did not answer within {LEADER_SAID_WITHIN:?}"
            )),
        }
    }
    if !not.is_empty() {
        return Err(not);
    }
    // The leader key is the prefix's, the same for every pool.
    let Some((_, requests)) = pools.first() else {
        return Ok(ready);
    };
    let lease = tokio::time::timeout(LEADER_SAID_WITHIN, requests.leader_lease()).await;
    let why = match lease {
        Ok(Ok(Some((left, granted)))) if renewed_lately(left, granted) => return Ok(ready),
        Ok(Ok(Some((left, granted)))) => format!(
            "published ready, but its leader has not renewed its lease for {} (frozen or cut off?)",
            crate::config::in_words(granted.saturating_sub(left))
        ),
        Ok(Ok(None)) => "published ready, but no replica leads now".to_string(),
        Ok(Err(e)) => format!("the leader's lease: etcd: {e}"),
        Err(_) => format!("the leader's lease: etcd did not answer within {LEADER_SAID_WITHIN:?}"),
    };
    Err(vec![why])
}

/// Completes once every pool of `pools` is ready as the leader published
/// it (each with its epoch); never when there are none to read. `last`
/// keeps what the latest read found instead.
pub(super) async fn until_ready(
    pools: Option<&[(String, Requests)]>,
    last: &RefCell<Vec<String>>,
) -> Vec<(String, u64)> {
    let Some(pools) = pools else {
        return std::future::pending().await;
    };
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        look.tick().await;
        match read(pools).await {
            Ok(ready) => return ready,
            Err(not) => *last.borrow_mut() = not,
        }
    }
}

/// Says each pool ready, as the leader published it.
pub(super) fn say_ready(ready: &[(String, u64)]) {
    for (pool, epoch) in ready {
        crate::say!(
            info,
            "poolgate: pool {pool} ready, epoch {epoch} (as the leading replica published it; this process does not lead)"
        );
    }
}

/// Says that `within` ran out, with what the latest read found (`last`),
/// and who leads when known.
pub(super) fn say_not_ready(last: &RefCell<Vec<String>>, within: Duration, leader: Option<String>) {
    let within = crate::config::in_words(within);
    let leader = leader.map_or_else(String::new, |l| format!("; leader: {l}"));
    let last = last.borrow();
    let states = match last.is_empty() {
        true => "nothing read from etcd yet".to_string(),
        false => last.join("; "),
    };
    crate::say!(
        warn,
        "poolgate: not ready within {within}: {states} (read from what the leading replica publishes{leader})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_taken_as_renewing_for_three_renewals_and_a_second_of_its_lease() {
        let s = Duration::from_secs;
        // A 10 s lease, renewed every second: 4 s without, not any more.
        assert!(renewed_lately(s(10), s(10)));
        assert!(renewed_lately(s(6), s(10)));
        assert!(!renewed_lately(s(5), s(10)));
        // A 2 s lease, in etcd's whole seconds: one renewal's rounding
        // is not a missed renewal.
        assert!(renewed_lately(s(1), s(2)));
        assert!(!renewed_lately(s(0), s(2)));
    }
}
