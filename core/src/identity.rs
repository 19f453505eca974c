//! Data-plane identity material and its fingerprint.
//!
//! The gate compares identities by SHA-256 fingerprint and keeps only the
//! fingerprint. The bytes never reach a log, an error or an event: the
//! `Debug` form of [`IdentityMaterial`] prints the fingerprint.

use std::fmt;

use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

/// Largest identity material accepted, in bytes (design §1).
pub const MAX_IDENTITY_BYTES: usize = 16 * 1024;

/// Why identity material was refused. The node keeps the identity it had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidIdentity {
    /// No bytes at all.
    #[error("identity material is empty")]
    Empty,
    /// More than [`MAX_IDENTITY_BYTES`].
    #[error("identity material is {len} bytes, the limit is {MAX_IDENTITY_BYTES}")]
    TooLarge {
        /// Its length in bytes.
        len: usize,
    },
    /// Text that should have carried the bytes could not be decoded.
    #[error("identity material is not valid base64")]
    NotBase64,
    /// A recorded fingerprint is not 64 hex digits.
    #[error("identity fingerprint is not 64 hex digits")]
    NotFingerprint,
}

/// The SHA-256 of a node's identity material.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from its 64 lowercase or uppercase hex digits (as
    /// events and recordings print it); `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        bytes.try_into().ok().map(Fingerprint)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{self}")
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Fingerprint::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("not a sha256 fingerprint (64 hex digits)"))
    }
}

/// A node's data-plane identity material: 1 byte to 16 KiB, validated when
/// made. Only its fingerprint is ever shown.
#[derive(Clone, PartialEq, Eq)]
pub struct IdentityMaterial {
    bytes: Vec<u8>,
    fingerprint: Fingerprint,
}

impl IdentityMaterial {
    /// Checks the size and computes the fingerprint.
    pub fn new(bytes: Vec<u8>) -> Result<Self, InvalidIdentity> {
        if bytes.is_empty() {
            return Err(InvalidIdentity::Empty);
        }
        if bytes.len() > MAX_IDENTITY_BYTES {
            return Err(InvalidIdentity::TooLarge { len: bytes.len() });
        }
        let fingerprint = Fingerprint::of(&bytes);
        Ok(Self { bytes, fingerprint })
    }

    /// The fingerprint the gate compares and publishes.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The bytes themselves, for an embedder that hands them on to the data
    /// plane. Do not log them.
    pub fn expose_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for IdentityMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityMaterial")
            .field("len", &self.bytes.len())
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_material_must_be_one_byte_to_sixteen_kib() {
        assert_eq!(IdentityMaterial::new(vec![]), Err(InvalidIdentity::Empty));
        assert!(IdentityMaterial::new(vec![7; MAX_IDENTITY_BYTES]).is_ok());
        assert_eq!(
            IdentityMaterial::new(vec![7; MAX_IDENTITY_BYTES + 1]),
            Err(InvalidIdentity::TooLarge {
                len: MAX_IDENTITY_BYTES + 1
            })
        );
    }

    #[test]
    fn debug_output_shows_the_fingerprint_and_never_the_bytes() {
        let material = IdentityMaterial::new(b"secret-key-bytes".to_vec()).unwrap();
        let shown = format!("{material:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(
            !shown.contains(&hex::encode(b"secret-key-bytes")),
            "{shown}"
        );
        assert!(shown.contains(&material.fingerprint().to_string()));
    }

    #[test]
    fn fingerprint_is_the_sha256_of_the_bytes() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            Fingerprint::of(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
