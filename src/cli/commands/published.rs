//! `watch --until-ready` among replicas in a process that does not lead:
//! a follower, or a `watch` beside the replica that holds this host's
//! sockets. Only the leader's gate sees `PoolReady`; what it publishes of
//! each pool (design §12, the record a follower's `status` reads) is read
//! from etcd instead, and taken as ready only while the leader that
//! wrote it renews its lease.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crate::ha::requests::renewals::{Reading, Renewal, Renewals};
use crate::ha::requests::{Published, Requests, LEADER_SAID_WITHIN};

/// How often a process that does not lead reads what the leader
/// published.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// What the leader published of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    /// Ready, at this epoch.
    Ready(u64),
    /// Not ready: what it says of the pool.
    Not(String),
}

/// What a process that does not lead has read of what the leader
/// publishes: each pool's state as last read, why the latest read was
/// not taken as ready, and the leader's lease as seen over time. No I/O:
/// [`until_ready`] feeds it.
#[derive(Debug, Default)]
pub(super) struct Looks {
    /// Each pool's state as last read: kept when a later read fails, as
    /// with etcd out of quorum.
    states: Vec<(String, Said)>,
    /// Why the latest read that ended was not taken as ready, beyond the
    /// states: kept while the next read is under way (with etcd out of
    /// quorum, each read waits out its bound, and a timeout comes mid-read).
    why: Vec<String>,
    /// What the read under way found wrong so far.
    wrong: Vec<String>,
    /// The leader's lease: renewed by its holder, or by etcd's hand?
    renewals: Renewals,
}

impl Looks {
    /// A read begins: what the last one found wrong is forgotten.
    fn begin(&mut self) {
        self.wrong.clear();
    }

    /// The read under way ended: what it found wrong is what to say.
    fn end(&mut self) {
        self.why = std::mem::take(&mut self.wrong);
    }

    /// Notes what the leader published of `pool`.
    fn pool(&mut self, pool: &str, said: Said) {
        match self.states.iter_mut().find(|(p, _)| p == pool) {
            Some((_, last)) => *last = said,
            None => self.states.push((pool.to_string(), said)),
        }
    }

    /// Notes why this read is not taken as ready (`pool`'s, when it is
    /// one pool's).
    fn not(&mut self, pool: Option<&str>, why: String) {
        self.wrong.push(match pool {
            Some(pool) => format!("{pool}: {why}"),
            None => why,
        });
    }

    /// Whether the leader whose lease reads `reading` (at `now`; `doubt`:
    /// since when leases are in doubt, as this process saw) renews it:
    /// three renewals missed (and etcd's whole second) mean it is frozen
    /// or cut off, and its last record (written only when the pool
    /// changes) may be stale; after etcd elected a raft leader (which
    /// gives every lease a fresh TTL) or answered again after an outage,
    /// only once seen renewing it (the rule a leader holds its requesters
    /// to).
    fn leader(&mut self, reading: Reading, doubt: Option<Instant>, now: Instant) -> bool {
        let why = match self.renewals.renewal(reading, doubt, now) {
            Renewal::Renews => return true,
            Renewal::Stopped(unrenewed) => format!(
                "published ready, but the leader has not renewed its lease for {} (frozen or cut off?)",
                crate::config::in_words(unrenewed)
            ),
            Renewal::Unproven => "published ready, but etcd elected a raft leader or answered again lately (which renews every lease), and the leader is not seen renewing its lease since".to_string(),
        };
        self.not(None, why);
        false
    }

    /// Every pool of `pools` ready as the last read that ended found it,
    /// each with its epoch; none if anything it found is wrong.
    fn ready<'a>(&self, pools: impl IntoIterator<Item = &'a str>) -> Option<Vec<(String, u64)>> {
        match self.why.is_empty() {
            true => self.all_ready(pools),
            false => None,
        }
    }

    /// Whether the read under way found every pool of `pools` ready so
    /// far, with nothing wrong.
    fn reading_ready<'a>(&self, pools: impl IntoIterator<Item = &'a str>) -> bool {
        self.wrong.is_empty() && self.all_ready(pools).is_some()
    }

    /// Every pool of `pools` ready as last read, each with its epoch.
    fn all_ready<'a>(
        &self,
        pools: impl IntoIterator<Item = &'a str>,
    ) -> Option<Vec<(String, u64)>> {
        pools
            .into_iter()
            .map(|pool| match self.states.iter().find(|(p, _)| p == pool) {
                Some((_, Said::Ready(epoch))) => Some((pool.to_string(), *epoch)),
                _ => None,
            })
            .collect()
    }

    /// What the latest reads found, to say at a timeout: each pool's
    /// state as last read, then what the latest read found wrong.
    fn said(&self) -> String {
        let parts: Vec<String> = self
            .states
            .iter()
            .map(|(pool, said)| match said {
                Said::Ready(epoch) => format!("{pool}: published ready, epoch {epoch}"),
                Said::Not(state) => state.clone(),
            })
            .collect();
        let why = self.why.join("; ");
        match (parts.is_empty(), why.is_empty()) {
            (true, true) => "nothing read from etcd yet".to_string(),
            (false, true) => parts.join("; "),
            (true, false) => why,
            (false, false) => format!("{}; then {why}", parts.join("; ")),
        }
    }
}

