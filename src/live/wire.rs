//! What crosses the network, and how it is protected (design §7–§8).
//!
//! **Agent frames** (node → orchestrator, TCP): a 4-byte big-endian length,
//! then that many bytes of JSON:
//!
//! ```text
//! {"v":1,"node":"node-1","seq":1733160000000000001,"body":"<announcement JSON>","sig":"<base64>"}
//! ```
//!
//! The body is the node's whole state, as a JSON string (so the signed
//! bytes are exactly the bytes sent): `{"available":true,"identity":
//! "<base64>","swim":"127.0.0.1:7946","fault":null,"leaving":false}`. The
//! signature is Ed25519 over `poolgate/announce/v1 \0 label \0 node \0
//! seq (8 bytes, big-endian) body`. A frame longer than [`MAX_FRAME`] is
//! refused before anything is allocated for it.
//!
//! A frame may carry a question beside the state (`"ask"`: a SWIM member
//! the node probed without an answer, [`Ask`]); the orchestrator answers it
//! in the frame's acknowledgement (`"vouch"`, [`Vouch`]) from that
//! member's own agent connection (design §15).
//!
//! **Gossip datagrams** (SWIM, UDP): `nonce (24 bytes) ‖ ciphertext`,
//! XChaCha20-Poly1305 under the first key of the ring with the cluster
//! label as associated data; opening tries every key of the ring.

use std::net::SocketAddr;

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::keys::{ClusterKey, NodeKey, PublicKey};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The longest agent frame accepted, in bytes.
pub const MAX_FRAME: usize = 64 * 1024;

/// The wire format's version.
const VERSION: u32 = 1;

/// What a node says of itself: its whole state, sent on every change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// `NodeAvailable`.
    pub available: bool,
    /// Data-plane identity material, base64 (never logged).
    pub identity: Option<String>,
    /// The SWIM address the node answers on.
    pub swim: Option<SocketAddr>,
    /// The generation of the node's SWIM identity: with `swim` and the
    /// node's name, the one identity whose SWIM facts count (design §11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Why the node is faulted, if it is.
    pub fault: Option<String>,
    /// The node is leaving the cluster (SIGTERM).
    pub leaving: bool,
    /// How often the node sends a frame when nothing changed (`[node]
    /// heartbeat`), in milliseconds: the orchestrator takes a connection
    /// silent for a few of them as gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// A question beside the state: whether a SWIM member this node
    /// probed without an answer lives, by its own agent connection (see
    /// [`Ask`]). Not part of the state: a frame that adds only this
    /// repeats the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
}

/// A node's question: one of its SWIM probes of `node` (at `swim`,
/// `generation`) went unanswered over UDP; does that member's agent
/// connection show it alive? The orchestrator answers in the frame's
/// acknowledgement ([`Vouch`]), from the member's own signed heartbeats
/// only (design §15): SWIM's probes fall back on the TCP connections the
/// orchestrator already holds, as memberlist falls back to a TCP probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// The probed member's node name.
    pub node: String,
    /// Its SWIM address.
    pub swim: SocketAddr,
    /// Its SWIM generation.
    pub generation: u64,
    /// foca's number for the probe (given back in the answer).
    pub probe: u8,
}

/// The orchestrator's answer to an [`Ask`]: `alive` when that member's
/// agent connection is up, it signed exactly that SWIM identity, and its
/// latest frame is no more than a heartbeat (and a little) old.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vouch {
    /// The question answered.
    #[serde(flatten)]
    pub ask: Ask,
    /// Whether the member's own evidence shows it alive now.
    pub alive: bool,
}

/// Sets TCP keepalive on an agent connection, either end (a dead peer is
/// found even where no frame flows), probing after `idle`.
pub fn keep_alive(stream: &tokio::net::TcpStream, idle: std::time::Duration) {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(idle);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "TCP keepalive not set");
    }
}

/// The longest reply a node reads (orchestrator → node), in bytes.
pub const MAX_REPLY: usize = 4096;

