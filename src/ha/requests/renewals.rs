//! Whether a run's requester renews its etcd session, from what etcd says
//! of its lease: a value the leader's looks feed, no I/O.
//!
//! A requester renews its lease every tenth of its TTL, so a lease whose
//! time left reads short of its TTL by more than three renewals (and the
//! second etcd's rounding takes) has lost its holder. But etcd's own raft
//! leader, as it takes over, gives every lease a fresh TTL: a requester
//! killed while etcd had no quorum reads as renewing once etcd has one
//! again, for about three tenths of its TTL (an operator's trial: its run
//! was committed, held by nobody, then ended when the session expired).
//! And a renewal an etcd member held while etcd could not apply it lands
//! when it can, after its sender is gone (another trial: etcd's paused
//! raft leader resumed). So for one TTL after either (etcd's raft term
//! rose, or etcd answered the leader again after an outage: see
//! `Etcd::leases_in_doubt_since`), a lease counts as renewed only once
//! seen renewed: its time left shrinking by less than the time between
//! two readings.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How much less a lease must have lost than the time between two
/// readings to count as renewed meanwhile: etcd says what is left in whole
/// seconds, rounded down (a lease nobody renews can seem to lose up to a
/// second less than the time passed), and the two readings' own delays.
const RENEWED_BY: Duration = Duration::from_millis(1500);

/// One reading of a requester's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The lease.
    pub lease: i64,
    /// What etcd says is left of it.
    pub left: Duration,
    /// The TTL it was granted.
    pub granted: Duration,
}

/// Whether a requester renews its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// It does.
    Renews,
    /// It stopped: not renewed for this long.
    Stopped(Duration),
    /// Its lease reads fresh, but the leases were in doubt less than a
    /// TTL ago and its holder has not been seen renewing it since.
    Unproven,
}

/// What the leader has read of its requesters' leases since they were
/// last in doubt.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    /// The doubt these readings follow.
    after: Option<Instant>,
    /// The first reading of each lease since then, and when.
    first: HashMap<i64, (Instant, Duration)>,
}

impl Renewals {
    /// Whether the holder of `reading`'s lease renews it, read at `now`;
    /// `doubt`: since when the leases are in doubt, as far as this replica
    /// saw (none: not since it started).
    pub(crate) fn renewal(
        &mut self,
        reading: Reading,
        doubt: Option<Instant>,
        now: Instant,
    ) -> Renewal {
        let unrenewed = reading.granted.saturating_sub(reading.left);
        if unrenewed >= stale_after(reading.granted) {
            return Renewal::Stopped(unrenewed);
        }
        if self.after != doubt {
            self.after = doubt;
            self.first.clear();
        }
        // Past one TTL (and etcd's rounding) since then, a lease only
        // etcd's takeover, or a renewal held back, renewed has expired:
        // what is left was renewed by its holder.
        let refreshed_by_etcd = doubt.is_some_and(|at| {
            now.saturating_duration_since(at) < reading.granted + Duration::from_secs(1)
        });
        if !refreshed_by_etcd {
            // Another lease, of a longer TTL, may still be in doubt.
            self.first.remove(&reading.lease);
            return Renewal::Renews;
        }
        let &mut (then, left_then) = self
            .first
            .entry(reading.lease)
            .or_insert((now, reading.left));
        if reading.left + now.saturating_duration_since(then) >= left_then + RENEWED_BY {
            Renewal::Renews
        } else {
            Renewal::Unproven
        }
    }
}

