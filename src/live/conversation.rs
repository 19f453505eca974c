//! One agent connection's frames, judged: a value with no I/O (design §8).
//! Bytes go in, a verdict comes out; the listener does the reading, the
//! writing, the counting and the telling.
//!
//! A frame is judged in two steps, so that the signature is checked
//! outside the lock on the node table and the sequence under it:
//!
//! 1. [`Conversation::open`] (no shared state): the frame decodes, names a
//!    node of the registry, and is signed by that node's key over the
//!    cluster label and the connection's challenge (none for the first).
//!    A frame signed without the challenge right after it was sent (the
//!    node's state changed before it read the challenge) is skipped, up
//!    to [`SKIPPED_BEFORE_CHALLENGE`].
//! 2. [`Conversation::admit`] (the sequences, under the lock): the node's
//!    key is still the one the frame was opened with, and the frame's
//!    sequence is above the last accepted from that node on any
//!    connection (else it is a replay). A connection's first frame is
//!    then answered with the connection's challenge and never applied;
//!    every later one is accepted.

use std::collections::HashMap;
use std::time::Duration;

use poolgate_actors::core::NodeId;

use super::keys::PublicKey;
use super::wire::{self, Announcement, Nonce, Refused};

/// How many frames signed without the connection's challenge are skipped
/// after it was sent (a node's state changes in the moment before it read
/// the challenge); more is not a node at work, and is refused.
pub const SKIPPED_BEFORE_CHALLENGE: u32 = 4;

/// The shortest silence after which a connection whose node announced its
/// heartbeat is taken for gone.
const SHORTEST_SILENCE: Duration = Duration::from_millis(100);

/// What the signature check made of one frame.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Signed before the node read the challenge: read on.
    Skip,
    /// Opened: its sequence is judged next ([`Conversation::admit`]).
    Opened(Box<Opened>),
    /// Refused: say why (naming the node, if it is known) and close.
    Refuse {
        /// The node the frame named, when the registry has it.
        node: Option<NodeId>,
        /// Why.
        refused: Refused,
    },
}

/// A frame whose signature holds, before its sequence is judged.
#[derive(Debug, PartialEq)]
pub struct Opened {
    node: NodeId,
    key: PublicKey,
    seq: u64,
    announcement: Announcement,
}

/// What the sequence check made of an opened frame.
#[derive(Debug, PartialEq)]
pub enum Admitted {
    /// The connection's first frame: answer with this challenge, apply
    /// nothing, read on.
    Challenge(Nonce),
    /// Accepted: acknowledge its sequence; apply what it says unless it
    /// repeats the state last accepted on this connection (a heartbeat).
    Accepted(Accepted),
    /// Refused: say why and close.
    Refuse {
        /// The node.
        node: NodeId,
        /// Why.
        refused: Refused,
    },
}

/// A frame accepted on a connection (see [`Admitted::Accepted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The node.
    pub node: NodeId,
    /// Its sequence, to acknowledge.
    pub seq: u64,
    /// What it says.
    pub announcement: Announcement,
    /// The same node and state as the last accepted frame here.
    pub repeats: bool,
    /// The first frame accepted on this connection.
    pub first: bool,
    /// The frame's question beside the state, to answer in the
    /// acknowledgement (taken out of `announcement`).
    pub ask: Option<Box<crate::live::wire::Ask>>,
}

/// One agent connection, from its first frame on.
#[derive(Debug, Default)]
pub struct Conversation {
    /// The connection's challenge, once its first frame asked for it.
    challenge: Option<Nonce>,
    /// Frames signed without it skipped since.
    skipped: u32,
    /// The last announcement accepted here, and whose.
    last: Option<(NodeId, Announcement)>,
}

impl Conversation {
    /// A connection that has sent nothing yet.
    pub fn new() -> Self {
        Conversation::default()
    }

    /// Whether no frame was accepted on it yet.
    pub fn is_new(&self) -> bool {
        self.last.is_none()
    }

    /// Into the last announcement accepted here, and whose.
    pub fn into_last(self) -> Option<(NodeId, Announcement)> {
        self.last
    }

