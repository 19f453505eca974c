//! The campaign for the `leader` key: one thread that follows, campaigns,
//! leads (renewing its lease) and steps down, telling the replica its
//! [`Role`] and the store its [`Fence`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::ha::etcd::{self, Etcd, RENEWALS_PER_TTL};
use crate::state::etcd::{Fence, LeaderTerm};

/// How often a follower looks at the leader key.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// What the leader key says about the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// The leading replica's name.
    pub replica: String,
    /// Where its agent listener is reached (what nodes are pointed to).
    pub agents: String,
}

impl std::fmt::Display for Leader {
    /// `<replica> at <agents>`, as refusals and status say it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.replica, self.agents)
    }
}

/// This replica's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Another replica leads (`Some`), or nobody is known to.
    Following(Option<Leader>),
    /// This replica leads, since the instant it won.
    Leading(Instant),
}

/// Why a replica stopped leading (said once, at the step down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SteppedDown {
    /// No renewal succeeded within the renew deadline.
    NoRenewal(Duration),
    /// The lease is gone on etcd (expired, revoked, or etcd's data lost).
    LeaseGone,
    /// The leader key is no longer this replica's.
    KeyTaken,
    /// etcd refused a write of this term (the leader key or a record
    /// changed under it).
    WriteRefused,
}

impl std::fmt::Display for SteppedDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SteppedDown::NoRenewal(d) => write!(
                f,
                "the lease could not be renewed within {}: stepped down before it can expire",
                crate::config::in_words(*d)
            ),
            SteppedDown::LeaseGone => f.write_str("the lease is gone on etcd"),
            SteppedDown::KeyTaken => f.write_str("the leader key is no longer this replica's"),
            SteppedDown::WriteRefused => f.write_str(
                "etcd refused a write of this term (the leader key or a record changed under it)",
            ),
        }
    }
}

/// A replica's part in the election: started with [`Campaign::start`],
/// ended (lease revoked, leadership handed on at once) by
/// [`Campaign::resign`] or on drop.
#[derive(Debug)]
pub(crate) struct Campaign {
    stop: Arc<AtomicBool>,
    abandoned: Arc<AtomicBool>,
    /// Why this replica last stepped down, if it has.
    stepped_down: Arc<std::sync::Mutex<Option<SteppedDown>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    role: watch::Receiver<Role>,
}

/// What a campaign needs.
#[derive(Debug, Clone)]
pub(crate) struct CampaignSettings {
    /// The leader key.
    pub key: Vec<u8>,
    /// What this replica writes there.
    pub me: Leader,
    /// The lease's TTL.
    pub ttl: Duration,
}

impl Campaign {
    /// Starts campaigning; `fence` follows the terms won.
    pub fn start(etcd: Arc<Etcd>, settings: CampaignSettings, fence: Arc<Fence>) -> Campaign {
        let (tx, role) = watch::channel(Role::Following(None));
        let stop = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicBool::new(false));
        let stepped_down = Arc::default();
        let thread = {
            let (stop, abandoned) = (Arc::clone(&stop), Arc::clone(&abandoned));
            let mut elector = Elector::new(etcd, settings, fence, tx, stop);
            elector.stepped_down = Arc::clone(&stepped_down);
            std::thread::Builder::new()
                .name("poolgate-leadership".into())
                .spawn(move || elector.run(&abandoned))
                .ok()
        };
        Campaign {
            stop,
            abandoned,
            stepped_down,
            thread,
            role,
        }
    }

    /// Why this replica last stepped down, if it has.
    pub fn stepped_down(&self) -> Option<SteppedDown> {
        self.stepped_down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The role, as it changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Stops campaigning; a leader revokes its lease so another replica
    /// leads at once.
    pub fn resign(mut self) {
        self.end();
    }

    /// Stops campaigning without revoking the lease, as a crashed process
    /// would: another replica leads once the lease expires.
    pub fn abandon(mut self) {
        self.abandoned.store(true, Ordering::Relaxed);
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.end();
    }
}

/// Renew deadline: acting stops this long after a renewal began.
pub(crate) fn renew_deadline(ttl: Duration) -> Duration {
    ttl * 2 / 3
}