/// How long a requester's lease of `granted` may read unrenewed (what
/// etcd says is left, in whole seconds rounded down, against the TTL)
/// before its requester counts as stopped: three of its renewals (a tenth
/// of the TTL each) and the second etcd's rounding takes.
pub(crate) fn stale_after(granted: Duration) -> Duration {
    granted * 3 / 10 + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    /// What etcd says is left of a lease `since` after it was last
    /// renewed: whole seconds, rounded down.
    fn reading(lease: i64, since: Duration) -> Reading {
        let left = TTL.saturating_sub(since);
        Reading {
            lease,
            left: Duration::from_secs(left.as_secs()),
            granted: TTL,
        }
    }

    #[test]
    fn with_no_rise_of_etcds_term_a_lease_renews_while_it_reads_fresh() {
        let mut renewals = Renewals::default();
        let now = Instant::now();
        let mut at = |since| renewals.renewal(reading(1, since), None, now);
        assert_eq!(at(Duration::from_millis(500)), Renewal::Renews);
        // Three renewals missed and the rounding: stopped.
        assert_eq!(at(Duration::from_millis(2_900)), Renewal::Renews);
        assert_eq!(
            at(Duration::from_millis(4_100)),
            Renewal::Stopped(Duration::from_secs(5))
        );
    }

    #[test]
    fn after_a_rise_a_lease_nobody_renews_never_counts_as_renewed_and_one_renewed_soon_does() {
        let rose = Instant::now();
        let mut renewals = Renewals::default();
        // The lease etcd's takeover renewed, read every 100 ms for as long
        // as it reads fresh: never renewed.
        let mut at = Duration::ZERO;
        while at < TTL {
            let told = renewals.renewal(reading(1, at), Some(rose), rose + at);
            assert_ne!(told, Renewal::Renews, "at {at:?}");
            at += Duration::from_millis(100);
        }
        // A lease its holder renews every tenth of its TTL (a second),
        // read every 100 ms from the rise: renewed within about two
        // seconds.
        let mut renewals = Renewals::default();
        let told = (0..40u64)
            .map(|step| Duration::from_millis(step * 100))
            .find(|at| {
                let since_renewal = Duration::from_millis(at.as_millis() as u64 % 1_000);
                renewals.renewal(reading(2, since_renewal), Some(rose), rose + *at)
                    == Renewal::Renews
            })
            .expect("a renewing holder is seen renewing");
        assert!(told <= Duration::from_millis(2_500), "{told:?}");
    }

    #[test]
    fn one_ttl_after_the_rise_a_fresh_lease_renews_at_once_and_a_new_rise_starts_over() {
        let rose = Instant::now();
        let mut renewals = Renewals::default();
        let later = rose + TTL + Duration::from_secs(1);
        let fresh = reading(1, Duration::ZERO);
        assert_eq!(renewals.renewal(fresh, Some(rose), later), Renewal::Renews);
        // etcd elects again: the evidence starts over.
        let again = later + Duration::from_secs(5);
        assert_eq!(
            renewals.renewal(fresh, Some(again), again),
            Renewal::Unproven
        );
        let second = again + Duration::from_secs(1);
        let one_on = reading(1, Duration::from_secs(1));
        assert_eq!(
            renewals.renewal(one_on, Some(again), second),
            Renewal::Unproven
        );
        // Renewed meanwhile: what is left is full again two seconds on.
        let third = again + Duration::from_secs(2);
        assert_eq!(renewals.renewal(fresh, Some(again), third), Renewal::Renews);
    }

    /// How long a lease of `granted` renewed `ago` reads unrenewed: the
    /// TTL against what etcd says is left (whole seconds, rounded down).
    fn unrenewed_read(granted: Duration, ago: Duration) -> Duration {
        granted - Duration::from_secs(granted.saturating_sub(ago).as_secs())
    }

    #[test]
    fn a_requester_renewing_every_tenth_is_never_stale_and_one_gone_three_tenths_and_a_second_is() {
        for secs in [2, 3, 5, 6, 10, 30] {
            let granted = Duration::from_secs(secs);
            // Renewed a moment ago, or up to two renewals ago (one lost).
            let every = granted / 10;
            let mut ago = Duration::ZERO;
            while ago <= every * 2 {
                assert!(
                    unrenewed_read(granted, ago) < stale_after(granted),
                    "a {secs} s lease renewed {ago:?} ago"
                );
                ago += Duration::from_millis(10);
            }
            let gone = granted * 3 / 10 + Duration::from_secs(1);
            assert!(
                unrenewed_read(granted, gone) >= stale_after(granted),
                "a {secs} s lease unrenewed for {gone:?}"
            );
        }
    }

    #[test]
    fn a_lease_past_its_doubt_does_not_erase_what_was_seen_of_a_longer_one() {
        let doubt = Instant::now();
        let mut renewals = Renewals::default();
        let long = |since: Duration| Reading {
            lease: 2,
            left: Duration::from_secs(30 - since.as_secs()),
            granted: Duration::from_secs(30),
        };
        let at = doubt + Duration::from_secs(12);
        assert_eq!(
            renewals.renewal(long(Duration::ZERO), Some(doubt), at),
            Renewal::Unproven
        );
        // The 10 s lease, past its doubt, read in between.
        let short = reading(1, Duration::ZERO);
        let later = at + Duration::from_secs(2);
        assert_eq!(renewals.renewal(short, Some(doubt), later), Renewal::Renews);
        // The 30 s lease renewed meanwhile: full again two seconds on.
        assert_eq!(
            renewals.renewal(long(Duration::ZERO), Some(doubt), later),
            Renewal::Renews
        );
    }
}