/// Reads what the leader published of each pool of `pools`, and its
/// lease when every pool reads ready, into `looks`.
async fn read(pools: &[(String, Requests)], looks: &RefCell<Looks>) {
    looks.borrow_mut().begin();
    read_into(pools, looks).await;
    looks.borrow_mut().end();
}

/// [`read`]'s reads, between its beginning and its end.
async fn read_into(pools: &[(String, Requests)], looks: &RefCell<Looks>) {
    // The leader key is the prefix's, the same for every pool.
    let mut leader = None;
    for (pool, requests) in pools {
        let read = tokio::time::timeout(LEADER_SAID_WITHIN, requests.leader_published()).await;
        let mut looks = looks.borrow_mut();
        match read {
            Ok(Ok(Some(published))) => {
                leader = leader.or(published.leader_lease);
                looks.pool(pool, said_of(pool, &published));
            }
            Ok(Ok(None)) => looks.pool(
                pool,
                Said::Not(format!("{pool}: nothing published by a leader yet")),
            ),
            Ok(Err(e)) => looks.not(Some(pool), format!("etcd: {e}")),
            Err(_) => looks.not(
                Some(pool),
                format!("etcd did not answer within {LEADER_SAID_WITHIN:?}"),
            ),
        }
    }
    let Some((_, requests)) = pools.first() else {
        return;
    };
    if !looks
        .borrow()
        .reading_ready(pools.iter().map(|(p, _)| p.as_str()))
    {
        return;
    }
    let Some(lease) = leader else {
        let why = "published ready, but no replica leads now".to_string();
        looks.borrow_mut().not(None, why);
        return;
    };
    let lived = tokio::time::timeout(LEADER_SAID_WITHIN, requests.lease_left(lease)).await;
    // Read after the answer, which may be the first to tell of a rise of
    // etcd's raft term, or of etcd back.
    let doubt = requests.leases_in_doubt_since();
    let mut looks = looks.borrow_mut();
    match lived {
        Ok(Ok(Some((left, granted)))) => {
            let reading = Reading {
                lease,
                left,
                granted,
            };
            looks.leader(reading, doubt, Instant::now());
        }
        Ok(Ok(None)) => looks.not(
            None,
            "published ready, but no replica leads now".to_string(),
        ),
        Ok(Err(e)) => looks.not(None, format!("the leader's lease: etcd: {e}")),
        Err(_) => looks.not(
            None,
            format!("the leader's lease: etcd did not answer within {LEADER_SAID_WITHIN:?}"),
        ),
    }
}

/// What `published` says of `pool`: ready only as the replica leading
/// now published it (a takeover leaves the record of the leader before,
/// until the next one publishes its own).
fn said_of(pool: &str, published: &Published) -> Said {
    let said = &published.said;
    let state = || {
        said["state"]
            .as_str()
            .map_or_else(|| format!("{pool}: {}", said["phase"]), str::to_string)
    };
    match (said["phase"].as_str(), said["epoch"].as_u64()) {
        _ if published.leader_lease.is_some() && !published.by_leader_now => Said::Not(format!(
            "{}, as published by a leader before the one leading now (which has published nothing yet)",
            state()
        )),
        (Some("ready"), Some(epoch)) => Said::Ready(epoch),
        _ => Said::Not(state()),
    }
}

