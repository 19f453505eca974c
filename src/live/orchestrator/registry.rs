//! The registry and the pools as they change while the orchestrator runs:
//! a node registered or unregistered, and a reload (SIGHUP) applying the
//! difference of `[registry]` and the pools, said line by line.
//!
//! Among replicas the registry is the one the replicas share (design
//! §12): each term starts from what is written in etcd, and a change is
//! written under the term before it applies, so a takeover never changes
//! the registry and replicas whose files differ cannot disagree. A
//! replica's own `[registry]` counts only while nothing is written.

use std::collections::BTreeMap;
use std::sync::Arc;

use poolgate_actors::core::NodeId;

use crate::config::Config;
use crate::live::keys::PublicKey;
use crate::live::listener::{lock, Registry};
use crate::live::LiveError;

use super::Orchestrator;

impl Orchestrator {
    /// Pins `key` for `node` from now on, as a `[registry]` entry would:
    /// a node added (the gate is told it is `known`, its frames are
    /// checked against `key`, SWIM facts about it are kept), or a node's
    /// key replaced (its frame sequences start over with the new key).
    pub async fn register(&self, node: NodeId, key: PublicKey) -> Result<(), LiveError> {
        let fact = poolgate_actors::core::RegistryFact::Known { node: node.clone() };
        self.change_registry(fact, |registry| {
            registry.insert(node.clone(), key) != Some(key)
        })
        .await
    }

    /// Forgets `node`, as removing its `[registry]` entry and restarting
    /// would, without the restart: the gate is told it is `forgotten` (a
    /// committed run requiring it faults), its frames are refused from
    /// its next one on (closing its connection), SWIM facts about it are
    /// no longer taken in. Forgetting a node not registered changes nothing.
    pub async fn unregister(&self, node: &NodeId) -> Result<(), LiveError> {
        let fact = poolgate_actors::core::RegistryFact::Forgotten { node: node.clone() };
        self.change_registry(fact, |registry| registry.remove(node).is_some())
            .await
    }

    /// Applies `change` to the registry; if it changed the node's key
    /// (`true`), drops the node's sequences (a node removed is forgotten
    /// whole: [`crate::live::nodes::Nodes::forget`]), keeps SWIM facts of
    /// the registry's names only and tells the gate `fact`. Under the nodes'
    /// lock, as the listener accepts a frame: a frame of the old key is
    /// accepted before the change or refused after it, and the old key's
    /// sequences go with it (a thief's 2^64 − 1 does not lock a new key
    /// out).
    ///
    /// Among replicas the new registry is first written for the replicas
    /// to share (under the term: a deposed leader's change never lands);
    /// a change that cannot be written is not made. Changes go one at a
    /// time, so what is written is what applies.
    async fn change_registry(
        &self,
        fact: poolgate_actors::core::RegistryFact,
        change: impl FnOnce(&mut BTreeMap<NodeId, PublicKey>) -> bool,
    ) -> Result<(), LiveError> {
        if self.gate.is_stopped() {
            return Err(poolgate_actors::GateError::Stopped.into());
        }
        let node = match &fact {
            poolgate_actors::core::RegistryFact::Known { node }
            | poolgate_actors::core::RegistryFact::Forgotten { node } => node.clone(),
        };
        let _one_at_a_time = self.registry_changes.lock().await;
        let mut next = self.registered();
        if !change(&mut next) {
            return Ok(());
        }
        if let Some(store) = self.store.as_ref().filter(|s| s.shares_registry()) {
            let (store, text) = (Arc::clone(store), as_text(&next));
            tokio::task::spawn_blocking(move || store.save_registry(&text))
                .await
                .map_err(|e| LiveError::Io(std::io::Error::other(e)))?
                .map_err(|e| {
                    LiveError::Gate(poolgate_actors::GateError::NotDurable(format!(
                        "the registry the replicas share not written, so not changed: {e}"
                    )))
                })?;
        }
        let names = {
            let mut nodes = lock(&self.nodes);
            let mut registry = self
                .registry
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *registry = next;
            match &fact {
                poolgate_actors::core::RegistryFact::Forgotten { .. } => nodes.forget(&node),
                poolgate_actors::core::RegistryFact::Known { .. } => nodes.key_pinned(&node),
            }
            registry.keys().map(|n| n.to_string()).collect()
        };
        self.swim
            .do_send(crate::live::swim::member::OnlyMembers(names));
        self.fleet.registry(fact).await?;
        Ok(())
    }

