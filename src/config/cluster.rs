//! The live cluster's sections of `config.toml` (design §7–§10): `[swim]`,
//! `[agents]`, `[registry]` and `[demo]`, their types and their checks.
//! Built with the `live` feature only; without it those sections are
//! refused by name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use poolgate_actors::core::NodeId;
use toml::de::DeValue;

use super::doc::{dotted, Doc, Table, Value};

use super::endpoint::Endpoint;
use super::ConfigError;
use crate::keys::PublicKey;

/// `[agents] max_connections`: how many agent connections may be open at
/// once.
pub(crate) const MAX_CONNECTIONS: std::ops::RangeInclusive<u64> = 1..=1_000_000;

/// What a whole number outside `range` is told.
pub(crate) fn range_problem(range: &std::ops::RangeInclusive<u64>) -> String {
    format!(
        "must be a whole number from {} to {}",
        range.start(),
        range.end()
    )
}

/// Why `timings` cannot hold together, if they cannot: the key at fault
/// and what it must be. The one rule for `config.toml` and for a `Config`
/// built in code.
pub(crate) fn timings_problem(timings: &SwimTimings) -> Option<(&'static str, &'static str)> {
    (timings.probe_rtt >= timings.probe_period)
        .then_some(("swim.probe_rtt", "must be shorter than swim.probe_period"))
}

/// Members asked to probe a silent member before it is suspected. foca's
/// default is 3; with 3, 1% packet loss made a false suspicion about once
/// per 125 node-hours in simulation, and the gate faults a committed run on a
/// suspicion of a required node (8 false run faults per hour at 1,000
/// required nodes). With 6: none in 1,000 node-hours (BENCHMARKS.md). But
/// at 10% UDP loss on the multi-host rig, 6 gave 2 false run faults in 10
/// minutes over 16 nodes where Serf saw no failure; with 16 (each indirect
/// path is 4 datagrams, so all 16 fail together about once in 10^7 at 10%
/// loss): none (BENCHMARKS.md, "Separate hosts"). The extra datagrams go
/// out only when a direct probe failed.
pub const DEFAULT_INDIRECT_PROBES: usize = 16;

/// SWIM timings (config `[swim]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwimTimings {
    /// How often a random member is probed.
    pub probe_period: Duration,
    /// How long to wait for a direct probe reply before asking others.
    pub probe_rtt: Duration,
    /// How long a member stays suspect before it is declared down.
    pub suspicion_timeout: Duration,
    /// How many members are asked to probe a member that did not answer
    /// in time, before it is suspected.
    pub indirect_probes: usize,
}

/// The default: the `steady` profile.
impl Default for SwimTimings {
    fn default() -> Self {
        SwimTimings::STEADY
    }
}

/// Every `[swim] profile`, by name.
pub const PROFILES: &[&str] = &["steady", "fast"];

impl SwimTimings {
    /// `steady`, the default: a member is suspected only when it missed a
    /// whole 1.5 s probe period (a direct probe, then 16 others asked
    /// after 500 ms), so a node agent stalled for a second (a paused VM,
    /// a starved process) faults nothing. A lost host is still found in
    /// under 2 s by its agent connection falling silent (four 500 ms
    /// heartbeats), a crashed process in about 100 ms by its connection
    /// closing (BENCHMARKS.md, "SWIM profiles").
    pub const STEADY: SwimTimings = SwimTimings {
        probe_period: Duration::from_millis(1500),
        probe_rtt: Duration::from_millis(500),
        suspicion_timeout: Duration::from_secs(3),
        indirect_probes: DEFAULT_INDIRECT_PROBES,
    };

    /// `fast`: a 400 ms period and 120 ms before indirect probes: a cut
    /// host is suspected about 0.6 s after its last answer (SWIM's
    /// e/(e−1) × the period), but a stall of 0.3 s can be taken for a
    /// death.
    pub const FAST: SwimTimings = SwimTimings {
        probe_period: Duration::from_millis(400),
        probe_rtt: Duration::from_millis(120),
        suspicion_timeout: Duration::from_secs(2),
        indirect_probes: DEFAULT_INDIRECT_PROBES,
    };

    /// The timings of a named profile (`[swim] profile`); the explicit
    /// keys (`probe_period`, …) override them.
    pub fn profile(name: &str) -> Option<SwimTimings> {
        match name {
            "steady" => Some(SwimTimings::STEADY),
            "fast" => Some(SwimTimings::FAST),
            _ => None,
        }
    }
}