/// Completes once every pool of `pools` is ready as the leader published
/// it (each with its epoch); never when there are none to read. `looks`
/// keeps what the reads found instead.
pub(super) async fn until_ready(
    pools: Option<&[(String, Requests)]>,
    looks: &RefCell<Looks>,
) -> Vec<(String, u64)> {
    let Some(pools) = pools else {
        return std::future::pending().await;
    };
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        look.tick().await;
        read(pools, looks).await;
        if let Some(ready) = looks.borrow().ready(pools.iter().map(|(p, _)| p.as_str())) {
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

/// Says that `within` ran out, with what the reads found (`looks`), and
/// who leads when known.
pub(super) fn say_not_ready(looks: &RefCell<Looks>, within: Duration, leader: Option<String>) {
    let within = crate::config::in_words(within);
    let leader = leader.map_or_else(String::new, |l| format!("; leader: {l}"));
    let states = looks.borrow().said();
    crate::say!(
        warn,
        "poolgate: not ready within {within} (as the leading replica publishes it{leader}): {states}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    /// The leader's lease as etcd says it `since` its last renewal.
    fn lease(since: Duration) -> Reading {
        Reading {
            lease: 7,
            left: Duration::from_secs(TTL.saturating_sub(since).as_secs()),
            granted: TTL,
        }
    }

    /// A read that finds pool-a published ready at `epoch` and its
    /// leader's lease `lease` at `now`; whether it is taken as ready.
    fn read_ready(
        looks: &mut Looks,
        epoch: u64,
        lease: Reading,
        doubt: Option<Instant>,
        now: Instant,
    ) -> bool {
        looks.begin();
        looks.pool("pool-a", Said::Ready(epoch));
        let renewed = looks.leader(lease, doubt, now);
        looks.end();
        assert_eq!(renewed, looks.ready(["pool-a"]).is_some());
        renewed
    }

    #[test]
    fn a_leader_is_taken_as_renewing_for_three_renewals_and_a_second_of_its_lease() {
        let now = Instant::now();
        let mut looks = Looks::default();
        assert!(read_ready(
            &mut looks,
            3,
            lease(Duration::from_millis(2_900)),
            None,
            now
        ));
        assert_eq!(looks.ready(["pool-a"]), Some(vec![("pool-a".into(), 3)]));
        assert!(!read_ready(
            &mut looks,
            3,
            lease(Duration::from_millis(4_100)),
            None,
            now
        ));
        assert!(
            looks.said().contains("has not renewed its lease for 5s"),
            "{}",
            looks.said()
        );
    }

    #[test]
    fn after_etcd_renewed_every_lease_a_fresh_lease_is_taken_only_once_seen_renewed() {
        // An operator's trial: the leader's host, cut off, also held
        // etcd's raft leadership; etcd's next raft leader gave every lease
        // a fresh TTL, and the frozen leader's last ready was taken for
        // 6 s.
        let rose = Instant::now();
        let mut looks = Looks::default();
        // Read every 250 ms while it reads fresh (three tenths of its
        // TTL): never taken.
        let mut at = Duration::ZERO;
        while at < TTL * 3 / 10 {
            assert!(
                !read_ready(&mut looks, 3, lease(at), Some(rose), rose + at),
                "at {at:?}"
            );
            at += Duration::from_millis(250);
        }
        assert!(
            looks.said().contains("not seen renewing"),
            "{}",
            looks.said()
        );
        // A leader renewing every tenth of its TTL is seen doing so.
        let mut looks = Looks::default();
        let renewing = (0..16u64)
            .map(|step| Duration::from_millis(step * 250))
            .find(|at| {
                let since = Duration::from_millis(at.as_millis() as u64 % 1_000);
                read_ready(&mut looks, 3, lease(since), Some(rose), rose + *at)
            });
        assert!(
            renewing.is_some_and(|at| at <= Duration::from_millis(2_500)),
            "{renewing:?}"
        );
    }

    #[test]
    fn a_read_that_fails_keeps_each_pools_last_state_beside_why() {
        // An operator's trial: with etcd out of quorum, the timeout said
        // only etcd's errors, not what had last been read of each pool;
        // the next said the states, but not etcd's errors (the timeout
        // came while a read waited out its bound).
        let mut looks = Looks::default();
        assert_eq!(looks.said(), "nothing read from etcd yet");
        looks.begin();
        looks.pool("pool-a", Said::Ready(4));
        looks.pool("pool-b", Said::Not("pool-b converging".into()));
        looks.end();
        assert_eq!(looks.ready(["pool-a", "pool-b"]), None);
        looks.begin();
        looks.not(Some("pool-a"), "etcd: no quorum".into());
        looks.not(Some("pool-b"), "etcd: no quorum".into());
        looks.end();
        let said = "pool-a: published ready, epoch 4; pool-b converging; then pool-a: etcd: no quorum; pool-b: etcd: no quorum";
        assert_eq!(looks.said(), said);
        assert_eq!(looks.ready(["pool-a"]), None, "a failed read is not ready");
        // The next read under way (waiting on etcd) when the time runs
        // out: what the last one found is said.
        looks.begin();
        assert_eq!(looks.said(), said);
        // A read that works again forgets the errors.
        looks.pool("pool-a", Said::Ready(4));
        looks.pool("pool-b", Said::Ready(2));
        looks.end();
        assert_eq!(
            looks.said(),
            "pool-a: published ready, epoch 4; pool-b: published ready, epoch 2"
        );
        assert_eq!(
            looks.ready(["pool-a", "pool-b"]),
            Some(vec![("pool-a".into(), 4), ("pool-b".into(), 2)])
        );
    }

    #[test]
    fn a_record_of_the_leader_before_is_not_ready() {
        let published = |by_leader_now, leader_lease| Published {
            said: serde_json::json!({"pool": "pool-a", "phase": "ready", "epoch": 3, "state": "pool-a ready, epoch 3"}),
            by_leader_now,
            leader_lease,
        };
        assert_eq!(said_of("pool-a", &published(true, Some(7))), Said::Ready(3));
        let Said::Not(before) = said_of("pool-a", &published(false, Some(7))) else {
            panic!("the record of the leader before taken as ready");
        };
        assert!(
            before.contains("a leader before the one leading now"),
            "{before}"
        );
        // With none leading, the lease's read says so.
        assert_eq!(said_of("pool-a", &published(false, None)), Said::Ready(3));
    }
}
