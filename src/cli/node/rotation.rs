//! Which of the orchestrator's addresses a node tries next: a reset
//! connection again first, alone; a silent or refusing one shunned; a
//! leader a follower names followed, a few times at once. Values the
//! session asks, with no I/O but a name's lookup.

use std::net::SocketAddr;

use crate::config::endpoint::{lookup_all, Endpoint};

/// How many leaders named by followers an agent goes to at once before it
/// pauses as after any refused round: followers that name one another
/// (each behind on a failover) cannot keep it connecting in a loop.
const POINTERS_FOLLOWED: u32 = 3;

/// The named leaders followed at once since the agent last paused or was
/// accepted.
#[derive(Debug, Default)]
pub(super) struct Pointers(u32);

impl Pointers {
    /// Whether one more may be followed at once (counted if so).
    pub(super) fn follow(&mut self) -> bool {
        self.0 += 1;
        self.0 <= POINTERS_FOLLOWED
    }

    /// Whether the others may still be tried at once this round (not once
    /// the named leaders followed are used up: then the round pauses).
    pub(super) fn within_round(&self) -> bool {
        self.0 <= POINTERS_FOLLOWED
    }

    pub(super) fn reset(&mut self) {
        self.0 = 0;
    }
}

/// The address of `[orchestrator] agents` that a follower at `from` names
/// as the leader's (`pointer`, as the leader advertises it), if it is one
/// of them and not `from` itself: a node goes only where its own
/// configuration lets it, whatever a refusal says.
pub(super) async fn leader_named(
    pointer: Option<&str>,
    from: SocketAddr,
    agents: &[Endpoint],
    addrs: &[SocketAddr],
) -> Option<SocketAddr> {
    let pointer = pointer?;
    let named = match pointer.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            let listed: Vec<Endpoint> = agents
                .iter()
                .filter(|agent| agent.as_str() == pointer)
                .cloned()
                .collect();
            lookup_all(&listed)
                .await
                .0
                .into_iter()
                .find(|addr| addrs.contains(addr))
        }
    };
    named.filter(|addr| *addr != from && addrs.contains(addr))
}

/// Which of the orchestrator's addresses to try: an address that took the
/// connection but accepted no frame, or went silent, is shunned (tried
/// after the others), so a frozen process whose kernel still completes
/// handshakes cannot hold the node; once no other address answers, every
/// one is worth a try again. A connection that had frames accepted and
/// then closed (a reset, not a freeze) is tried again first, alone: the
/// replica it was connected to most likely still leads, and the node is
/// back within the orchestrator's lost-connection grace (docs/failover.md
/// §6).
#[derive(Debug, Default)]
pub(super) struct Rotation {
    shunned: std::collections::HashSet<SocketAddr>,
    /// The address to try first, alone, next round, and why.
    first: Option<(SocketAddr, First)>,
}

impl Rotation {
    /// The addresses to try this round, and which round it is (when a
    /// part of them fails, the others are tried at once).
    pub(super) fn candidates(&mut self, addrs: Vec<SocketAddr>) -> (Vec<SocketAddr>, Round) {
        if let Some((first, why)) = self.first.take().filter(|(a, _)| addrs.contains(a)) {
            return (vec![first], Round::Alone(why));
        }
        let fresh: Vec<SocketAddr> = addrs
            .iter()
            .copied()
            .filter(|a| !self.shunned.contains(a))
            .collect();
        if fresh.is_empty() || fresh.len() == addrs.len() {
            self.shunned.clear();
            return (addrs, Round::Every);
        }
        (fresh, Round::Fresh)
    }

    /// A round ended (on `addr`, when one was connected) as `how`.
    pub(super) fn ended(&mut self, addr: SocketAddr, how: Ended) {
        match how {
            Ended::Reset => {
                self.shunned.remove(&addr);
                self.first = Some((addr, First::Again));
            }
            Ended::Shunned => {
                self.shunned.insert(addr);
            }
            Ended::Unreachable => self.shunned.clear(),
            Ended::Stopped => {}
        }
    }

    /// `addr` is tried first, alone, next round, for `why`.
    pub(super) fn try_first(&mut self, addr: SocketAddr, why: First) {
        self.first = Some((addr, why));
    }

    /// Whether some of `addrs` are not shunned (worth trying at once).
    pub(super) fn has_fresh(&self, addrs: &[SocketAddr]) -> bool {
        addrs.iter().any(|a| !self.shunned.contains(a))
    }
}

/// Which addresses a round tries ([`Rotation::candidates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Round {
    /// One tried first, alone.
    Alone(First),
    /// Those not shunned (the others refused or lost lately).
    Fresh,
    /// Every address.
    Every,
}

/// Why an address is tried first, alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum First {
    /// The leader a follower named.
    Named,
    /// Tried again: it refused a replay, or its connection was reset.
    Again,
}

