//! Any bytes as a sealed gossip datagram: opened or dropped, never a
//! panic; and whatever is sealed opens to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::live::keys::ClusterKey;
use poolgate::live::wire::Keyring;

fuzz_target!(|data: &[u8]| {
    let ring = Keyring::new(&[ClusterKey::from_bytes([7; 32])], "poolgate");
    let _ = ring.open(data);
    let sealed = ring.seal(data);
    assert_eq!(ring.open(&sealed).as_deref(), Some(data));
});