/// `[registry]`: each node the orchestrator knows, with its pinned public
/// key.
pub type Registry = BTreeMap<NodeId, PublicKey>;

/// `[agents]`: the orchestrator's agent listener (TCP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentsConfig {
    /// `listen`: the address (port 0 picks a free one).
    pub listen: SocketAddr,
    /// `max_connections`: connections served at once; more are closed.
    pub max_connections: usize,
    /// `idle_timeout`: a connection that sends nothing this long is closed.
    pub idle_timeout: Duration,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7947)),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// `[swim]`: where the orchestrator's SWIM member listens, whom it asks to
/// join, and SWIM's timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwimConfig {
    /// `bind`: the UDP address (port 0 picks a free one).
    pub bind: SocketAddr,
    /// `advertise`: the address other members reach this one at, which a
    /// node's announcements sign; `None` = the bound address (refused when
    /// that is unspecified, `0.0.0.0` or `::`). Port 0 = the bound port.
    pub advertise: Option<Endpoint>,
    /// `seeds`: members to announce to at start (hostnames resolved then,
    /// and again at every later join).
    pub seeds: Vec<Endpoint>,
    /// `probe_period`, `probe_rtt`, `suspicion_timeout`, `indirect_probes`.
    pub timings: SwimTimings,
    /// `cluster_keys`: key files of the gossip keyring; the first seals,
    /// all open (relative paths are from the config file's folder).
    pub cluster_keys: Vec<PathBuf>,
    /// Cluster keys given in code rather than files (from an embedder's
    /// secret store, say; never read from TOML): they come first in the
    /// keyring, before `cluster_keys`' files, so the first of them seals.
    pub cluster_key_material: Vec<crate::keys::ClusterKey>,
    /// `insecure`: run with no cluster keys (gossip in the clear).
    pub insecure: bool,
    /// `label`: the cluster's label, sealed into every datagram and signed
    /// into every announcement.
    pub label: String,
}

impl Default for SwimConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            seeds: Vec::new(),
            timings: SwimTimings::default(),
            cluster_keys: Vec::new(),
            cluster_key_material: Vec::new(),
            insecure: false,
            label: "poolgate".to_string(),
        }
    }
}

/// `[demo]`: the live demonstration's cluster and its crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoConfig {
    /// `nodes`: how many node members to start (1 to 64).
    pub nodes: u32,
    /// `announce_within`: each node agent announces itself after a random
    /// delay up to this.
    pub announce_within: Duration,
    /// `crash_after`: how long after commit a required node crashes.
    pub crash_after: Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            nodes: 5,
            announce_within: Duration::from_millis(800),
            crash_after: Duration::from_secs(1),
        }
    }
}

/// What is wrong with `label` as `[swim] label`, if anything (the one rule
/// for parsed and built configurations).
pub fn label_problem(label: &str) -> Option<&'static str> {
    (label.is_empty() || label.len() > 128 || label.chars().any(char::is_control))
        .then_some("must be 1 to 128 bytes with no control characters")
}

impl Doc<'_> {
    pub(super) fn swim(&self, table: &Table<'_>) -> Result<SwimConfig, ConfigError> {
        self.only_keys(
            table,
            "swim",
            &[
                "bind",
                "advertise",
                "seeds",
                "profile",
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
        if let Some(value) = table.get("profile") {
            let (name, span) = self.string(value, "swim.profile")?;
            swim.timings = SwimTimings::profile(&name).ok_or_else(|| {
                self.error(
                    span,
                    "swim.profile",
                    format!("unknown profile `{name}`; one of {}", PROFILES.join(", ")),
                )
            })?;
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
        if let Some((key, problem)) = timings_problem(timings) {
            return Err(self.error(rtt_span.unwrap_or(0..0), key, problem));
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
                self.whole(value, "agents.max_connections", MAX_CONNECTIONS)? as usize;
        }
        if let Some(value) = table.get("idle_timeout") {
            agents.idle_timeout = self.duration(value, "agents.idle_timeout")?.0;
        }
        Ok(agents)
    }

    pub(super) fn registry(&self, table: &Table<'_>) -> Result<Registry, ConfigError> {
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

    pub(super) fn endpoint(&self, value: &Value<'_>, key: &str) -> Result<Endpoint, ConfigError> {
        let (text, span) = self.string(value, key)?;
        Endpoint::parse(&text).map_err(|e| self.error(span, key, e))
    }

    /// A whole number in `range`, else "must be a whole number from … to
    /// …" ([`range_problem`]).
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
            .ok_or_else(|| self.error(value.span(), key, range_problem(&range)))
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
}
