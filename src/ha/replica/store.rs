//! What a replica opens of `[state] etcd`: its client, the prefix and the
//! store over it, checked before it campaigns; and the requests a `run`
//! puts there.

use std::sync::Arc;
use std::time::Duration;

use crate::ha::etcd::Etcd;
use crate::live::LiveError;
use crate::state::etcd::{EtcdStore, Fence};

use super::STORE_CALL;

/// What [`open_store`] gives: the client, the prefix, the store's fence,
/// the store and what it held.
pub(super) type OpenStore = (
    Arc<Etcd>,
    String,
    Arc<Fence>,
    Arc<EtcdStore>,
    Option<(
        crate::core::Durable,
        std::collections::BTreeMap<String, u64>,
    )>,
);

/// The state key `[state]` names, checked with what it needs first (no
/// plain http without `insecure`, a key unless `insecure`): a bad setting
/// is an error before anything is asked of etcd.
fn state_key(config: &crate::Config) -> Result<Option<crate::state::mac::StateKey>, LiveError> {
    let bad = |message: String| LiveError::Setting {
        key: "state.etcd",
        message,
    };
    if !config.state.insecure {
        if let Some(plain) = config.state.etcd.iter().find(|e| e.starts_with("http://")) {
            return Err(bad(format!(
                "{plain}: plain http is refused; set [state] insecure = true to accept it"
            )));
        }
        if config.state.key.is_none() {
            return Err(LiveError::Setting {
                key: "state.key",
                message: "[state] etcd needs a key (poolgate keygen --cluster), or insecure = true"
                    .into(),
            });
        }
    }
    let Some(path) = &config.state.key else {
        return Ok(None);
    };
    let key = crate::keys::ClusterKey::load(path).map_err(|e| LiveError::Setting {
        key: "state.key",
        message: e.to_string(),
    })?;
    Ok(Some(crate::state::mac::StateKey::from_bytes(key.0)))
}

/// `[state] etcd`'s store, checked (another cluster's prefix, a newer
/// format, a damaged record, no endpoint: an error naming it), with a
/// fence of its own and what it holds.
pub(super) fn open_store(config: &crate::Config) -> Result<OpenStore, LiveError> {
    let key = state_key(config)?;
    let etcd = Arc::new(etcd_client(config, STORE_CALL)?);
    if config.state.insecure {
        tracing::warn!(
            mac = key.is_some(),
            "[state] insecure = true: plain http to etcd is accepted{}",
            if key.is_some() {
                ""
            } else {
                ", and its records and requests carry no MAC: anyone who reaches etcd can rewrite the gate"
            }
        );
    }
    let prefix = config.etcd_prefix();
    let fence = Arc::new(Fence::default());
    // With [pools.<id>] the prefix holds no pool's state of its own (each
    // pool's is under pools/<id>/): it names no pool.
    let pool = if config.pools.is_empty() {
        config.pool.id().as_str()
    } else {
        ""
    };
    let store = Arc::new(
        EtcdStore::new(
            Arc::clone(&etcd),
            &prefix,
            &config.swim.label,
            pool,
            Arc::clone(&fence),
        )
        .with_key(key),
    );
    let held = store.read_records()?;
    if held.is_none() {
        refuse_a_moved_prefix(config, &etcd, &prefix)?;
    }
    Ok((etcd, prefix, fence, store, held))
}

/// With `[pools.<id>]` and no `[state] prefix`, the first pool's id names
/// the prefix, so a pool added with an id that sorts first moves it: an
/// empty prefix while another of the label's holds one of these pools'
/// state would start those pools' epochs over (told twice). Refused,
/// naming the prefix to set.
fn refuse_a_moved_prefix(
    config: &crate::Config,
    etcd: &Etcd,
    prefix: &str,
) -> Result<(), LiveError> {
    if config.pools.is_empty() || config.state.prefix.is_some() {
        return Ok(());
    }
    let label = format!("/poolgate/{}/", config.swim.label);
    let keys = etcd.keys_under(label.as_bytes()).map_err(|e| {
        LiveError::State(crate::state::StateError {
            file: format!("etcd {}", etcd.endpoints()),
            what: format!("{label}: {e}"),
        })
    })?;
    let ours: Vec<String> = config
        .pool_definitions()
        .iter()
        .map(|p| p.id().to_string())
        .collect();
    for key in keys {
        let key = String::from_utf8_lossy(&key);
        let Some(rest) = key.strip_prefix(&label) else {
            continue;
        };
        // `<first>/pools/<id>/…` (pools apart), or `<id>/…` (a one-pool
        // deployment's, its pool named by the prefix).
        let mut parts = rest.split('/');
        let (first, pool) = match (parts.next(), parts.next(), parts.next()) {
            (Some(first), Some("pools"), Some(pool)) => (first, pool),
            (Some(first), Some(_), _) => (first, first),
            _ => continue,
        };
        let elsewhere = format!("{label}{first}/");
        if elsewhere != prefix && ours.iter().any(|id| id == pool) {
            return Err(LiveError::Setting {
                key: "state.prefix",
                message: format!(
                    "etcd holds pool {pool}'s state under {elsewhere}, but this configuration's prefix is {prefix} (with [pools.<id>] and no [state] prefix the first pool's id names it, so a pool whose id sorts first moved it): set [state] prefix = \"{elsewhere}\" to go on from that state, or remove it from etcd to start over"
                ),
            });
        }
    }
    Ok(())
}

