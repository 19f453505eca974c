//! What a checked configuration gives the gates: each pool's settings,
//! with its durable state when `[state] path` keeps it.

use std::path::Path;

use poolgate_actors::core::PoolDefinition;
use poolgate_actors::GateSettings;

use super::{Config, PoolConfig, SettingsError};

impl Config {
    /// What the gate needs, in memory only; refused
    /// ([`GateError::InvalidSettings`](poolgate_actors::GateError)) only for
    /// a configuration changed in code to what `config.toml` would refuse.
    pub fn gate_settings(&self) -> Result<GateSettings, poolgate_actors::GateError> {
        match self.pools.first() {
            // With [pools.<id>]: the first pool, with its own window and policy.
            Some(first) => first.gate_settings(),
            None => GateSettings::new(self.pool.clone(), self.convergence_window, self.planning),
        }
    }

    /// This configuration acting on one pool (`run --pool`): `id`, or the
    /// only pool when `None`, whose definition and settings become
    /// `[pool]`'s and which comes first; the other pools stay defined
    /// after it, so an orchestrator started from it restores their runs
    /// and a node one of them holds stays reserved (design §14). An error
    /// names the pools defined when there is no such pool, or several and
    /// none named.
    pub fn with_only_pool(&self, id: Option<&str>) -> Result<Config, String> {
        let defined: Vec<String> = self
            .pool_definitions()
            .iter()
            .map(|p| p.id().to_string())
            .collect();
        let chosen = match (id, self.pools.len()) {
            (None, 0 | 1) => return Ok(self.clone()),
            (None, _) => {
                return Err(format!(
                    "several pools are defined ({}): name one with --pool",
                    defined.join(", ")
                ))
            }
            (Some(id), 0) if id == self.pool.id().as_str() => return Ok(self.clone()),
            (Some(id), _) => self
                .pools
                .iter()
                .find(|p| p.definition.id().as_str() == id)
                .ok_or_else(|| format!("no pool {id} (defined: {})", defined.join(", ")))?,
        };
        let mut narrowed = self.clone();
        // Among replicas the pools share one prefix: the narrowed
        // configuration keeps the whole one's.
        #[cfg(feature = "live")]
        {
            narrowed.state.prefix = Some(self.etcd_prefix());
        }
        narrowed.pool = chosen.definition.clone();
        narrowed.convergence_window = chosen.convergence_window;
        narrowed.planning = chosen.planning;
        narrowed.pools = std::iter::once(chosen.clone())
            .chain(
                self.pools
                    .iter()
                    .filter(|p| p.definition.id() != chosen.definition.id())
                    .cloned(),
            )
            .collect();
        Ok(narrowed)
    }

    /// Where the state lives in etcd: `[state] prefix`, else
    /// `/poolgate/<label>/<pool>/` (of the first pool with
    /// `[pools.<id>]`; each pool's state is then under `pools/<id>/` of
    /// it).
    #[cfg(feature = "live")]
    pub fn etcd_prefix(&self) -> String {
        self.state.prefix.clone().unwrap_or_else(|| {
            crate::state::etcd::default_prefix(&self.swim.label, self.pool.id().as_str())
        })
    }

    /// Every pool's definition: `[pool]`'s one, or each of `[pools.<id>]`,
    /// by id.
    pub fn pool_definitions(&self) -> Vec<PoolDefinition> {
        if self.pools.is_empty() {
            return vec![self.pool.clone()];
        }
        self.pools.iter().map(|p| p.definition.clone()).collect()
    }

    /// Every pool's gate settings: `[pool]`'s one, or each of
    /// `[pools.<id>]`, by id.
    pub fn pool_settings(&self) -> Result<Vec<GateSettings>, poolgate_actors::GateError> {
        if self.pools.is_empty() {
            return Ok(vec![self.gate_settings()?]);
        }
        self.pools.iter().map(PoolConfig::gate_settings).collect()
    }

    /// What the gate needs, with the state file of `[state] path` (or
    /// `path`, which wins) opened and read.
    pub fn gate_settings_with_state(
        &self,
        path: Option<&Path>,
    ) -> Result<GateSettings, SettingsError> {
        self.gate_settings_with_store(path)
            .map(|(settings, _)| settings)
    }

    /// As [`Config::gate_settings_with_state`], also handing back the
    /// opened store (the orchestrator keeps agent sequences in it too).
    pub fn gate_settings_with_store(
        &self,
        path: Option<&Path>,
    ) -> Result<
        (
            GateSettings,
            Option<std::sync::Arc<dyn crate::state::OrchestratorStore>>,
        ),
        SettingsError,
    > {
        let (mut all, store) = self.pool_settings_with_store(path)?;
        let first = all.remove(0);
        Ok((first, store))
    }

    /// Every pool's gate settings with its durable state: `[pool]`'s under
    /// the state file's `state` record, each of `[pools.<id>]` under its
    /// own (`pools/<id>/state`); with the opened store.
    pub fn pool_settings_with_store(
        &self,
        path: Option<&Path>,
    ) -> Result<PoolsWithStore, SettingsError> {
        let settings = self.pool_settings()?;
        let Some(path) = path.or(self.state.path.as_deref()) else {
            return Ok((settings, None));
        };
        let (store, restored) = open_file_store(path)?;
        let durable = |store: std::sync::Arc<dyn poolgate_actors::StateStore>, restored| {
            poolgate_actors::DurableSettings {
                store,
                restored,
                restore_grace: self.state.restore_grace,
            }
        };
        if self.pools.is_empty() {
            let settings = settings
                .into_iter()
                .map(|s| s.with_durable(durable(store.clone(), restored.clone())))
                .collect::<Result<_, _>>()?;
            return Ok((settings, Some(store)));
        }
        let mut kept = Vec::with_capacity(settings.len());
        for s in settings {
            let (record, held) = std::sync::Arc::clone(&store)
                .pool_record(s.definition.id())
                .map_err(|e| crate::state::StateError {
                    file: path.display().to_string(),
                    what: e.to_string(),
                })?;
            kept.push(s.with_durable(durable(record, held))?);
        }
        Ok((kept, Some(store)))
    }
}

/// Every pool's gate settings with its durable state, and the store
/// opened (the orchestrator keeps agent sequences in it too).
pub type PoolsWithStore = (
    Vec<GateSettings>,
    Option<std::sync::Arc<dyn crate::state::OrchestratorStore>>,
);

/// The state file at `path`, opened (redb).
#[cfg(feature = "redb")]
fn open_file_store(path: &Path) -> Result<crate::state::OpenedStore, crate::state::StateError> {
    let (store, restored) = crate::state::RedbStore::open(path)?;
    Ok((store, restored))
}

/// Without the `redb` feature there is no file store: an error naming
/// the file, never a gate that forgets.
#[cfg(not(feature = "redb"))]
fn open_file_store(path: &Path) -> Result<crate::state::OpenedStore, crate::state::StateError> {
    Err(crate::state::StateError {
        file: path.display().to_string(),
        what: "[state] path needs poolgate built with the `redb` feature".into(),
    })
}
