//! `[state] etcd`: the durable state of orchestrator replicas in etcd v3
//! (design §12), under a prefix naming the cluster label and the pool.
//!
//! Keys under the prefix: `leader` (the leading replica, on its lease),
//! `format`, `cluster` (label and pool, so a prefix of another cluster is
//! refused), and the records of [`super`] with their checksums. Every
//! write is one transaction conditioned on the `leader` key still being
//! the one this replica created ([`Fence`]): a deposed leader's write
//! fails and changes nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use poolgate_actors::core::Durable;
use poolgate_actors::{StateStore, StoreError};
use serde_json::Value;

use super::mac::StateKey;
use super::records::{
    checksum, checksum_key, decode_registry, decode_sequences, decode_state, encode_registry,
    encode_sequences, encode_state, verified, FORMAT,
};
use super::{OrchestratorStore, StateError};
use crate::ha::etcd::{self, Etcd};

mod fence;
mod raw;

pub use fence::{Fence, LeaderTerm};

/// Where a pool with no record yet starts, among pools kept apart under
/// a prefix that holds `prefix_held`: above every epoch the prefix itself
/// told (a one-pool deployment's, before it kept pools apart), so no
/// epoch is told twice; with no run.
pub fn new_pool_state(prefix_held: Option<&Durable>) -> Durable {
    Durable {
        last_epoch: prefix_held.map_or(0, |held| held.last_epoch),
        run: None,
    }
}

/// The default prefix: `/poolgate/<label>/<pool>/`.
pub fn default_prefix(label: &str, pool: &str) -> String {
    format!("/poolgate/{label}/{pool}/")
}

/// What the prefix holds: the gate's state and the agent sequences.
pub type StoredRecords = (Durable, BTreeMap<String, u64>);

/// The keys under one folder of the prefix, by name, each with its value.
pub type Listing = Vec<(String, Vec<u8>)>;

/// The durable state in etcd.
#[derive(Debug)]
pub struct EtcdStore {
    etcd: Arc<Etcd>,
    prefix: String,
    cluster: Value,
    fence: Arc<Fence>,
    /// The highest epoch this store (or a term's store bound from it)
    /// wrote.
    written: Arc<std::sync::atomic::AtomicU64>,
    /// The term this store writes in (none: it reads, and puts only the
    /// requests anyone may put), and the revision of each record it last
    /// read or wrote: a write lands only while both still hold.
    bound: Option<Bound>,
    /// `[state] key`: every record and request carries its MAC.
    mac: Option<StateKey>,
    /// How many values failed their MAC (logged at the 1st, 2nd, 4th, …).
    forged: Arc<std::sync::atomic::AtomicU64>,
    /// The `leader` key every write is fenced by: under this prefix, or
    /// for a pool's store ([`EtcdStore::for_pool`]) under the replicas'.
    leader: Vec<u8>,
}

/// What one read of the prefix gave.
struct Read {
    held: Option<StoredRecords>,
    /// The registry the replicas share, if written.
    registry: Option<BTreeMap<String, String>>,
    revisions: BTreeMap<String, i64>,
    /// The extra keys asked for that exist.
    extra: BTreeMap<String, Vec<u8>>,
}

/// What a requester reads of its run (see [`EtcdStore::standing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Whether a replica leads.
    pub led: bool,
    /// The stored state (none for a prefix never written).
    pub state: Option<Durable>,
    /// What became of the run, as the leader wrote it (unparsed).
    pub outcome: Option<Vec<u8>>,
}

/// What a term's writes are conditioned on (docs/failover.md §1).
#[derive(Debug)]
struct Bound {
    /// The `leader` key's create revision for the term.
    term: i64,
    /// Each record's last-change revision as this term knows it (absent:
    /// the record does not exist).
    revisions: Mutex<BTreeMap<String, i64>>,
    /// What this term tried to write to each record since its last write
    /// known to have landed (at most [`ATTEMPTS_KEPT`], the latest): a
    /// try whose answer was lost may have landed all the same.
    attempts: Mutex<BTreeMap<String, Vec<Vec<u8>>>>,
    /// The registry the replicas share, as this term read or wrote it.
    registry: Mutex<Option<BTreeMap<String, String>>>,
}