/// What the orchestrator answers on an agent connection: each accepted
/// frame is acknowledged (so a node knows its orchestrator is there), and a
/// refusal says why before the connection closes; the first frame of a
/// connection is answered with the connection's challenge. Length-prefixed
/// JSON like the frames: `{"reply":"challenge","nonce":"…"}`,
/// `{"reply":"accepted","seq":…}`,
/// `{"reply":"refused","code":"unknown_node","detail":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The frame with this sequence was accepted.
    Accepted {
        /// Its sequence.
        seq: u64,
        /// The answer to the frame's [`Ask`], if it asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vouch: Option<Vouch>,
    },
    /// The connection's challenge, in base64: the answer to its first
    /// frame (which is not applied). Every later frame on the connection
    /// is signed over it, so no frame made for another connection (an
    /// earlier life of this orchestrator, another replica) is accepted.
    Challenge {
        /// [`NONCE_LEN`] bytes, base64.
        nonce: String,
    },
    /// The frame was refused; the connection closes.
    Refused {
        /// The refusal's code ([`Refused::code`]).
        code: String,
        /// In words (never key or identity bytes).
        detail: String,
        /// With `not_leader`: where the leading replica's agent listener
        /// is reached, as it advertises it (`host:port`), when the
        /// refusing replica knows. Absent from other refusals.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leader: Option<String>,
        /// With `replayed`: another connection, still open, carried this
        /// node's latest accepted frame (another process signs as the node
        /// now: a copy of its config and key). An agent told so waits for
        /// it to stop; told a replay without it, the agent takes over (a
        /// new life of sequences and a new SWIM generation). Absent when
        /// false.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        signed_elsewhere: bool,
    },
}

/// The challenge reply for `nonce`.
pub fn challenge(nonce: &Nonce) -> Reply {
    Reply::Challenge {
        nonce: B64.encode(nonce),
    }
}

/// The nonce of a challenge reply, if it is one.
pub fn challenge_nonce(text: &str) -> Option<Nonce> {
    B64.decode(text.as_bytes()).ok()?.try_into().ok()
}

/// A reply, length prefix included, ready to write.
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let json = serde_json::to_vec(reply).unwrap_or_default();
    length_prefixed(&json)
}

fn length_prefixed(json: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + json.len());
    frame.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(json);
    frame
}

/// Reads one reply; `Ok(None)` at a clean end of stream.
pub async fn read_reply<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Reply>, ReadError> {
    let Some(bytes) = read_prefixed(reader, MAX_REPLY).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|_| ReadError::Refused(Refused::Malformed("not a reply")))
}

/// Reads a 4-byte big-endian length, then that many bytes, refusing a
/// length over `max` before anything is allocated.
pub async fn read_prefixed<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, ReadError> {
    let mut length = [0u8; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > max {
        return Err(ReadError::Refused(Refused::TooLong(length)));
    }
    let mut bytes = vec![0u8; length];
    reader.read_exact(&mut bytes).await.map_err(ReadError::Io)?;
    Ok(Some(bytes))
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    v: u32,
    node: String,
    seq: u64,
    body: String,
    sig: String,
}

/// A frame as read, before its signature is checked.
#[derive(Debug)]
pub struct Frame {
    /// The node it claims to come from.
    pub node: String,
    /// Its sequence number.
    pub seq: u64,
    body: String,
    sig: [u8; 64],
}

/// The refusal code of a replica that does not lead (an agent tries the
/// next address).
pub const NOT_LEADER: &str = "not_leader";

/// Why a frame was refused. Never holds key or identity bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    /// Longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes is over the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// Not a frame of this format.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// The node is not in the registry.
    #[error("node is not in the registry")]
    UnknownNode,
    /// The signature is not the pinned key's.
    #[error("bad signature")]
    BadSignature,
    /// The sequence number does not exceed the last accepted one.
    #[error("sequence {seq} does not exceed the last accepted {last}{}", stepped_hint(*.seq, *.last))]
    Replayed {
        /// The frame's sequence.
        seq: u64,
        /// The last one accepted from that node.
        last: u64,
    },
}

impl Refused {
    /// What the sender is told: for a replay, without the sequences (the
    /// last accepted one is the orchestrator's to know; the log says it).
    pub fn detail_for_peer(&self) -> String {
        match self {
            Refused::Replayed { seq, last } => format!(
                "the frame's sequence does not exceed the last accepted one{}",
                stepped_hint(*seq, *last)
            ),
            other => other.to_string(),
        }
    }

