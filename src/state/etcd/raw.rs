//! The keys the run requests use (design §12: `requests/`, `alive/`,
//! `requested/`, `runs/`, `waiting/`, `finish/`), read and written as
//! they are, each sealed under the state key when there is one; the
//! gate's own records go through the checked, fenced path of the parent.

use std::sync::Arc;
use std::time::Duration;

use poolgate_actors::StoreError;

use super::{read_in_txn, EtcdStore, Listing};
use crate::ha::etcd::{self, Etcd};

/// What a key holds, read in one transaction with the leader key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfLeader {
    /// The value (as [`EtcdStore::get_raw`] reads it).
    pub value: Option<Vec<u8>>,
    /// Whether the replica leading now wrote it: its last change came
    /// after the leader key was created (false with no leader).
    pub by_leader_now: bool,
    /// The lease the leader key is on; none when no replica leads.
    pub leader_lease: Option<i64>,
}

impl EtcdStore {
    /// What `name` holds, read with the leader key in one transaction:
    /// a record a replica publishes, and whether the one leading now
    /// wrote it.
    pub fn get_raw_of_leader(&self, name: &str) -> Result<OfLeader, StoreError> {
        let key = self.key(name);
        let (_, answer) = self
            .etcd
            .txn(
                vec![],
                vec![etcd::range(&self.leader), etcd::range(&key)],
                vec![],
            )
            .map_err(|e| StoreError(e.to_string()))?;
        let leader = read_in_txn(&answer, 0).filter(|kv| kv.lease != 0);
        let held = read_in_txn(&answer, 1);
        Ok(OfLeader {
            by_leader_now: match (&leader, &held) {
                (Some(leader), Some(held)) => held.mod_revision > leader.create_revision,
                _ => false,
            },
            leader_lease: leader.map(|kv| kv.lease),
            value: held.and_then(|kv| self.open(name, kv.value)),
        })
    }

    /// What `name` holds under the prefix, unchecked (the run requests).
    pub fn get_raw(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.etcd
            .get(&self.key(name))
            .map(|kv| kv.and_then(|kv| self.open(name, kv.value)))
            .map_err(|e| StoreError(e.to_string()))
    }

    /// Every `(name, value)` under `dir` (a name ending in `/`).
    pub fn list_raw(&self, dir: &str) -> Result<Listing, StoreError> {
        let kvs = self
            .etcd
            .get_prefix(&self.key(dir))
            .map_err(|e| StoreError(e.to_string()))?;
        Ok(self.named(dir, kvs))
    }

    /// Watches the requests' keys (`alive/`, `finish/`, `requested/`,
    /// `requests/`, and what sorts between them: the prefix's `cluster`,
    /// `format` and `leader`, seldom written) for `span` at most,
    /// calling `changed` for each batch of changes (see
    /// [`Etcd::watch_range`]).
    pub fn watch_requests(&self, span: Duration, changed: impl FnMut()) -> Result<(), StoreError> {
        self.etcd
            .watch_range(&self.key("alive/"), &self.key("requests0"), span, changed)
            .map_err(|e| StoreError(e.to_string()))
    }

    /// What [`EtcdStore::list_raw`] gives for each of `dirs`, read in one
    /// transaction (one request, one revision: a consistent look).
    pub fn list_raw_all(&self, dirs: &[&str]) -> Result<Vec<Listing>, StoreError> {
        let ranges = dirs
            .iter()
            .map(|dir| etcd::prefix_range(&self.key(dir)))
            .collect();
        let (_, answer) = self
            .etcd
            .txn(vec![], ranges, vec![])
            .map_err(|e| StoreError(e.to_string()))?;
        let responses = answer["responses"].as_array().cloned().unwrap_or_default();
        if responses.len() != dirs.len() {
            return Err(StoreError(format!(
                "etcd answered {} reads of {}",
                responses.len(),
                dirs.len()
            )));
        }
        Ok(dirs
            .iter()
            .zip(responses)
            .map(|(dir, response)| self.named(dir, etcd::kvs(&response["response_range"])))
            .collect())
    }

    /// The keys under `dir` by name, each value opened (what fails its
    /// MAC is left out, counted and logged by `open`).
    fn named(&self, dir: &str, kvs: Vec<etcd::KeyValue>) -> Listing {
        let full = format!("{}{dir}", self.prefix);
        kvs.into_iter()
            .filter_map(|kv| {
                let key = String::from_utf8(kv.key).ok()?;
                let name = key.strip_prefix(&full)?.to_string();
                let value = self.open(&format!("{dir}{name}"), kv.value)?;
                Some((name, value))
            })
            .collect()
    }

    /// Puts `value` under `name`, unconditioned (a request any replica or
    /// `run` may make), on `lease` (0: none).
    pub fn put_raw(&self, name: &str, value: &[u8], lease: i64) -> Result<(), StoreError> {
        self.put_raw_all(&[(name, value)], lease)
    }

    /// Puts each `(name, value)` of `puts` in one transaction, as
    /// [`EtcdStore::put_raw`] does one.
    pub fn put_raw_all(&self, puts: &[(&str, &[u8])], lease: i64) -> Result<(), StoreError> {
        let puts = puts
            .iter()
            .map(|(name, value)| etcd::put(&self.key(name), &self.seal(name, value), lease))
            .collect();
        self.etcd
            .txn(vec![], puts, vec![])
            .map(drop)
            .map_err(|e| StoreError(e.to_string()))
    }

    /// What is left of `lease` and the TTL it was granted (whole seconds,
    /// as etcd says them); `None` when it is gone.
    pub fn lease_left(&self, lease: i64) -> Result<Option<(Duration, Duration)>, StoreError> {
        self.etcd
            .time_to_live(lease)
            .map_err(|e| StoreError(e.to_string()))
    }

    /// The etcd client.
    pub fn etcd(&self) -> &Arc<Etcd> {
        &self.etcd
    }

    /// Deletes `name`.
    pub fn delete_raw(&self, name: &str) -> Result<(), StoreError> {
        self.etcd
            .delete(&self.key(name))
            .map_err(|e| StoreError(e.to_string()))
    }

    /// Puts `value` under `name` (on `lease`, 0: none) if this store's
    /// term still leads.
    pub fn put_fenced(&self, name: &str, value: &[u8], lease: i64) -> Result<(), StoreError> {
        let term = self.writing_term().map_err(StoreError)?;
        let (succeeded, answer) = self
            .etcd
            .txn(
                vec![etcd::created_at(&self.leader, term)],
                vec![etcd::put(&self.key(name), &self.seal(name, value), lease)],
                // On a refusal, etcd also says what the leader key is now.
                vec![etcd::range(&self.leader)],
            )
            .map_err(|e| StoreError(e.to_string()))?;
        if !succeeded {
            let leader = read_in_txn(&answer, 0).map(|kv| kv.create_revision);
            tracing::warn!(key = %format!("{}{name}", self.prefix), term, leader_created = ?leader, "etcd refused a write of this term: the leader key is no longer this term's (created at the revision shown; none: gone)");
            self.fence.end(term);
            return Err(StoreError("leadership lost: nothing written".into()));
        }
        Ok(())
    }
}
