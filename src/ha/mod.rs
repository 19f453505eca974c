//! Orchestrator replicas on etcd (design §12), the room of what changes
//! together when failover does: the etcd client, the leadership among
//! replicas, and the runs asked of whichever replica leads. The state the
//! replicas share is a store like the others ([`crate::state::etcd`]).
//!
//! - [`etcd`]: a small etcd v3 client over the JSON gateway (no feature).
//! - [`replica`] (feature `live`): campaigning for the `leader` key,
//!   following, and each term's orchestrator.
//! - `requests` (feature `live`): a run asked through etcd by
//!   `poolgate run` and served by the leader; a requester's lease.

#[doc(hidden)]
pub mod etcd;
#[cfg(feature = "live")]
pub mod replica;
#[cfg(feature = "live")]
#[doc(hidden)]
pub mod requests;