    /// A short label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Refused::TooLong(_) => "too_long",
            Refused::Malformed(_) => "malformed",
            Refused::UnknownNode => "unknown_node",
            Refused::BadSignature => "bad_signature",
            Refused::Replayed { .. } => REPLAYED,
        }
    }
}

/// The code of [`Refused::Replayed`].
pub const REPLAYED: &str = "replayed";

/// Bits of a sequence that count frames within one life of a node; the
/// bits above are the life (a generation, rising across restarts).
pub const COUNTER_BITS: u32 = 20;

fn stepped_hint(seq: u64, last: u64) -> &'static str {
    if seq >> COUNTER_BITS < last >> COUNTER_BITS {
        " (the frame's life began before the last accepted one's: another process signs as \
         this node (a copy of its config and key), or its clock was stepped back and its \
         generation file beside its key was lost)"
    } else {
        ""
    }
}

/// The bytes of an orchestrator's challenge on one agent connection: a
/// node's frames on that connection are signed over them, so a frame is
/// good on the connection it was made for only.
pub const NONCE_LEN: usize = 16;

/// A connection's challenge.
pub type Nonce = [u8; NONCE_LEN];

/// What a frame's signature covers: the cluster label, the node, the
/// sequence, the connection's challenge (none on the first frame of a
/// connection, which only asks for it) and the body.
fn signed_bytes(label: &str, node: &str, seq: u64, nonce: Option<&Nonce>, body: &str) -> Vec<u8> {
    let mut message = Vec::with_capacity(48 + label.len() + node.len() + body.len());
    match nonce {
        None => message.extend_from_slice(b"poolgate/announce/v1\0"),
        Some(_) => message.extend_from_slice(b"poolgate/announce/v2\0"),
    }
    message.extend_from_slice(label.as_bytes());
    message.push(0);
    message.extend_from_slice(node.as_bytes());
    message.push(0);
    message.extend_from_slice(&seq.to_be_bytes());
    if let Some(nonce) = nonce {
        message.extend_from_slice(nonce);
    }
    message.extend_from_slice(body.as_bytes());
    message
}

/// A signed frame, length prefix included, ready to write: over the
/// connection's challenge `nonce` once the orchestrator gave it (the
/// first frame of a connection has none, and is answered with one).
pub fn encode(
    key: &NodeKey,
    label: &str,
    node: &str,
    seq: u64,
    nonce: Option<&Nonce>,
    announcement: &Announcement,
) -> Vec<u8> {
    // Serialising these plain types cannot fail.
    let body = serde_json::to_string(announcement).unwrap_or_default();
    let sig = key.sign(&signed_bytes(label, node, seq, nonce, &body));
    let envelope = Envelope {
        v: VERSION,
        node: node.to_string(),
        seq,
        body,
        sig: B64.encode(sig),
    };
    let json = serde_json::to_vec(&envelope).unwrap_or_default();
    length_prefixed(&json)
}

/// Reads one frame; `Ok(None)` at a clean end of stream. The length is
/// checked before the frame is read.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, ReadError> {
    match read_prefixed(reader, MAX_FRAME).await? {
        Some(bytes) => decode_frame(&bytes).map(Some).map_err(ReadError::Refused),
        None => Ok(None),
    }
}

/// Why reading a frame stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The connection failed.
    #[error(transparent)]
    Io(std::io::Error),
    /// The frame was refused.
    #[error(transparent)]
    Refused(Refused),
}

/// Decodes a frame's bytes (after the length prefix), before its
/// signature is checked.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame, Refused> {
    if bytes.len() > MAX_FRAME {
        return Err(Refused::TooLong(bytes.len()));
    }
    let envelope: Envelope =
        serde_json::from_slice(bytes).map_err(|_| Refused::Malformed("not a frame envelope"))?;
    if envelope.v != VERSION {
        return Err(Refused::Malformed("unknown version"));
    }
    let sig: [u8; 64] = B64
        .decode(envelope.sig.as_bytes())
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or(Refused::Malformed("signature is not 64 bytes of base64"))?;
    Ok(Frame {
        node: envelope.node,
        seq: envelope.seq,
        body: envelope.body,
        sig,
    })
}