    /// Applies what changed in `config` (SIGHUP, `systemctl reload`):
    /// nodes added to `[registry]` or whose key was replaced are
    /// registered, nodes removed are forgotten ([`Orchestrator::register`],
    /// [`Orchestrator::unregister`]), the pool is redefined if its members
    /// changed, and the cluster keys are read again. The pool's
    /// definition does not change under a committed run (the run's nodes
    /// were checked against it): then the registry changes and the pool's
    /// does not, said in the answer, and a SIGHUP once the run has ended
    /// applies it. A pool of another id is refused (that is a new pool,
    /// not a reload). Each change applies or is said not to (a registry
    /// write among replicas that fails, say): one failing does not stop
    /// the others. Returns what changed and what did not, one line each;
    /// an error only for a pool of another id, a file whose settings do
    /// not hold, or a term that ended. Among replicas, leave `config` in
    /// [`Replica::reloads`](crate::ha::replica::Replica::reloads) too
    /// (as `watch` does on SIGHUP), so that later terms serve the pools
    /// this one added.
    pub async fn reload(&self, config: &Config) -> Result<Vec<String>, LiveError> {
        let mut said = Vec::new();
        let running = self.fleet.pools();
        if config.pools.is_empty() && !running.contains(config.pool.id()) {
            return Err(LiveError::Setting {
                key: "pool.id",
                message: format!(
                    "{} is not the running pool {}: a new pool needs a restart",
                    config.pool.id(),
                    running
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let before = self.registered();
        // Each change applies or is said not to, whatever the others do:
        // a registry write that fails (etcd out of reach) is not made,
        // and the rest goes on. Only a term that ended stops the reload.
        for (node, key) in &config.registry {
            let (change, done) = match before.get(node) {
                Some(old) if old == key => continue,
                Some(_) => ("key replaced", "key NOT replaced"),
                None => ("registered", "NOT registered"),
            };
            match self.register(node.clone(), *key).await {
                Ok(()) => said.push(format!("{node}: {change}")),
                Err(e) => said.push(self.not_done(format!("{node}: {done}"), e)?),
            }
        }
        for node in before.keys().filter(|n| !config.registry.contains_key(*n)) {
            match self.unregister(node).await {
                Ok(()) => said.push(format!("{node}: forgotten (removed from [registry])")),
                Err(e) => said.push(self.not_done(format!("{node}: NOT forgotten"), e)?),
            }
        }
        let settings = match config.pools.is_empty() {
            true => vec![config.gate_settings()?],
            false => config.pool_settings()?,
        };
        // Among replicas, a file whose pools name another prefix (with
        // `[pools.<id>]`, the first pool's id names it) adds no pool: the
        // next term, on the prefix it started with, would not find it.
        let moved = self
            .term_pools
            .get()
            .map(|term| &term.prefix)
            .filter(|prefix| **prefix != config.etcd_prefix());
        for pool in &settings {
            if let Some(prefix) = moved.filter(|_| self.fleet.pool(pool.definition.id()).is_none())
            {
                said.push(format!(
                    "pool {}: NOT defined: this file's pools would move the replicas' state from {prefix} to {} (keep the first pool first, or set [state] prefix = \"{prefix}\")",
                    pool.definition.id(),
                    config.etcd_prefix()
                ));
                continue;
            }
            match self.reload_pool(pool, config.state.restore_grace).await {
                Ok(change) => said.extend(change),
                Err(e) => said.push(
                    self.not_done(format!("pool {}: NOT reloaded", pool.definition.id()), e)?,
                ),
            }
        }
        // With [pools.<id>], a pool no longer listed is removed.
        if !config.pools.is_empty() {
            for id in running
                .iter()
                .filter(|id| !settings.iter().any(|s| s.definition.id() == *id))
            {
                match self.fleet.remove_pool(id).await {
                    Ok(()) => said.push(format!("pool {id}: removed")),
                    Err(poolgate_actors::GateError::Refused(
                        poolgate_actors::core::Refusal::RunCommitted(run),
                    )) => said.push(format!(
                        "pool {id}: NOT removed while run {run} is committed (reload again once it ends)"
                    )),
                    Err(e) => said.push(self.not_done(format!("pool {id}: NOT removed"), e.into())?),
                }
            }
        }
        if let Err(e) = self.reload_cluster_keys(&config.swim) {
            said.push(format!(
                "cluster keys NOT read again ({e}); the old ones kept"
            ));
        }
        Ok(said)
    }

    /// Among replicas: defines `settings`' new pool under `term`, its
    /// record under `pools/<id>/` of the prefix bound to the term (a pool
    /// defined there before goes on from its record; a run it found
    /// planning is aborted), its gate fenced by the term, and its runs
    /// asked through etcd served, as the term's first pools are.
    async fn serve_added_pool(
        &self,
        term: &super::TermPools,
        settings: &poolgate_actors::GateSettings,
        restore_grace: std::time::Duration,
    ) -> Result<String, LiveError> {
        let definition = settings.definition.clone();
        let unbound = term.base.for_pool(definition.id().as_str());
        let (base, created) = (Arc::clone(&term.base), term.term);
        let (store, restored) = tokio::task::spawn_blocking(move || {
            let (store, held) = unbound.bind(created)?;
            // A pool with no record yet starts above every epoch the
            // prefix itself told, as a term's first pools do.
            let restored = match held {
                Some((durable, _)) => durable,
                None => crate::state::etcd::new_pool_state(
                    base.read_records()?.as_ref().map(|(d, _)| d),
                ),
            };
            Ok::<_, crate::state::StateError>((store, restored))
        })
        .await
        .map_err(|e| LiveError::Io(std::io::Error::other(e)))??;
        let aborted_at_start = restored
            .run
            .as_ref()
            .filter(|run| !run.committed)
            .map(|run| run.run.clone());
        let settings = settings
            .clone()
            .with_durable(poolgate_actors::DurableSettings {
                store: store.clone(),
                restored,
                restore_grace,
            })?;
        let gate = self.fleet.define_pool(settings).await?;
        let fence = Arc::clone(&term.fence);
        gate.fence_with(move || fence());
        let serving = actix::spawn(crate::ha::requests::serve_in(
            Some(self.fleet.clone()),
            gate,
            store,
            definition.clone(),
            aborted_at_start,
        ));
        lock(&self.pool_tasks).push(serving);
        Ok(format!("{}, served under this term", defined(&definition)))
    }

    /// What a reload says of a change `what` that failed with `error`, or
    /// the error itself once the term is over (nothing more can apply).
    fn not_done(&self, what: String, error: LiveError) -> Result<String, LiveError> {
        if self.gate.is_stopped() {
            return Err(error);
        }
        Ok(format!("{what} ({error}); reload again to retry"))
    }

    /// Defines `settings`' pool if it is new, or redefines its members if
    /// they changed (not under a committed run); what changed, in words.
    async fn reload_pool(
        &self,
        settings: &poolgate_actors::GateSettings,
        restore_grace: std::time::Duration,
    ) -> Result<Option<String>, LiveError> {
        let definition = &settings.definition;
        let Some(gate) = self.fleet.pool(definition.id()) else {
            if let Some(term) = self.term_pools.get() {
                return self
                    .serve_added_pool(term, settings, restore_grace)
                    .await
                    .map(Some);
            }
            // A new pool keeps its state where the others keep theirs
            // (its own record: a pool defined again goes on from it).
            let mut settings = settings.clone();
            if let Some(store) = &self.store {
                let (record, restored) =
                    Arc::clone(store)
                        .pool_record(definition.id())
                        .map_err(|e| {
                            LiveError::Io(std::io::Error::other(format!("the state store: {e}")))
                        })?;
                settings = settings.with_durable(poolgate_actors::DurableSettings {
                    store: record,
                    restored,
                    restore_grace,
                })?;
            }
            self.fleet.define_pool(settings).await?;
            return Ok(Some(defined(definition)));
        };
        let report = gate.report().await?;
        let now: std::collections::BTreeSet<&NodeId> =
            report.candidates.iter().map(|c| &c.node).collect();
        let wanted: std::collections::BTreeSet<&NodeId> = definition.members().iter().collect();
        if now == wanted {
            return Ok(None);
        }
        let added: Vec<String> = wanted.difference(&now).map(|n| n.to_string()).collect();
        let removed: Vec<String> = now.difference(&wanted).map(|n| n.to_string()).collect();
        let change = format!(
            "pool {} members: added [{}], removed [{}]",
            report.pool,
            added.join(", "),
            removed.join(", ")
        );
        match self.fleet.define_pool(settings.clone()).await {
            Ok(_) => Ok(Some(change)),
            Err(poolgate_actors::GateError::Refused(
                poolgate_actors::core::Refusal::RunCommitted(run),
            )) => Ok(Some(format!(
                "{change}: NOT applied while run {run} is committed (reload again once it ends)"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// The nodes registered now and their pinned keys.
    pub fn registered(&self) -> std::collections::BTreeMap<NodeId, PublicKey> {
        self.registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// What a reload says of a pool it defined: `pool c: defined over [n1, n2]`.
fn defined(definition: &poolgate_actors::core::PoolDefinition) -> String {
    let members: Vec<String> = definition.members().iter().map(|n| n.to_string()).collect();
    format!(
        "pool {}: defined over [{}]",
        definition.id(),
        members.join(", ")
    )
}

/// The names of `registry`'s nodes (what a SWIM member keeps).
pub(super) fn registry_names(registry: &Registry) -> std::collections::HashSet<String> {
    registry
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .keys()
        .map(|n| n.to_string())
        .collect()
}

/// The registry a term starts from: among replicas (a store that shares
/// it), what the replicas share, or with nothing written yet this
/// replica's `[registry]`, written for the others; alone, `[registry]`.
/// A replica whose file differs from what is shared says how.
pub(super) async fn starting_registry(
    config: &Config,
    store: Option<&Arc<dyn crate::state::OrchestratorStore>>,
) -> Result<BTreeMap<NodeId, PublicKey>, LiveError> {
    let Some(store) = store.filter(|s| s.shares_registry()) else {
        return Ok(config.registry.clone());
    };
    let shared = store
        .shared_registry()
        .map_err(|e| LiveError::Io(std::io::Error::other(e.to_string())))?;
    let Some(shared) = shared else {
        let (writer, text) = (Arc::clone(store), as_text(&config.registry));
        let written = tokio::task::spawn_blocking(move || writer.save_registry(&text)).await;
        match written {
            Ok(Ok(())) => tracing::info!(
                nodes = config.registry.len(),
                "[registry] written for the replicas to share"
            ),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "[registry] not written for the replicas to share: this term uses it, and its next change writes it")
            }
            Err(e) => {
                tracing::warn!(error = %e, "[registry] not written for the replicas to share: this term uses it, and its next change writes it")
            }
        }
        return Ok(config.registry.clone());
    };
    let shared = from_text(&shared).map_err(|what| {
        LiveError::State(crate::state::StateError {
            file: "the registry the replicas share (etcd)".into(),
            what,
        })
    })?;
    let differences = differences(&config.registry, &shared);
    if !differences.is_empty() {
        tracing::warn!(
            differences = %differences.join(", "),
            "this replica's [registry] differs from the registry the replicas share: the shared one is used (a reload of the leader applies and writes its file's)"
        );
    }
    Ok(shared)
}

/// `registry` as the shared record holds it: each key as `[registry]`
/// writes it.
fn as_text(registry: &BTreeMap<NodeId, PublicKey>) -> BTreeMap<String, String> {
    registry
        .iter()
        .map(|(node, key)| (node.to_string(), key.to_string()))
        .collect()
}

/// The shared record read back; what does not parse is named.
fn from_text(text: &BTreeMap<String, String>) -> Result<BTreeMap<NodeId, PublicKey>, String> {
    text.iter()
        .map(|(node, key)| {
            let id = NodeId::new(node).map_err(|e| format!("node {node:?}: {e}"))?;
            let key = PublicKey::parse(key).map_err(|e| format!("node {node}: {e}"))?;
            Ok((id, key))
        })
        .collect()
}

/// How `own` differs from `shared`, a phrase per node.
fn differences(
    own: &BTreeMap<NodeId, PublicKey>,
    shared: &BTreeMap<NodeId, PublicKey>,
) -> Vec<String> {
    let mut said = Vec::new();
    for (node, key) in own {
        match shared.get(node) {
            None => said.push(format!("{node}: in this file only")),
            Some(other) if other != key => said.push(format!("{node}: another key here")),
            Some(_) => {}
        }
    }
    for node in shared.keys().filter(|n| !own.contains_key(*n)) {
        said.push(format!("{node}: shared only"));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str) -> NodeId {
        NodeId::new(name).unwrap()
    }

    #[test]
    fn the_shared_record_reads_back_what_was_written_and_names_what_does_not_parse() {
        let key = crate::keys::NodeKey::generate().public();
        let registry = BTreeMap::from([(n("node-1"), key)]);
        assert_eq!(from_text(&as_text(&registry)), Ok(registry));
        let bad = BTreeMap::from([("node-2".to_string(), "ed25519:nope".to_string())]);
        let error = from_text(&bad).unwrap_err();
        assert!(error.contains("node-2"), "{error}");
    }

    #[test]
    fn differences_say_each_node_once() {
        let (k1, k2) = (
            crate::keys::NodeKey::generate().public(),
            crate::keys::NodeKey::generate().public(),
        );
        let own = BTreeMap::from([(n("a"), k1), (n("b"), k1), (n("c"), k1)]);
        let shared = BTreeMap::from([(n("b"), k1), (n("c"), k2), (n("d"), k1)]);
        assert_eq!(
            differences(&own, &shared),
            vec![
                "a: in this file only".to_string(),
                "c: another key here".to_string(),
                "d: shared only".to_string()
            ]
        );
        assert!(differences(&own, &own).is_empty());
    }
}