/// How many unconfirmed tries of a record a term remembers.
const ATTEMPTS_KEPT: usize = 16;

impl EtcdStore {
    /// The store under `prefix`, for the cluster `label` and `pool`,
    /// writing only within `fence`'s terms.
    pub fn new(etcd: Arc<Etcd>, prefix: &str, label: &str, pool: &str, fence: Arc<Fence>) -> Self {
        EtcdStore {
            etcd,
            leader: format!("{prefix}leader").into_bytes(),
            prefix: prefix.to_string(),
            cluster: serde_json::json!({ "label": label, "pool": pool }),
            fence,
            written: Arc::default(),
            bound: None,
            mac: None,
            forged: Arc::default(),
        }
    }

    /// The store of one of several pools (design §14): its records,
    /// requests and runs under `pools/<pool>/` of this prefix, its writes
    /// fenced by this prefix's `leader` key (one leader gates every pool).
    pub fn for_pool(&self, pool: &str) -> EtcdStore {
        let label = self.cluster["label"].as_str().unwrap_or_default();
        EtcdStore {
            etcd: Arc::clone(&self.etcd),
            leader: self.leader.clone(),
            prefix: format!("{}pools/{pool}/", self.prefix),
            cluster: serde_json::json!({ "label": label, "pool": pool }),
            fence: Arc::clone(&self.fence),
            written: Arc::default(),
            bound: None,
            mac: self.mac.clone(),
            forged: Arc::clone(&self.forged),
        }
    }

    /// The full key of `name`: under the prefix, but `leader`, which is
    /// the replicas' (see [`EtcdStore::for_pool`]).
    fn key_of(&self, name: &str) -> Vec<u8> {
        if name == "leader" {
            self.leader.clone()
        } else {
            self.key(name)
        }
    }

    /// Seals every record and request this store writes with `key`'s MAC,
    /// and refuses what it reads that does not verify under it.
    pub fn with_key(mut self, key: Option<StateKey>) -> Self {
        self.mac = key;
        self
    }

    /// `value` as stored under `name`: sealed when there is a key.
    fn seal(&self, name: &str, value: &[u8]) -> Vec<u8> {
        match &self.mac {
            Some(key) => key.seal(&self.key(name), value),
            None => value.to_vec(),
        }
    }

    /// What `stored` under `name` says, if it verifies (always, without a
    /// key); what does not is counted and logged naming the key.
    fn open(&self, name: &str, stored: Vec<u8>) -> Option<Vec<u8>> {
        let Some(key) = &self.mac else {
            return Some(stored);
        };
        if let Some(value) = key.open(&self.key(name), &stored) {
            return Some(value.to_vec());
        }
        self.forged(name);
        None
    }

    /// Counts and logs a value under `name` that failed its MAC.
    fn forged(&self, name: &str) {
        #[cfg(feature = "live")]
        metrics::counter!("poolgate_state_unauthenticated_total").increment(1);
        let count = 1 + self
            .forged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if count.is_power_of_two() {
            tracing::error!(key = %format!("{}{name}", self.prefix), refused = count, "refused: a value in etcd that does not verify under [state] key (written by someone without the key)");
        }
    }

    /// A store for the term whose `leader` key was created at `term`,
    /// starting from what etcd holds now: what it holds, and the store,
    /// whose every write is conditioned on that term and on each record
    /// being unchanged since this read (or its own last write). A write
    /// prepared in an earlier term, or against a record someone else
    /// changed, never lands; the term then ends ([`Fence::end`]).
    pub fn bind(&self, term: i64) -> Result<(Arc<EtcdStore>, Option<StoredRecords>), StateError> {
        let Read {
            held,
            registry,
            revisions,
            ..
        } = self.read_with(&[])?;
        let store = EtcdStore {
            etcd: Arc::clone(&self.etcd),
            leader: self.leader.clone(),
            prefix: self.prefix.clone(),
            cluster: self.cluster.clone(),
            fence: Arc::clone(&self.fence),
            written: Arc::clone(&self.written),
            mac: self.mac.clone(),
            forged: Arc::clone(&self.forged),
            bound: Some(Bound {
                term,
                revisions: Mutex::new(revisions),
                attempts: Mutex::default(),
                registry: Mutex::new(registry),
            }),
        };
        Ok((Arc::new(store), held))
    }