impl Frame {
    /// Checks the signature against `key`, the cluster `label` and the
    /// connection's challenge `nonce` (none: the first frame of a
    /// connection), and returns what the node announced.
    pub fn open(
        &self,
        key: &PublicKey,
        label: &str,
        nonce: Option<&Nonce>,
    ) -> Result<Announcement, Refused> {
        let message = signed_bytes(label, &self.node, self.seq, nonce, &self.body);
        if !key.verifies(&message, &self.sig) {
            return Err(Refused::BadSignature);
        }
        serde_json::from_str(&self.body)
            .map_err(|_| Refused::Malformed("body is not an announcement"))
    }
}

/// Decodes announced identity material (base64).
pub fn identity_bytes(announcement: &Announcement) -> Option<Result<Vec<u8>, ()>> {
    announcement
        .identity
        .as_ref()
        .map(|text| B64.decode(text.as_bytes()).map_err(drop))
}

/// Encodes identity material for an announcement.
pub fn identity_text(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// The cluster's gossip keyring: the first key seals, every key opens. An
/// empty ring (`insecure = true`) passes datagrams through as they are.
/// The cipher work is `poolgate-seal`'s (compiled optimised in every
/// profile).
#[derive(Clone)]
pub struct Keyring(poolgate_seal::Sealer);

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({:?})", self.0)
    }
}

impl Keyring {
    /// A ring of `keys` for the cluster `label`.
    pub fn new(keys: &[ClusterKey], label: &str) -> Self {
        let bytes: Vec<[u8; 32]> = keys.iter().map(|k| k.0).collect();
        Keyring(poolgate_seal::Sealer::new(&bytes, label))
    }