struct Elector {
    etcd: Arc<Etcd>,
    settings: CampaignSettings,
    value: Vec<u8>,
    fence: Arc<Fence>,
    tx: watch::Sender<Role>,
    stop: Arc<AtomicBool>,
    said: crate::live::throttle::Throttle,
    /// Why it last stepped down (read by [`Campaign::stepped_down`]).
    stepped_down: Arc<std::sync::Mutex<Option<SteppedDown>>>,
    /// The last renewal failed: the next comes sooner.
    failed_renewal: bool,
    /// Leases this replica was granted and could not revoke (etcd out of
    /// reach), newest last: if the leader key is found on one of them
    /// once etcd answers, it names this replica for a term it no longer
    /// holds, and is revoked then (see [`Elector::follow`]).
    unrevoked: Vec<i64>,
}

/// How many unrevoked leases a replica remembers; an older one ends by
/// its TTL.
const UNREVOKED_HELD: usize = 4;

/// The longest an election of etcd's own keeps renewals from going
/// through, at etcd's default election timeout (1 s): the followers
/// notice the lost leader 1 to 2 s after its last heartbeat, and a split
/// vote costs another 1 to 2 s. Measured here: renewals went through
/// again 1.8 to 3.2 s after the last one before etcd's leader was killed
/// (docs/failover.md §5).
pub(crate) const ETCD_ELECTION_WORST: Duration = Duration::from_secs(4);

/// The deadline of one renewal call across every endpoint: a sixth of
/// the TTL (a quarter of the renew deadline), at most a second.
pub(crate) fn renewal_call_timeout(ttl: Duration) -> Duration {
    (ttl / 6).min(Duration::from_secs(1))
}

/// What a leader of lease `ttl` has left of its renew deadline when an
/// etcd election of [`ETCD_ELECTION_WORST`] begins just before a renewal
/// was due and ends just after a renewal call began (zero: it steps down).
pub(crate) fn spare_through_etcd_election(ttl: Duration) -> Duration {
    renew_deadline(ttl)
        .saturating_sub(ttl / RENEWALS_PER_TTL)
        .saturating_sub(ETCD_ELECTION_WORST)
        .saturating_sub(renewal_call_timeout(ttl))
}

/// How soon a failed renewal is tried again.
pub(crate) const RENEW_RETRY: Duration = Duration::from_millis(100);

/// A term being held: the lease, the key's create revision, the TTL.
#[derive(Clone, Copy)]
struct HeldLease {
    lease: i64,
    created: i64,
    ttl: Duration,
    /// When the last renewal that went through began.
    renewed: Instant,
    until: Instant,
}

impl Elector {
    fn new(
        etcd: Arc<Etcd>,
        settings: CampaignSettings,
        fence: Arc<Fence>,
        tx: watch::Sender<Role>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let value = serde_json::to_vec(&settings.me).unwrap_or_default();
        Elector {
            etcd,
            settings,
            value,
            fence,
            tx,
            stop,
            said: crate::live::throttle::Throttle::new(crate::live::throttle::LOG_EVERY),
            stepped_down: Arc::default(),
            failed_renewal: false,
            unrevoked: Vec::new(),
        }
    }

    fn run(mut self, abandoned: &AtomicBool) {
        let mut held: Option<HeldLease> = None;
        while !self.stop.load(Ordering::Relaxed) {
            held = match held {
                None => {
                    let won = self.follow();
                    if won.is_none() {
                        self.pause(POLL);
                    }
                    won
                }
                Some(term) => self.lead(term),
            };
        }
        self.fence.clear();
        if let (Some(term), false) = (held, abandoned.load(Ordering::Relaxed)) {
            // Hand over at once rather than at the lease's expiry.
            let _ = self.etcd.revoke(term.lease);
            tracing::info!("resigned the leadership (lease revoked)");
        }
    }

    /// Revokes `lease`, a lease of this replica's that holds no term; if
    /// etcd cannot be told, the lease is remembered, so that the leader
    /// key found on it later is revoked then. Whether it was revoked.
    fn revoke(&mut self, lease: i64) -> Result<(), etcd::EtcdError> {
        let revoked = self.etcd.revoke(lease);
        if revoked.is_err() {
            if self.unrevoked.len() == UNREVOKED_HELD {
                self.unrevoked.remove(0);
            }
            self.unrevoked.push(lease);
        }
        revoked
    }