/// How a round's connection ended, as the rotation weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// It closed after frames on it were accepted (a reset, not a
    /// freeze): tried again first, alone.
    Reset,
    /// It accepted nothing, went silent or refused: tried after the
    /// others.
    Shunned,
    /// No address could be connected to: every one is worth a try.
    Unreachable,
    /// The agent is stopping.
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::super::session::{Session, CLOSED, SILENT};
    use super::*;
    use crate::live::wire;

    /// `rotation` told that a round on `addr` ended with `session`.
    fn end(rotation: &mut Rotation, addr: SocketAddr, session: &Session) {
        rotation.ended(addr, session.weighed());
    }

    /// Two replicas' addresses, on `port`.
    fn two_replicas(port: u16) -> (SocketAddr, SocketAddr) {
        (
            SocketAddr::from(([10, 0, 0, 1], port)),
            SocketAddr::from(([10, 0, 0, 2], port)),
        )
    }

    #[test]
    fn the_leader_that_refused_a_replay_is_asked_again_first_alone() {
        let (leader, down) = two_replicas(7947);
        let mut rotation = Rotation::default();
        let refused = Session::Refused {
            code: wire::REPLAYED.into(),
            detail: String::new(),
            leader: None,
            signed_elsewhere: false,
        };
        end(&mut rotation, leader, &refused);
        // Shunned for the refusal, the leader would wait behind the
        // replica that is down.
        assert_eq!(
            rotation.candidates(vec![leader, down]),
            (vec![down], Round::Fresh)
        );
        end(&mut rotation, leader, &refused);
        rotation.try_first(leader, First::Again);
        assert_eq!(
            rotation.candidates(vec![leader, down]),
            (vec![leader], Round::Alone(First::Again))
        );
    }

    #[test]
    fn a_follower_is_followed_only_to_another_listed_address() {
        let (a, b) = two_replicas(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let named = |pointer: Option<&str>, from| {
            runtime.block_on(leader_named(pointer, from, &[], &[a, b]))
        };
        assert_eq!(named(Some("10.0.0.1:1"), b), Some(a));
        // Not to itself, nowhere unlisted, and not on a pointer that is
        // no address.
        assert_eq!(named(Some("10.0.0.1:1"), a), None);
        assert_eq!(named(Some("10.0.0.9:1"), b), None);
        assert_eq!(named(Some("leader"), b), None);
        assert_eq!(named(None, b), None);
        // Followed at once a few times, then not until reset.
        let mut pointers = Pointers::default();
        let followed = (0..10).filter(|_| pointers.follow()).count();
        assert_eq!(followed, POINTERS_FOLLOWED as usize);
        pointers.reset();
        assert!(pointers.follow());
    }

    #[test]
    fn an_address_that_accepted_nothing_is_tried_after_the_others() {
        let (a, b) = two_replicas(1);
        let mut rotation = Rotation::default();
        assert_eq!(rotation.candidates(vec![a, b]), (vec![a, b], Round::Every));
        end(
            &mut rotation,
            a,
            &Session::Lost {
                accepted: false,
                why: SILENT,
            },
        );
        assert_eq!(rotation.candidates(vec![a, b]), (vec![b], Round::Fresh));
        // Every one shunned: all of them again.
        end(
            &mut rotation,
            b,
            &Session::Refused {
                code: "x".into(),
                detail: "y".into(),
                leader: None,
                signed_elsewhere: false,
            },
        );
        assert_eq!(rotation.candidates(vec![a, b]), (vec![a, b], Round::Every));
    }

    #[test]
    fn a_connection_that_went_silent_is_shunned() {
        // A frozen replica whose kernel still completes handshakes must
        // not hold the node.
        let (a, b) = two_replicas(1);
        let mut rotation = Rotation::default();
        end(
            &mut rotation,
            a,
            &Session::Lost {
                accepted: true,
                why: SILENT,
            },
        );
        assert_eq!(rotation.candidates(vec![a, b]), (vec![b], Round::Fresh));
    }

    #[test]
    fn a_connection_reset_is_tried_again_first_alone_then_the_others() {
        // Issue 28, reproduction 6: after a reset, the node tried the
        // follower first (listed first), was refused, and came back 3 ms
        // after the orchestrator's 100 ms grace: the run faulted.
        let (follower, leader) = two_replicas(1);
        let mut rotation = Rotation::default();
        end(
            &mut rotation,
            leader,
            &Session::Lost {
                accepted: true,
                why: CLOSED,
            },
        );
        assert_eq!(
            rotation.candidates(vec![follower, leader]),
            (vec![leader], Round::Alone(First::Again))
        );
        // Gone (a crash, not a reset): every address, at once.
        end(
            &mut rotation,
            leader,
            &Session::Unreachable(std::io::ErrorKind::ConnectionRefused.into()),
        );
        assert_eq!(
            rotation.candidates(vec![follower, leader]),
            (vec![follower, leader], Round::Every)
        );
        // A follower's refusal leaves the other to try at once.
        end(
            &mut rotation,
            follower,
            &Session::Refused {
                code: wire::NOT_LEADER.into(),
                detail: "not the leader".into(),
                leader: None,
                signed_elsewhere: false,
            },
        );
        assert!(rotation.has_fresh(&[follower, leader]));
        assert_eq!(
            rotation.candidates(vec![follower, leader]),
            (vec![leader], Round::Fresh)
        );
    }

    #[test]
    fn a_leader_a_follower_names_is_tried_next_alone_as_named_and_only_once() {
        let (follower, leader) = two_replicas(1);
        let mut rotation = Rotation::default();
        rotation.try_first(leader, First::Named);
        // What the round is tells a gone leader (a failover under way)
        // from an address tried again.
        assert_eq!(
            rotation.candidates(vec![follower, leader]),
            (vec![leader], Round::Alone(First::Named))
        );
        assert_eq!(
            rotation.candidates(vec![follower, leader]),
            (vec![follower, leader], Round::Every)
        );
        // Named, but no longer among the addresses resolved: not tried.
        rotation.try_first(leader, First::Named);
        assert_eq!(
            rotation.candidates(vec![follower]),
            (vec![follower], Round::Every)
        );
    }
}
