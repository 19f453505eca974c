//! What a member sends to an address it has not heard from is bounded.
//!
//! SWIM probes every member it is told of, at the address the member's
//! identity gives. An insider with the cluster key can announce invented
//! members at a third party's address and have every member send there:
//! a reflector, each announcement multiplied by the cluster's probes.
//! A member therefore sends freely only to addresses it received a
//! datagram from within [`HEARD_FOR`]; to any other address, at most
//! [`UNHEARD_SENDS`] datagrams per [`UNHEARD_WINDOW`] (a probe and its
//! copy, an announce, a few retries: enough for a member learnt from
//! gossip to answer and be heard), the rest withheld and counted. A
//! member that answers is heard at once; one that never answers is
//! suspected and declared down, as SWIM would have it without the bound.
//!
//! A member's source address must therefore be its identity's address
//! (`[swim] advertise`, where given, is the address its datagrams come
//! from). Both tables are bounded ([`TABLE_LIMIT`] addresses each): a
//! full table of unheard addresses withholds sends to new ones, which is
//! the safe side.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long an address stays heard after its last datagram.
pub const HEARD_FOR: Duration = Duration::from_secs(60);
/// Datagrams sent per [`UNHEARD_WINDOW`] to an address not heard from.
pub const UNHEARD_SENDS: u32 = 8;
/// The window of [`UNHEARD_SENDS`].
pub const UNHEARD_WINDOW: Duration = Duration::from_secs(10);
/// Addresses each table holds at most.
pub const TABLE_LIMIT: usize = 4096;

/// Where this member may send, by what it has heard.
#[derive(Debug, Default)]
pub struct SendBound {
    /// Address → when a datagram last came from it.
    heard: HashMap<SocketAddr, Instant>,
    /// Address not heard from → (its window's start, datagrams sent in it).
    unheard: HashMap<SocketAddr, (Instant, u32)>,
}

impl SendBound {
    /// A datagram came from `from` at `now`.
    pub fn heard(&mut self, from: SocketAddr, now: Instant) {
        if self.heard.len() >= TABLE_LIMIT && !self.heard.contains_key(&from) {
            self.heard
                .retain(|_, at| now.saturating_duration_since(*at) < HEARD_FOR);
            if self.heard.len() >= TABLE_LIMIT {
                return; // stays unheard: bounded, never wrong
            }
        }
        self.heard.insert(from, now);
        self.unheard.remove(&from);
    }

    /// Whether a datagram may go to `to` at `now` (and counts it if so).
    pub fn may_send(&mut self, to: SocketAddr, now: Instant) -> bool {
        if self
            .heard
            .get(&to)
            .is_some_and(|at| now.saturating_duration_since(*at) < HEARD_FOR)
        {
            return true;
        }
        if self.unheard.len() >= TABLE_LIMIT && !self.unheard.contains_key(&to) {
            self.unheard
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < UNHEARD_WINDOW);
            if self.unheard.len() >= TABLE_LIMIT {
                return false;
            }
        }
        let (start, sent) = self.unheard.entry(to).or_insert((now, 0));
        if now.saturating_duration_since(*start) >= UNHEARD_WINDOW {
            (*start, *sent) = (now, 0);
        }
        if *sent >= UNHEARD_SENDS {
            return false;
        }
        *sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn an_address_never_heard_from_gets_a_few_datagrams_a_window_and_a_heard_one_all() {
        let mut bound = SendBound::default();
        let t0 = Instant::now();
        let victim = addr(9);
        let sent = (0..100).filter(|_| bound.may_send(victim, t0)).count();
        assert_eq!(sent, UNHEARD_SENDS as usize);
        // The next window, as many again, no more.
        let t1 = t0 + UNHEARD_WINDOW;
        let sent = (0..100).filter(|_| bound.may_send(victim, t1)).count();
        assert_eq!(sent, UNHEARD_SENDS as usize);
        // A member that answers is heard: every datagram goes.
        let peer = addr(10);
        assert!((0..UNHEARD_SENDS).all(|_| bound.may_send(peer, t1)));
        assert!(!bound.may_send(peer, t1));
        bound.heard(peer, t1);
        assert!((0..1000).all(|_| bound.may_send(peer, t1)));
        // Silent for longer than HEARD_FOR: bounded again.
        let later = t1 + HEARD_FOR;
        assert_eq!(
            (0..100).filter(|_| bound.may_send(peer, later)).count(),
            UNHEARD_SENDS as usize
        );
    }

    #[test]
    fn the_tables_stay_bounded_and_a_full_one_withholds_rather_than_forgets() {
        let mut bound = SendBound::default();
        let t0 = Instant::now();
        for i in 0..(TABLE_LIMIT as u32 + 100) {
            let to = SocketAddr::from((std::net::Ipv4Addr::from(0x0a00_0000 + i), 7946));
            let _ = bound.may_send(to, t0);
            bound.heard(
                SocketAddr::from((std::net::Ipv4Addr::from(0x0b00_0000 + i), 1)),
                t0,
            );
        }
        assert!(bound.unheard.len() <= TABLE_LIMIT);
        assert!(bound.heard.len() <= TABLE_LIMIT);
        // Full of live entries: a new unheard address gets nothing.
        assert!(!bound.may_send(addr(1), t0));
        // A window later the old entries make room.
        assert!(bound.may_send(addr(1), t0 + UNHEARD_WINDOW));
    }
}
