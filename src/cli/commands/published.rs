//! `watch --until-ready` among replicas in a process that does not lead:
//! a follower, or a `watch` beside the replica that holds this host's
//! sockets. Only the leader's gate sees `PoolReady`; what it publishes of
//! each pool (design §12, the record a follower's `status` reads) is read
//! from etcd instead.

use std::time::Duration;

use crate::ha::requests::{Requests, LEADER_SAID_WITHIN};

/// How often a process that does not lead reads what the leader
/// published.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Every pool ready, as the leader last published it: each with its
/// epoch; otherwise what it published of each pool that is not (or why
/// nothing was read).
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
    if not.is_empty() {
        Ok(ready)
    } else {
        Err(not)
    }
}

/// Completes once every pool of `pools` is ready as the leader published
/// it (each with its epoch); never when there are none to read.
pub(super) async fn until_ready(pools: Option<&[(String, Requests)]>) -> Vec<(String, u64)> {
    let Some(pools) = pools else {
        return std::future::pending().await;
    };
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        look.tick().await;
        if let Ok(ready) = read(pools).await {
            return ready;
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

/// Says that `within` ran out, with what the leader last published of
/// each pool not ready, and who leads when known.
pub(super) async fn say_not_ready(
    pools: &[(String, Requests)],
    within: Duration,
    leader: Option<String>,
) {
    let within = crate::config::in_words(within);
    let leader = leader.map_or_else(String::new, |l| format!("; leader: {l}"));
    let states = match read(pools).await {
        Ok(_) => "ready just now".to_string(),
        Err(not) => not.join("; "),
    };
    crate::say!(
        warn,
        "poolgate: not ready within {within}: {states} (as the leading replica published it{leader})"
    );
}
