//! Reading `config.toml`: the text checked section by section, every
//! error naming its key and line, and relative paths resolved beside the
//! file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::{OnReadinessLost, PlanningPolicy, PoolId};
use toml::de::DeTable;

use super::doc::Doc;
#[cfg(feature = "live")]
use super::{AgentsConfig, DemoConfig, Registry, SwimConfig};
use super::{Config, ConfigError, RunConfig, StateConfig};

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = Config::parse(&text, &file)?;
        config.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        Ok(config)
    }

    /// Checks the text of a configuration; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let doc = Doc { text, file };
        let root = DeTable::parse(text)
            .map_err(|e| doc.error(e.span().unwrap_or(0..0), "toml", e.message().trim_end()))?;
        let root = root.get_ref();
        doc.only_keys(
            root,
            "",
            &[
                "pool",
                "pools",
                "readiness",
                "planning",
                "swim",
                "demo",
                "agents",
                "registry",
                "state",
                "run",
                "control",
            ],
        )?;

        let pool_section = doc.section(root, "pool")?;
        let pools_section = doc.section(root, "pools")?;
        let readiness = doc.section(root, "readiness")?;
        let planning = doc.section(root, "planning")?;

        let convergence_window = match readiness {
            Some((table, span)) => {
                doc.only_keys(table, "readiness", &["convergence_window"])?;
                let window = doc.required(table, "readiness", "convergence_window", span)?;
                Some(doc.duration(window, "readiness.convergence_window")?.0)
            }
            None if pools_section.is_some() => None,
            None => return Err(doc.error(0..0, "readiness", "missing section")),
        };
        let mut planning_policy = PlanningPolicy {
            on_readiness_lost: OnReadinessLost::Wait,
            wait_timeout: None,
        };
        if let Some((table, _)) = planning {
            doc.only_keys(table, "planning", &["on_readiness_lost", "wait_timeout"])?;
            doc.planning(table, "planning", convergence_window, &mut planning_policy)?;
        }

        let (pool, pools) = match (pool_section, pools_section) {
            (Some((_, span)), Some(_)) => {
                return Err(doc.error(
                    span,
                    "pool",
                    "give either [pool] (one pool) or [pools.<id>] (a fleet's pools), not both",
                ))
            }
            (None, None) => {
                return Err(doc.error(0..0, "pool", "missing section (or [pools.<id>])"))
            }
            (Some((pool_table, pool_span)), None) => {
                doc.only_keys(pool_table, "pool", &["id", "members"])?;
                let id = doc.required(pool_table, "pool", "id", pool_span.clone())?;
                let id = doc.string(id, "pool.id")?;
                let id = PoolId::new(&id.0).map_err(|e| doc.error(id.1, "pool.id", e))?;
                let members = doc.required(pool_table, "pool", "members", pool_span)?;
                (doc.members(members, id, "pool.members")?, Vec::new())
            }
            (None, Some((table, span))) => {
                let pools = doc.pools(table, convergence_window, planning_policy)?;
                let Some(first) = pools.first() else {
                    return Err(doc.error(span, "pools", "defines no pool"));
                };
                (first.definition.clone(), pools)
            }
        };
        // With [pools], the defaults are the first pool's where [readiness]
        // gives none.
        let convergence_window = convergence_window
            .or_else(|| pools.first().map(|p| p.convergence_window))
            .unwrap_or_default();

        #[cfg(not(feature = "live"))]
        for section in ["swim", "demo", "agents", "registry"] {
            if let Some((_, span)) = doc.section(root, section)? {
                return Err(doc.error(
                    span,
                    section,
                    "the live cluster's section needs poolgate built with the `live` feature",
                ));
            }
        }
        #[cfg(feature = "live")]
        let swim = match doc.section(root, "swim")? {
            Some((table, _)) => doc.swim(table)?,
            None => SwimConfig::default(),
        };
        #[cfg(feature = "live")]
        let demo = match doc.section(root, "demo")? {
            Some((table, _)) => doc.demo(table)?,
            None => DemoConfig::default(),
        };
        #[cfg(feature = "live")]
        let agents = match doc.section(root, "agents")? {
            Some((table, _)) => doc.agents(table)?,
            None => AgentsConfig::default(),
        };
        #[cfg(feature = "live")]
        let registry = match doc.section(root, "registry")? {
            Some((table, _)) => doc.registry(table)?,
            None => Registry::new(),
        };
        let mut state = StateConfig::default();
        if let Some((table, _)) = doc.section(root, "state")? {
            doc.only_keys(
                table,
                "state",
                &[
                    "path",
                    "restore_grace",
                    "etcd",
                    "lease",
                    "prefix",
                    "key",
                    "insecure",
                    "username",
                    "password_file",
                    "ca_file",
                    "cert_file",
                    "key_file",
                ],
            )?;
            if let Some(value) = table.get("path") {
                state.path = Some(PathBuf::from(doc.string(value, "state.path")?.0));
            }
            if let Some(value) = table.get("restore_grace") {
                state.restore_grace = doc.duration(value, "state.restore_grace")?.0;
            }
            if let Some(value) = table.get("etcd") {
                state.etcd = doc.strings(value, "state.etcd")?;
                if let Err(e) = crate::ha::etcd::Etcd::new(&state.etcd, Duration::from_secs(1)) {
                    return Err(doc.error(value.span(), "state.etcd", e));
                }
                if table.contains_key("path") {
                    return Err(doc.error(
                        value.span(),
                        "state.etcd",
                        "give either path (one machine) or etcd (replicas), not both",
                    ));
                }
            }
            if let Some(value) = table.get("lease") {
                let (lease, span) = doc.duration(value, "state.lease")?;
                if lease < Duration::from_secs(1) || lease > Duration::from_secs(3600) {
                    return Err(doc.error(span, "state.lease", "must be from 1s to 1h"));
                }
                if lease.subsec_nanos() != 0 {
                    return Err(doc.error(
                        span,
                        "state.lease",
                        "must be whole seconds (etcd's leases are)",
                    ));
                }
                state.lease = lease;
            }
            if let Some(value) = table.get("prefix") {
                let (prefix, span) = doc.string(value, "state.prefix")?;
                if prefix.is_empty() || prefix.len() > 256 {
                    return Err(doc.error(span, "state.prefix", "must be 1 to 256 bytes"));
                }
                state.prefix = Some(prefix);
            }
            if let Some(value) = table.get("key") {
                state.key = Some(PathBuf::from(doc.string(value, "state.key")?.0));
            }
            if let Some(value) = table.get("insecure") {
                state.insecure = doc.boolean(value, "state.insecure")?;
            }
            if let Some(value) = table.get("username") {
                let (user, span) = doc.string(value, "state.username")?;
                if user.is_empty() {
                    return Err(doc.error(span, "state.username", "must not be empty"));
                }
                state.username = Some(user);
            }
            if let Some(value) = table.get("password_file") {
                state.password_file =
                    Some(PathBuf::from(doc.string(value, "state.password_file")?.0));
            }
            for (key, file) in [
                ("ca_file", &mut state.tls.ca_file),
                ("cert_file", &mut state.tls.cert_file),
                ("key_file", &mut state.tls.key_file),
            ] {
                if let Some(value) = table.get(key) {
                    let (path, span) = doc.string(value, &format!("state.{key}"))?;
                    if path.is_empty() {
                        return Err(doc.error(span, &format!("state.{key}"), "must not be empty"));
                    }
                    *file = Some(PathBuf::from(path));
                }
            }
            if state.tls.cert_file.is_some() != state.tls.key_file.is_some() {
                let (key, other) = match state.tls.cert_file {
                    Some(_) => ("state.cert_file", "key_file"),
                    None => ("state.key_file", "cert_file"),
                };
                let span = table
                    .get(key.trim_start_matches("state."))
                    .map_or(0..0, |v| v.span());
                return Err(doc.error(span, key, format!("needs {other} too")));
            }
            if state.tls.any() && !state.etcd.iter().all(|e| e.starts_with("https://")) {
                let key = ["ca_file", "cert_file", "key_file"]
                    .into_iter()
                    .find(|k| table.contains_key(*k))
                    .unwrap_or("ca_file");
                let span = table.get(key).map_or(0..0, |v| v.span());
                return Err(doc.error(
                    span,
                    &format!("state.{key}"),
                    "TLS files need [state] etcd endpoints, every one https://",
                ));
            }
            if state.username.is_some() != state.password_file.is_some() {
                let (key, other) = match state.username {
                    Some(_) => ("state.username", "password_file"),
                    None => ("state.password_file", "username"),
                };
                let span = table
                    .get(key.trim_start_matches("state."))
                    .map_or(0..0, |v| v.span());
                return Err(doc.error(span, key, format!("needs {other} too")));
            }
            if let Some(value) = table.get("etcd") {
                if !state.insecure {
                    if let Some(plain) = state.etcd.iter().find(|e| e.starts_with("http://")) {
                        return Err(doc.error(
                            value.span(),
                            "state.etcd",
                            format!("{plain}: plain http is refused (anyone on the path reads and rewrites the gate's state); set [state] insecure = true to accept it"),
                        ));
                    }
                }
                if state.key.is_none() && !state.insecure {
                    return Err(doc.error(
                        value.span(),
                        "state.key",
                        "[state] etcd needs a key (poolgate keygen --cluster --out state.key), shared by the replicas and the requesters; or insecure = true",
                    ));
                }
            }
        }

        let mut run = RunConfig::default();
        if let Some((table, _)) = doc.section(root, "run")? {
            doc.only_keys(table, "run", &["unguarded_after"])?;
            if let Some(value) = table.get("unguarded_after") {
                let (after, span) = doc.duration(value, "run.unguarded_after")?;
                if after < Duration::from_secs(1) || after > Duration::from_secs(30) {
                    return Err(doc.error(span, "run.unguarded_after", "must be from 1s to 30s"));
                }
                if after.subsec_nanos() != 0 {
                    return Err(doc.error(
                        span,
                        "run.unguarded_after",
                        "must be whole seconds (it is also the requester's etcd lease)",
                    ));
                }
                run.unguarded_after = after;
            }
        }

        let mut control = None;
        if let Some((table, span)) = doc.section(root, "control")? {
            doc.only_keys(table, "control", &["socket"])?;
            let value = doc.required(table, "control", "socket", span)?;
            let (text, span) = doc.string(value, "control.socket")?;
            if text.is_empty() {
                return Err(doc.error(span, "control.socket", "must be a path"));
            }
            if !state.etcd.is_empty() {
                return Err(doc.error(
                    span,
                    "control.socket",
                    "among replicas ([state] etcd), run and status go through etcd: [control] socket is for one orchestrator",
                ));
            }
            control = Some(PathBuf::from(text));
        }

        Ok(Config {
            pool,
            pools,
            control,
            convergence_window,
            planning: planning_policy,
            #[cfg(feature = "live")]
            swim,
            #[cfg(feature = "live")]
            demo,
            #[cfg(feature = "live")]
            agents,
            #[cfg(feature = "live")]
            registry,
            state,
            run,
        })
    }

    /// Relative key paths, resolved from `dir` (the config file's folder).
    pub fn resolve_paths(&mut self, dir: &Path) {
        for path in [
            &mut self.state.path,
            &mut self.state.key,
            &mut self.state.password_file,
            &mut self.state.tls.ca_file,
            &mut self.state.tls.cert_file,
            &mut self.state.tls.key_file,
            &mut self.control,
        ] {
            if let Some(path) = path.as_mut().filter(|p| p.is_relative()) {
                *path = dir.join(&*path);
            }
        }
        #[cfg(feature = "live")]
        for path in &mut self.swim.cluster_keys {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }
}