    /// Seals a datagram under a random nonce (or passes it through with no
    /// keys).
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        self.0.seal(plaintext, rand::random())
    }

    /// Opens a datagram with any key of the ring; `None` if none opens it.
    pub fn open(&self, datagram: &[u8]) -> Option<Vec<u8>> {
        self.0.open(datagram)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announcement() -> Announcement {
        Announcement {
            available: true,
            identity: Some(identity_text(b"data-plane key")),
            swim: Some(SocketAddr::from(([127, 0, 0, 1], 7946))),
            generation: None,
            fault: None,
            leaving: false,
            heartbeat_ms: Some(1000),
            ask: None,
        }
    }

    #[actix_rt::test]
    async fn replies_read_back_and_an_oversized_one_is_refused() {
        let accepted = Reply::Accepted {
            seq: 9,
            vouch: None,
        };
        let bytes = encode_reply(&accepted);
        assert_eq!(read_reply(&mut &bytes[..]).await.unwrap(), Some(accepted));
        let mut huge = ((MAX_REPLY + 1) as u32).to_be_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(matches!(
            read_reply(&mut &huge[..]).await,
            Err(ReadError::Refused(Refused::TooLong(_)))
        ));
    }

    #[actix_rt::test]
    async fn a_question_and_its_answer_cross_and_old_peers_read_past_them() {
        let ask = Ask {
            node: "node-3".into(),
            swim: SocketAddr::from(([127, 0, 0, 1], 7946)),
            generation: 4,
            probe: 200,
        };
        let answer = Reply::Accepted {
            seq: 9,
            vouch: Some(Vouch {
                ask: ask.clone(),
                alive: true,
            }),
        };
        let bytes = encode_reply(&answer);
        assert_eq!(read_reply(&mut &bytes[..]).await.unwrap(), Some(answer));
        // An orchestrator that does not answer questions.
        let old: Reply = serde_json::from_str(r#"{"reply":"accepted","seq":3}"#).unwrap();
        assert_eq!(
            old,
            Reply::Accepted {
                seq: 3,
                vouch: None
            }
        );
        // A state with a question reads as the state to a reader without
        // one, and a state without one as no question.
        let asked = Announcement {
            ask: Some(ask),
            ..announcement()
        };
        let text = serde_json::to_string(&asked).unwrap();
        assert!(text.contains(r#""ask":{"node":"node-3""#), "{text}");
        let plain: Announcement =
            serde_json::from_str(&serde_json::to_string(&announcement()).unwrap()).unwrap();
        assert_eq!(plain.ask, None);
    }

    #[test]
    fn a_replay_from_an_earlier_life_says_the_clock_may_have_stepped() {
        let earlier = Refused::Replayed {
            seq: 5 << COUNTER_BITS,
            last: 6 << COUNTER_BITS,
        };
        assert!(earlier.to_string().contains("stepped back"), "{earlier}");
        let same = Refused::Replayed {
            seq: (6 << COUNTER_BITS) + 1,
            last: (6 << COUNTER_BITS) + 2,
        };
        assert!(!same.to_string().contains("stepped"), "{same}");
    }

    async fn read_back(bytes: &[u8]) -> Result<Option<Frame>, ReadError> {
        let mut reader = bytes;
        read_frame(&mut reader).await
    }

    #[actix_rt::test]
    async fn a_frame_signed_by_the_pinned_key_opens_to_what_was_announced() {
        let key = NodeKey::generate();
        let bytes = encode(&key, "poolgate", "n1", 7, None, &announcement());
        let frame = read_back(&bytes).await.unwrap().unwrap();
        assert_eq!((frame.node.as_str(), frame.seq), ("n1", 7));
        assert_eq!(
            frame.open(&key.public(), "poolgate", None).unwrap(),
            announcement()
        );
        // Another key, another cluster label: refused.
        let other = NodeKey::generate();
        assert_eq!(
            frame.open(&other.public(), "poolgate", None),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            frame.open(&key.public(), "other", None),
            Err(Refused::BadSignature)
        );
    }

    #[actix_rt::test]
    async fn a_frame_made_for_one_connections_challenge_opens_on_that_connection_only() {
        let key = NodeKey::generate();
        let (ours, theirs) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let bytes = encode(&key, "poolgate", "n1", 8, Some(&ours), &announcement());
        let frame = read_back(&bytes).await.unwrap().unwrap();
        assert!(frame.open(&key.public(), "poolgate", Some(&ours)).is_ok());
        for other in [Some(&theirs), None] {
            assert_eq!(
                frame.open(&key.public(), "poolgate", other),
                Err(Refused::BadSignature)
            );
        }
        // Nor does a first frame (no challenge) open as an answer to one.
        let first = encode(&key, "poolgate", "n1", 8, None, &announcement());
        let first = read_back(&first).await.unwrap().unwrap();
        assert_eq!(
            first.open(&key.public(), "poolgate", Some(&ours)),
            Err(Refused::BadSignature)
        );
        let Reply::Challenge { nonce } = challenge(&ours) else {
            unreachable!()
        };
        assert_eq!(challenge_nonce(&nonce), Some(ours));
        assert_eq!(challenge_nonce("AAAA"), None);
    }

    #[actix_rt::test]
    async fn an_oversized_or_malformed_frame_is_refused() {
        let mut huge = (10_000_000u32).to_be_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(matches!(
            read_back(&huge).await,
            Err(ReadError::Refused(Refused::TooLong(10_000_000)))
        ));
        let mut garbage = 5u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"hello");
        assert!(matches!(
            read_back(&garbage).await,
            Err(ReadError::Refused(Refused::Malformed(_)))
        ));
        assert!(read_back(&[]).await.unwrap().is_none());
    }

    #[test]
    fn a_sealed_datagram_opens_with_any_key_of_the_ring_and_the_same_label_only() {
        let (old, new) = (ClusterKey::generate(), ClusterKey::generate());
        let sender = Keyring::new(std::slice::from_ref(&new), "poolgate");
        let datagram = sender.seal(b"swim");
        assert_ne!(&datagram[24..], b"swim");
        let ring = Keyring::new(&[old.clone(), new.clone()], "poolgate");
        assert_eq!(ring.open(&datagram).as_deref(), Some(&b"swim"[..]));
        assert_eq!(Keyring::new(&[old], "poolgate").open(&datagram), None);
        assert_eq!(Keyring::new(&[new], "other").open(&datagram), None);
        assert_eq!(ring.open(b"short"), None);
    }
}
