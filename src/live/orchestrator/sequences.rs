//! Agent frame sequences kept across restarts (design §8, replay
//! protection): written to the state store as they rise, read back at
//! start for the registry's keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use poolgate_actors::core::NodeId;

use crate::live::keys::PublicKey;
use crate::live::listener::{lock, pinned, Registry};
use crate::live::nodes::Nodes;
use crate::live::throttle::LOG_EVERY;

/// How often accepted sequences are written to the state file: a frame
/// captured in the last interval before a crash could be replayed once
/// after a restart, never an older one.
#[doc(hidden)]
pub const SEQUENCES_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// How long writing the sequences may fail before it is an error, not a
/// warning: longer than an etcd election.
const SEQUENCES_FAILING_IS_AN_ERROR: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes the sequences to `store` every [`SEQUENCES_EVERY`] while they
/// rise; told on `last` (the orchestrator stopping, no frame taken any
/// more), writes them once more, after any write under way, and ends.
pub(super) async fn keep_sequences(
    store: Arc<dyn crate::state::OrchestratorStore>,
    nodes: Arc<Mutex<Nodes>>,
    registry: Registry,
    last: tokio::sync::oneshot::Receiver<()>,
) {
    let mut written = HashMap::new();
    let mut said = crate::live::throttle::Throttle::new(LOG_EVERY);
    // Since when writing has failed: a write held up by an etcd election
    // is a warning; one failing for longer, an error.
    let mut failing_since: Option<std::time::Instant> = None;
    // None once its sender is gone without a word (the orchestrator
    // dropped, its tasks left running): the writer goes on.
    let mut last = Some(last);
    loop {
        let mut unheard = false;
        let stopping = match last.as_mut() {
            None => {
                tokio::time::sleep(SEQUENCES_EVERY).await;
                false
            }
            Some(told) => tokio::select! {
                () = tokio::time::sleep(SEQUENCES_EVERY) => false,
                result = told => {
                    unheard = result.is_err();
                    result.is_ok()
                }
            },
        };
        if unheard {
            last = None;
        }
        let Some((current, sequences)) = labelled(&nodes, &registry, &written) else {
            if stopping {
                return;
            }
            continue;
        };
        let saved = save(&store, sequences).await;
        if stopping {
            if let Err(e) = saved {
                metrics::counter!("poolgate_state_write_errors_total").increment(1);
                tracing::warn!(error = %e, "agent sequences not written at the stop");
            }
            return;
        }
        match saved {
            Ok(()) => {
                written = current;
                if let Some(since) = failing_since.take() {
                    tracing::info!(after = %crate::config::in_words(since.elapsed()), "agent sequences written again");
                }
            }
            Err(e) => {
                metrics::counter!("poolgate_state_write_errors_total").increment(1);
                let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                if let Some(held) = said.allow(std::time::Instant::now()) {
                    if since.elapsed() < SEQUENCES_FAILING_IS_AN_ERROR {
                        tracing::warn!(error = %e, held, "agent sequences not written (tried again every 100 ms)");
                    } else {
                        tracing::error!(error = %e, held, failing_for = %crate::config::in_words(since.elapsed()), "agent sequences not written (tried again every 100 ms)");
                    }
                }
            }
        }
    }
}

/// The sequences as they are now, if they differ from `written`: as held,
/// and as stored (each labelled with its node's key). Labelled under the
/// nodes' lock, where a key is replaced: a sequence is never stored under
/// a key that did not sign it.
fn labelled(
    nodes: &Mutex<Nodes>,
    registry: &Registry,
    written: &HashMap<NodeId, u64>,
) -> Option<(HashMap<NodeId, u64>, BTreeMap<String, u64>)> {
    let held = lock(nodes);
    if held.sequences() == written {
        return None;
    }
    let sequences = held
        .sequences()
        .iter()
        .map(|(node, seq)| (sequence_key(node, pinned(registry, node).as_ref()), *seq))
        .collect();
    Some((held.sequences().clone(), sequences))
}

/// Writes `sequences` off the actors' thread (a write ends with an fsync,
/// every 100 ms while nodes send frames).
async fn save(
    store: &Arc<dyn crate::state::OrchestratorStore>,
    sequences: BTreeMap<String, u64>,
) -> Result<(), crate::StoreError> {
    let writer = Arc::clone(store);
    tokio::task::spawn_blocking(move || writer.save_sequences(&sequences))
        .await
        .unwrap_or_else(|e| Err(crate::StoreError(e.to_string())))
}

/// How a node's last sequence is stored: `node@<key id>`, so that it
/// holds only for the key it was signed with.
pub(super) fn sequence_key(node: &NodeId, key: Option<&PublicKey>) -> String {
    match key {
        Some(key) => format!("{node}@{}", key.id()),
        None => node.to_string(),
    }
}

/// The stored sequences that still hold: each for the node's key in
/// `registry` (a node whose key was replaced, after a theft say, starts
/// over: a thief's sequence of 2^64 − 1 cannot lock the node out for good).
/// Entries stored before keys were noted hold for the node.
pub(super) fn restore_sequences(
    stored: std::collections::BTreeMap<String, u64>,
    registry: &std::collections::BTreeMap<NodeId, PublicKey>,
) -> HashMap<NodeId, u64> {
    let mut restored = HashMap::new();
    for (name, seq) in stored {
        let (node, key) = match name.rsplit_once('@') {
            Some((node, key)) if key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()) => {
                (node, Some(key))
            }
            _ => (name.as_str(), None),
        };
        let Ok(node) = NodeId::new(node) else {
            continue;
        };
        let pinned = registry.get(&node).map(PublicKey::id);
        match key {
            Some(key) if pinned.as_deref() != Some(key) => {
                tracing::info!(%node, "the node's key changed: its frame sequences start over");
            }
            _ => {
                restored.insert(node, seq);
            }
        }
    }
    restored
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::keys::NodeKey;
    use poolgate_actors::core::NodeId;

    #[test]
    fn a_stored_sequence_holds_only_for_the_key_it_was_signed_with() {
        // A thief with node-1's key sent sequence 2^64 − 1; node-1's key
        // was then replaced: its sequences start over, node-2's hold.
        let node1 = NodeId::new("node-1").unwrap();
        let node2 = NodeId::new("node-2").unwrap();
        let (stolen, fresh, other) = (
            NodeKey::generate().public(),
            NodeKey::generate().public(),
            NodeKey::generate().public(),
        );
        let stored = [
            (sequence_key(&node1, Some(&stolen)), u64::MAX),
            (sequence_key(&node2, Some(&other)), 7),
        ]
        .into_iter()
        .collect();
        let registry = [(node1.clone(), fresh), (node2.clone(), other)]
            .into_iter()
            .collect();
        let restored = restore_sequences(stored, &registry);
        assert_eq!(restored.get(&node1), None);
        assert_eq!(restored.get(&node2), Some(&7));
        // Stored before keys were noted: holds for the node.
        let old = [("node-1".to_string(), 9)].into_iter().collect();
        assert_eq!(restore_sequences(old, &registry).get(&node1), Some(&9));
    }
}
