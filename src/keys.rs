//! Key files: a node's Ed25519 signing key and the cluster's gossip keys
//! (`poolgate keygen`), and the pinned public keys of `[registry]`.
//!
//! A key file is one line, its kind then the standard base64 of the key's
//! 32 bytes: `poolgate-signing-key:<base64>` or
//! `poolgate-cluster-key:<base64>`, written with mode 0600. A key of the
//! other kind is refused, naming both (a cluster key where a signing key
//! belongs would otherwise load silently: same length, same encoding). A
//! line of bare base64 (files written before the tag) is read as either. A public key is written `ed25519:<base64>` (the
//! 32 bytes of the verifying key). Keys never appear in logs or errors.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use ed25519_dalek::{SigningKey, VerifyingKey};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Why a key could not be written or read. Never holds key bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("{file}: {source}")]
    Io {
        /// The key file.
        file: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file exists already: keygen never overwrites a key.
    #[error("{0}: exists already; keygen does not overwrite a key (remove it first)")]
    Exists(PathBuf),
    /// The file does not hold a key of the expected form.
    #[error("{file}: {what}")]
    Malformed {
        /// The key file.
        file: PathBuf,
        /// What is wrong with it.
        what: &'static str,
    },
    /// A key file others may read.
    #[error("{0}: readable by others (mode {1:o}); chmod 600 it")]
    Exposed(PathBuf, u32),
    /// A key file of the other kind.
    #[error("{file}: holds a {found}, not a {wanted}")]
    WrongKind {
        /// The key file.
        file: PathBuf,
        /// What it holds.
        found: &'static str,
        /// What was asked for.
        wanted: &'static str,
    },
    /// A public key is not `ed25519:<base64 of 32 bytes>`.
    #[error("`{0}` is not a public key like \"ed25519:<base64 of 32 bytes>\"")]
    BadPublicKey(String),
}

/// A node's signing key (its `Debug` shows the public key only).
#[derive(Clone)]
pub struct NodeKey(SigningKey);

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKey({})", PublicKey(self.0.verifying_key()))
    }
}

impl NodeKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        NodeKey(SigningKey::from_bytes(&rand::random::<[u8; 32]>()))
    }

    /// A key from its 32 secret bytes (an embedder's secret store).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        NodeKey(SigningKey::from_bytes(&bytes))
    }

    /// Reads a key file written by `poolgate keygen`.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        Ok(NodeKey(SigningKey::from_bytes(&read_key(
            path,
            Kind::Signing,
        )?)))
    }

    /// Writes the key to a new file, mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        write_key(path, Kind::Signing, &self.0.to_bytes())
    }

    /// The key's public half, as the registry pins it.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        self.0.sign(message).to_bytes()
    }
}

/// A node's public key, pinned in `[registry]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Parses `ed25519:<base64>`.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let bad = || KeyError::BadPublicKey(text.chars().take(80).collect());
        let encoded = text.strip_prefix("ed25519:").ok_or_else(bad)?;
        let bytes: [u8; 32] = B64
            .decode(encoded)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(bad)?;
        VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|_| bad())
    }

    /// A public key from its 32 bytes; refused if they are not a point
    /// of the curve.
    pub fn from_bytes(bytes: [u8; 32]) -> Result<Self, KeyError> {
        VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|_| KeyError::BadPublicKey(format!("ed25519:{}", B64.encode(bytes))))
    }

    /// Its 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// A short name for the key (the first 8 bytes of its SHA-256, hex):
    /// what is kept with a node's frame sequence, so a new key starts its
    /// sequences over.
    pub fn id(&self) -> String {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(self.0.to_bytes())[..8])
    }

    /// Whether `signature` is this key's over `message` (strict Ed25519).
    pub fn verifies(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        let signature = ed25519_dalek::Signature::from_bytes(signature);
        self.0.verify_strict(message, &signature).is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519:{}", B64.encode(self.0.to_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A 32-byte cluster gossip key (its `Debug` shows nothing of it).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(pub(crate) [u8; 32]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        ClusterKey(rand::random())
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterKey(bytes)
    }

    /// Reads a key file written by `poolgate keygen --cluster`.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        read_key(path, Kind::Cluster).map(ClusterKey)
    }

    /// Writes the key to a new file, mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        write_key(path, Kind::Cluster, &self.0)
    }
}

