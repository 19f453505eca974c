//! Gossip sealing for poolgate (design §8): every SWIM datagram is
//! `nonce (24 bytes) ‖ ciphertext`, XChaCha20-Poly1305 under the first key
//! of the ring with the cluster label as associated data; opening tries
//! every key of the ring.
//!
//! ```
//! use poolgate_seal::{Sealer, NONCE, TAG};
//!
//! let (old, new) = ([7u8; 32], [9u8; 32]);
//! // Mid-rotation: the new key seals, both open.
//! let rotating = Sealer::new(&[new, old], "cluster-a");
//! let sealed = rotating.seal(b"ping", [1u8; NONCE]);
//! assert_eq!(sealed.len(), NONCE + b"ping".len() + TAG);
//! assert_eq!(Sealer::new(&[new], "cluster-a").open(&sealed).as_deref(), Some(&b"ping"[..]));
//! // Another cluster's label, or a key left out of the ring, opens nothing.
//! assert_eq!(Sealer::new(&[new], "cluster-b").open(&sealed), None);
//! assert_eq!(Sealer::new(&[old], "cluster-a").open(&sealed), None);
//! ```
//!
//! A crate of its own so that it is compiled optimised even in debug
//! builds (see the workspace's `[profile.dev.package.poolgate-seal]`):
//! the AEAD's generic code is instantiated here, not in the crate that
//! calls it, and a datagram no key opens must cost microseconds, not the
//! tens of them an unoptimised build spends, or a garbage flood against a
//! debug build starves SWIM.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// The nonce's length in bytes.
pub const NONCE: usize = 24;
/// The authentication tag's length in bytes.
pub const TAG: usize = 16;

/// A keyring: the first key seals, every key opens. An empty ring passes
/// datagrams through as they are (`insecure = true`).
#[derive(Clone)]
pub struct Sealer {
    ciphers: Vec<XChaCha20Poly1305>,
    label: Vec<u8>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer({} keys)", self.ciphers.len())
    }
}

impl Sealer {
    /// A ring of 32-byte `keys` for the cluster `label`.
    pub fn new(keys: &[[u8; 32]], label: &str) -> Self {
        let ciphers = keys
            .iter()
            .filter_map(|k| XChaCha20Poly1305::new_from_slice(k).ok())
            .collect();
        Sealer {
            ciphers,
            label: label.as_bytes().to_vec(),
        }
    }

    /// Seals `plaintext` with `nonce` (random, never reused under a key),
    /// or passes it through with no keys.
    pub fn seal(&self, plaintext: &[u8], nonce: [u8; NONCE]) -> Vec<u8> {
        let Some(cipher) = self.ciphers.first() else {
            return plaintext.to_vec();
        };
        let payload = Payload {
            msg: plaintext,
            aad: &self.label,
        };
        match cipher.encrypt(&XNonce::from(nonce), payload) {
            Ok(sealed) => {
                let mut datagram = Vec::with_capacity(NONCE + sealed.len());
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
        if datagram.len() < NONCE + TAG {
            return None;
        }
        let (nonce, sealed) = datagram.split_at(NONCE);
        let nonce: [u8; NONCE] = nonce.try_into().ok()?;
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

    #[test]
    fn a_sealed_datagram_opens_with_any_key_of_the_ring_and_the_same_label_only() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let datagram = Sealer::new(&[new], "poolgate").seal(b"swim", [7; NONCE]);
        assert_ne!(&datagram[NONCE..], b"swim");
        let ring = Sealer::new(&[old, new], "poolgate");
        assert_eq!(ring.open(&datagram).as_deref(), Some(&b"swim"[..]));
        assert_eq!(Sealer::new(&[old], "poolgate").open(&datagram), None);
        assert_eq!(Sealer::new(&[new], "other").open(&datagram), None);
        assert_eq!(ring.open(b"short"), None);
        assert_eq!(
            Sealer::new(&[], "x").open(b"plain").as_deref(),
            Some(&b"plain"[..])
        );
    }
}
