//! What crosses the network, and how it is protected (SPEC §7–§8).
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
//! **Gossip datagrams** (SWIM, UDP): `nonce (24 bytes) ‖ ciphertext`,
//! XChaCha20-Poly1305 under the first key of the ring with the cluster
//! label as associated data; opening tries every key of the ring.

use std::net::SocketAddr;

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
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
    /// Why the node is faulted, if it is.
    pub fault: Option<String>,
    /// The node is leaving the cluster (SIGTERM).
    pub leaving: bool,
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
    #[error("sequence {seq} does not exceed the last accepted {last}")]
    Replayed {
        /// The frame's sequence.
        seq: u64,
        /// The last one accepted from that node.
        last: u64,
    },
}

impl Refused {
    /// A short label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Refused::TooLong(_) => "too_long",
            Refused::Malformed(_) => "malformed",
            Refused::UnknownNode => "unknown_node",
            Refused::BadSignature => "bad_signature",
            Refused::Replayed { .. } => "replayed",
        }
    }
}

fn signed_bytes(label: &str, node: &str, seq: u64, body: &str) -> Vec<u8> {
    let mut message = Vec::with_capacity(32 + label.len() + node.len() + body.len());
    message.extend_from_slice(b"poolgate/announce/v1\0");
    message.extend_from_slice(label.as_bytes());
    message.push(0);
    message.extend_from_slice(node.as_bytes());
    message.push(0);
    message.extend_from_slice(&seq.to_be_bytes());
    message.extend_from_slice(body.as_bytes());
    message
}

/// A signed frame, length prefix included, ready to write.
pub fn encode(
    key: &NodeKey,
    label: &str,
    node: &str,
    seq: u64,
    announcement: &Announcement,
) -> Vec<u8> {
    // Serialising these plain types cannot fail.
    let body = serde_json::to_string(announcement).unwrap_or_default();
    let sig = key.sign(&signed_bytes(label, node, seq, &body));
    let envelope = Envelope {
        v: VERSION,
        node: node.to_string(),
        seq,
        body,
        sig: B64.encode(sig),
    };
    let json = serde_json::to_vec(&envelope).unwrap_or_default();
    let mut frame = Vec::with_capacity(4 + json.len());
    frame.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&json);
    frame
}

/// Reads one frame; `Ok(None)` at a clean end of stream. The length is
/// checked before the frame is read.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, ReadError> {
    let mut length = [0u8; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_FRAME {
        return Err(ReadError::Refused(Refused::TooLong(length)));
    }
    let mut bytes = vec![0u8; length];
    reader.read_exact(&mut bytes).await.map_err(ReadError::Io)?;
    decode_frame(&bytes).map(Some).map_err(ReadError::Refused)
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
    /// Checks the signature against `key` and the cluster `label`, and
    /// returns what the node announced.
    pub fn open(&self, key: &PublicKey, label: &str) -> Result<Announcement, Refused> {
        let message = signed_bytes(label, &self.node, self.seq, &self.body);
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
#[derive(Clone)]
pub struct Keyring {
    ciphers: Vec<XChaCha20Poly1305>,
    label: Vec<u8>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({} keys)", self.ciphers.len())
    }
}

impl Keyring {
    /// A ring of `keys` for the cluster `label`.
    pub fn new(keys: &[ClusterKey], label: &str) -> Self {
        let ciphers = keys
            .iter()
            .filter_map(|k| XChaCha20Poly1305::new_from_slice(&k.0).ok())
            .collect();
        Keyring {
            ciphers,
            label: label.as_bytes().to_vec(),
        }
    }

    /// Whether datagrams are sealed at all.
    pub fn seals(&self) -> bool {
        !self.ciphers.is_empty()
    }

    /// Seals a datagram (or passes it through with no keys).
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        let Some(cipher) = self.ciphers.first() else {
            return plaintext.to_vec();
        };
        let nonce: [u8; 24] = rand::random();
        let payload = Payload {
            msg: plaintext,
            aad: &self.label,
        };
        match cipher.encrypt(&XNonce::from(nonce), payload) {
            Ok(sealed) => {
                let mut datagram = Vec::with_capacity(24 + sealed.len());
                datagram.extend_from_slice(&nonce);
                datagram.extend_from_slice(&sealed);
                datagram
            }
            // Only an over-long plaintext fails; a datagram never is.
            Err(_) => Vec::new(),
        }
    }

    /// Opens a datagram with any key of the ring; `None` if none opens it.
    pub fn open(&self, datagram: &[u8]) -> Option<Vec<u8>> {
        if self.ciphers.is_empty() {
            return Some(datagram.to_vec());
        }
        if datagram.len() < 24 + 16 {
            return None;
        }
        let (nonce, sealed) = datagram.split_at(24);
        let nonce: [u8; 24] = nonce.try_into().ok()?;
        let nonce = XNonce::from(nonce);
        self.ciphers.iter().find_map(|cipher| {
            cipher
                .decrypt(
                    &nonce,
                    Payload {
                        msg: sealed,
                        aad: &self.label,
                    },
                )
                .ok()
        })
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
            fault: None,
            leaving: false,
        }
    }

    async fn read_back(bytes: &[u8]) -> Result<Option<Frame>, ReadError> {
        let mut reader = bytes;
        read_frame(&mut reader).await
    }

    #[actix_rt::test]
    async fn a_frame_signed_by_the_pinned_key_opens_to_what_was_announced() {
        let key = NodeKey::generate();
        let bytes = encode(&key, "poolgate", "n1", 7, &announcement());
        let frame = read_back(&bytes).await.unwrap().unwrap();
        assert_eq!((frame.node.as_str(), frame.seq), ("n1", 7));
        assert_eq!(
            frame.open(&key.public(), "poolgate").unwrap(),
            announcement()
        );
        // Another key, another cluster label: refused.
        let other = NodeKey::generate();
        assert_eq!(
            frame.open(&other.public(), "poolgate"),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            frame.open(&key.public(), "other"),
            Err(Refused::BadSignature)
        );
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
