//! The configuration's checks, key by key and line by line.

use super::*;
use std::path::Path;

#[test]
fn durations_are_said_to_the_whole_millisecond() {
    let third = Duration::from_secs(4) / 3;
    assert_eq!(in_words(third).to_string(), "1s 333ms");
    assert_eq!(in_words(Duration::from_micros(999)).to_string(), "0s");
    assert_eq!(in_words(Duration::from_secs(90)).to_string(), "1m 30s");
}

const GOOD: &str = r#"
[pool]
id = "pool-a"
members = ["node-1", "node-2", "node-3"]

[readiness]
convergence_window = "5s"

[planning]
on_readiness_lost = "wait"   # "wait" | "abort"
wait_timeout = "30s"
"#;

fn error_of(text: &str) -> (usize, String, String) {
    match Config::parse(text, "config.toml") {
        Err(ConfigError::Invalid {
            line, key, message, ..
        }) => (line, key, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn etcd_needs_a_state_key_and_refuses_plain_http_unless_insecure() {
    let etcd =
        |extra: &str| format!("{GOOD}\n[state]\netcd = [\"http://127.0.0.1:2379\"]\n{extra}");
    let (_, key, message) = error_of(&etcd("key = \"state.key\"\n"));
    assert_eq!(key, "state.etcd");
    assert!(message.contains("plain http"), "{message}");
    let (_, key, _) = error_of(&etcd(""));
    assert_eq!(key, "state.etcd", "plain http is said first");
    let open = Config::parse(&etcd("insecure = true\n"), "c").unwrap();
    assert!(open.state.insecure && open.state.key.is_none());
    let keyed = Config::parse(&etcd("insecure = true\nkey = \"state.key\"\n"), "c").unwrap();
    assert_eq!(keyed.state.key, Some(PathBuf::from("state.key")));
    let (_, key, _) = error_of(&etcd("insecure = \"yes\"\n"));
    assert_eq!(key, "state.insecure");
    let user = Config::parse(
        &etcd("insecure = true\nusername = \"gate\"\npassword_file = \"pw\"\n"),
        "c",
    )
    .unwrap();
    assert_eq!(user.state.username.as_deref(), Some("gate"));
    let (_, key, message) = error_of(&etcd("insecure = true\nusername = \"gate\"\n"));
    assert_eq!(key, "state.username");
    assert!(message.contains("password_file"), "{message}");
    let (_, key, _) = error_of(&etcd("insecure = true\npassword_file = \"pw\"\n"));
    assert_eq!(key, "state.password_file");
}

#[test]
fn tls_files_go_with_https_endpoints_in_pairs_and_resolve_beside_the_config() {
    let etcd = |endpoint: &str, extra: &str| {
        format!("{GOOD}\n[state]\netcd = [\"{endpoint}\"]\nkey = \"state.key\"\n{extra}")
    };
    let https = "https://etcd-1:2379";
    let mut both = Config::parse(
        &etcd(
            https,
            "ca_file = \"ca.pem\"\ncert_file = \"client.pem\"\nkey_file = \"client.key\"\n",
        ),
        "c",
    )
    .unwrap();
    assert!(!both.state.insecure, "https with a key needs no insecure");
    both.resolve_paths(Path::new("/etc/poolgate"));
    assert_eq!(
        both.state.tls.ca_file,
        Some(PathBuf::from("/etc/poolgate/ca.pem"))
    );
    assert_eq!(
        both.state.tls.key_file,
        Some(PathBuf::from("/etc/poolgate/client.key"))
    );
    let (_, key, message) = error_of(&etcd(https, "cert_file = \"client.pem\"\n"));
    assert_eq!(key, "state.cert_file");
    assert!(message.contains("key_file"), "{message}");
    let (_, key, _) = error_of(&etcd(https, "key_file = \"client.key\"\n"));
    assert_eq!(key, "state.key_file");
    let (_, key, message) = error_of(&etcd(
        "http://etcd-1:2379",
        "insecure = true\nca_file = \"ca.pem\"\n",
    ));
    assert_eq!(key, "state.ca_file");
    assert!(message.contains("https"), "{message}");
    let (_, key, _) = error_of(&etcd(https, "ca_file = \"\"\n"));
    assert_eq!(key, "state.ca_file");
    let (_, key, _) = error_of(&etcd(https, "ca = \"ca.pem\"\n"));
    assert_eq!(key, "state.ca");
}

#[test]
fn run_unguarded_after_is_whole_seconds_up_to_30s_and_defaults_to_10s() {
    assert_eq!(
        Config::parse(GOOD, "c").unwrap().run.unguarded_after,
        DEFAULT_UNGUARDED_AFTER
    );
    let set = |value: &str| format!("{GOOD}\n[run]\nunguarded_after = \"{value}\"\n");
    assert_eq!(
        Config::parse(&set("30s"), "c").unwrap().run.unguarded_after,
        Duration::from_secs(30)
    );
    for bad in ["31s", "500ms", "1500ms", "0s"] {
        let (_, key, _) = error_of(&set(bad));
        assert_eq!(key, "run.unguarded_after", "{bad}");
    }
    let (_, key, _) = error_of(&format!("{GOOD}\n[run]\nunguarded = \"5s\"\n"));
    assert!(key.contains("unguarded"), "{key}");
}

#[test]
fn the_spec_example_parses() {
    let config = Config::parse(GOOD, "config.toml").unwrap();
    assert_eq!(config.pool.id().as_str(), "pool-a");
    assert_eq!(config.pool.members().len(), 3);
    assert_eq!(config.convergence_window, Duration::from_secs(5));
    assert_eq!(config.planning.on_readiness_lost, OnReadinessLost::Wait);
    assert_eq!(config.planning.wait_timeout, Some(Duration::from_secs(30)));
}

#[cfg(not(feature = "live"))]
#[test]
fn without_the_live_feature_its_sections_are_refused_by_name() {
    let text = include_str!("../../config.toml");
    let (_, key, message) = error_of(text);
    assert_eq!(key, "swim");
    assert!(message.contains("`live` feature"), "{message}");
    let (_, key, _) = error_of(&format!("{GOOD}\n[registry]\nnode-1 = \"k\"\n"));
    assert_eq!(key, "registry");
}

#[cfg(feature = "live")]
#[test]
fn the_shipped_config_parses() {
    let text = include_str!("../../config.toml");
    Config::parse(text, "config.toml").unwrap();
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let text = GOOD.replace("wait_timeout", "wait_timout");
    let (line, key, message) = error_of(&text);
    assert_eq!((line, key.as_str()), (11, "planning.wait_timout"));
    assert!(message.contains("unknown key"), "{message}");
}

#[test]
fn an_absurd_duration_is_refused_naming_its_key() {
    // Issue 20: a timer this far out cannot be set; refused, not a panic.
    let text = GOOD.replace("wait_timeout = \"30s\"", "wait_timeout = \"1000years\"");
    assert_ne!(text, GOOD);
    let (_, key, message) = error_of(&text);
    assert_eq!(key, "planning.wait_timeout");
    assert!(message.contains("365 days"), "{message}");
}

#[test]
fn an_unknown_section_is_named() {
    let (line, key, _) = error_of(&format!("{GOOD}\n[extra]\nx = 1\n"));
    assert_eq!((line, key.as_str()), (13, "extra"));
}

#[test]
fn an_empty_member_list_is_refused() {
    let text = GOOD.replace(r#"["node-1", "node-2", "node-3"]"#, "[]");
    let (line, key, message) = error_of(&text);
    assert_eq!((line, key.as_str()), (4, "pool.members"));
    assert!(message.contains("no members"), "{message}");
}

#[test]
fn a_duplicated_member_is_refused() {
    let text = GOOD.replace(r#""node-3""#, r#""node-1""#);
    let (line, key, message) = error_of(&text);
    assert_eq!((line, key.as_str()), (4, "pool.members"));
    assert!(message.contains("node-1"), "{message}");
}

#[test]
fn an_invalid_node_id_is_refused() {
    let text = GOOD.replace(r#""node-3""#, r#""""#);
    let (_, key, message) = error_of(&text);
    assert_eq!(key, "pool.members");
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn a_zero_window_is_refused() {
    let (line, key, _) = error_of(&GOOD.replace("\"5s\"", "\"0s\""));
    assert_eq!((line, key.as_str()), (7, "readiness.convergence_window"));
}

#[test]
fn an_unparsable_window_is_refused() {
    let (_, key, message) = error_of(&GOOD.replace("\"5s\"", "\"soon\""));
    assert_eq!(key, "readiness.convergence_window");
    assert!(message.contains("not a duration"), "{message}");
}

const FLEET: &str = r#"[readiness]
convergence_window = "5s"
[planning]
on_readiness_lost = "wait"
wait_timeout = "30s"
[pools.b]
members = ["n2", "n3"]
convergence_window = "2s"
on_readiness_lost = "abort"
wait_timeout = "10s"
[pools.a]
members = ["n1", "n2"]
"#;

#[test]
fn pools_take_their_own_settings_or_the_defaults_and_come_by_id() {
    let config = Config::parse(FLEET, "config.toml").unwrap();
    let ids: Vec<&str> = config
        .pools
        .iter()
        .map(|p| p.definition.id().as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(config.pool.id().as_str(), "a", "the first pool, by id");
    let (a, b) = (&config.pools[0], &config.pools[1]);
    assert_eq!(a.convergence_window, Duration::from_secs(5));
    assert_eq!(a.planning.on_readiness_lost, OnReadinessLost::Wait);
    assert_eq!(a.planning.wait_timeout, Some(Duration::from_secs(30)));
    assert_eq!(b.convergence_window, Duration::from_secs(2));
    assert_eq!(b.planning.on_readiness_lost, OnReadinessLost::Abort);
    assert_eq!(b.planning.wait_timeout, Some(Duration::from_secs(10)));
    assert!(b.gate_settings().is_ok());
    // [readiness] is optional when every pool gives its window.
    let own = "[pools.a]\nmembers = [\"n1\"]\nconvergence_window = \"1s\"\n";
    let config = Config::parse(own, "config.toml").unwrap();
    assert_eq!(config.convergence_window, Duration::from_secs(1));
}

#[test]
fn run_pool_acts_on_the_pool_named_and_keeps_the_others_defined_after_it() {
    // `run --pool b` alone gates every pool (a run of another restored
    // from the state file keeps its nodes reserved), pool b first: its
    // gate is the one `run` acts on, with its own window and policy.
    let config = Config::parse(FLEET, "config.toml").unwrap();
    let b = config.with_only_pool(Some("b")).unwrap();
    let ids: Vec<&str> = b.pools.iter().map(|p| p.definition.id().as_str()).collect();
    assert_eq!(ids, ["b", "a"]);
    assert_eq!(b.pool.id().as_str(), "b");
    assert_eq!(b.convergence_window, Duration::from_secs(2));
    assert_eq!(b.planning.on_readiness_lost, OnReadinessLost::Abort);
    assert_eq!(b.gate_settings().unwrap().definition.id().as_str(), "b");
    let refused = config.with_only_pool(Some("z")).unwrap_err();
    assert!(refused.contains("no pool z (defined: a, b)"), "{refused}");
    let unnamed = config.with_only_pool(None).unwrap_err();
    assert!(unnamed.contains("name one with --pool"), "{unnamed}");
}

#[test]
fn a_wrong_pool_of_a_fleet_is_named_by_key_and_line() {
    let cases = [
        (
            FLEET.replace(
                "[pools.a]",
                "[pool]\nid = \"x\"\nmembers = [\"n\"]\n[pools.a]",
            ),
            11,
            "pool",
        ),
        (
            FLEET.replace("[\"n1\", \"n2\"]", "[\"n1\", \"n1\"]"),
            12,
            "pools.a.members",
        ),
        (
            FLEET.replace("[\"n1\", \"n2\"]", "[]"),
            12,
            "pools.a.members",
        ),
        (
            FLEET.replace("members = [\"n1\", \"n2\"]", "size = 2"),
            12,
            "pools.a.size",
        ),
        (
            FLEET.replace("wait_timeout = \"10s\"", "wait_timeout = \"2s\""),
            10,
            "pools.b.wait_timeout",
        ),
        (
            FLEET.replace("[pools.a]", "[pools.\"a\\u0007\"]"),
            11,
            "pools.a\u{7}",
        ),
        (
            FLEET.replace(
                "convergence_window = \"5s\"",
                "convergence_window = \"31s\"",
            ),
            5,
            "planning.wait_timeout",
        ),
        (
            "[pools.a]\nmembers = [\"n1\"]\n".to_string(),
            1,
            "pools.a.convergence_window",
        ),
        (
            "[pools]\n[readiness]\nconvergence_window = \"1s\"\n".to_string(),
            1,
            "pools",
        ),
        (
            "[readiness]\nconvergence_window = \"1s\"\n".to_string(),
            1,
            "pool",
        ),
    ];
    for (text, line, key) in cases {
        let (l, k, message) = error_of(&text);
        assert_eq!((l, k.as_str()), (line, key), "{message}\n{text}");
    }
}

#[test]
fn a_wait_timeout_not_longer_than_the_window_is_refused() {
    let (line, key, _) = error_of(&GOOD.replace("\"30s\"", "\"5s\""));
    assert_eq!((line, key.as_str()), (11, "planning.wait_timeout"));
}

#[test]
fn an_unknown_policy_is_refused() {
    let (line, key, message) = error_of(&GOOD.replace("\"wait\"   #", "\"retry\" #"));
    assert_eq!((line, key.as_str()), (10, "planning.on_readiness_lost"));
    assert!(message.contains("retry"), "{message}");
}

#[test]
fn a_missing_key_names_its_section() {
    let text = GOOD.replace("id = \"pool-a\"\n", "");
    let (line, key, _) = error_of(&text);
    assert_eq!((line, key.as_str()), (2, "pool.id"));
}

#[test]
fn a_syntax_error_gives_its_line() {
    let text = GOOD.replace("convergence_window = \"5s\"", "convergence_window = ");
    let (line, key, _) = error_of(&text);
    assert_eq!((line, key.as_str()), (7, "toml"));
}

#[cfg(feature = "live")]
#[test]
fn swim_and_demo_sections_are_read_and_checked() {
    let text = format!("{GOOD}\n[swim]\nbind = \"127.0.0.1:7946\"\nseeds = [\"127.0.0.1:7947\"]\nprobe_period = \"400ms\"\nprobe_rtt = \"100ms\"\nsuspicion_timeout = \"1s\"\n[demo]\nnodes = 3\ncrash_after = \"2s\"\n");
    let config = Config::parse(&text, "c").unwrap();
    assert_eq!(config.swim.bind.port(), 7946);
    assert_eq!(config.swim.seeds.len(), 1);
    assert_eq!(config.swim.timings.probe_period, Duration::from_millis(400));
    assert_eq!(config.demo.nodes, 3);
    assert_eq!(config.demo.crash_after, Duration::from_secs(2));

    let (line, key, _) = error_of(&text.replace("\"100ms\"", "\"400ms\""));
    assert_eq!((line, key.as_str()), (17, "swim.probe_rtt"));
    let (line, key, _) = error_of(&text.replace("nodes = 3", "nodes = 0"));
    assert_eq!((line, key.as_str()), (20, "demo.nodes"));
    let (_, key, _) = error_of(&text.replace("127.0.0.1:7947", "nowhere"));
    assert_eq!(key, "swim.seeds");
    let (_, key, _) = error_of(&text.replace("probe_period", "probe_perod"));
    assert_eq!(key, "swim.probe_perod");

    assert_eq!(
        config.swim.timings.indirect_probes, 16,
        "the shipped default"
    );
    let fewer = text.replace("[demo]", "indirect_probes = 3\n[demo]");
    let config = Config::parse(&fewer, "c").unwrap();
    assert_eq!(config.swim.timings.indirect_probes, 3);
    let foca = config.swim.timings.foca_config(10);
    assert_eq!(foca.num_indirect_probes.get(), 3);
    let (_, key, _) = error_of(&text.replace("[demo]", "indirect_probes = 0\n[demo]"));
    assert_eq!(key, "swim.indirect_probes");
}

#[cfg(feature = "live")]
#[test]
fn an_unspecified_bind_needs_advertise_and_hostnames_are_accepted() {
    let unspecified = format!("{GOOD}\n[swim]\nbind = \"0.0.0.0:7946\"\n");
    let (line, key, message) = error_of(&unspecified);
    assert_eq!((line, key.as_str()), (14, "swim.advertise"));
    assert!(message.contains("0.0.0.0:7946"), "{message}");
    let (_, key, _) = error_of(&unspecified.replace("0.0.0.0", "[::]"));
    assert_eq!(key, "swim.advertise");

    let advertised = format!(
        "{GOOD}\n[swim]\nbind = \"0.0.0.0:7946\"\nadvertise = \"orch-1.example:7946\"\nseeds = [\"node-1:7946\", \"10.0.0.2:7946\"]\n"
    );
    let config = Config::parse(&advertised, "c").unwrap();
    assert_eq!(
        config.swim.advertise.as_ref().map(|e| e.as_str()),
        Some("orch-1.example:7946")
    );
    assert_eq!(config.swim.seeds.len(), 2);
    let (_, key, _) = error_of(&advertised.replace("orch-1.example:7946", "orch 1:7946"));
    assert_eq!(key, "swim.advertise");
}

#[cfg(feature = "live")]
const NODE: &str = "[node]\nname = \"node-1\"\nsigning_key = \"k\"\nidentity = \"i\"\n[orchestrator]\nagents = \"orch-1:7947\"\n";

#[cfg(feature = "live")]
#[test]
fn a_node_names_one_orchestrator_or_several_and_a_heartbeat() {
    let one = NodeConfig::parse(NODE, "n").unwrap();
    assert_eq!(one.agents.len(), 1);
    assert_eq!(one.heartbeat, DEFAULT_HEARTBEAT);
    let several = NODE.replace(
        "agents = \"orch-1:7947\"",
        "agents = [\"orch-1:7947\", \"10.0.0.2:7947\"]",
    );
    assert_eq!(NodeConfig::parse(&several, "n").unwrap().agents.len(), 2);
    let none = NODE.replace("agents = \"orch-1:7947\"", "agents = []");
    let error = NodeConfig::parse(&none, "n").unwrap_err().to_string();
    assert!(error.contains("orchestrator.agents"), "{error}");
    let beat = NODE.replace(
        "identity = \"i\"",
        "identity = \"i\"\nheartbeat = \"250ms\"",
    );
    assert_eq!(
        NodeConfig::parse(&beat, "n").unwrap().heartbeat,
        Duration::from_millis(250)
    );
    let fast = beat.replace("250ms", "1ms");
    let error = NodeConfig::parse(&fast, "n").unwrap_err().to_string();
    assert!(error.contains("node.heartbeat"), "{error}");
}

#[test]
fn the_planning_section_is_optional() {
    let text = GOOD.split("[planning]").next().unwrap();
    let config = Config::parse(text, "c").unwrap();
    assert_eq!(config.planning.wait_timeout, None);
}

#[test]
fn state_etcd_keys_are_checked_by_name() {
    let base = "[pool]\nid = \"p\"\nmembers = [\"a\"]\n[readiness]\nconvergence_window = \"1s\"\n[state]\n";
    let (_, key, message) = error_of(&format!(
        "{base}etcd = [\"http://127.0.0.1:2379\"]\nlease = \"2500ms\"\n"
    ));
    assert_eq!(key, "state.lease");
    assert!(message.contains("whole seconds"), "{message}");
    // https is taken; without a state key it is refused for that.
    let (_, key, _) = error_of(&format!("{base}etcd = [\"https://e:2379\"]\n"));
    assert_eq!(key, "state.key");
    let (_, key, message) = error_of(&format!("{base}etcd = [\"ftp://e:2379\"]\n"));
    assert_eq!(key, "state.etcd");
    assert!(message.contains("https://host:port"), "{message}");
    let (_, key, _) = error_of(&format!(
        "{base}path = \"s.db\"\netcd = [\"http://127.0.0.1:2379\"]\n"
    ));
    assert_eq!(key, "state.etcd");
    let config = Config::parse(
        &format!("{base}etcd = [\"http://127.0.0.1:2379\"]\nlease = \"3s\"\ninsecure = true\n"),
        "config.toml",
    )
    .unwrap();
    assert_eq!(config.state.lease, Duration::from_secs(3));
}
