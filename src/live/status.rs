//! `poolgate status`: asks a running orchestrator why each node is or is
//! not ready (design §10).
//!
//! The question goes to the orchestrator's agent listener (`[agents]
//! listen`, so the same `config.toml` finds it): a length-prefixed
//! `{"v":1,"query":"status"}` as the first frame of a connection. The
//! answer is one length-prefixed JSON object, then the connection closes:
//!
//! ```text
//! {"pool":"pool-a","phase":"forming","epoch":null,"deadline_ms":null,"run":null,
//!  "leader":"this replica (no replicas configured)","at_ms":5120,
//!  "candidates":[{"node":"node-1","ready":true,"blockers":[],"since_ms":800},
//!                {"node":"node-2","ready":false,"blockers":["not_live"],
//!                 "detail":"not_live (never seen)","since_ms":0}]}
//! ```
//!
//! It holds node names and blockers only: no identity material, no
//! fingerprint, nothing a node signed.

use std::net::SocketAddr;
use std::time::Duration;

use poolgate_actors::core::{PoolPhase, PoolReport, Time};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::wire;
use crate::config::Config;

/// The longest status answer read, in bytes.
pub const MAX_STATUS: usize = 16 * 1024 * 1024;

/// How long `poolgate status` waits for an answer.
pub const STATUS_WAIT: Duration = Duration::from_secs(3);

/// A question on the agent listener (instead of a first agent frame).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Query {
    /// The format's version (1).
    pub v: u32,
    /// What is asked: `status`.
    pub query: String,
    /// One pool only (`status --pool`); every pool when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// Whether `bytes` (a first frame) is a status question.
pub fn is_status_query(bytes: &[u8]) -> bool {
    status_query(bytes).is_some()
}

/// The status question `bytes` (a first frame) asks, if it is one: the
/// pool it asks of, if one.
pub fn status_query(bytes: &[u8]) -> Option<Option<String>> {
    serde_json::from_slice::<Query>(bytes)
        .ok()
        .filter(|q| q.v == 1 && q.query == "status")
        .map(|q| q.pool)
}

/// The status answer for a fleet's `reports` (design §14): the first
/// pool's answer (or `only`'s), with `pools` listing every pool's answer
/// when there are several; for an `only` no pool has, an `error`.
pub fn answer_all(
    reports: &[PoolReport],
    only: Option<&str>,
    now: Time,
    leader: &str,
    writing: bool,
) -> Value {
    if let Some(only) = only {
        return match reports.iter().find(|r| r.pool.as_str() == only) {
            Some(report) => answer(report, now, leader, writing),
            None => {
                let defined: Vec<&str> = reports.iter().map(|r| r.pool.as_str()).collect();
                unknown_pool(only, &defined, Some(&leader))
            }
        };
    }
    let Some(first) = reports.first() else {
        return json!({"error": "no pool is defined", "leader": leader});
    };
    let mut all = answer(first, now, leader, writing);
    if reports.len() > 1 {
        all["pools"] = Value::Array(
            reports
                .iter()
                .map(|r| answer(r, now, leader, writing))
                .collect(),
        );
    }
    all
}

/// The answer to `status --pool ID` of a pool that is not defined: an
/// error naming the pools there are.
pub fn unknown_pool(only: &str, defined: &[&str], leader: Option<&dyn std::fmt::Display>) -> Value {
    json!({
        "error": format!("no pool {only} (defined: {})", defined.join(", ")),
        "pools_defined": defined,
        "leader": leader.map_or_else(|| "none right now".to_string(), |l| l.to_string()),
    })
}

/// The status answer for `report`, taken at `now`; `writing`: whether the
/// gate's last write of its durable state succeeded.
pub fn answer(report: &PoolReport, now: Time, leader: &str, writing: bool) -> Value {
    let (phase, epoch, deadline) = match report.phase {
        PoolPhase::Forming => ("forming", None, None),
        PoolPhase::Converging { deadline } => ("converging", None, Some(deadline.as_millis())),
        PoolPhase::Ready { epoch } => ("ready", Some(epoch.0), None),
    };
    let candidates: Vec<Value> = report
        .candidates
        .iter()
        .map(|c| {
            let names: Vec<&str> = c.verdict.blockers().map(|b| b.as_str()).collect();
            let mut entry = json!({
                "node": c.node.as_str(),
                "ready": c.verdict.is_ready(),
                "blockers": names,
                "since_ms": c.since.as_millis(),
            });
            if !c.verdict.is_ready() {
                entry["detail"] = Value::String(c.blockers_in_words());
            }
            entry
        })
        .collect();
    json!({
        "pool": report.pool.as_str(),
        "phase": phase,
        "epoch": epoch,
        "deadline_ms": deadline,
        "run": report.run.as_ref().map(|r| r.as_str()),
        "leader": leader,
        "writing": writing,
        "at_ms": now.as_millis(),
        "candidates": candidates,
    })
}

/// What a follower read of what the leader published of a pool.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaderSaid {
    /// Read: the leader's last words of the pool (see [`published`]), if
    /// it published any.
    Read(Option<Value>),
    /// Not read, and why (etcd did not answer in time, say).
    Unread(String),
}