    /// How long the connection may be silent: until its first frame is
    /// accepted `first`, then a few of its node's heartbeats, within
    /// `idle`.
    pub fn silence(&self, first: Duration, idle: Duration) -> Duration {
        match &self.last {
            None => first.min(idle),
            Some((_, announcement)) => match announcement.heartbeat_ms {
                Some(ms) => (Duration::from_millis(ms) * crate::config::HEARTBEATS_MISSED)
                    .clamp(SHORTEST_SILENCE, idle),
                None => idle,
            },
        }
    }

    /// Step 1: the frame's bytes (after the length prefix), against the
    /// registry's pinned `keys` and the cluster `label`.
    pub fn open(
        &mut self,
        bytes: &[u8],
        keys: impl Fn(&NodeId) -> Option<PublicKey>,
        label: &str,
    ) -> Verdict {
        let frame = match wire::decode_frame(bytes) {
            Ok(frame) => frame,
            Err(refused) => {
                return Verdict::Refuse {
                    node: None,
                    refused,
                }
            }
        };
        let Ok(node) = NodeId::new(&frame.node) else {
            return Verdict::Refuse {
                node: None,
                refused: Refused::UnknownNode,
            };
        };
        let Some(key) = keys(&node) else {
            return Verdict::Refuse {
                node: Some(node),
                refused: Refused::UnknownNode,
            };
        };
        // The signature first: what the orchestrator knows of a node (its
        // last sequence) is said only to the node itself.
        let announcement = match frame.open(&key, label, self.challenge.as_ref()) {
            Ok(announcement) => announcement,
            // Sent before the node read the challenge, so signed without
            // it: skipped, never applied (the challenge is on its way, and
            // the node sends again over it).
            Err(_)
                if self.is_new()
                    && self.challenge.is_some()
                    && self.skipped < SKIPPED_BEFORE_CHALLENGE
                    && frame.open(&key, label, None).is_ok() =>
            {
                self.skipped += 1;
                return Verdict::Skip;
            }
            Err(refused) => {
                return Verdict::Refuse {
                    node: Some(node),
                    refused,
                }
            }
        };
        Verdict::Opened(Box::new(Opened {
            node,
            key,
            seq: frame.seq,
            announcement,
        }))
    }

