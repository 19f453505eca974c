//! The checking of a TOML text: every error names the key and the line
//! it is on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use poolgate_actors::core::{NodeId, PoolDefinition, PoolId};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::{label_problem, AgentsConfig, ConfigError, DemoConfig, SwimConfig};
use crate::keys::PublicKey;
use crate::live::endpoint::Endpoint;

pub(super) type Table<'i> = DeTable<'i>;
pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// The text being checked, for turning spans into lines.
pub(super) struct Doc<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
}

impl<'a> Doc<'a> {
    pub(super) fn error(
        &self,
        span: Range<usize>,
        key: &str,
        message: impl ToString,
    ) -> ConfigError {
        let end = span.start.min(self.text.len());
        ConfigError::Invalid {
            file: self.file.to_string(),
            line: self.text.as_bytes()[..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1,
            key: key.to_string(),
            message: message.to_string(),
        }
    }

    pub(super) fn only_keys(
        &self,
        table: &Table<'_>,
        section: &str,
        allowed: &[&str],
    ) -> Result<(), ConfigError> {
        for (key, _) in table.iter() {
            if !allowed.contains(&key.get_ref().as_ref()) {
                let dotted = dotted(section, key.get_ref());
                let expected = allowed.join("`, `");
                return Err(self.error(
                    key.span(),
                    &dotted,
                    format!("unknown key (expected `{expected}`)"),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<Option<(&'t Table<'i>, Range<usize>)>, ConfigError> {
        match root.get(name) {
            Some(value) => match value.get_ref() {
                DeValue::Table(table) => Ok(Some((table, value.span()))),
                _ => Err(self.error(value.span(), name, "must be a table")),
            },
            None => Ok(None),
        }
    }

    pub(super) fn required_section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<(&'t Table<'i>, Range<usize>), ConfigError> {
        self.section(root, name)?
            .ok_or_else(|| self.error(0..0, name, "missing section"))
    }

    pub(super) fn required<'t, 'i>(
        &self,
        table: &'t Table<'i>,
        section: &str,
        key: &str,
        section_span: Range<usize>,
    ) -> Result<&'t Value<'i>, ConfigError> {
        table
            .get(key)
            .ok_or_else(|| self.error(section_span, &dotted(section, key), "missing key"))
    }

    pub(super) fn string(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<(String, Range<usize>), ConfigError> {
        match value.get_ref() {
            DeValue::String(s) => Ok((s.to_string(), value.span())),
            _ => Err(self.error(value.span(), key, "must be a string")),
        }
    }

    pub(super) fn duration(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<(Duration, Range<usize>), ConfigError> {
        let (text, span) = self.string(value, key)?;
        let duration = humantime::parse_duration(&text).map_err(|e| {
            self.error(
                span.clone(),
                key,
                format!("`{text}` is not a duration ({e}); write e.g. \"5s\""),
            )
        })?;
        if let Some(problem) = poolgate_actors::duration_problem(duration) {
            return Err(self.error(span, key, format!("`{text}` {problem}")));
        }
        Ok((duration, span))
    }

    pub(super) fn swim(&self, table: &Table<'_>) -> Result<SwimConfig, ConfigError> {
        self.only_keys(
            table,
            "swim",
            &[
                "bind",
                "advertise",
                "seeds",
                "probe_period",
                "probe_rtt",
                "suspicion_timeout",
                "indirect_probes",
                "cluster_keys",
                "insecure",
                "label",
            ],
        )?;
        let mut swim = SwimConfig::default();
        if let Some(value) = table.get("cluster_keys") {
            swim.cluster_keys = self
                .strings(value, "swim.cluster_keys")?
                .into_iter()
                .map(PathBuf::from)
                .collect();
        }
        if let Some(value) = table.get("insecure") {
            swim.insecure = self.boolean(value, "swim.insecure")?;
        }
        if let Some(value) = table.get("label") {
            let (label, span) = self.string(value, "swim.label")?;
            if let Some(problem) = label_problem(&label) {
                return Err(self.error(span, "swim.label", problem));
            }
            swim.label = label;
        }
        if let Some(value) = table.get("bind") {
            swim.bind = self.socket_addr(value, "swim.bind")?;
        }
        match table.get("advertise") {
            Some(value) => swim.advertise = Some(self.endpoint(value, "swim.advertise")?),
            None if swim.bind.ip().is_unspecified() => {
                let span = table.get("bind").map(|v| v.span()).unwrap_or(0..0);
                return Err(self.error(
                    span,
                    "swim.advertise",
                    format!(
                        "swim.bind {} is unspecified, so other members cannot reach the address \
                         it would advertise; set swim.advertise = \"host:port\" to the address \
                         they reach this member at",
                        swim.bind
                    ),
                ));
            }
            None => {}
        }
        if let Some(value) = table.get("seeds") {
            let DeValue::Array(items) = value.get_ref() else {
                return Err(self.error(
                    value.span(),
                    "swim.seeds",
                    "must be a list of \"host:port\"",
                ));
            };
            swim.seeds = items
                .iter()
                .map(|item| self.endpoint(item, "swim.seeds"))
                .collect::<Result<_, _>>()?;
        }
        let timings = &mut swim.timings;
        let mut rtt_span = None;
        if let Some(value) = table.get("probe_period") {
            timings.probe_period = self.duration(value, "swim.probe_period")?.0;
        }
        if let Some(value) = table.get("probe_rtt") {
            let (rtt, span) = self.duration(value, "swim.probe_rtt")?;
            timings.probe_rtt = rtt;
            rtt_span = Some(span);
        }
        if let Some(value) = table.get("suspicion_timeout") {
            timings.suspicion_timeout = self.duration(value, "swim.suspicion_timeout")?.0;
        }
        if let Some(value) = table.get("indirect_probes") {
            timings.indirect_probes = self.whole(value, "swim.indirect_probes", 1..=16)? as usize;
        }
        if timings.probe_rtt >= timings.probe_period {
            return Err(self.error(
                rtt_span.unwrap_or(0..0),
                "swim.probe_rtt",
                "must be shorter than swim.probe_period",
            ));
        }
        Ok(swim)
    }

    pub(super) fn agents(&self, table: &Table<'_>) -> Result<AgentsConfig, ConfigError> {
        self.only_keys(
            table,
            "agents",
            &["listen", "max_connections", "idle_timeout"],
        )?;
        let mut agents = AgentsConfig::default();
        if let Some(value) = table.get("listen") {
            agents.listen = self.socket_addr(value, "agents.listen")?;
        }
        if let Some(value) = table.get("max_connections") {
            agents.max_connections =
                self.whole(value, "agents.max_connections", 1..=1_000_000)? as usize;
        }
        if let Some(value) = table.get("idle_timeout") {
            agents.idle_timeout = self.duration(value, "agents.idle_timeout")?.0;
        }
        Ok(agents)
    }

    pub(super) fn registry(
        &self,
        table: &Table<'_>,
    ) -> Result<BTreeMap<NodeId, PublicKey>, ConfigError> {
        let mut registry = BTreeMap::new();
        for (key, value) in table.iter() {
            let dotted = dotted("registry", key.get_ref());
            let node =
                NodeId::new(key.get_ref()).map_err(|e| self.error(key.span(), &dotted, e))?;
            let (text, span) = self.string(value, &dotted)?;
            let public = PublicKey::parse(&text).map_err(|e| self.error(span, &dotted, e))?;
            registry.insert(node, public);
        }
        Ok(registry)
    }

    pub(super) fn strings(&self, value: &Value<'_>, key: &str) -> Result<Vec<String>, ConfigError> {
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), key, "must be a list of strings"));
        };
        items
            .iter()
            .map(|item| self.string(item, key).map(|(text, _)| text))
            .collect()
    }

    pub(super) fn boolean(&self, value: &Value<'_>, key: &str) -> Result<bool, ConfigError> {
        match value.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(self.error(value.span(), key, "must be true or false")),
        }
    }

    pub(super) fn whole(
        &self,
        value: &Value<'_>,
        key: &str,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ConfigError> {
        value
            .get_ref()
            .as_integer()
            .and_then(|n| u64::from_str_radix(&n.as_str().replace('_', ""), n.radix()).ok())
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                self.error(
                    value.span(),
                    key,
                    format!(
                        "must be a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    pub(super) fn demo(&self, table: &Table<'_>) -> Result<DemoConfig, ConfigError> {
        self.only_keys(table, "demo", &["nodes", "announce_within", "crash_after"])?;
        let mut demo = DemoConfig::default();
        if let Some(value) = table.get("nodes") {
            let nodes = value
                .get_ref()
                .as_integer()
                .and_then(|n| u32::from_str_radix(&n.as_str().replace('_', ""), n.radix()).ok())
                .filter(|n| (1..=64).contains(n));
            demo.nodes = nodes.ok_or_else(|| {
                self.error(
                    value.span(),
                    "demo.nodes",
                    "must be a whole number from 1 to 64",
                )
            })?;
        }
        if let Some(value) = table.get("announce_within") {
            demo.announce_within = self.duration(value, "demo.announce_within")?.0;
        }
        if let Some(value) = table.get("crash_after") {
            demo.crash_after = self.duration(value, "demo.crash_after")?.0;
        }
        Ok(demo)
    }

    pub(super) fn socket_addr(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let (text, span) = self.string(value, key)?;
        text.parse().map_err(|_| {
            self.error(
                span,
                key,
                format!("`{text}` is not an address like \"127.0.0.1:7946\""),
            )
        })
    }

    pub(super) fn endpoint(&self, value: &Value<'_>, key: &str) -> Result<Endpoint, ConfigError> {
        let (text, span) = self.string(value, key)?;
        Endpoint::parse(&text).map_err(|e| self.error(span, key, e))
    }

    pub(super) fn members(
        &self,
        value: &Value<'_>,
        id: PoolId,
    ) -> Result<PoolDefinition, ConfigError> {
        const KEY: &str = "pool.members";
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), KEY, "must be a list of node ids"));
        };
        let mut members = Vec::with_capacity(items.len());
        let mut spans = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (text, span) = self.string(item, KEY)?;
            members.push(NodeId::new(&text).map_err(|e| self.error(span.clone(), KEY, e))?);
            spans.push(span);
        }
        PoolDefinition::new(id, members.clone()).map_err(|e| {
            use poolgate_actors::core::DefinitionError;
            let span = match &e {
                DefinitionError::NoMembers => value.span(),
                DefinitionError::DuplicateMember(node) => members
                    .iter()
                    .zip(&spans)
                    .filter(|(m, _)| *m == node)
                    .nth(1)
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(|| value.span()),
            };
            self.error(span, KEY, e)
        })
    }
}

pub(super) fn dotted(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    }
}