/// A follower replica's answer: who leads (design §12), and what the
/// leader last published of the pool (`leader_said`, `null` when nothing
/// was or it could not be read; then `leader_said_unread` says why).
pub fn follower_answer(
    pool: &str,
    leader: Option<&dyn std::fmt::Display>,
    said: LeaderSaid,
) -> Value {
    let leader = match leader {
        Some(l) => l.to_string(),
        None => "none right now".to_string(),
    };
    let (said, unread) = match said {
        LeaderSaid::Read(said) => (said, None),
        LeaderSaid::Unread(why) => (None, Some(why)),
    };
    // The run is what the leader last published of it, if anything.
    let run = said
        .as_ref()
        .map_or(Value::Null, |said| said["run"].clone());
    let mut answer = json!({
        "pool": pool,
        "phase": "following",
        "epoch": null,
        "deadline_ms": null,
        "run": run,
        "leader": leader,
        "candidates": [],
        "leader_said": said,
    });
    if let Some(why) = unread {
        answer["leader_said_unread"] = json!(why);
    }
    answer
}

/// What the leader among replicas publishes of its pool (the `status`
/// record), for every replica's `status` and a requester that gives up
/// to tell: the pool, its phase, epoch and run, and its state in words
/// ([`crate::report::state_line_live`]: the blockers, grouped past eight,
/// its instants as UTC times by the gate's `clock`). Small whatever the
/// pool's size; the caller adds when it was written.
pub fn published(report: &PoolReport, clock: &poolgate_actors::Clock) -> Value {
    let (phase, epoch) = match report.phase {
        PoolPhase::Forming => ("forming", None),
        PoolPhase::Converging { .. } => ("converging", None),
        PoolPhase::Ready { epoch } => ("ready", Some(epoch.0)),
    };
    json!({
        "pool": report.pool.as_str(),
        "phase": phase,
        "epoch": epoch,
        "run": report.run.as_ref().map(|r| r.as_str()),
        "state": crate::report::state_line_live(report, clock),
    })
}

/// Writes `answer` on `stream`, length-prefixed.
pub async fn write_answer(
    stream: &mut tokio::net::TcpStream,
    answer: &Value,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(answer).unwrap_or_default();
    stream
        .write_all(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes())
        .await?;
    stream.write_all(&bytes).await
}

/// Where `poolgate status` asks: the agent listener, on this machine when
/// it listens on every address.
pub fn address(config: &Config) -> SocketAddr {
    let mut addr = config.agents.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    addr
}

/// Whether a status question from `peer`, reaching the listener at
/// `local`, is answered: from the orchestrator's own host only (a
/// loopback address, or the listener's own address). What the pool is
/// made of, and what blocks it, is nobody else's business; a remote
/// peer is refused and told so.
pub fn answers(peer: std::net::IpAddr, local: std::net::IpAddr) -> bool {
    let mapped = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    let (peer, local) = (mapped(peer), mapped(local));
    peer.is_loopback() || peer == local
}

/// Asks the orchestrator at `addr`; its answer, or why there is none.
pub async fn ask(addr: SocketAddr) -> Result<Value, String> {
    ask_pool(addr, None).await
}

/// Asks the orchestrator at `addr` of `pool` (every pool when `None`).
pub async fn ask_pool(addr: SocketAddr, pool: Option<&str>) -> Result<Value, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("no orchestrator answers at {addr} (a replica between following and leading, or none runs there): {e}"))?;
        let query = serde_json::to_vec(&Query {
            v: 1,
            query: "status".into(),
            pool: pool.map(str::to_string),
        })
        .unwrap_or_default();
        let mut framed = u32::try_from(query.len())
            .unwrap_or(0)
            .to_be_bytes()
            .to_vec();
        framed.extend_from_slice(&query);
        stream
            .write_all(&framed)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let bytes = wire::read_prefixed(&mut stream, MAX_STATUS)
            .await
            .map_err(|e| format!("{addr}: {e}"))?
            .ok_or_else(|| format!("{addr} closed without an answer (a replica between following and leading, a process stopping, or not a poolgate orchestrator of this version)"))?;
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|_| format!("{addr}: the answer is not a status"))?;
        if answer["reply"] == "refused" {
            return Err(format!(
                "{addr} refused: {}",
                answer["detail"].as_str().unwrap_or("no reason given")
            ));
        }
        if let Some(error) = answer["error"].as_str() {
            return Err(format!("{addr}: {error}"));
        }
        Ok(answer)
    };
    tokio::time::timeout(STATUS_WAIT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer from {addr} within {STATUS_WAIT:?}")))
}

/// The answer in words, one line per candidate; every pool's, one after
/// another, when there are several.
pub fn render(answer: &Value) -> String {
    match answer["pools"].as_array() {
        Some(pools) => pools.iter().map(render_one).collect::<Vec<_>>().join("\n"),
        None => render_one(answer),
    }
}