    fn pause(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// One look at the leader key; a campaign if it is free.
    fn follow(&mut self) -> Option<HeldLease> {
        match self.etcd.get(&self.settings.key) {
            Ok(Some(kv)) if self.unrevoked.contains(&kv.lease) => {
                // A term this replica no longer holds: etcd, answering
                // again, may have given its lease a fresh TTL (a raft
                // election of its own renews every lease), and nobody
                // would lead until it ran out.
                if self.etcd.revoke(kv.lease).is_ok() {
                    tracing::info!(
                        "leadership: the leader key still named this replica, for the term it stepped down from (etcd was out of reach): its lease revoked now, so a replica can lead"
                    );
                    self.unrevoked.retain(|lease| *lease != kv.lease);
                }
                self.tx.send_if_modified(|role| {
                    let now = Role::Following(None);
                    (*role != now).then(|| *role = now).is_some()
                });
                None
            }
            Ok(Some(kv)) => {
                // On a lease of another's: this replica's leases hold no
                // key and end by their TTL.
                self.unrevoked.clear();
                let leader = serde_json::from_slice::<Leader>(&kv.value).ok();
                self.tx.send_if_modified(|role| {
                    let now = Role::Following(leader);
                    (*role != now).then(|| *role = now).is_some()
                });
                None
            }
            Ok(None) => {
                if !self.unrevoked.is_empty() {
                    // Revoked late (a revoke etcd held through its outage)
                    // or expired: said, as the revoke here is.
                    tracing::info!("leadership: the leader key is free again (the lease of the term this replica stepped down from ended: revoked late, or expired)");
                    self.unrevoked.clear();
                }
                self.campaign()
            }
            Err(e) => {
                if let Some(held) = self.said.allow(Instant::now()) {
                    tracing::warn!(error = %e, held, "leadership: etcd not reachable; following nobody");
                }
                self.tx.send_if_modified(|role| {
                    let now = Role::Following(None);
                    (*role != now).then(|| *role = now).is_some()
                });
                None
            }
        }
    }

    fn campaign(&mut self) -> Option<HeldLease> {
        let began = Instant::now();
        let (lease, ttl) = match self.etcd.grant(self.settings.ttl) {
            Ok(granted) => granted,
            Err(e) => {
                tracing::warn!(error = %e, "leadership: no lease granted");
                return None;
            }
        };
        let key = &self.settings.key;
        let txn = self.etcd.txn(
            vec![etcd::created_at(key, 0)],
            vec![etcd::put(key, &self.value, lease)],
            vec![etcd::range(key)],
        );
        match txn {
            Ok((true, answer)) => {
                let term = HeldLease {
                    lease,
                    created: etcd::revision(&answer),
                    ttl,
                    renewed: began,
                    until: began + renew_deadline(ttl),
                };
                if Instant::now() >= term.until {
                    // Won too slowly to act on it.
                    let _ = self.revoke(lease);
                    return None;
                }
                self.fence.set(LeaderTerm {
                    created: term.created,
                    until: term.until,
                });
                tracing::info!(replica = %self.settings.me.replica, ttl = ?ttl, "leading");
                self.tx.send_replace(Role::Leading(Instant::now()));
                Some(term)
            }
            Ok((false, _)) | Err(_) => {
                // Not won, or not known to be (an error may follow a
                // write that was made).
                let _ = self.revoke(lease);
                None
            }
        }
    }

    /// Renews a held term once, stepping down if it cannot.
    fn lead(&mut self, term: HeldLease) -> Option<HeldLease> {
        // Renewed every tenth of the TTL; a renewal that failed is tried
        // again soon, so one slow answer does not cost the term.
        let every = if self.failed_renewal {
            RENEW_RETRY
        } else {
            term.ttl / RENEWALS_PER_TTL
        };
        let next = Instant::now() + every;
        while Instant::now() < next.min(term.until) {
            if self.stop.load(Ordering::Relaxed) {
                return Some(term);
            }
            if self.fence.is_ended(term.created) {
                return self.step_down(term, SteppedDown::WriteRefused);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if Instant::now() >= term.until {
            return self.step_down(term, SteppedDown::NoRenewal(renew_deadline(term.ttl)));
        }
        if self.fence.is_ended(term.created) {
            return self.step_down(term, SteppedDown::WriteRefused);
        }
        let began = Instant::now();
        match self.etcd.keep_alive_on(term.lease, &self.settings.key) {
            Ok(Some(ttl)) => match self.etcd.get(&self.settings.key) {
                Ok(Some(kv)) if kv.create_revision == term.created && kv.lease == term.lease => {
                    let renewed = HeldLease {
                        ttl,
                        renewed: began,
                        until: began + renew_deadline(ttl),
                        ..term
                    };
                    self.fence.set(LeaderTerm {
                        created: renewed.created,
                        until: renewed.until,
                    });
                    if self.failed_renewal {
                        // How close the term came to its end: what an
                        // operator sizes `[state] lease` by.
                        let unrenewed = began.saturating_duration_since(term.renewed);
                        let spare = term.until.saturating_duration_since(Instant::now());
                        tracing::info!(unrenewed = ?unrenewed, spare = ?spare, "leadership: the lease renewed again");
                    }
                    self.failed_renewal = false;
                    Some(renewed)
                }
                Ok(_) => self.step_down(term, SteppedDown::KeyTaken),
                Err(_) => {
                    self.failed_renewal = true;
                    Some(term)
                }
            },
            Ok(None) => self.step_down(term, SteppedDown::LeaseGone),
            Err(e) => {
                // Not said once the deadline has passed (a renewal that
                // waited out its call): the step down is, next.
                if Instant::now() < term.until {
                    if let Some(held) = self.said.allow(Instant::now()) {
                        tracing::warn!(error = %e, held, "leadership: the lease not renewed; acting until the renew deadline");
                    }
                }
                self.failed_renewal = true;
                Some(term)
            }
        }
    }

    fn step_down(&mut self, term: HeldLease, why: SteppedDown) -> Option<HeldLease> {
        self.fence.clear();
        self.failed_renewal = false;
        // Failover doing its work, not a failure of this process: a warning.
        tracing::warn!(why = %why, "stepped down: no longer the leader");
        *self
            .stepped_down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
        self.tx.send_replace(Role::Following(None));
        match self.revoke(term.lease) {
            Ok(()) => {}
            // Expired already while it went unrenewed (this process
            // frozen past it), or a member's lessor behind its log: looked
            // at again while following, as any lease not revoked.
            Err(etcd::EtcdError::Refused { message, .. })
                if message.contains("lease not found") =>
            {
                tracing::info!("leadership: the lease of the term that ended is gone already (it expired unrenewed)");
            }
            // etcd may apply the revoke later, or, electing a leader of
            // its own, give the lease a fresh TTL.
            Err(e) => {
                tracing::warn!(error = %e, "leadership: the lease of the term that ended not revoked (etcd out of reach): revoked once etcd answers, should the leader key still be on it; until then no replica leads")
            }
        }
        // Not at once a candidate again: the orchestrator of the term
        // that ended must see it end first.
        self.pause(POLL * 2);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default lease rides through etcd's own elections, a split vote
    /// included (design: etcd's elections are not ours); a 6 s lease
    /// renewed every sixth of it did not (measured: 0.76 s to spare
    /// without a split vote).
    #[test]
    fn the_default_lease_rides_through_the_longest_etcd_election() {
        let spare = spare_through_etcd_election(crate::config::DEFAULT_LEASE);
        assert!(spare >= Duration::from_millis(500), "{spare:?}");
        // What failed: the election outlasts the renew deadline.
        let old = renew_deadline(Duration::from_secs(6))
            .saturating_sub(Duration::from_secs(1))
            .saturating_sub(ETCD_ELECTION_WORST)
            .saturating_sub(Duration::from_secs(1));
        assert_eq!(old, Duration::ZERO);
    }

    /// A lease's renewal calls end well before its renew deadline.
    #[test]
    fn renewal_calls_fit_many_times_in_the_renew_deadline() {
        for secs in [1, 2, 3, 6, 10, 60, 3600] {
            let ttl = Duration::from_secs(secs);
            let call = renewal_call_timeout(ttl);
            assert!(call * 4 <= renew_deadline(ttl), "{secs}s: {call:?}");
            assert!(call <= Duration::from_secs(1));
        }
    }
}
