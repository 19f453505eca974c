//! The records every store keeps, one format: JSON values, each beside
//! its SHA-256.

use std::collections::BTreeMap;

use poolgate_actors::core::{Durable, DurableRun, Epoch, Fingerprint, NodeId, RunId};
use serde::{Deserialize, Serialize};

/// 2: every record has its checksum.
pub(crate) const FORMAT: u64 = 2;

#[derive(Serialize, Deserialize)]
struct Stored {
    last_epoch: u64,
    run: Option<StoredRun>,
}

#[derive(Serialize, Deserialize)]
struct StoredRun {
    run: String,
    epoch: u64,
    committed: bool,
    required: Vec<(String, Option<String>)>,
}

pub(crate) fn checksum_key(key: &str) -> String {
    format!("{key}.sha256")
}

pub(crate) fn checksum(record: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(record).into()
}

/// `record` stored under `key`, checked against `sum` (required from
/// format 2 on).
pub(crate) fn verified(
    key: &str,
    record: Vec<u8>,
    sum: Option<&[u8]>,
    format: u64,
) -> Result<Vec<u8>, String> {
    match sum {
        Some(sum) if sum == checksum(&record).as_slice() => Ok(record),
        Some(_) => Err(format!(
            "damaged: the {key} record does not match its checksum"
        )),
        None if format < 2 => Ok(record),
        None => Err(format!("damaged: the {key} record has no checksum")),
    }
}

/// The `state` record of `durable`.
pub(crate) fn encode_state(durable: &Durable) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&encode(durable)).map_err(|e| e.to_string())
}

/// The gate's state from a `state` record.
pub(crate) fn decode_state(record: &[u8]) -> Result<Durable, String> {
    let stored: Stored = serde_json::from_slice(record)
        .map_err(|e| format!("damaged: the state record does not parse ({e})"))?;
    decode(stored)
}

/// The `sequences` record.
pub(crate) fn encode_sequences(sequences: &BTreeMap<String, u64>) -> Result<Vec<u8>, String> {
    serde_json::to_vec(sequences).map_err(|e| e.to_string())
}

/// Sequences from a `sequences` record.
pub(crate) fn decode_sequences(record: &[u8]) -> Result<BTreeMap<String, u64>, String> {
    serde_json::from_slice(record).map_err(|e| format!("damaged: sequences do not parse ({e})"))
}

/// The `registry` record (the registry replicas share): each node's
/// pinned key as `[registry]` writes it.
pub(crate) fn encode_registry(registry: &BTreeMap<String, String>) -> Result<Vec<u8>, String> {
    serde_json::to_vec(registry).map_err(|e| e.to_string())
}

/// The registry from a `registry` record.
pub(crate) fn decode_registry(record: &[u8]) -> Result<BTreeMap<String, String>, String> {
    serde_json::from_slice(record)
        .map_err(|e| format!("damaged: the registry does not parse ({e})"))
}

fn encode(durable: &Durable) -> Stored {
    Stored {
        last_epoch: durable.last_epoch,
        run: durable.run.as_ref().map(|run| StoredRun {
            run: run.run.to_string(),
            epoch: run.epoch.0,
            committed: run.committed,
            required: run
                .required
                .iter()
                .map(|(node, fingerprint)| {
                    (
                        node.to_string(),
                        fingerprint.map(|f| hex::encode(f.as_bytes())),
                    )
                })
                .collect(),
        }),
    }
}

fn decode(stored: Stored) -> Result<Durable, String> {
    let damaged = |what: &str| format!("damaged: {what}");
    let run = match stored.run {
        None => None,
        Some(run) => Some(DurableRun {
            run: RunId::new(&run.run).map_err(|_| damaged("a run id is not valid"))?,
            epoch: Epoch(run.epoch),
            committed: run.committed,
            required: run
                .required
                .into_iter()
                .map(|(node, fingerprint)| {
                    let node = NodeId::new(&node).map_err(|_| damaged("a node id is not valid"))?;
                    let fingerprint = match fingerprint {
                        Some(hex) => Some(
                            Fingerprint::from_hex(&hex)
                                .ok_or_else(|| damaged("a fingerprint is not valid"))?,
                        ),
                        None => None,
                    };
                    Ok((node, fingerprint))
                })
                .collect::<Result<_, String>>()?,
        }),
    };
    Ok(Durable {
        last_epoch: stored.last_epoch,
        run,
    })
}
