//! The registry and the pools as they change while the orchestrator runs:
//! a node registered or unregistered, and a reload (SIGHUP) applying the
//! difference of `[registry]` and the pools, said line by line.

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
    /// (`true`), drops the node's sequences, keeps SWIM facts of the
    /// registry's names only and tells the gate `fact`. Under the nodes'
    /// lock, as the listener accepts a frame: a frame of the old key is
    /// accepted before the change or refused after it, and the old key's
    /// sequences go with it (a thief's 2^64 − 1 does not lock a new key
    /// out).
    async fn change_registry(
        &self,
        fact: poolgate_actors::core::RegistryFact,
        change: impl FnOnce(&mut std::collections::BTreeMap<NodeId, PublicKey>) -> bool,
    ) -> Result<(), LiveError> {
        if self.gate.is_stopped() {
            return Err(poolgate_actors::GateError::Stopped.into());
        }
        let node = match &fact {
            poolgate_actors::core::RegistryFact::Known { node }
            | poolgate_actors::core::RegistryFact::Forgotten { node } => node.clone(),
        };
        let names = {
            let mut nodes = lock(&self.nodes);
            let mut registry = self
                .registry
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !change(&mut registry) {
                None
            } else {
                nodes.last_seq.remove(&node);
                Some(registry.keys().map(|n| n.to_string()).collect())
            }
        };
        let Some(names) = names else {
            return Ok(());
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
    /// not a reload). Returns what changed, one line each.
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
        for (node, key) in &config.registry {
            match before.get(node) {
                Some(old) if old == key => {}
                Some(_) => {
                    self.register(node.clone(), *key).await?;
                    said.push(format!("{node}: key replaced"));
                }
                None => {
                    self.register(node.clone(), *key).await?;
                    said.push(format!("{node}: registered"));
                }
            }
        }
        for node in before.keys().filter(|n| !config.registry.contains_key(*n)) {
            self.unregister(node).await?;
            said.push(format!("{node}: forgotten (removed from [registry])"));
        }
        let settings = match config.pools.is_empty() {
            true => vec![config.gate_settings()?],
            false => config.pool_settings()?,
        };
        for pool in &settings {
            said.extend(self.reload_pool(pool, config.state.restore_grace).await?);
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
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.reload_cluster_keys(&config.swim)?;
        Ok(said)
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
            return Ok(Some(format!(
                "pool {}: defined over [{}]",
                definition.id(),
                definition
                    .members()
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
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

/// The names of `registry`'s nodes (what a SWIM member keeps).
pub(super) fn registry_names(registry: &Registry) -> std::collections::HashSet<String> {
    registry
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .keys()
        .map(|n| n.to_string())
        .collect()
}