/// A client of `[state] etcd`, each call bounded by `timeout`, over TLS
/// as `ca_file`, `cert_file` and `key_file` say, authenticated as `[state] username` with the password in
/// `password_file` when they are given.
pub(super) fn etcd_client(config: &crate::Config, timeout: Duration) -> Result<Etcd, LiveError> {
    let etcd = Etcd::new(&config.state.etcd, timeout).map_err(|message| LiveError::Setting {
        key: "state.etcd",
        message,
    })?;
    let etcd = etcd
        .with_tls(&config.state.tls)
        .map_err(|message| LiveError::Setting {
            key: "state",
            message,
        })?;
    let Some((user, file)) = config
        .state
        .username
        .as_ref()
        .zip(config.state.password_file.as_ref())
    else {
        return Ok(etcd);
    };
    let password = std::fs::read_to_string(file).map_err(|e| LiveError::Setting {
        key: "state.password_file",
        message: format!("{}: {e}", file.display()),
    })?;
    let password = password.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(LiveError::Setting {
            key: "state.password_file",
            message: format!("{}: empty", file.display()),
        });
    }
    Ok(etcd.with_auth(user, password))
}

/// Runs asked of whichever replica leads, by a process that is not a
/// replica itself (`poolgate run --end`).
#[doc(hidden)]
pub fn requests_of(config: &crate::Config) -> Result<crate::ha::requests::Requests, LiveError> {
    let (_, _, _, store, _) = open_store(config)?;
    // With [pools.<id>], the first pool's (`run --pool` narrows the
    // configuration to the pool it asks of).
    let store = match config.pools.first() {
        Some(pool) => Arc::new(store.for_pool(pool.definition.id().as_str())),
        None => store,
    };
    Ok(crate::ha::requests::Requests::new(store))
}

/// Where each pool's state is published by whichever replica leads, by
/// pool id, as a follower's `status` reads it: with `[pool]`, the
/// prefix's own; with `[pools.<id>]`, each pool's. For a process that
/// does not lead (`watch --until-ready` while it follows, or beside the
/// replica that holds this host's sockets).
#[doc(hidden)]
pub fn published_of(
    config: &crate::Config,
) -> Result<Vec<(String, crate::ha::requests::Requests)>, LiveError> {
    let (_, _, _, store, _) = open_store(config)?;
    let requests = |store| crate::ha::requests::Requests::new(store);
    if config.pools.is_empty() {
        return Ok(vec![(config.pool.id().to_string(), requests(store))]);
    }
    Ok(config
        .pool_definitions()
        .into_iter()
        .map(|pool| {
            let id = pool.id().to_string();
            let of_pool = Arc::new(store.for_pool(&id));
            (id, requests(of_pool))
        })
        .collect())
}

/// An etcd client of `config`'s `[state]` (a bad setting: the error to
/// say at once) and one read of its prefix: `Ok(Err(why))` while etcd
/// cannot answer it (no quorum, an election, out of reach), which a
/// readiness check waits out instead of failing at its start.
#[doc(hidden)]
pub fn etcd_answers(config: &crate::Config) -> Result<Result<(), String>, LiveError> {
    state_key(config)?;
    let etcd = etcd_client(config, STORE_CALL)?;
    let format = format!("{}format", config.etcd_prefix());
    Ok(etcd
        .get(format.as_bytes())
        .map(drop)
        .map_err(|e| format!("etcd {}: {e}", etcd.endpoints())))
}

/// The replica's name: `[swim] advertise`, else the agent listener.
pub(super) fn replica_name(config: &crate::Config) -> String {
    match &config.swim.advertise {
        Some(advertise) => advertise.as_str().to_string(),
        None => config.agents.listen.to_string(),
    }
}

/// Where nodes reach this replica's agent listener: its address, or on
/// an unspecified one, `[swim] advertise`'s host with the listener's port.
pub(super) fn advertised_agents(config: &crate::Config) -> String {
    let listen = config.agents.listen;
    match (&config.swim.advertise, listen.ip().is_unspecified()) {
        (Some(advertise), true) => {
            let text = advertise.as_str();
            let host = text.rsplit_once(':').map_or(text, |(host, _)| host);
            format!("{host}:{}", listen.port())
        }
        _ => listen.to_string(),
    }
}