/// What a key file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Signing,
    Cluster,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Signing, Kind::Cluster];

    fn tag(self) -> &'static str {
        match self {
            Kind::Signing => "poolgate-signing-key:",
            Kind::Cluster => "poolgate-cluster-key:",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Signing => "node signing key (poolgate keygen)",
            Kind::Cluster => "cluster gossip key (poolgate keygen --cluster)",
        }
    }
}

fn write_key(path: &Path, kind: Kind, key: &[u8; 32]) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        file: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists(path.to_path_buf()),
            _ => io(e),
        })?;
    writeln!(file, "{}{}", kind.tag(), B64.encode(key)).map_err(io)?;
    file.sync_all().map_err(io)
}

fn read_key(path: &Path, wanted: Kind) -> Result<[u8; 32], KeyError> {
    let io = |source| KeyError::Io {
        file: path.to_path_buf(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(io)?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Exposed(path.to_path_buf(), mode));
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let malformed = |what| KeyError::Malformed {
        file: path.to_path_buf(),
        what,
    };
    let text = text.trim();
    let body = match Kind::ALL.into_iter().find(|k| text.starts_with(k.tag())) {
        Some(kind) if kind == wanted => &text[kind.tag().len()..],
        Some(kind) => {
            return Err(KeyError::WrongKind {
                file: path.to_path_buf(),
                found: kind.name(),
                wanted: wanted.name(),
            })
        }
        None => text,
    };
    let bytes = B64
        .decode(body)
        .map_err(|_| malformed("not a key file (one line: its kind, then base64)"))?;
    bytes.try_into().map_err(|_| malformed("not a 32-byte key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("poolgate-keys-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_saved_signing_key_loads_back_private_and_verifies_its_own_signatures() {
        let dir = scratch("sign");
        let key = NodeKey::generate();
        let path = dir.join("n.key");
        key.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = NodeKey::load(&path).unwrap();
        assert_eq!(loaded.public(), key.public());
        let signature = loaded.sign(b"hello");
        assert!(key.public().verifies(b"hello", &signature));
        assert!(!key.public().verifies(b"hellO", &signature));
        assert!(matches!(key.save(&path), Err(KeyError::Exists(_))));
        let text = key.public().to_string();
        assert_eq!(PublicKey::parse(&text).unwrap(), key.public());
    }

    #[test]
    fn exposed_or_malformed_key_files_are_refused_without_showing_them() {
        let dir = scratch("bad");
        let path = dir.join("c.key");
        ClusterKey::generate().save(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            ClusterKey::load(&path),
            Err(KeyError::Exposed(..))
        ));
        std::fs::write(&path, "not base64!\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(error.contains("not a key file"), "{error}");
        assert!(PublicKey::parse("ed25519:AAAA").is_err());
        assert!(PublicKey::parse("rsa:xyz").is_err());
    }

    #[test]
    fn a_key_of_the_other_kind_is_refused_naming_both_and_an_untagged_one_still_loads() {
        let dir = scratch("kinds");
        let cluster = dir.join("cluster.key");
        ClusterKey::generate().save(&cluster).unwrap();
        let text = std::fs::read_to_string(&cluster).unwrap();
        assert!(text.starts_with("poolgate-cluster-key:"), "tagged");
        let error = NodeKey::load(&cluster).unwrap_err().to_string();
        assert!(
            error.contains("cluster gossip key") && error.contains("node signing key"),
            "{error}"
        );
        let signing = dir.join("node.key");
        NodeKey::generate().save(&signing).unwrap();
        assert!(matches!(
            ClusterKey::load(&signing),
            Err(KeyError::WrongKind { .. })
        ));
        // A file from before the tag: bare base64.
        let old = dir.join("old.key");
        std::fs::write(&old, format!("{}\n", B64.encode([7u8; 32]))).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            ClusterKey::load(&old).unwrap(),
            ClusterKey::from_bytes([7; 32])
        );
    }
}
