//! `node.toml`: one node agent (`poolgate node`, design §7).

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_actors::core::NodeId;

use super::doc::Doc;
use super::endpoint::Endpoint;
use super::{ConfigError, SwimConfig};
use toml::de::{DeTable, DeValue};

/// `node.toml`: one node agent (`poolgate node`, design §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// `[node] name`: the node's id, as the pool and registry name it.
    pub name: NodeId,
    /// `[node] signing_key`: the node's Ed25519 key file.
    pub signing_key: PathBuf,
    /// `[node] identity`: the data-plane identity material file (1 B to
    /// 16 KiB), re-read on SIGHUP.
    pub identity: PathBuf,
    /// `[node] health_check`: argv run every `health_interval`; exit 0
    /// keeps the node available.
    pub health_check: Option<Vec<String>>,
    /// `[node] health_interval`.
    pub health_interval: Duration,
    /// `[swim]`: as in `config.toml`.
    pub swim: SwimConfig,
    /// `[node] generation_file`: where the node keeps its last life
    /// (default `<signing_key>.generation`); its folder must be writable.
    pub generation_file: Option<PathBuf>,
    /// `[node] heartbeat`: how often a signed frame goes to the
    /// orchestrator when nothing changed; a connection silent for
    /// [`HEARTBEATS_MISSED`] heartbeats is taken as gone, on both sides.
    pub heartbeat: Duration,
    /// `[orchestrator] agents`: the orchestrator's agent listener, or
    /// several (replicas, a standby): tried in turn.
    pub agents: Vec<Endpoint>,
}

/// How many heartbeats may be missed before a connection is taken as gone:
/// four, so that a node agent stalled for a second (with up to a heartbeat
/// gone by since its last frame) is not taken for gone, and a lost host is
/// still found within 2 s at the default heartbeat.
pub const HEARTBEATS_MISSED: u32 = 4;

/// `[node] heartbeat`'s default: a node whose host is cut off is not
/// live within 4 × 500 ms (plus the lost connection's grace) whatever
/// SWIM says, for about 700 bytes a second per node (BENCHMARKS.md).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(500);

impl NodeConfig {
    /// Reads and checks a node configuration; relative paths are from the
    /// file's folder.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = NodeConfig::parse(&text, &file)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let paths = [&mut config.signing_key, &mut config.identity]
            .into_iter()
            .chain(config.generation_file.iter_mut())
            .chain(config.swim.cluster_keys.iter_mut());
        for path in paths {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
        Ok(config)
    }

    /// Checks the text of a node configuration; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<NodeConfig, ConfigError> {
        let doc = Doc { text, file };
        let root = DeTable::parse(text)
            .map_err(|e| doc.error(e.span().unwrap_or(0..0), "toml", e.message().trim_end()))?;
        let root = root.get_ref();
        doc.only_keys(root, "", &["node", "swim", "orchestrator"])?;
        let (node, node_span) = doc.required_section(root, "node")?;
        doc.only_keys(
            node,
            "node",
            &[
                "name",
                "signing_key",
                "identity",
                "health_check",
                "health_interval",
                "heartbeat",
                "generation_file",
            ],
        )?;
        let name = doc.required(node, "node", "name", node_span.clone())?;
        let (name_text, name_span) = doc.string(name, "node.name")?;
        let name = NodeId::new(&name_text).map_err(|e| doc.error(name_span, "node.name", e))?;
        let key = doc.required(node, "node", "signing_key", node_span.clone())?;
        let signing_key = PathBuf::from(doc.string(key, "node.signing_key")?.0);
        let identity = doc.required(node, "node", "identity", node_span)?;
        let identity = PathBuf::from(doc.string(identity, "node.identity")?.0);
        let health_check = match node.get("health_check") {
            Some(value) => {
                let argv = doc.strings(value, "node.health_check")?;
                if argv.is_empty() {
                    return Err(doc.error(
                        value.span(),
                        "node.health_check",
                        "must name a program (a non-empty argv list)",
                    ));
                }
                Some(argv)
            }
            None => None,
        };
        let health_interval = match node.get("health_interval") {
            Some(value) => doc.duration(value, "node.health_interval")?.0,
            None => Duration::from_secs(5),
        };
        let heartbeat = match node.get("heartbeat") {
            Some(value) => {
                let (heartbeat, span) = doc.duration(value, "node.heartbeat")?;
                if heartbeat < Duration::from_millis(50) || heartbeat > Duration::from_secs(60) {
                    return Err(doc.error(span, "node.heartbeat", "must be from 50ms to 60s"));
                }
                heartbeat
            }
            None => DEFAULT_HEARTBEAT,
        };
        let generation_file = match node.get("generation_file") {
            Some(value) => Some(PathBuf::from(doc.string(value, "node.generation_file")?.0)),
            None => None,
        };
        let swim = match doc.section(root, "swim")? {
            Some((table, _)) => doc.swim(table)?,
            None => SwimConfig::default(),
        };
        let (orchestrator, span) = doc.required_section(root, "orchestrator")?;
        doc.only_keys(orchestrator, "orchestrator", &["agents"])?;
        let agents = doc.required(orchestrator, "orchestrator", "agents", span)?;
        let agents = match agents.get_ref() {
            DeValue::Array(items) if items.is_empty() => {
                return Err(doc.error(
                    agents.span(),
                    "orchestrator.agents",
                    "must name at least one \"host:port\"",
                ))
            }
            DeValue::Array(items) => items
                .iter()
                .map(|item| doc.endpoint(item, "orchestrator.agents"))
                .collect::<Result<_, _>>()?,
            _ => vec![doc.endpoint(agents, "orchestrator.agents")?],
        };
        Ok(NodeConfig {
            name,
            signing_key,
            identity,
            health_check,
            health_interval,
            generation_file,
            heartbeat,
            swim,
            agents,
        })
    }
}