    /// The highest last epoch this store has written: what etcd must hold
    /// at least, unless its data was wiped or rolled back.
    pub fn written_epoch(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The key of `name` under the prefix.
    pub fn key(&self, name: &str) -> Vec<u8> {
        format!("{}{name}", self.prefix).into_bytes()
    }

    fn where_(&self) -> String {
        format!("etcd {} {}", self.etcd.endpoints(), self.prefix)
    }

    /// Reads what the prefix holds (a fresh prefix holds nothing: the
    /// default state). Another cluster's prefix, a newer format or a
    /// damaged record is an error naming the key.
    pub fn read(&self) -> Result<StoredRecords, StateError> {
        self.read_records().map(Option::unwrap_or_default)
    }

    /// As [`EtcdStore::read`]; `None` for a prefix never written (no
    /// format record): a replica that saw it written and then finds it so
    /// knows etcd's data was wiped.
    pub fn read_records(&self) -> Result<Option<StoredRecords>, StateError> {
        self.read_with(&[]).map(|read| read.held)
    }

    /// What a requester looks at to know that `run` is still guarded,
    /// read in one transaction: whether a replica leads (the `leader`
    /// key), the stored state, and what became of `run` (`runs/<run>`).
    pub fn standing(&self, run: &str) -> Result<Standing, StateError> {
        let outcome = format!("runs/{run}");
        let mut read = self.read_with(&["leader", &outcome])?;
        Ok(Standing {
            led: read.extra.contains_key("leader"),
            state: read.held.map(|(state, _)| state),
            outcome: read
                .extra
                .remove(&outcome)
                .and_then(|stored| self.open(&outcome, stored)),
        })
    }

    /// The records (with the last-change revision of each) and the
    /// `extra` keys, in one transaction.
    fn read_with(&self, extra: &[&str]) -> Result<Read, StateError> {
        let error = |what: String| StateError {
            file: self.where_(),
            what,
        };
        // The records' keys only, in one read (the prefix also holds the
        // run requests, however many).
        let names = [
            "format",
            "cluster",
            "state",
            "state.sha256",
            "state.mac",
            "sequences",
            "sequences.sha256",
            "sequences.mac",
            "registry",
            "registry.sha256",
            "registry.mac",
        ];
        let ranges = names
            .iter()
            .chain(extra)
            .map(|n| etcd::range(&self.key_of(n)))
            .collect();
        let (_, answer) = self
            .etcd
            .txn(vec![], ranges, vec![])
            .map_err(|e| error(e.to_string()))?;
        let mut revisions = BTreeMap::new();
        let mut held: BTreeMap<String, Vec<u8>> = answer["responses"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| etcd::kvs(&r["response_range"]))
            .filter_map(|kv| {
                let name = if kv.key == self.leader {
                    "leader".to_string()
                } else {
                    let key = String::from_utf8(kv.key).ok()?;
                    key.strip_prefix(&self.prefix)?.to_string()
                };
                revisions.insert(name.clone(), kv.mod_revision);
                Some((name, kv.value))
            })
            .collect();
        let extra: BTreeMap<String, Vec<u8>> = extra
            .iter()
            .filter_map(|name| Some((name.to_string(), held.remove(*name)?)))
            .collect();
        let named = |name: &str| format!("{}{name}", self.prefix);
        let format = match held.get("format") {
            None if !held.contains_key("state") => {
                return Ok(Read {
                    held: None,
                    registry: None,
                    revisions,
                    extra,
                })
            }
            None => return Err(error(format!("{}: missing", named("format")))),
            Some(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| error(format!("{}: not a format version", named("format"))))?,
        };
        if format > FORMAT {
            return Err(error(format!(
                "{}: written by a newer poolgate (state format {format}); this one reads format {FORMAT}",
                named("format")
            )));
        }
        let cluster: Option<Value> = held
            .get("cluster")
            .and_then(|bytes| serde_json::from_slice(bytes).ok());
        // The replicas' prefix of several pools holds no pool's state of
        // its own: any pool of the cluster's label is its (a one-pool
        // deployment's prefix is taken over whole when it grows pools).
        let ours = match (&cluster, self.cluster["pool"].as_str()) {
            (Some(held), Some("")) => held["label"] == self.cluster["label"],
            (held, _) => held.as_ref() == Some(&self.cluster),
        };
        if !ours {
            return Err(error(format!(
                "{}: the prefix holds another cluster's state ({}), not {}",
                named("cluster"),
                cluster.map_or_else(|| "none".to_string(), |c| c.to_string()),
                self.cluster
            )));
        }
        let record = |name: &str| -> Result<Option<Vec<u8>>, StateError> {
            let Some(record) = held.get(name) else {
                return Ok(None);
            };
            let sum = held.get(&checksum_key(name)).map(Vec::as_slice);
            let record = verified(name, record.clone(), sum, format)
                .map_err(|e| error(format!("{}: {e}", named(name))))?;
            if let Some(key) = &self.mac {
                let mac = held.get(&mac_key(name)).map_or(&[][..], Vec::as_slice);
                if !key.verifies(&self.key(name), &record, mac) {
                    self.forged(name);
                    return Err(error(format!(
                        "{}: does not verify under [state] key (written by someone without the key, or by replicas without one): refused",
                        named(name)
                    )));
                }
            }
            Ok(Some(record))
        };
        let state = match record("state")? {
            Some(bytes) => {
                decode_state(&bytes).map_err(|e| error(format!("{}: {e}", named("state"))))?
            }
            None => {
                return Err(error(format!(
                    "{}: damaged: no state record",
                    named("state")
                )))
            }
        };
        let sequences = match record("sequences")? {
            Some(bytes) => decode_sequences(&bytes)
                .map_err(|e| error(format!("{}: {e}", named("sequences"))))?,
            None => BTreeMap::new(),
        };
        let registry = match record("registry")? {
            Some(bytes) => Some(
                decode_registry(&bytes)
                    .map_err(|e| error(format!("{}: {e}", named("registry"))))?,
            ),
            None => None,
        };
        Ok(Read {
            held: Some((state, sequences)),
            registry,
            revisions,
            extra,
        })
    }

    /// The term this store writes in, while it is the replica's current
    /// term.
    fn writing_term(&self) -> Result<i64, String> {
        let Some(bound) = &self.bound else {
            return Err("not bound to a term: nothing written".into());
        };
        match self.fence.current() {
            Some(term) if term.created == bound.term => Ok(bound.term),
            Some(_) => Err("a write prepared in an earlier term: nothing written".into()),
            None => Err("not the leader: nothing written".into()),
        }
    }

    /// Puts `name`'s `record` (with its checksum, the format and the
    /// cluster) if this store's term still leads and `name` is as this
    /// term last read or wrote it; nothing otherwise, and the term ends.
    fn put(&self, name: &str, record: &[u8]) -> Result<(), StoreError> {
        let failed = |what: String| StoreError(format!("{}: {what}", self.where_()));
        let term = self.writing_term().map_err(failed)?;
        let Some(bound) = &self.bound else {
            return Err(failed("not bound to a term".into()));
        };
        {
            let mut attempts = lock(&bound.attempts);
            let tried = attempts.entry(name.to_string()).or_default();
            if tried.len() == ATTEMPTS_KEPT {
                tried.remove(0);
            }
            tried.push(record.to_vec());
        }
        // Once more at most: after finding a try of this term's own in
        // place (its revision then known).
        for _ in 0..2 {
            let revision = lock(&bound.revisions).get(name).copied().unwrap_or(0);
            let (succeeded, answer) = self
                .etcd
                .txn(
                    vec![
                        etcd::created_at(&self.leader, term),
                        etcd::modified_at(&self.key(name), revision),
                    ],
                    self.puts(name, record),
                    // On a refusal, etcd also says what holds now.
                    vec![etcd::range(&self.leader), etcd::range(&self.key(name))],
                )
                .map_err(|e| failed(e.to_string()))?;
            if succeeded {
                lock(&bound.revisions).insert(name.to_string(), etcd::revision(&answer));
                lock(&bound.attempts).remove(name);
                return Ok(());
            }
            // A try of this term's own that landed though its answer was
            // lost (an endpoint that timed out after applying it, the
            // call then tried on the next; or an earlier write that
            // failed so) is no change under the term: its revision is
            // taken and the write made on it.
            let tried = lock(&bound.attempts).get(name).cloned().unwrap_or_default();
            match own_write_landed(&answer, term, &tried) {
                Some(landed) => {
                    #[cfg(feature = "live")]
                    metrics::counter!("poolgate_state_own_write_found_total").increment(1);
                    tracing::info!(key = %format!("{}{name}", self.prefix), revision = landed, "a write of this term that landed though its answer was lost: taken as its own, written on");
                    lock(&bound.revisions).insert(name.to_string(), landed);
                }
                None => {
                    let leader = read_in_txn(&answer, 0).map(|kv| kv.create_revision);
                    let held = read_in_txn(&answer, 1).map(|kv| kv.mod_revision);
                    tracing::warn!(key = %format!("{}{name}", self.prefix), term, leader_created = ?leader, expected = revision, held = ?held, tries = tried.len(), "etcd refused a write of this term: the leader key is no longer this term's, or the record changed since this term last read or wrote it (and holds none of its tries)");
                    break;
                }
            }
        }
        self.fence.end(term);
        Err(failed(
            "leadership lost: etcd refused the write (the leader key is no longer this term's, or the record changed since this term read it)"
                .into(),
        ))
    }

    /// The puts of one write of `name`'s `record`: the format, the
    /// cluster, the record, its checksum and (with a key) its MAC.
    fn puts(&self, name: &str, record: &[u8]) -> Vec<Value> {
        let cluster = self.cluster.to_string();
        let mut puts = vec![
            etcd::put(&self.key("format"), FORMAT.to_string().as_bytes(), 0),
            etcd::put(&self.key("cluster"), cluster.as_bytes(), 0),
            etcd::put(&self.key(name), record, 0),
            etcd::put(&self.key(&checksum_key(name)), &checksum(record), 0),
        ];
        if let Some(key) = &self.mac {
            let mac = key.mac(&self.key(name), record);
            puts.push(etcd::put(&self.key(&mac_key(name)), &mac, 0));
        }
        puts
    }
}

/// The first key a transaction's `i`th read found, if any: a read of the
/// failure branch of a refused write, or of a transaction that only reads.
fn read_in_txn(answer: &Value, i: usize) -> Option<etcd::KeyValue> {
    let responses = answer["responses"].as_array()?;
    etcd::kvs(&responses.get(i)?["response_range"])
        .into_iter()
        .next()
}

/// The revision of a try of this term's own, if a refused write
/// (`answer`, its failure branch reading the leader key and the record)
/// finds one in place: the leader key still created at `term`, the record
/// holding exactly one of `tried`.
fn own_write_landed(answer: &Value, term: i64, tried: &[Vec<u8>]) -> Option<i64> {
    let ours = read_in_txn(answer, 0).is_some_and(|kv| kv.create_revision == term);
    let landed = read_in_txn(answer, 1).filter(|kv| tried.contains(&kv.value))?;
    ours.then_some(landed.mod_revision)
}

/// The key of `name`'s MAC.
fn mac_key(name: &str) -> String {
    format!("{name}.mac")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StateStore for EtcdStore {
    fn save(&self, state: &Durable) -> Result<(), StoreError> {
        let record = encode_state(state).map_err(StoreError)?;
        self.put("state", &record)?;
        self.written
            .fetch_max(state.last_epoch, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl OrchestratorStore for EtcdStore {
    fn sequences(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.read()
            .map(|(_, sequences)| sequences)
            .map_err(|e| StoreError(e.to_string()))
    }

    fn save_sequences(&self, sequences: &BTreeMap<String, u64>) -> Result<(), StoreError> {
        let record = encode_sequences(sequences).map_err(StoreError)?;
        self.put("sequences", &record)
    }

    fn shares_registry(&self) -> bool {
        true
    }

    /// As this term read it at its start, or last wrote it.
    fn shared_registry(&self) -> Result<Option<BTreeMap<String, String>>, StoreError> {
        Ok(self
            .bound
            .as_ref()
            .and_then(|bound| lock(&bound.registry).clone()))
    }

    /// Under the term, on the registry as this term last read or wrote
    /// it; only beside a state record (a prefix holding records but no
    /// state would read as damaged).
    fn save_registry(&self, registry: &BTreeMap<String, String>) -> Result<(), StoreError> {
        let Some(bound) = &self.bound else {
            return Err(StoreError("not bound to a term: nothing written".into()));
        };
        if !lock(&bound.revisions).contains_key("state") {
            return Err(StoreError(format!(
                "{}: no state record yet: the registry is written beside one",
                self.where_()
            )));
        }
        let record = encode_registry(registry).map_err(StoreError)?;
        self.put("registry", &record)?;
        *lock(&bound.registry) = Some(registry.clone());
        Ok(())
    }

    /// Among replicas with `[pools.<id>]` the term serves a pool a reload
    /// adds itself (its record bound to the term); this is only reached
    /// with `[pool]`, which gains pools by moving to `[pools.<id>]`: a
    /// restart of every replica.
    fn pool_record(
        self: Arc<Self>,
        pool: &poolgate_actors::core::PoolId,
    ) -> Result<(Arc<dyn StateStore>, Durable), StoreError> {
        Err(StoreError(format!(
            "pool {pool}: among replicas a configuration of one [pool] gains pools by moving to [pools.<id>] and restarting every replica"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused write's answer: its failure branch read the leader key
    /// (created at `leader`) and the record (holding `held`, changed at
    /// revision 42).
    fn refused(leader: i64, held: &[u8]) -> Value {
        let kv = |key: &[u8], value: &[u8], created: i64, changed: i64| {
            serde_json::json!({
                "key": etcd::b64(key),
                "value": etcd::b64(value),
                "create_revision": created.to_string(),
                "mod_revision": changed.to_string(),
            })
        };
        serde_json::json!({
            "succeeded": false,
            "responses": [
                {"response_range": {"kvs": [kv(b"/p/leader", b"{}", leader, leader)]}},
                {"response_range": {"kvs": [kv(b"/p/state", held, 7, 42)]}},
            ],
        })
    }

    #[test]
    fn a_refusal_finding_any_try_of_this_terms_own_in_place_is_no_change_under_it() {
        let tried = vec![b"v1".to_vec(), b"v2".to_vec()];
        // An earlier try (v1) landed though its answer was lost; the term
        // now writes v2: the record is its own, at revision 42.
        assert_eq!(own_write_landed(&refused(9, b"v1"), 9, &tried), Some(42));
        assert_eq!(own_write_landed(&refused(9, b"v2"), 9, &tried), Some(42));
        // Other bytes: someone else's change.
        assert_eq!(own_write_landed(&refused(9, b"v3"), 9, &tried), None);
        // The leader key another term's: whatever the record holds.
        assert_eq!(own_write_landed(&refused(10, b"v1"), 9, &tried), None);
        // Nothing read (an answer without the failure branch).
        assert_eq!(own_write_landed(&serde_json::json!({}), 9, &tried), None);
    }
}
