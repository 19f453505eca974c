//! Identity material never appears in logs, events or errors: only its
//! SHA-256 fingerprint. The replay runs with every trace enabled, and its
//! whole output is searched for the raw bytes in base64 and in hex.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use base64::Engine;

#[test]
fn identity_bytes_never_reach_logs_or_events() {
    let secret = b"very-secret-data-plane-key-0123456789";
    let other = b"another-secret-key-material-abcdef";
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut scenario = String::new();
    for (i, node) in ["a", "b", "c"].iter().enumerate() {
        scenario += &format!(
            "{{\"at_ms\":{i},\"type\":\"known\",\"node\":\"{node}\"}}\n{{\"at_ms\":{i},\"type\":\"swim\",\"node\":\"{node}\",\"state\":\"alive\",\"incarnation\":1}}\n{{\"at_ms\":{i},\"type\":\"available\",\"node\":\"{node}\"}}\n{{\"at_ms\":{i},\"type\":\"identity\",\"node\":\"{node}\",\"material\":\"{}\"}}\n",
            b64(secret)
        );
    }
    scenario += &format!(
        "{{\"at_ms\":2000,\"type\":\"identity\",\"node\":\"a\",\"material\":\"{}\"}}\n",
        b64(other)
    );
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/config.toml");
    for human in [false, true] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_poolgate"));
        command.args(["replay", "--config"]).arg(&config);
        if human {
            command.arg("--human");
        }
        let mut child = command
            .arg("-")
            .env("RUST_LOG", "trace")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(scenario.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        let all = [output.stdout, output.stderr].concat();
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.contains("pool_ready") || text.contains("READY"),
            "the scenario ran: {text}"
        );
        assert!(text.contains("gate event"), "tracing was on: {text}");
        for material in [&secret[..], &other[..]] {
            for shown in [
                b64(material),
                hex::encode(material),
                String::from_utf8_lossy(material).into_owned(),
            ] {
                assert!(!text.contains(&shown), "{shown} leaked");
            }
        }
    }
}
