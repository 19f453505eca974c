//! Validated names: node, pool and run ids, and the pool's epoch.
//!
//! An id is made once, at the edge (config, replay, embedding API), and is
//! valid from then on: 1 to 128 bytes of UTF-8 with no control characters
//! (design §1). Ids are cheap to clone (`Arc<str>`), because the same node id
//! travels in every message about that node.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// Longest id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Why a string is not a valid id. Nothing was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidId {
    /// The string was empty.
    #[error("{kind} id is empty")]
    Empty {
        /// Which kind of id was being made.
        kind: &'static str,
    },
    /// The string was longer than [`MAX_ID_BYTES`].
    #[error("{kind} id is {len} bytes long, the limit is {MAX_ID_BYTES}")]
    TooLong {
        /// Which kind of id was being made.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The string held a control character.
    #[error("{kind} id contains a control character")]
    ControlCharacter {
        /// Which kind of id was being made.
        kind: &'static str,
    },
}

fn validate(kind: &'static str, text: &str) -> Result<(), InvalidId> {
    if text.is_empty() {
        return Err(InvalidId::Empty { kind });
    }
    if text.len() > MAX_ID_BYTES {
        return Err(InvalidId::TooLong {
            kind,
            len: text.len(),
        });
    }
    if text.chars().any(char::is_control) {
        return Err(InvalidId::ControlCharacter { kind });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Checks `text` (design §1) and wraps it.
            pub fn new(text: &str) -> Result<Self, InvalidId> {
                validate($kind, text)?;
                Ok(Self(Arc::from(text)))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        /// Lets maps keyed by id be searched with the `&str` as it
        /// arrives (the derived `Hash`/`Eq` are those of the text).
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(text: &str) -> Result<Self, InvalidId> {
                Self::new(text)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        /// Checked as [`Self::new`] checks it.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::new(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A candidate (or any SWIM member) by name.
    NodeId,
    "node"
);
string_id!(
    /// The candidate pool by name.
    PoolId,
    "pool"
);
string_id!(
    /// One run planned over the pool.
    RunId,
    "run"
);

/// The number of one `PoolReady`: 1, 2, … per gate, never reused, so a
/// token from an earlier readiness cannot commit a plan (design §2–3).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_one_to_128_bytes_without_control_characters_are_valid() {
        assert!(NodeId::new("a").is_ok());
        assert!(NodeId::new(&"x".repeat(128)).is_ok());
        assert!(NodeId::new("nœud-1").is_ok());
    }

    #[test]
    fn empty_long_and_control_character_ids_are_refused() {
        assert_eq!(NodeId::new(""), Err(InvalidId::Empty { kind: "node" }));
        assert_eq!(
            RunId::new(&"x".repeat(129)),
            Err(InvalidId::TooLong {
                kind: "run",
                len: 129
            })
        );
        assert_eq!(
            PoolId::new("a\nb"),
            Err(InvalidId::ControlCharacter { kind: "pool" })
        );
    }
}
