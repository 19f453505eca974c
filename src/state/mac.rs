//! `[state] key`: a keyed MAC (HMAC-SHA256) on every record and request a
//! replica or a requester puts into etcd (docs/failover.md §4). What does not verify under the key is refused,
//! counted (`poolgate_state_unauthenticated_total`) and logged naming the
//! key; it never changes the gate, a run or a sequence.
//!
//! The MAC covers the key's full name with the value, so a value cannot
//! be moved to another key (a `finish/` put where a `requests/` was).

use sha2::{Digest, Sha256};

/// The length of a MAC, in bytes.
pub const MAC_LEN: usize = 32;

/// The 32-byte key shared by the replicas and the requesters (its `Debug`
/// shows nothing of it).
#[derive(Clone, PartialEq, Eq)]
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(…)")
    }
}

impl StateKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        StateKey(bytes)
    }

    /// The MAC of `value` stored under the key named `name`.
    pub fn mac(&self, name: &[u8], value: &[u8]) -> [u8; MAC_LEN] {
        let length = u64::try_from(name.len()).unwrap_or(u64::MAX).to_be_bytes();
        hmac_sha256(&self.0, &[&length, name, value])
    }

    /// Whether `mac` is the MAC of `value` under `name` (in constant time).
    pub fn verifies(&self, name: &[u8], value: &[u8], mac: &[u8]) -> bool {
        let expected = self.mac(name, value);
        mac.len() == MAC_LEN
            && expected
                .iter()
                .zip(mac)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    /// `value` sealed for `name`: its MAC, then the value.
    pub fn seal(&self, name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut sealed = Vec::with_capacity(MAC_LEN + value.len());
        sealed.extend_from_slice(&self.mac(name, value));
        sealed.extend_from_slice(value);
        sealed
    }

    /// The value sealed for `name` in `sealed`, if its MAC verifies.
    pub fn open<'a>(&self, name: &[u8], sealed: &'a [u8]) -> Option<&'a [u8]> {
        let (mac, value) = sealed.split_at_checked(MAC_LEN)?;
        self.verifies(name, value, mac).then_some(value)
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_gives_rfc_4231s_values() {
        // RFC 4231, test cases 1, 2 and 6 (a key longer than a block).
        let case = |key: &[u8], data: &[u8]| hex::encode(hmac_sha256(key, &[data]));
        assert_eq!(
            case(&[0x0b; 20], b"Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            case(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            case(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        // Parts are one message.
        assert_eq!(
            hmac_sha256(b"Jefe", &[b"what do ya ", b"want for nothing?"]),
            hmac_sha256(b"Jefe", &[b"what do ya want for nothing?"])
        );
    }

    #[test]
    fn a_sealed_value_opens_only_under_its_key_and_name_unchanged() {
        let key = StateKey::from_bytes([7; 32]);
        let sealed = key.seal(b"/p/finish/r1", b"{}");
        assert_eq!(key.open(b"/p/finish/r1", &sealed), Some(&b"{}"[..]));
        assert_eq!(key.open(b"/p/requests/r1", &sealed), None, "moved");
        assert_eq!(
            StateKey::from_bytes([8; 32]).open(b"/p/finish/r1", &sealed),
            None,
            "another key"
        );
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(key.open(b"/p/finish/r1", &flipped), None, "changed");
        assert_eq!(key.open(b"/p/finish/r1", b"short"), None);
        assert_eq!(format!("{key:?}"), "StateKey(…)");
    }
}