    /// Step 2, under the lock on the node table: `last_seq` holds the last
    /// sequence accepted per node (on any connection), `keys` the registry
    /// as it is now; `nonce` makes the connection's challenge when its
    /// first frame comes.
    pub fn admit(
        &mut self,
        opened: Box<Opened>,
        last_seq: &mut HashMap<NodeId, u64>,
        keys: impl Fn(&NodeId) -> Option<PublicKey>,
        nonce: impl FnOnce() -> Nonce,
    ) -> Admitted {
        let Opened {
            node,
            key,
            seq,
            announcement,
        } = *opened;
        if keys(&node) != Some(key) {
            // The key was replaced (or the node forgotten) since the frame
            // was opened.
            return Admitted::Refuse {
                node,
                refused: Refused::UnknownNode,
            };
        }
        let last = last_seq.get(&node).copied().unwrap_or(0);
        if seq <= last {
            return Admitted::Refuse {
                node,
                refused: Refused::Replayed { seq, last },
            };
        }
        if self.challenge.is_none() {
            // The connection's first frame is not applied: it is answered
            // with the connection's challenge, and only frames signed over
            // it count (a frame captured on another connection, of this
            // life or an earlier one, or of another replica, never does).
            let nonce = nonce();
            self.challenge = Some(nonce);
            return Admitted::Challenge(nonce);
        }
        last_seq.insert(node.clone(), seq);
        let first = self.is_new();
        // A question is not part of the node's state.
        let mut announcement = announcement;
        let ask = announcement.ask.take().map(Box::new);
        let repeats = self
            .last
            .as_ref()
            .is_some_and(|(n, a)| *n == node && *a == announcement);
        self.last = Some((node.clone(), announcement.clone()));
        Admitted::Accepted(Accepted {
            node,
            seq,
            announcement,
            repeats,
            first,
            ask,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::NodeKey;

    const LABEL: &str = "lab";

    fn node() -> NodeId {
        NodeId::new("node-1").unwrap()
    }

    fn state(available: bool) -> Announcement {
        Announcement {
            available,
            identity: None,
            swim: None,
            generation: None,
            fault: None,
            leaving: false,
            heartbeat_ms: Some(1000),
            ask: None,
        }
    }

    /// A frame of node-1 signed by `key`, without its length prefix.
    fn frame(key: &NodeKey, seq: u64, nonce: Option<&Nonce>, said: &Announcement) -> Vec<u8> {
        wire::encode(key, LABEL, "node-1", seq, nonce, said)[4..].to_vec()
    }

    struct Peer {
        nonce: Nonce,
        key: NodeKey,
        last_seq: HashMap<NodeId, u64>,
        talk: Conversation,
    }

    impl Peer {
        fn new() -> Self {
            Peer {
                nonce: rand::random(),
                key: NodeKey::generate(),
                last_seq: HashMap::new(),
                talk: Conversation::new(),
            }
        }

        /// The frame's bytes through both steps, with the registry pinning
        /// `pinned` for node-1.
        fn send(&mut self, bytes: &[u8], pinned: &PublicKey) -> Result<Admitted, Verdict> {
            let keys = |n: &NodeId| (*n == node()).then_some(*pinned);
            match self.talk.open(bytes, keys, LABEL) {
                Verdict::Opened(opened) => {
                    let nonce = self.nonce;
                    Ok(self.talk.admit(opened, &mut self.last_seq, keys, || nonce))
                }
                other => Err(other),
            }
        }

        /// Connects: the first frame (seq) is challenged.
        fn connect(&mut self, seq: u64) -> Nonce {
            let pinned = self.key.public();
            let first = frame(&self.key, seq, None, &state(true));
            match self.send(&first, &pinned) {
                Ok(Admitted::Challenge(nonce)) => nonce,
                other => panic!("the first frame is challenged, not {other:?}"),
            }
        }
    }

    #[test]
    fn the_first_frame_is_challenged_never_applied_and_later_ones_are_accepted_over_the_challenge()
    {
        let mut peer = Peer::new();
        let pinned = peer.key.public();
        let nonce = peer.connect(1);
        assert!(peer.talk.is_new());
        assert_eq!(
            peer.last_seq.get(&node()),
            None,
            "the first frame counts for nothing"
        );
        let said = state(true);
        match peer.send(&frame(&peer.key, 2, Some(&nonce), &said), &pinned) {
            Ok(Admitted::Accepted(Accepted {
                seq: 2,
                announcement,
                repeats: false,
                first: true,
                ..
            })) => assert_eq!(announcement, said),
            other => panic!("{other:?}"),
        }
        assert_eq!(peer.last_seq[&node()], 2);
        // A heartbeat repeats the state.
        match peer.send(&frame(&peer.key, 3, Some(&nonce), &said), &pinned) {
            Ok(Admitted::Accepted(Accepted {
                repeats: true,
                first: false,
                ..
            })) => {}
            other => panic!("{other:?}"),
        }
        // A change does not.
        match peer.send(&frame(&peer.key, 4, Some(&nonce), &state(false)), &pinned) {
            Ok(Admitted::Accepted(Accepted { repeats: false, .. })) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_frame_not_above_the_last_accepted_is_a_replay_on_any_connection() {
        let mut peer = Peer::new();
        let pinned = peer.key.public();
        let nonce = peer.connect(1);
        let said = state(true);
        let captured = frame(&peer.key, 5, Some(&nonce), &said);
        assert!(matches!(
            peer.send(&captured, &pinned),
            Ok(Admitted::Accepted(_))
        ));
        assert_eq!(
            peer.send(&captured, &pinned),
            Ok(Admitted::Refuse {
                node: node(),
                refused: Refused::Replayed { seq: 5, last: 5 }
            })
        );
        // On a new connection, a captured first frame is a replay too.
        peer.talk = Conversation::new();
        let old_first = frame(&peer.key, 1, None, &said);
        assert_eq!(
            peer.send(&old_first, &pinned),
            Ok(Admitted::Refuse {
                node: node(),
                refused: Refused::Replayed { seq: 1, last: 5 }
            })
        );
    }

    #[test]
    fn a_frame_captured_on_another_connection_is_refused_as_badly_signed() {
        let mut first = Peer::new();
        let pinned = first.key.public();
        let nonce = first.connect(1);
        let captured = frame(&first.key, 2, Some(&nonce), &state(true));
        // Replayed on a connection of its own, whose challenge differs.
        let mut other = Peer::new();
        other.key = first.key.clone();
        other.last_seq = first.last_seq.clone();
        let _ = other.connect(1);
        assert_eq!(
            other.talk.open(&captured, |_: &NodeId| Some(pinned), LABEL),
            Verdict::Refuse {
                node: Some(node()),
                refused: Refused::BadSignature
            }
        );
    }

    #[test]
    fn frames_signed_before_the_challenge_was_read_are_skipped_four_times_then_refused() {
        let mut peer = Peer::new();
        let pinned = peer.key.public();
        peer.connect(1);
        for seq in 2..2 + u64::from(SKIPPED_BEFORE_CHALLENGE) {
            let early = frame(&peer.key, seq, None, &state(false));
            assert_eq!(peer.send(&early, &pinned), Err(Verdict::Skip), "seq {seq}");
        }
        let one_more = frame(&peer.key, 9, None, &state(false));
        assert_eq!(
            peer.send(&one_more, &pinned),
            Err(Verdict::Refuse {
                node: Some(node()),
                refused: Refused::BadSignature
            })
        );
    }

    #[test]
    fn a_node_outside_the_registry_or_with_a_replaced_key_is_unknown() {
        let mut peer = Peer::new();
        let stranger = NodeKey::generate().public();
        let bytes = frame(&peer.key, 1, None, &state(true));
        assert_eq!(
            peer.send(&bytes, &stranger),
            Err(Verdict::Refuse {
                node: Some(node()),
                refused: Refused::BadSignature
            })
        );
        let keys = |_: &NodeId| None;
        assert_eq!(
            peer.talk.open(&bytes, keys, LABEL),
            Verdict::Refuse {
                node: Some(node()),
                refused: Refused::UnknownNode
            }
        );
        // Opened under the old key, judged after it was replaced.
        let pinned = peer.key.public();
        let nonce = peer.connect(1);
        let keys = |n: &NodeId| (*n == node()).then_some(pinned);
        let Verdict::Opened(opened) = peer.talk.open(
            &frame(&peer.key, 2, Some(&nonce), &state(true)),
            keys,
            LABEL,
        ) else {
            panic!("opened under its key");
        };
        let replaced = |_: &NodeId| Some(stranger);
        assert_eq!(
            peer.talk
                .admit(opened, &mut peer.last_seq, replaced, || [0; 16]),
            Admitted::Refuse {
                node: node(),
                refused: Refused::UnknownNode
            }
        );
    }

    #[test]
    fn what_is_not_a_frame_is_refused_naming_no_node() {
        let mut talk = Conversation::new();
        let keys = |_: &NodeId| None;
        assert!(matches!(
            talk.open(b"{\"not\":\"a frame\"}", keys, LABEL),
            Verdict::Refuse {
                node: None,
                refused: Refused::Malformed(_)
            }
        ));
    }

    #[test]
    fn the_silence_allowed_is_the_first_frame_deadline_then_a_few_heartbeats_within_idle() {
        let mut peer = Peer::new();
        let pinned = peer.key.public();
        let (first, idle) = (Duration::from_secs(2), Duration::from_secs(30));
        assert_eq!(peer.talk.silence(first, idle), first);
        let nonce = peer.connect(1);
        let _ = peer.send(&frame(&peer.key, 2, Some(&nonce), &state(true)), &pinned);
        assert_eq!(
            peer.talk.silence(first, idle),
            Duration::from_secs(crate::config::HEARTBEATS_MISSED.into())
        );
    }
}