fn render_one(answer: &Value) -> String {
    let mut out = String::new();
    let pool = answer["pool"].as_str().unwrap_or("?");
    let phase = answer["phase"].as_str().unwrap_or("?");
    match phase {
        "ready" => out.push_str(&format!("pool {pool}: ready, epoch {}\n", answer["epoch"])),
        "converging" => out.push_str(&format!(
            "pool {pool}: converging, PoolReady due in {} ms\n",
            answer["deadline_ms"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(answer["at_ms"].as_u64().unwrap_or(0))
        )),
        "following" => {
            out.push_str(&format!("pool {pool}: this replica follows\n"));
            let said = &answer["leader_said"];
            match said["state"].as_str() {
                // The run it published is the answer's `run`, said below
                // (once: an operator's trial read `run: none` twice).
                Some(state) => out.push_str(&format!(
                    "{} published, {} s ago: {state}\n",
                    match said["by_leader_now"].as_bool() {
                        // A takeover: the next leader has not published yet.
                        Some(false) => "the leader before the one leading now",
                        _ => "the leader",
                    },
                    said["age_ms"].as_u64().unwrap_or(0) / 1000,
                )),
                None => match answer["leader_said_unread"].as_str() {
                    Some(why) => out.push_str(&format!(
                        "what the leader published cannot be read now: {why}\n"
                    )),
                    None => out.push_str(
                        "the leader has published nothing (ask it with poolgate status on its host)\n",
                    ),
                },
            }
        }
        _ => out.push_str(&format!("pool {pool}: {phase}\n")),
    }
    match answer["run"].as_str() {
        Some(run) => out.push_str(&format!("run: {run}\n")),
        // A follower that could not read what the leader published does
        // not know of any run (an operator's trial: "run: none" while a
        // run was committed).
        None if answer["leader_said_unread"].is_string() => {
            out.push_str("run: unknown (what the leader published cannot be read now)\n")
        }
        None => out.push_str("run: none\n"),
    }
    out.push_str(&format!(
        "leader: {}\n",
        answer["leader"].as_str().unwrap_or("?")
    ));
    for candidate in answer["candidates"].as_array().into_iter().flatten() {
        let node = candidate["node"].as_str().unwrap_or("?");
        if candidate["ready"].as_bool() == Some(true) {
            out.push_str(&format!("  {node}: ready\n"));
        } else {
            out.push_str(&format!(
                "  {node}: {}\n",
                candidate["detail"].as_str().unwrap_or("not ready")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_answered_on_the_orchestrators_own_host_only() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let listener = ip("10.0.0.1");
        assert!(super::answers(ip("127.0.0.1"), listener));
        assert!(super::answers(ip("127.0.0.2"), ip("127.0.0.1")));
        assert!(super::answers(ip("::1"), ip("::1")));
        assert!(super::answers(ip("10.0.0.1"), listener));
        assert!(super::answers(ip("::ffff:10.0.0.1"), listener));
        assert!(!super::answers(ip("10.0.0.2"), listener));
        assert!(!super::answers(
            ip("::ffff:10.0.0.2"),
            ip("::ffff:10.0.0.1")
        ));
    }

    #[test]
    fn a_follower_says_what_the_leader_published_or_why_it_cannot_read_it() {
        let leader = "r1 at 10.0.0.1:7947";
        let said = json!({"state": "ready", "run": "run-7", "age_ms": 2_500});
        let read = follower_answer("a", Some(&leader), LeaderSaid::Read(Some(said)));
        assert_eq!(read["run"], "run-7");
        assert!(read.get("leader_said_unread").is_none(), "{read}");
        assert!(
            render(&read).contains("the leader published, 2 s ago: ready\n"),
            "{}",
            render(&read)
        );
        assert_eq!(
            render(&read).matches("run:").count(),
            1,
            "{}",
            render(&read)
        );
        assert!(render(&read).contains("run: run-7\n"), "{}", render(&read));
        // A takeover, the next leader yet to publish.
        let before = json!({"state": "ready", "run": null, "age_ms": 900, "by_leader_now": false});
        let before = follower_answer("a", Some(&leader), LeaderSaid::Read(Some(before)));
        assert!(
            render(&before)
                .contains("the leader before the one leading now published, 0 s ago: ready\n"),
            "{}",
            render(&before)
        );
        let nothing = follower_answer("a", None, LeaderSaid::Read(None));
        assert!(nothing["leader_said"].is_null() && nothing["run"].is_null());
        assert!(render(&nothing).contains("the leader has published nothing"));
        assert!(render(&nothing).contains("leader: none right now"));
        let unread = follower_answer(
            "a",
            Some(&leader),
            LeaderSaid::Unread("etcd did not answer".into()),
        );
        assert!(unread["leader_said"].is_null(), "{unread}");
        assert_eq!(unread["leader_said_unread"], "etcd did not answer");
        assert!(render(&unread).contains("cannot be read now: etcd did not answer"));
        assert!(
            render(&unread).contains("run: unknown"),
            "{}",
            render(&unread)
        );
        assert!(render(&nothing).contains("run: none"));
    }
}
