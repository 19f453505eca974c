//! The nemesis (issue 28): randomized fault injection on real processes,
//! judged by a checker written from the promises of docs/failover.md and
//! docs/design.md and docs/failover.md (durability, runs, liveness), not from the code.
//!
//! On 127.0.0.1 only: a 3-member etcd; two replicas (`poolgate watch
//! --json`), each reaching every etcd member through a cuttable proxy of
//! its own; four `poolgate node` processes whose `[orchestrator] agents`
//! list both replicas; and two requesters (`poolgate run --json --require
//! node-N -- sh -c 'echo $$ > PIDFILE; exec sleep 1000'`), each through
//! proxies of its own, started again (a new pid file, a new node) whenever
//! one exits. A requester's `[swim] bind` and `[agents] listen` are
//! sockets this test holds, so no requester can run an orchestrator:
//! every term that acts is a replica's, whose events this test reads.
//! Records and requests in etcd carry a MAC (`[state] key`); plain http
//! is accepted on loopback (`[state] insecure`).
//!
//! For `NEMESIS_SECONDS` (default 60), on a schedule drawn from a seed
//! (`NEMESIS_SEED`: a number, or `fresh`; default 28; printed), it
//! injects every 0.3–3 s one of: SIGKILL of a replica (restarted 0.2–3 s
//! later), SIGSTOP of a replica for 0.5–10 s, cutting a replica from etcd
//! (all three links, or one or two) for 1–10 s, SIGKILL, SIGSTOP
//! (0.5–10 s) or SIGTERM of a requester, cutting a requester from etcd,
//! SIGKILL of a node (restarted 0.3–3 s later), SIGSTOP of a node for
//! 0.5–5 s (a stall: its SWIM member and agent fall silent, then wake
//! with late timers), SIGKILL of one etcd member
//! or of etcd's raft leader (restarted 1–8 s later; never two members
//! down at once). The seed fixes each step's kind, target, duration and
//! the pause after it; a target that cannot take its fault at that moment
//! gives way to the next, and a step no target can take is skipped. It
//! does not fix the interleaving: real processes on a real clock.
//! `NEMESIS_LEASE` (whole seconds, default 3) sets `[state] lease`.
//!
//! Then everything is healed, the requesters are stopped with SIGTERM,
//! and the checker reads every replica's and requester's stdout (stamped
//! with the wall clock when read), every version of the state key in etcd
//! (walked down its revisions, and polled every 50 ms with the leader
//! key), the requesters' exit codes, and whether each one's command (its
//! pid file) outlived it. It fails on: (1) an epoch told twice; (2) the
//! stored last epoch going down, a run back in the stored state after it
//! left, an epoch told but never stored; (3) a run told committed but
//! never stored, an end of one run told twice or two outcomes, an end told but not
//! stored, a requester whose run was committed never exiting, printing
//! twice, exiting 3 without run_faulted, its command outliving it by 15 s
//! or a told end by `unguarded_after` + the stop grace, paused or not; (4) a command
//! running when its `run` exited by itself; (6) a node SIGKILLed while a
//! run requiring it was committed, and that run not ended `run_faulted`
//! (unless something else ended it within the lease, a second and the
//! restore grace; a node only paused need not fault it). It lists (5)
//! `run_faulted` naming a node no fault (kill or pause) had harmed, and notes takeovers slower than the
//! lease + 1 s, new terms after etcd faults alone, requesters that held
//! the leader key, and requesters left waiting. A summary line (JSON)
//! says the seed, the time, the faults per kind and the violations:
//!
//! `NEMESIS_SEED=fresh NEMESIS_SECONDS=60 cargo test --test nemesis -- --nocapture`
//!
//! (`NEMESIS_KEEP=1` keeps the folder of configs, logs and pid files.)

mod common;
#[path = "common/etcd.rs"]
#[macro_use]
mod etcd;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use poolgate::cli::cluster::LocalCluster;
use serde_json::{json, Value};

/// The schedule of a run without `NEMESIS_SEED`: CI repeats it.
const DEFAULT_SEED: u64 = 28;
/// How long faults are injected without `NEMESIS_SECONDS`.
const DEFAULT_SECONDS: u64 = 60;
const NODES: usize = 4;
const REPLICAS: usize = 2;
const REQUESTERS: usize = 2;
const LABEL: &str = "nemesis";
const POOL: &str = "nemesis";
/// `[state] lease`, whole seconds, without `NEMESIS_LEASE`.
const DEFAULT_LEASE_S: u64 = 3;
/// `[run] unguarded_after`, whole seconds.
const UNGUARDED_S: u64 = 5;
/// docs/operator.md: SIGTERM, then SIGKILL 5 s later.
const STOP_GRACE_S: u64 = 5;
/// How long a command may outlive the exit of its `run` (issue 28).
const COMMAND_GONE_WITHIN_MS: u64 = 15_000;
/// How often the harness looks at its processes.
const TICK: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------
// Randomness and time.

/// SplitMix64: a seeded source with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn seed_from_env() -> u64 {
    match std::env::var("NEMESIS_SEED") {
        Ok(text) if text == "fresh" || text == "random" => {
            wall_ms() ^ (u64::from(std::process::id()) << 32) ^ 0x5eed
        }
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("NEMESIS_SEED={text}: a number or `fresh`"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

fn seconds_from_env() -> u64 {
    std::env::var("NEMESIS_SECONDS")
        .ok()
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("NEMESIS_SECONDS={s}: whole seconds"))
        })
        .unwrap_or(DEFAULT_SECONDS)
}

// ---------------------------------------------------------------------------
// What the processes said.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Replica,
    Requester,
}

/// One life of one process of the test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Who {
    role: Role,
    slot: usize,
    life: usize,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Replica => "replica",
            Role::Requester => "requester",
        };
        write!(f, "{role}-{}.{}", self.slot, self.life)
    }
}

/// A line of a process's stdout, stamped when read.
#[derive(Clone, Debug)]
struct Line {
    wall: u64,
    who: Who,
    text: String,
}

type Lines = Arc<Mutex<Vec<Line>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads `out` line by line until it closes, on a thread of its own.
fn read_lines(out: ChildStdout, who: Who, lines: Lines) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(out);
        let mut buf = String::new();
        loop {
            buf.clear();
            match reader.read_line(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => lock(&lines).push(Line {
                    wall: wall_ms(),
                    who,
                    text: buf.trim_end().to_string(),
                }),
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Processes.

/// A process this test started, with its pid.
struct Proc {
    child: Child,
    pid: i32,
    stopped: bool,
}

impl Proc {
    fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.pid), signal);
    }

    /// Its exit code as a shell says it (128 + signal), once it exited.
    fn exited(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        match self.child.try_wait() {
            Ok(Some(status)) => Some(
                status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(-1),
            ),
            _ => None,
        }
    }

    fn kill_and_reap(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process as /proc identifies it: its pid and its start time, so a
/// reused pid is not taken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcId {
    pid: i32,
    start: u64,
}

/// The state letter and start time (clock ticks) of `pid`.
fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command: state is field 3 of stat, starttime field 22.
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

impl ProcId {
    fn of(pid: i32) -> Option<ProcId> {
        proc_stat(pid).map(|(_, start)| ProcId { pid, start })
    }

    /// Whether it runs (a zombie does not).
    fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Some((state, start)) if start == self.start && state != 'Z' && state != 'X')
    }
}

/// One life of a requester: a `poolgate run` process and its command.
#[derive(Debug)]
struct RunLife {
    who: Who,
    require: String,
    pid_file: PathBuf,
    pid: i32,
    started: u64,
    exited: Option<u64>,
    code: Option<i32>,
    /// What this test did to it last (`sigkill`, `sigterm`), if anything.
    by_us: Option<&'static str>,
    /// Its command, once its pid file was read.
    command: Option<ProcId>,
    /// The pid file was read but named no running process.
    command_gone_at_read: bool,
    /// Whether the command still ran when `run`'s exit was seen.
    command_alive_at_exit: Option<bool>,
    command_gone: Option<u64>,
    /// When it was SIGSTOPped, and SIGCONTed.
    stops: Vec<(u64, u64)>,
    /// When it was cut from etcd, and healed.
    cuts: Vec<(u64, u64)>,
}

/// One injected fault or healing.
#[derive(Debug, Clone)]
struct Fault {
    wall: u64,
    kind: &'static str,
    target: String,
    detail: String,
}

/// Healings and restarts due later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    ReplicaCont(usize),
    ReplicaUncut(usize),
    ReplicaRestart(usize),
    RequesterCont(usize),
    RequesterUncut(usize),
    RequesterRestart(usize),
    NodeRestart(usize),
    NodeCont(usize),
    EtcdRestart(usize),
}

struct ReplicaSlot {
    config: PathBuf,
    proxies: Vec<etcd::Proxy>,
    proc: Option<Proc>,
    life: usize,
    cut: bool,
    /// Exits it made on its own: (when, code, its last stderr line).
    exits: Vec<(u64, i32, String)>,
}

struct RequesterSlot {
    config: PathBuf,
    proxies: Vec<etcd::Proxy>,
    proc: Option<Proc>,
    life: usize,
    cut: bool,
    /// Index into `World::lives` of its current life.
    current: Option<usize>,
    stopped_since: u64,
}

/// Everything this test started, stopped and removed on drop whatever
/// the path out (a panic included).
struct World {
    dir: PathBuf,
    binary: PathBuf,
    lines: Lines,
    replicas: Vec<ReplicaSlot>,
    requesters: Vec<RequesterSlot>,
    lives: Vec<RunLife>,
    faults: Vec<Fault>,
    due: Vec<(Instant, Due)>,
    node_up: Vec<bool>,
    /// Which nodes are paused (SIGSTOP) now.
    node_stopped: Vec<bool>,
    /// When each node was harmed (SIGKILLed or SIGSTOPped).
    node_harm: Vec<Vec<u64>>,
    /// When each node was SIGKILLed.
    node_kills: Vec<Vec<u64>>,
    /// When each replica was killed, paused, cut or gone: (replica,
    /// from, until).
    trouble: Vec<(usize, u64, u64)>,
    etcd_down: Option<usize>,
    /// No etcd fault before this (a restarted member catches up first).
    etcd_calm: Instant,
    rng: Rng,
    /// Sockets held so that requesters cannot bind them (never lead).
    _held: Vec<(TcpListener, UdpSocket)>,
}

impl Drop for World {
    fn drop(&mut self) {
        for slot in &mut self.replicas {
            if let Some(mut p) = slot.proc.take() {
                p.kill_and_reap();
            }
        }
        for slot in &mut self.requesters {
            if let Some(mut p) = slot.proc.take() {
                p.kill_and_reap();
            }
        }
        for life in &self.lives {
            if let Some(command) = life.command {
                if command.alive() {
                    let _ = kill(Pid::from_raw(command.pid), Signal::SIGKILL);
                }
            }
        }
    }
}

impl World {
    fn record(&mut self, kind: &'static str, target: String, detail: String) {
        self.faults.push(Fault {
            wall: wall_ms(),
            kind,
            target,
            detail,
        });
    }

    fn trouble_begins(&mut self, replica: usize) {
        self.trouble.push((replica, wall_ms(), u64::MAX));
    }

    fn trouble_ends(&mut self, replica: usize) {
        let now = wall_ms();
        if let Some(t) = self
            .trouble
            .iter_mut()
            .rev()
            .find(|t| t.0 == replica && t.2 == u64::MAX)
        {
            t.2 = now;
        }
    }

    fn later(&mut self, after: Duration, due: Due) {
        self.due.push((Instant::now() + after, due));
    }

    fn spawn_replica(&mut self, i: usize) {
        let slot = &mut self.replicas[i];
        slot.life += 1;
        let who = Who {
            role: Role::Replica,
            slot: i,
            life: slot.life,
        };
        let stderr = std::fs::File::create(self.dir.join(format!("{who}.err"))).expect("log");
        let mut child = Command::new(&self.binary)
            .args(["watch", "--config"])
            .arg(&slot.config)
            .arg("--json")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("poolgate watch starts");
        read_lines(
            child.stdout.take().expect("stdout"),
            who,
            Arc::clone(&self.lines),
        );
        let pid = child.id() as i32;
        slot.proc = Some(Proc {
            child,
            pid,
            stopped: false,
        });
    }

    fn spawn_requester(&mut self, i: usize) {
        let require = format!("node-{}", 1 + self.rng.below(NODES));
        let slot = &mut self.requesters[i];
        slot.life += 1;
        let who = Who {
            role: Role::Requester,
            slot: i,
            life: slot.life,
        };
        let pid_file = self.dir.join(format!("{who}.pid"));
        let stderr = std::fs::File::create(self.dir.join(format!("{who}.err"))).expect("log");
        let mut child = Command::new(&self.binary)
            .args(["run", "--config"])
            .arg(&slot.config)
            .args(["--json", "--require", &require, "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > '{}'; exec sleep 1000",
                pid_file.display()
            ))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("poolgate run starts");
        read_lines(
            child.stdout.take().expect("stdout"),
            who,
            Arc::clone(&self.lines),
        );
        let pid = child.id() as i32;
        slot.proc = Some(Proc {
            child,
            pid,
            stopped: false,
        });
        slot.current = Some(self.lives.len());
        let now = wall_ms();
        let cut = slot.cut;
        self.lives.push(RunLife {
            who,
            require,
            pid_file,
            pid,
            started: now,
            exited: None,
            code: None,
            by_us: None,
            command: None,
            command_gone_at_read: false,
            command_alive_at_exit: None,
            command_gone: None,
            stops: Vec::new(),
            cuts: if cut {
                vec![(now, u64::MAX)]
            } else {
                Vec::new()
            },
        });
    }

    /// Reads a life's pid file, once its shell wrote it.
    fn read_pid_file(&mut self, l: usize) {
        let life = &mut self.lives[l];
        if life.command.is_some() || life.command_gone_at_read {
            return;
        }
        let Ok(text) = std::fs::read_to_string(&life.pid_file) else {
            return;
        };
        if !text.ends_with('\n') {
            return;
        }
        let pid: i32 = text.trim().parse().expect("a pid in the pid file");
        match ProcId::of(pid).filter(ProcId::alive) {
            Some(id) => life.command = Some(id),
            None => {
                life.command_gone_at_read = true;
                life.command_gone = Some(wall_ms());
            }
        }
    }

    /// One look at every requester and its command.
    fn look_at_requesters(&mut self, healing: bool) {
        for i in 0..self.requesters.len() {
            let Some(l) = self.requesters[i].current else {
                continue;
            };
            self.read_pid_file(l);
            let code = self.requesters[i].proc.as_mut().and_then(Proc::exited);
            if let Some(code) = code {
                let now = wall_ms();
                self.requesters[i].proc = None;
                let who = self.lives[l].who;
                let err = std::fs::read_to_string(self.dir.join(format!("{who}.err")))
                    .unwrap_or_default();
                assert!(
                    !err.contains(".toml: line"),
                    "{who}'s config was refused: {err}"
                );
                self.read_pid_file(l);
                let life = &mut self.lives[l];
                life.exited = Some(now);
                life.code = Some(code);
                life.command_alive_at_exit = Some(life.command.is_some_and(|c| c.alive()));
                for stop in &mut life.stops {
                    stop.1 = stop.1.min(now);
                }
                for cut in &mut life.cuts {
                    cut.1 = cut.1.min(now);
                }
                if !healing {
                    let after = self.rng.millis(300, 2000);
                    self.later(after, Due::RequesterRestart(i));
                }
            }
        }
        for life in &mut self.lives {
            if let (Some(command), None) = (life.command, life.command_gone) {
                if !command.alive() {
                    life.command_gone = Some(wall_ms());
                }
            }
        }
    }

    /// A replica that exited on its own is said and started again.
    fn look_at_replicas(&mut self) {
        for i in 0..self.replicas.len() {
            let code = self.replicas[i].proc.as_mut().and_then(Proc::exited);
            if let Some(code) = code {
                self.replicas[i].proc = None;
                let life = self.replicas[i].life;
                let err = std::fs::read_to_string(self.dir.join(format!("replica-{i}.{life}.err")))
                    .unwrap_or_default();
                let last = err.lines().last().unwrap_or("").to_string();
                // A config refused is this test's mistake, not a fault's.
                assert!(
                    !(last.contains(".toml: line") || last.contains("unknown key")),
                    "replica-{i}'s config was refused: {last}"
                );
                self.replicas[i].exits.push((wall_ms(), code, last.clone()));
                self.trouble_begins(i);
                self.record(
                    "replica_exited_by_itself",
                    format!("replica-{i}.{life}"),
                    format!("exit {code}: {last}"),
                );
                self.later(Duration::from_secs(1), Due::ReplicaRestart(i));
            }
        }
    }

    fn apply(&mut self, due: Due, cluster: &mut LocalCluster, etcds: &mut etcd::Cluster) {
        match due {
            Due::ReplicaCont(i) => {
                if let Some(p) = self.replicas[i].proc.as_mut() {
                    p.signal(Signal::SIGCONT);
                    p.stopped = false;
                }
                self.trouble_ends(i);
                self.record("heal_replica_cont", format!("replica-{i}"), String::new());
            }
            Due::ReplicaUncut(i) => {
                for proxy in &self.replicas[i].proxies {
                    proxy.set_cut(false);
                }
                self.replicas[i].cut = false;
                self.trouble_ends(i);
                self.record("heal_replica_uncut", format!("replica-{i}"), String::new());
            }
            Due::ReplicaRestart(i) => {
                if self.replicas[i].proc.is_none() {
                    self.trouble_ends(i);
                    self.spawn_replica(i);
                    let life = self.replicas[i].life;
                    self.record(
                        "heal_replica_restart",
                        format!("replica-{i}.{life}"),
                        String::new(),
                    );
                }
            }
            Due::RequesterCont(i) => {
                let now = wall_ms();
                if let Some(p) = self.requesters[i].proc.as_mut() {
                    p.signal(Signal::SIGCONT);
                    p.stopped = false;
                    if let Some(l) = self.requesters[i].current {
                        let since = self.requesters[i].stopped_since;
                        self.lives[l].stops.push((since, now));
                    }
                }
                self.record(
                    "heal_requester_cont",
                    format!("requester-{i}"),
                    String::new(),
                );
            }
            Due::RequesterUncut(i) => {
                let now = wall_ms();
                for proxy in &self.requesters[i].proxies {
                    proxy.set_cut(false);
                }
                self.requesters[i].cut = false;
                for life in self.lives.iter_mut().filter(|l| l.who.slot == i) {
                    for cut in &mut life.cuts {
                        cut.1 = cut.1.min(now);
                    }
                }
                self.record(
                    "heal_requester_uncut",
                    format!("requester-{i}"),
                    String::new(),
                );
            }
            Due::RequesterRestart(i) => {
                if self.requesters[i].proc.is_none() {
                    self.spawn_requester(i);
                }
            }
            Due::NodeCont(i) => {
                if self.node_stopped[i] {
                    cluster.signal(i, Signal::SIGCONT);
                    self.node_stopped[i] = false;
                    self.record("heal_node_cont", format!("node-{}", i + 1), String::new());
                }
            }
            Due::NodeRestart(i) => {
                if !self.node_up[i] {
                    cluster.spawn(i).expect("node restarts");
                    self.node_up[i] = true;
                    self.record(
                        "heal_node_restart",
                        format!("node-{}", i + 1),
                        String::new(),
                    );
                }
            }
            Due::EtcdRestart(m) => {
                if self.etcd_down == Some(m) {
                    etcds.restart(m);
                    self.etcd_down = None;
                    self.etcd_calm = Instant::now() + Duration::from_secs(3);
                    self.record("heal_etcd_restart", format!("etcd-e{m}"), String::new());
                }
            }
        }
    }

    /// Applies what is due by now (everything, with `all`).
    fn apply_due(&mut self, all: bool, cluster: &mut LocalCluster, etcds: &mut etcd::Cluster) {
        let now = Instant::now();
        let mut due: Vec<(Instant, Due)> = Vec::new();
        self.due.retain(|(at, d)| {
            if all || *at <= now {
                due.push((*at, *d));
                false
            } else {
                true
            }
        });
        due.sort_by_key(|(at, _)| *at);
        for (_, d) in due {
            self.apply(d, cluster, etcds);
        }
    }

    fn pending(&self, due: Due) -> bool {
        self.due.iter().any(|(_, d)| *d == due)
    }

    /// Injects the fault of one step of the schedule: `draw` names its
    /// kind, target and duration whatever the state (so a seed replays
    /// the same schedule); a target that cannot take it (already down,
    /// paused or cut) gives way to the next one that can, and a kind no
    /// target can take now is skipped. Its kind, if injected.
    fn inject(
        &mut self,
        draw: &Draw,
        cluster: &mut LocalCluster,
        etcds: &mut etcd::Cluster,
        etcd_ports: &[u16],
    ) -> Option<&'static str> {
        let kind = KINDS[draw.kind % KINDS.len()];
        let running = |p: &Option<Proc>| p.as_ref().is_some_and(|p| !p.stopped);
        // The drawn target, or the next one after it that `can` take it.
        let target = |n: usize, can: &dyn Fn(usize) -> bool| {
            (0..n)
                .map(|k| (draw.target as usize + k) % n)
                .find(|&i| can(i))
        };
        let span = |lo: u64, hi: u64| Duration::from_millis(lo + draw.span % (hi - lo + 1));
        match kind {
            "replica_kill" => {
                let i = target(REPLICAS, &|i| running(&self.replicas[i].proc))?;
                let back = span(200, 3000);
                if let Some(mut p) = self.replicas[i].proc.take() {
                    p.kill_and_reap();
                }
                self.trouble_begins(i);
                let life = self.replicas[i].life;
                self.record(
                    kind,
                    format!("replica-{i}.{life}"),
                    format!("restart after {back:?}"),
                );
                self.later(back, Due::ReplicaRestart(i));
            }
            "replica_stop" => {
                let i = target(REPLICAS, &|i| running(&self.replicas[i].proc))?;
                let for_ = span(500, 10_000);
                if let Some(p) = self.replicas[i].proc.as_mut() {
                    p.signal(Signal::SIGSTOP);
                    p.stopped = true;
                }
                self.trouble_begins(i);
                let life = self.replicas[i].life;
                self.record(
                    kind,
                    format!("replica-{i}.{life}"),
                    format!("SIGCONT after {for_:?}"),
                );
                self.later(for_, Due::ReplicaCont(i));
            }
            "replica_cut" => {
                let i = target(REPLICAS, &|i| !self.replicas[i].cut)?;
                let for_ = span(1000, 10_000);
                // Wholly (3 in 5), or in part: one or two of its three
                // links to etcd's members.
                let whole = draw.mask % 5 < 3;
                let part = [0b001, 0b010, 0b100, 0b011, 0b101, 0b110][(draw.mask / 5 % 6) as usize];
                let mut cut = Vec::new();
                for (m, proxy) in self.replicas[i].proxies.iter().enumerate() {
                    if whole || part & (1 << m) != 0 {
                        proxy.set_cut(true);
                        cut.push(m);
                    }
                }
                self.replicas[i].cut = true;
                self.trouble_begins(i);
                self.record(
                    kind,
                    format!("replica-{i}"),
                    format!("links to etcd members {cut:?} cut for {for_:?}"),
                );
                self.later(for_, Due::ReplicaUncut(i));
            }
            "requester_kill" | "requester_term" => {
                let i = target(self.requesters.len(), &|i| {
                    running(&self.requesters[i].proc)
                })?;
                let (signal, by_us) = if kind == "requester_kill" {
                    (Signal::SIGKILL, "sigkill")
                } else {
                    (Signal::SIGTERM, "sigterm")
                };
                if let Some(p) = self.requesters[i].proc.as_ref() {
                    p.signal(signal);
                }
                if let Some(l) = self.requesters[i].current {
                    self.lives[l].by_us = Some(by_us);
                    let who = self.lives[l].who.to_string();
                    self.record(kind, who, String::new());
                }
            }
            "requester_stop" => {
                let i = target(self.requesters.len(), &|i| {
                    running(&self.requesters[i].proc)
                })?;
                let for_ = span(500, 10_000);
                if let Some(p) = self.requesters[i].proc.as_mut() {
                    p.signal(Signal::SIGSTOP);
                    p.stopped = true;
                }
                self.requesters[i].stopped_since = wall_ms();
                let who = self.requesters[i]
                    .current
                    .map(|l| self.lives[l].who.to_string())
                    .unwrap_or_default();
                self.record(kind, who, format!("SIGCONT after {for_:?}"));
                self.later(for_, Due::RequesterCont(i));
            }
            "requester_cut" => {
                let i = target(self.requesters.len(), &|i| !self.requesters[i].cut)?;
                let for_ = span(1000, 10_000);
                for proxy in &self.requesters[i].proxies {
                    proxy.set_cut(true);
                }
                let now = wall_ms();
                self.requesters[i].cut = true;
                if let Some(l) = self.requesters[i].current {
                    if self.lives[l].exited.is_none() {
                        self.lives[l].cuts.push((now, u64::MAX));
                    }
                }
                self.record(kind, format!("requester-{i}"), format!("for {for_:?}"));
                self.later(for_, Due::RequesterUncut(i));
            }
            "node_kill" => {
                let i = target(NODES, &|i| self.node_up[i] && !self.node_stopped[i])?;
                let back = span(300, 3000);
                cluster.kill(i);
                self.node_up[i] = false;
                self.node_harm[i].push(wall_ms());
                self.node_kills[i].push(wall_ms());
                self.record(
                    kind,
                    format!("node-{}", i + 1),
                    format!("restart after {back:?}"),
                );
                self.later(back, Due::NodeRestart(i));
            }
            "node_stop" => {
                let i = target(NODES, &|i| self.node_up[i] && !self.node_stopped[i])?;
                let for_ = span(500, 5000);
                cluster.signal(i, Signal::SIGSTOP);
                self.node_stopped[i] = true;
                self.node_harm[i].push(wall_ms());
                self.record(
                    kind,
                    format!("node-{}", i + 1),
                    format!("SIGCONT after {for_:?}"),
                );
                self.later(for_, Due::NodeCont(i));
            }
            "etcd_member_kill" | "etcd_leader_kill" => {
                // Never two members down at once, nor one that has just
                // rejoined and may still be catching up.
                if self.etcd_down.is_some() || Instant::now() < self.etcd_calm {
                    return None;
                }
                let m = if kind == "etcd_leader_kill" {
                    etcd_leader(etcd_ports)?
                } else {
                    draw.target as usize % etcd_ports.len()
                };
                let back = span(1000, 8000);
                etcds.kill(m);
                self.etcd_down = Some(m);
                self.record(
                    kind,
                    format!("etcd-e{m}"),
                    format!("restart after {back:?}"),
                );
                self.later(back, Due::EtcdRestart(m));
            }
            _ => unreachable!("one of KINDS"),
        }
        Some(kind)
    }
}

/// The kinds of fault, drawn with equal odds.
const KINDS: [&str; 11] = [
    "replica_kill",
    "replica_stop",
    "replica_cut",
    "requester_kill",
    "requester_stop",
    "requester_cut",
    "requester_term",
    "node_kill",
    "node_stop",
    "etcd_member_kill",
    "etcd_leader_kill",
];

/// One step of the schedule: the same draws whatever the state.
struct Draw {
    kind: usize,
    target: u64,
    span: u64,
    mask: u64,
    /// The pause before the next step.
    next: Duration,
}

impl Draw {
    fn from(rng: &mut Rng) -> Draw {
        Draw {
            kind: rng.below(KINDS.len()),
            target: rng.next() % 1_000_003,
            span: rng.next(),
            mask: rng.next(),
            next: rng.millis(300, 3000),
        }
    }
}

// ---------------------------------------------------------------------------
// etcd, read by the checker over its JSON gateway (independent of the
// project's own client).

/// `POST path` with a JSON body to etcd's client port; the JSON answer.
fn etcd_call(port: u16, path: &str, body: &Value) -> Result<Value, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).map_err(|e| e.to_string())?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let body = body.to_string();
    // HTTP/1.0: the answer is the rest of the stream, never chunked.
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no answer from {port}"))?;
    if head.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{}: {rest}", head.lines().next().unwrap_or("")));
    }
    serde_json::from_str(rest).map_err(|e| format!("{e}: {rest}"))
}

/// An int64 the gateway writes as a string (or a number).
fn int(value: &Value) -> i64 {
    match value {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(value: &Value) -> Vec<u8> {
    value
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// Which member (index into `ports`) is etcd's raft leader, as the live
/// members say.
fn etcd_leader(ports: &[u16]) -> Option<usize> {
    // Member ids are uint64s: compared as the gateway writes them.
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut members = BTreeMap::new();
    let mut leader = None;
    for (m, &port) in ports.iter().enumerate() {
        if let Ok(status) = etcd_call(port, "/v3/maintenance/status", &json!({})) {
            members.insert(text(&status["header"]["member_id"]), m);
            let said = text(&status["leader"]);
            if said != "0" && said != "null" {
                leader = Some(said);
            }
        }
    }
    members.get(&leader?).copied()
}

/// One version of a key.
#[derive(Debug, Clone)]
struct Version {
    mod_revision: i64,
    create_revision: i64,
    value: Vec<u8>,
}

fn range_at(port: u16, key: &str, revision: i64) -> Result<Option<Version>, String> {
    let mut body = json!({ "key": b64(key.as_bytes()) });
    if revision > 0 {
        body["revision"] = json!(revision.to_string());
    }
    let answer = etcd_call(port, "/v3/kv/range", &body)?;
    Ok(answer["kvs"].get(0).map(|kv| Version {
        mod_revision: int(&kv["mod_revision"]),
        create_revision: int(&kv["create_revision"]),
        value: unb64(&kv["value"]),
    }))
}

/// Every version of `key` since it was last created, oldest first, read
/// down its revisions.
fn history(ports: &[u16], key: &str) -> Result<Vec<Version>, String> {
    let mut last = String::new();
    for &port in ports {
        let mut out = Vec::new();
        let mut revision = 0;
        let walked = loop {
            match range_at(port, key, revision) {
                Ok(Some(v)) => {
                    revision = v.mod_revision - 1;
                    let done = revision < 1;
                    out.push(v);
                    if done || out.len() > 1_000_000 {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        match walked {
            Ok(()) => {
                out.reverse();
                return Ok(out);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Polls `keys` every 50 ms on a thread, recording each distinct version.
fn poll_keys(
    ports: Vec<u16>,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<BTreeMap<String, Vec<(u64, Version)>>> {
    std::thread::spawn(move || {
        let mut seen: BTreeMap<String, Vec<(u64, Version)>> = BTreeMap::new();
        let mut at = 0;
        while !stop.load(Ordering::Relaxed) {
            for key in &keys {
                for k in 0..ports.len() {
                    let port = ports[(at + k) % ports.len()];
                    if let Ok(found) = range_at(port, key, 0) {
                        if let Some(v) = found {
                            let list = seen.entry(key.clone()).or_default();
                            if list
                                .last()
                                .is_none_or(|(_, l)| l.mod_revision != v.mod_revision)
                            {
                                list.push((wall_ms(), v));
                            }
                        }
                        break;
                    }
                    at += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

/// The stored state as the checker reads it: the last issued epoch and
/// the active run, wherever the record holds them (docs/operator.md names what is
/// stored, not its layout).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    last_epoch: Option<u64>,
    run: Option<String>,
    committed: Option<bool>,
}

fn find_key<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|v| find_key(v, key))),
        Value::Array(items) => items.iter().find_map(|v| find_key(v, key)),
        _ => None,
    }
}

fn stored_of(bytes: &[u8]) -> Stored {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return Stored {
            last_epoch: None,
            run: None,
            committed: None,
        };
    };
    // The record itself, maybe wrapped (a MAC beside it).
    let record = find_object_with(&value, "last_epoch").unwrap_or(&value);
    let run = record.get("run").filter(|r| !r.is_null());
    Stored {
        last_epoch: record.get("last_epoch").and_then(Value::as_u64),
        run: run.and_then(|r| match r {
            Value::String(s) => Some(s.clone()),
            other => find_key(other, "run")
                .or_else(|| find_key(other, "id"))
                .and_then(Value::as_str)
                .map(str::to_string),
        }),
        committed: run
            .and_then(|r| find_key(r, "committed"))
            .and_then(Value::as_bool),
    }
}

fn find_object_with<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) if map.contains_key(key) => Some(value),
        Value::Object(map) => map.values().find_map(|v| find_object_with(v, key)),
        Value::Array(items) => items.iter().find_map(|v| find_object_with(v, key)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Setup.

/// `text` with `from` replaced by `to`, which must be there.
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "`{from}` not in:\n{text}");
    text.replace(from, to)
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// How long a required node's loss may take to fault its run, at most:
/// across a takeover, the lease and a second, then the restore grace (the
/// config's 10 s), and room for a loaded machine.
fn fault_within_ms() -> u64 {
    (lease_s() + 1 + 10 + 5) * 1000
}

fn lease_s() -> u64 {
    std::env::var("NEMESIS_LEASE")
        .ok()
        .map(|s| {
            s.trim_end_matches('s')
                .parse()
                .unwrap_or_else(|_| panic!("NEMESIS_LEASE={s}: whole seconds"))
        })
        .unwrap_or(DEFAULT_LEASE_S)
}

fn base_config(endpoints: &[String], state_key: &Path) -> String {
    let lease = lease_s();
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"
[pool]
id = "{POOL}"
members = ["unused"]
[readiness]
convergence_window = "300ms"
[planning]
on_readiness_lost = "wait"
[swim]
label = "{LABEL}"
probe_period = "200ms"
probe_rtt = "60ms"
suspicion_timeout = "1s"
[state]
etcd = [{}]
lease = "{lease}s"
restore_grace = "10s"
insecure = true
key = "{}"
[run]
unguarded_after = "{UNGUARDED_S}s"
"#,
        endpoints.join(", "),
        state_key.display()
    )
}

/// `text` (an orchestrator's config) with `[state] insecure = true` (plain
/// http on loopback) and `key`, unless its `[state]` already says them.
fn with_state_security(text: &str, state_key: &Path) -> String {
    let Some(at) = text.find("[state]\n") else {
        panic!("no [state] in:\n{text}")
    };
    let body_start = at + "[state]\n".len();
    let body_end = text[body_start..]
        .find("\n[")
        .map_or(text.len(), |i| body_start + i + 1);
    let section = &text[body_start..body_end];
    let mut added = String::new();
    if !section.lines().any(|l| l.starts_with("insecure")) {
        added.push_str("insecure = true\n");
    }
    if !section.lines().any(|l| l.starts_with("key")) {
        added.push_str(&format!("key = \"{}\"\n", state_key.display()));
    }
    format!("{}{added}{}", &text[..body_start], &text[body_start..])
}

/// The binary, copied where a rebuild of the shared target folder during
/// the run cannot change it under the test.
fn pinned_binary(dir: &Path) -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_poolgate"));
    let pinned = dir.join("poolgate");
    if std::fs::hard_link(&built, &pinned).is_err() {
        std::fs::copy(&built, &pinned).expect("the binary copied");
    }
    pinned
}

fn port_of(endpoint: &str) -> u16 {
    endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

// ---------------------------------------------------------------------------
// The checker.

/// An event a process printed.
#[derive(Debug, Clone)]
struct Told {
    wall: u64,
    who: Who,
    event: String,
    json: Value,
    text: String,
}

fn told(lines: &[Line]) -> Vec<Told> {
    lines
        .iter()
        .filter_map(|l| {
            let json: Value = serde_json::from_str(&l.text).ok()?;
            let event = json.get("event")?.as_str()?.to_string();
            Some(Told {
                wall: l.wall,
                who: l.who,
                event,
                json,
                text: l.text.clone(),
            })
        })
        .collect()
}

fn is_end(event: &str) -> bool {
    matches!(event, "run_faulted" | "run_finished" | "planning_aborted")
}

struct Verdict {
    violations: Vec<String>,
    notes: Vec<String>,
    unharmed_faults: Vec<String>,
    epochs_told: usize,
    runs_committed: usize,
}

struct Evidence<'a> {
    start: u64,
    told: &'a [Told],
    lives: &'a [RunLife],
    /// When each node was killed or paused (rule 5).
    node_harm: &'a [Vec<u64>],
    /// When each node was killed (rule 6).
    node_kills: &'a [Vec<u64>],
    /// Every version of the state key seen, by mod revision.
    state: &'a BTreeMap<i64, (Version, Stored)>,
    /// The state key's versions read down its revisions (complete since
    /// its last creation).
    walked: usize,
}

fn check(e: &Evidence<'_>) -> Verdict {
    let t = |wall: u64| format!("t={:.2}s", (wall as f64 - e.start as f64) / 1000.0);
    let mut violations = Vec::new();
    let mut notes = Vec::new();
    let replica_told: Vec<&Told> = e
        .told
        .iter()
        .filter(|x| x.who.role == Role::Replica)
        .collect();

    // (1) An epoch is told at most once, across replicas and their lives.
    let mut epochs: BTreeMap<u64, Vec<&Told>> = BTreeMap::new();
    for x in replica_told.iter().filter(|x| x.event == "pool_ready") {
        if let Some(epoch) = x.json["epoch"].as_u64() {
            epochs.entry(epoch).or_default().push(x);
        }
    }
    for (epoch, tellers) in &epochs {
        if tellers.len() > 1 {
            let lines: Vec<String> = tellers
                .iter()
                .map(|x| format!("  {} {}: {}", t(x.wall), x.who, x.text))
                .collect();
            violations.push(format!(
                "(1) epoch {epoch} told {} times:\n{}",
                tellers.len(),
                lines.join("\n")
            ));
        }
    }
    // Told in rising order, by the wall clock they were read at (a note:
    // a paused teller's line is read late).
    let mut by_time: Vec<&&Told> = replica_told
        .iter()
        .filter(|x| x.event == "pool_ready")
        .collect();
    by_time.sort_by_key(|x| x.wall);
    let mut highest: Option<&Told> = None;
    for x in by_time {
        let epoch = x.json["epoch"].as_u64().unwrap_or(0);
        if let Some(h) = highest {
            let top = h.json["epoch"].as_u64().unwrap_or(0);
            if epoch <= top {
                notes.push(format!(
                    "epoch {epoch} read from {} at {} after epoch {top} from {} at {}",
                    x.who,
                    t(x.wall),
                    h.who,
                    t(h.wall)
                ));
                continue;
            }
        }
        highest = Some(x);
    }

    // (2) The stored last epoch never goes down, and no run comes back
    // once it left the stored state (a faulted run is final; no write
    // from the past).
    let mut previous: Option<(i64, u64)> = None;
    let mut left: BTreeMap<String, i64> = BTreeMap::new();
    let mut active: Option<String> = None;
    let mut stored_epochs = BTreeSet::new();
    let mut stored_runs: BTreeMap<String, bool> = BTreeMap::new();
    for (revision, (_, stored)) in e.state {
        if let Some(epoch) = stored.last_epoch {
            stored_epochs.insert(epoch);
            if let Some((at, before)) = previous {
                if epoch < before {
                    violations.push(format!(
                        "(2) the stored last epoch went down: {before} at revision {at}, {epoch} at revision {revision}"
                    ));
                }
            }
            previous = Some((*revision, epoch));
        }
        if stored.run != active {
            if let Some(old) = active.take() {
                left.insert(old, *revision);
            }
            if let Some(new) = &stored.run {
                if let Some(gone_at) = left.get(new) {
                    violations.push(format!(
                        "(2) run {new} left the stored state at revision {gone_at} and is back at revision {revision}"
                    ));
                }
            }
            active = stored.run.clone();
        }
        if let Some(run) = &stored.run {
            let committed = stored.committed.unwrap_or(true);
            *stored_runs.entry(run.clone()).or_default() |= committed;
        }
    }
    let final_run = active;
    // Written before told: an epoch told was stored as the last issued.
    if e.walked > 0 {
        for epoch in epochs.keys() {
            if !stored_epochs.contains(epoch) {
                violations.push(format!(
                    "(2) epoch {epoch} was told but never stored as the last issued epoch (stored: {stored_epochs:?})"
                ));
            }
        }
    }

    // Runs, as replicas and requesters told them.
    let mut committed_by: BTreeMap<String, Vec<&Told>> = BTreeMap::new();
    let mut ends_by_replicas: BTreeMap<String, Vec<&Told>> = BTreeMap::new();
    let mut end_kinds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for x in e.told {
        let Some(run) = x.json["run"].as_str() else {
            continue;
        };
        if x.event == "run_committed" {
            committed_by.entry(run.to_string()).or_default().push(x);
        }
        if is_end(&x.event) {
            end_kinds
                .entry(run.to_string())
                .or_default()
                .insert(x.event.clone());
            if x.who.role == Role::Replica {
                ends_by_replicas.entry(run.to_string()).or_default().push(x);
            }
        }
    }
    for (run, ends) in &ends_by_replicas {
        if ends.len() > 1 {
            let lines: Vec<String> = ends
                .iter()
                .map(|x| format!("  {} {}: {}", t(x.wall), x.who, x.text))
                .collect();
            violations.push(format!(
                "(3) the end of run {run} told {} times by replicas:\n{}",
                ends.len(),
                lines.join("\n")
            ));
        }
    }
    for (run, kinds) in &end_kinds {
        if kinds.len() > 1 {
            violations.push(format!(
                "(3) run {run} ended as {kinds:?}: more than one outcome"
            ));
        }
    }
    // Committed and ended runs were written: a commit before it is told
    // (design §9), an end before it is told (docs/failover.md §2).
    if e.walked > 0 {
        for (run, tellers) in &committed_by {
            if stored_runs.get(run) != Some(&true) {
                let x = tellers[0];
                violations.push(format!(
                    "(3) run {run} was told committed ({} {}) but never stored as committed",
                    t(x.wall),
                    x.who
                ));
            }
        }
        for (run, ends) in &ends_by_replicas {
            if final_run.as_deref() == Some(run.as_str()) {
                let x = ends[0];
                violations.push(format!(
                    "(3) run {run} was told ended ({} {}: {}) but the stored state still holds it",
                    t(x.wall),
                    x.who,
                    x.text
                ));
            }
        }
    }

    // Requesters: each run_committed they saw ends exactly once (the
    // requester exits), and its command is gone within 15 s of that.
    let mut requester_runs: BTreeMap<String, Vec<Who>> = BTreeMap::new();
    for life in e.lives {
        let mine: Vec<&Told> = e.told.iter().filter(|x| x.who == life.who).collect();
        let committed: Vec<&&Told> = mine.iter().filter(|x| x.event == "run_committed").collect();
        let faulted = mine.iter().any(|x| x.event == "run_faulted");
        for c in &committed {
            if let Some(run) = c.json["run"].as_str() {
                requester_runs
                    .entry(run.to_string())
                    .or_default()
                    .push(life.who);
            }
        }
        let code = life.code;
        let said = format!(
            "{} (pid {}, --require {}, started {}, exit {:?} at {}, by us: {:?})",
            life.who,
            life.pid,
            life.require,
            t(life.started),
            code,
            life.exited.map(t).unwrap_or_else(|| "never".into()),
            life.by_us
        );
        if committed.len() > 1 {
            violations.push(format!(
                "(3) {said} printed run_committed {} times",
                committed.len()
            ));
        }
        // An end told twice is of one run: a run whose planning a new
        // leader abandoned (`planning_aborted`) is over, and its
        // requester asks the same plan again under a new id, whose end it
        // tells too (docs/failover.md §3, docs/operator.md).
        let mut ends: BTreeMap<&str, usize> = BTreeMap::new();
        for end in mine.iter().filter(|x| is_end(&x.event)) {
            *ends
                .entry(end.json["run"].as_str().unwrap_or(""))
                .or_default() += 1;
        }
        for (run, told) in ends.iter().filter(|(_, told)| **told > 1) {
            violations.push(format!("(3) {said} printed {told} ends of its run {run}"));
        }
        if !committed.is_empty() && life.exited.is_none() {
            violations.push(format!(
                "(3) {said}: its run was committed and it never exited"
            ));
        }
        if code == Some(3) && !faulted {
            violations.push(format!(
                "(3) {said} exited 3 (run faulted) without printing run_faulted"
            ));
        }
        if faulted && life.by_us.is_none() && code != Some(3) && code.is_some() {
            violations.push(format!(
                "(3) {said} printed run_faulted and exited {code:?}, not 3"
            ));
        }
        if let Some(command) = life.command {
            if committed.is_empty() && life.by_us != Some("sigkill") && life.exited.is_some() {
                // `run` prints run_committed before it starts the command
                // (design §9); a line lost to SIGKILL excepted.
                violations.push(format!(
                    "(3) {said}: its command (pid {}) ran but it never printed run_committed",
                    command.pid
                ));
            }
            if let Some(exited) = life.exited {
                match life.command_gone {
                    Some(gone) if gone <= exited + COMMAND_GONE_WITHIN_MS => {}
                    Some(gone) => violations.push(format!(
                        "(3) {said}: its command (pid {}) was gone only {} ms after run exited",
                        command.pid,
                        gone - exited
                    )),
                    None => violations.push(format!(
                        "(3) {said}: its command (pid {}) still runs",
                        command.pid
                    )),
                }
                // (4) A run that exited by itself left no command running.
                if life.by_us != Some("sigkill") && life.command_alive_at_exit == Some(true) {
                    violations.push(format!(
                        "(4) {said}: its command (pid {}) still ran when run exited (gone {})",
                        command.pid,
                        life.command_gone
                            .map(|g| format!("{} ms later", g.saturating_sub(exited)))
                            .unwrap_or_else(|| "never".into())
                    ));
                }
            }
        }
        // A run a replica told ended (faulted, or ended for a requester
        // gone) has its command stopped within unguarded_after + the stop
        // grace (+3 s), whatever became of its requester: a paused `run`'s
        // keeper stops the command after half of unguarded_after without
        // a sign (docs/failover.md §3).
        for c in &committed {
            let Some(run) = c.json["run"].as_str() else {
                continue;
            };
            let end = ends_by_replicas.get(run).and_then(|ends| ends.first());
            if let (Some(fault), Some(command)) = (end, life.command) {
                let bound = fault.wall + (UNGUARDED_S + STOP_GRACE_S + 3) * 1000;
                let gone = life.command_gone.unwrap_or(u64::MAX);
                if gone > bound {
                    violations.push(format!(
                        "(3) {said}: run {run} told ended at {} ({}: {}) but its command (pid {}) ran until {}",
                        t(fault.wall),
                        fault.who,
                        fault.text,
                        command.pid,
                        if gone == u64::MAX { "the end".into() } else { t(gone) }
                    ));
                }
            }
        }
    }
    // Liveness, noted: a requester left waiting while others' runs were
    // committed (its request lost, e.g. with a session that expired while
    // it was paused or cut off).
    for life in e.lives {
        let mine_committed = e
            .told
            .iter()
            .any(|x| x.who == life.who && x.event == "run_committed");
        if mine_committed {
            continue;
        }
        let until = life.exited.unwrap_or(u64::MAX);
        // Its own run (named after its pid) committed unseen is said too.
        let own = format!("run-{}-", life.pid);
        let committed_unseen: Vec<&str> = replica_told
            .iter()
            .filter(|x| x.event == "run_committed")
            .filter_map(|x| x.json["run"].as_str())
            .filter(|run| run.starts_with(&own))
            .collect();
        if !committed_unseen.is_empty() {
            notes.push(format!(
                "{} never printed run_committed, but a replica committed its run {} (exit {:?}, pauses {:?})",
                life.who,
                committed_unseen.join(", "),
                life.code,
                life.stops
                    .iter()
                    .map(|(a, b)| format!("{}..{}", t(*a), t(*b)))
                    .collect::<Vec<_>>()
            ));
        }
        let others: BTreeSet<&str> = replica_told
            .iter()
            .filter(|x| x.event == "run_committed" && x.wall > life.started && x.wall < until)
            .filter_map(|x| x.json["run"].as_str())
            .filter(|run| !run.starts_with(&own))
            .collect();
        if others.len() >= 2 {
            let paused: Vec<String> = life
                .stops
                .iter()
                .map(|(a, b)| format!("paused {}..{}", t(*a), t(*b)))
                .chain(
                    life.cuts
                        .iter()
                        .map(|(a, b)| format!("cut {}..{}", t(*a), t(*b))),
                )
                .collect();
            notes.push(format!(
                "{} (--require {}) asked at {} and was never committed until it exited at {}, while {} runs were committed for others ({}); {}",
                life.who,
                life.require,
                t(life.started),
                life.exited.map(t).unwrap_or_else(|| "never".into()),
                others.len(),
                others.iter().copied().collect::<Vec<_>>().join(", "),
                if paused.is_empty() { "never paused nor cut".to_string() } else { paused.join(", ") }
            ));
        }
    }
    for (run, whos) in &requester_runs {
        if whos.len() > 1 {
            violations.push(format!(
                "(3) run {run} committed for several requesters: {whos:?}"
            ));
        }
    }

    // (5) Faults naming a node no fault harmed before: allowed only as
    // The liveness rules' fail-safe (design §11); listed, not failed.
    let mut unharmed = Vec::new();
    for x in replica_told.iter().filter(|x| x.event == "run_faulted") {
        let node = x.json["node"].as_str().unwrap_or("");
        let harmed = node
            .strip_prefix("node-")
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| e.node_harm.get(n - 1))
            .is_some_and(|harms| harms.iter().any(|&h| h <= x.wall));
        if !harmed {
            unharmed.push(format!("{} {}: {}", t(x.wall), x.who, x.text));
        }
    }

    // (6) A required node lost after provisioning began faults the run:
    // a node SIGKILLed while a run that requires it is committed ends
    // that run `run_faulted`, unless something else ended it first
    // (within the time a fault may take: across a takeover, the lease, a
    // second, and the restore grace).
    for x in replica_told.iter().filter(|x| x.event == "run_committed") {
        let run = x.json["run"].as_str().unwrap_or("");
        let end = replica_told
            .iter()
            .filter(|y| y.wall >= x.wall && is_end(&y.event) && y.json["run"] == run)
            .min_by_key(|y| y.wall);
        let required = x.json["required"].as_array().cloned().unwrap_or_default();
        for node in required.iter().filter_map(Value::as_str) {
            let Some(harms) = node
                .strip_prefix("node-")
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| e.node_kills.get(n.wrapping_sub(1)))
            else {
                continue;
            };
            let until = end.map_or(u64::MAX, |y| y.wall);
            for &h in harms.iter().filter(|&&h| h > x.wall && h < until) {
                let faulted = end.is_some_and(|y| y.event == "run_faulted");
                let raced = end.is_some_and(|y| y.wall <= h + fault_within_ms());
                if !faulted && !raced {
                    violations.push(format!(
                        "(6) {node} killed at {} while run {run} was committed ({} {}): {}",
                        t(h),
                        t(x.wall),
                        x.who,
                        end.map_or("never ended".to_string(), |y| format!(
                            "its end, at {}, was {}",
                            t(y.wall),
                            y.text
                        ))
                    ));
                }
            }
        }
    }

    let committed_told = committed_by.len();
    Verdict {
        violations,
        notes,
        unharmed_faults: unharmed,
        epochs_told: epochs.len(),
        runs_committed: committed_told,
    }
}

/// One leadership term as the polled leader key showed it.
#[derive(Debug, Clone)]
struct TermSeen {
    first_seen: u64,
    holder: String,
}

/// The terms, in order: one per create revision of the leader key; its
/// holder named by the agent address it wrote (`holders`).
fn terms_of(polled: &[(u64, Version)], holders: &BTreeMap<String, String>) -> Vec<TermSeen> {
    let mut terms: Vec<(i64, TermSeen)> = Vec::new();
    for (wall, v) in polled {
        if terms.iter().any(|(c, _)| *c == v.create_revision) {
            continue;
        }
        let value: Value = serde_json::from_slice(&v.value).unwrap_or(Value::Null);
        let agents = find_key(&value, "agents")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let holder = holders.get(&agents).cloned().unwrap_or(agents);
        terms.push((
            v.create_revision,
            TermSeen {
                first_seen: *wall,
                holder,
            },
        ));
    }
    terms.into_iter().map(|(_, t)| t).collect()
}

/// Leadership moves away from a replica that no fault touched in the
/// lease (+2 s) before: after etcd faults only (docs/failover.md §5), or after none at all.
fn unexplained_moves(
    terms: &[TermSeen],
    trouble: &[(usize, u64, u64)],
    faults: &[Fault],
    window_ms: u64,
    start: u64,
) -> (Vec<String>, Vec<String>) {
    let t = |wall: u64| format!("t={:.2}s", (wall as f64 - start as f64) / 1000.0);
    let (mut after_etcd, mut after_nothing) = (Vec::new(), Vec::new());
    for pair in terms.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        let at = next.first_seen;
        let Some(r) = prev
            .holder
            .strip_prefix("replica-")
            .and_then(|r| r.parse::<usize>().ok())
        else {
            continue;
        };
        let from = at.saturating_sub(window_ms);
        // Touched lately, or killed during its term (a dead leader's
        // lease may outlive it: etcd renews every lease when its own
        // leader changes).
        if trouble
            .iter()
            .any(|(i, a, b)| *i == r && *a <= at && (*b >= from || *a >= prev.first_seen))
        {
            continue;
        }
        let etcd: Vec<String> = faults
            .iter()
            .filter(|f| f.kind.contains("etcd") && f.wall <= at && f.wall >= from)
            .map(|f| format!("{} {} {}", t(f.wall), f.kind, f.target))
            .collect();
        let said = format!(
            "a new term (held by {}) seen {}, while the previous holder {} was untouched by any fault since {}",
            next.holder,
            t(at),
            prev.holder,
            t(from)
        );
        if etcd.is_empty() {
            after_nothing.push(said);
        } else {
            after_etcd.push(format!("{said}; etcd: {}", etcd.join(", ")));
        }
    }
    (after_etcd, after_nothing)
}

/// Takeovers after a leading replica was SIGKILLed: (the kill, when the
/// next replica's term was first seen, what etcd went through meanwhile).
fn takeovers(terms: &[TermSeen], faults: &[Fault], start: u64) -> Vec<(u64, Option<u64>, String)> {
    let t = |wall: u64| format!("t={:.2}s", (wall as f64 - start as f64) / 1000.0);
    let mut out = Vec::new();
    for kill in faults.iter().filter(|f| f.kind == "replica_kill") {
        let slot = kill.target.split('.').next().unwrap_or("");
        let Some(current) = terms.iter().rposition(|term| term.first_seen <= kill.wall) else {
            continue;
        };
        if terms[current].holder != slot {
            continue;
        }
        // The next term that acts: a replica's.
        let next = terms[current + 1..]
            .iter()
            .find(|term| term.holder.starts_with("replica-"))
            .map(|term| term.first_seen);
        let until = next.unwrap_or(u64::MAX);
        let etcd: Vec<String> = faults
            .iter()
            .filter(|f| f.kind.contains("etcd") && f.wall >= kill.wall && f.wall <= until)
            .map(|f| format!("{} {} {}", t(f.wall), f.kind, f.target))
            .collect();
        out.push((kill.wall, next, etcd.join(", ")));
    }
    out
}

/// Whether a run a replica told committed had not yet been told ended
/// (faulted, finished) by any replica at `wall`.
fn committed_at(told: &[Told], wall: u64) -> bool {
    let by_replicas = told
        .iter()
        .filter(|x| x.wall <= wall && matches!(x.who.role, Role::Replica));
    let mut open: BTreeSet<String> = BTreeSet::new();
    for x in by_replicas {
        let Some(run) = x.json["run"].as_str() else {
            continue;
        };
        match x.event.as_str() {
            "run_committed" => {
                open.insert(run.to_string());
            }
            "run_faulted" | "run_finished" => {
                open.remove(run);
            }
            _ => {}
        }
    }
    !open.is_empty()
}

// ---------------------------------------------------------------------------
// The test.

#[test]
fn the_nemesis_breaks_nothing_that_must_hold_whatever_fails() {
    need_etcd!();
    let began = Instant::now();
    let seed = seed_from_env();
    let seconds = seconds_from_env();
    let keep = std::env::var_os("NEMESIS_KEEP").is_some();
    eprintln!(
        "nemesis: seed {seed} ({seconds} s of faults); NEMESIS_SEED={seed} repeats the schedule"
    );

    let mut etcds = etcd::Cluster::start("nemesis", 3);
    let etcd_ports: Vec<u16> = etcds.endpoints().iter().map(|e| port_of(e)).collect();
    let dir = std::env::temp_dir().join(format!("poolgate-nemesis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    let cleanup = RemoveOnDrop(dir.clone(), keep);
    let binary = pinned_binary(&dir);
    // Records and requests in etcd carry a MAC under a shared key
    // (docs/failover.md §4); plain http is accepted on loopback.
    let state_key = dir.join("state.key");
    let keygen = Command::new(&binary)
        .args(["keygen", "--cluster", "--out"])
        .arg(&state_key)
        .output()
        .expect("poolgate keygen");
    assert!(keygen.status.success(), "keygen: {keygen:?}");

    // Each replica and requester reaches every etcd member through a
    // proxy of its own.
    let proxies_to_etcd =
        || -> Vec<etcd::Proxy> { etcd_ports.iter().map(|&p| etcd::Proxy::start(p)).collect() };
    let replica_proxies: Vec<Vec<etcd::Proxy>> = (0..REPLICAS).map(|_| proxies_to_etcd()).collect();
    let endpoints = |proxies: &[etcd::Proxy]| -> Vec<String> {
        proxies.iter().map(etcd::Proxy::endpoint).collect()
    };

    let mut plan = common::live::plan(
        &base_config(&endpoints(&replica_proxies[0]), &state_key),
        NODES as u32,
    );
    plan.binary = binary.clone();
    plan.external_orchestrator = true;
    plan.seed = seed;
    plan.node_log = Some("warn".into());
    let mut cluster = actix::System::new()
        .block_on(LocalCluster::prepare(&plan))
        .expect("the cluster's files");

    // Replica 0's config as LocalCluster wrote it; replica 1's on ports of
    // its own. Each seeds its SWIM member with the other's.
    let first = with_state_security(
        &std::fs::read_to_string(&cluster.config_file).expect("orchestrator.toml"),
        &state_key,
    );
    let swim0 = cluster.config.swim.bind;
    let agents0 = cluster.config.agents.listen;
    let swim1 = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free UDP port");
    let agents1 = free_tcp();
    let first_endpoints = endpoints(&replica_proxies[0]);
    let with_endpoints = |text: &str, proxies: &[etcd::Proxy]| -> String {
        let mut text = text.to_string();
        for (from, to) in first_endpoints.iter().zip(endpoints(proxies)) {
            text = replaced(&text, &format!("\"{from}\""), &format!("\"{to}\""));
        }
        text
    };
    let bind0 = format!("bind = \"{swim0}\"");
    let listen0 = format!("listen = \"{agents0}\"");
    let replica_texts = [
        replaced(&first, &bind0, &format!("{bind0}\nseeds = [\"{swim1}\"]")),
        with_endpoints(
            &replaced(
                &replaced(
                    &first,
                    &bind0,
                    &format!("bind = \"{swim1}\"\nseeds = [\"{swim0}\"]"),
                ),
                &listen0,
                &format!("listen = \"{agents1}\""),
            ),
            &replica_proxies[1],
        ),
    ];
    // Nodes know both replicas: as SWIM seeds and as agent listeners.
    for node in &cluster.nodes {
        let text = std::fs::read_to_string(&node.config).expect("node.toml");
        let text = replaced(
            &text,
            &format!("seeds = [\"{swim0}\"]"),
            &format!("seeds = [\"{swim0}\", \"{swim1}\"]"),
        );
        let text = replaced(
            &text,
            &format!("agents = \"{agents0}\""),
            &format!("agents = [\"{agents0}\", \"{agents1}\"]"),
        );
        std::fs::write(&node.config, text).expect("node.toml");
    }

    let lines: Lines = Arc::new(Mutex::new(Vec::new()));
    let mut replicas = Vec::new();
    for (i, (text, proxies)) in replica_texts.iter().zip(replica_proxies).enumerate() {
        let config = dir.join(format!("replica-{i}.toml"));
        std::fs::write(&config, text).expect("replica config");
        replicas.push(ReplicaSlot {
            config,
            proxies,
            proc: None,
            life: 0,
            cut: false,
            exits: Vec::new(),
        });
    }
    // Requesters: replica 0's config on sockets this test holds (so they
    // never lead) and proxies of their own.
    let mut held = Vec::new();
    let mut requesters = Vec::new();
    let mut holders: BTreeMap<String, String> = BTreeMap::new();
    holders.insert(agents0.to_string(), "replica-0".into());
    holders.insert(agents1.to_string(), "replica-1".into());
    for i in 0..REQUESTERS {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("a held TCP port");
        let udp = UdpSocket::bind("127.0.0.1:0").expect("a held UDP port");
        let (t_addr, u_addr) = (tcp.local_addr().unwrap(), udp.local_addr().unwrap());
        held.push((tcp, udp));
        holders.insert(t_addr.to_string(), format!("requester-{i}"));
        let proxies = proxies_to_etcd();
        let text = with_endpoints(
            &replaced(
                &replaced(&first, &bind0, &format!("bind = \"{u_addr}\"")),
                &listen0,
                &format!("listen = \"{t_addr}\""),
            ),
            &proxies,
        );
        let config = dir.join(format!("requester-{i}.toml"));
        std::fs::write(&config, text).expect("requester config");
        requesters.push(RequesterSlot {
            config,
            proxies,
            proc: None,
            life: 0,
            cut: false,
            current: None,
            stopped_since: 0,
        });
    }

    let mut world = World {
        dir: dir.clone(),
        binary,
        lines: Arc::clone(&lines),
        replicas,
        requesters,
        lives: Vec::new(),
        faults: Vec::new(),
        due: Vec::new(),
        node_up: vec![false; NODES],
        node_stopped: vec![false; NODES],
        node_harm: vec![Vec::new(); NODES],
        node_kills: vec![Vec::new(); NODES],
        trouble: Vec::new(),
        etcd_down: None,
        etcd_calm: Instant::now(),
        rng: Rng(seed ^ 0x00C0_FFEE_D15C_0DE5),
        _held: held,
    };

    let prefix = format!("/poolgate/{LABEL}/{POOL}/");
    let state_record = format!("{prefix}state");
    let leader_key = format!("{prefix}leader");
    let stop_polling = Arc::new(AtomicBool::new(false));
    let poller = poll_keys(
        etcd_ports.clone(),
        vec![state_record.clone(), leader_key.clone()],
        Arc::clone(&stop_polling),
    );

    // Start: replicas, nodes, then requesters once a pool_ready is told.
    let start = wall_ms();
    for i in 0..REPLICAS {
        world.spawn_replica(i);
    }
    for i in 0..NODES {
        cluster.spawn(i).expect("a node starts");
        world.node_up[i] = true;
    }
    let ready_by = Instant::now() + Duration::from_secs(30);
    while !lock(&lines)
        .iter()
        .any(|l| l.text.contains("\"pool_ready\""))
    {
        assert!(
            Instant::now() < ready_by,
            "no pool_ready within 30 s of the start; replica stderr:\n{}",
            tails(&dir, "replica")
        );
        world.look_at_replicas();
        std::thread::sleep(TICK);
    }
    eprintln!(
        "nemesis: ready after {:.1} s",
        began.elapsed().as_secs_f64()
    );
    for i in 0..REQUESTERS {
        world.spawn_requester(i);
    }

    // The faults.
    let faulting_until = Instant::now() + Duration::from_secs(seconds);
    let mut next_fault = Instant::now() + Duration::from_secs(2);
    let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut skipped = 0u64;
    // The schedule's own source: what else is drawn (requesters' restarts
    // and their --require) does not shift it.
    let mut schedule = Rng(seed);
    while Instant::now() < faulting_until {
        world.apply_due(false, &mut cluster, &mut etcds);
        world.look_at_replicas();
        world.look_at_requesters(false);
        if Instant::now() >= next_fault {
            let draw = Draw::from(&mut schedule);
            match world.inject(&draw, &mut cluster, &mut etcds, &etcd_ports) {
                Some(kind) => *injected.entry(kind).or_default() += 1,
                None => skipped += 1,
            }
            next_fault = Instant::now() + draw.next;
        }
        std::thread::sleep(TICK);
    }

    // Heal everything, let it settle, then stop the requesters as an
    // operator would (SIGTERM: each ends its run).
    let healed_at = wall_ms();
    world
        .due
        .retain(|(_, d)| !matches!(d, Due::RequesterRestart(_)));
    world.apply_due(true, &mut cluster, &mut etcds);
    for i in 0..REPLICAS {
        if world.replicas[i].proc.is_none() && !world.pending(Due::ReplicaRestart(i)) {
            world.spawn_replica(i);
        }
    }
    let settle = Instant::now() + Duration::from_secs(4);
    while Instant::now() < settle {
        world.apply_due(true, &mut cluster, &mut etcds);
        world.look_at_replicas();
        world.look_at_requesters(true);
        std::thread::sleep(TICK);
    }
    for i in 0..world.requesters.len() {
        if let Some(p) = world.requesters[i].proc.as_ref() {
            p.signal(Signal::SIGTERM);
            if let Some(l) = world.requesters[i].current {
                world.lives[l].by_us = Some("sigterm");
            }
        }
    }
    let stop_by = Instant::now() + Duration::from_secs(20);
    while Instant::now() < stop_by
        && (world.requesters.iter().any(|r| r.proc.is_some())
            || world
                .lives
                .iter()
                .any(|l| l.command.is_some() && l.command_gone.is_none()))
    {
        world.look_at_replicas();
        world.look_at_requesters(true);
        std::thread::sleep(TICK);
    }
    let requesters_left: Vec<String> = world
        .requesters
        .iter()
        .filter_map(|r| r.current.filter(|_| r.proc.is_some()))
        .map(|l| world.lives[l].who.to_string())
        .collect();
    // Late lines in.
    std::thread::sleep(Duration::from_millis(500));
    let replicas_stopped_at = wall_ms();
    for slot in &mut world.replicas {
        if let Some(p) = slot.proc.as_ref() {
            p.signal(Signal::SIGCONT);
            p.signal(Signal::SIGTERM);
        }
    }
    let replicas_by = Instant::now() + Duration::from_secs(5);
    while Instant::now() < replicas_by && world.replicas.iter().any(|r| r.proc.is_some()) {
        for slot in &mut world.replicas {
            if slot.proc.as_mut().and_then(Proc::exited).is_some() {
                slot.proc = None;
            }
        }
        std::thread::sleep(TICK);
    }
    stop_polling.store(true, Ordering::Relaxed);
    let polled = poller.join().expect("the poller");

    // The state key's history: walked down its revisions, and polled.
    let walked = history(&etcd_ports, &state_record);
    let mut state: BTreeMap<i64, (Version, Stored)> = BTreeMap::new();
    let walked_len = match &walked {
        Ok(versions) => {
            for v in versions {
                state.insert(v.mod_revision, (v.clone(), stored_of(&v.value)));
            }
            versions.len()
        }
        Err(e) => {
            eprintln!("nemesis: the state key's history not read ({e}); polled versions only");
            0
        }
    };
    for (_, v) in polled.get(&state_record).into_iter().flatten() {
        state
            .entry(v.mod_revision)
            .or_insert_with(|| (v.clone(), stored_of(&v.value)));
    }
    let state_lives: BTreeSet<i64> = state.values().map(|(v, _)| v.create_revision).collect();
    let terms = terms_of(
        polled.get(&leader_key).map_or(&[][..], Vec::as_slice),
        &holders,
    );
    // Terms begun after the replicas were told to stop are theirs, not
    // a fault's.
    let terms: Vec<TermSeen> = terms
        .into_iter()
        .filter(|term| term.first_seen < replicas_stopped_at)
        .collect();
    let mut terms_by_holder: BTreeMap<String, u64> = BTreeMap::new();
    for term in &terms {
        *terms_by_holder.entry(term.holder.clone()).or_default() += 1;
    }
    let (moves_after_etcd, moves_unexplained) = unexplained_moves(
        &terms,
        &world.trouble,
        &world.faults,
        (lease_s() + 2) * 1000,
        start,
    );

    let all_lines = lock(&lines).clone();
    let told = told(&all_lines);
    let mut verdict = check(&Evidence {
        start,
        told: &told,
        lives: &world.lives,
        node_harm: &world.node_harm,
        node_kills: &world.node_kills,
        state: &state,
        walked: walked_len,
    });
    for who in &requesters_left {
        verdict
            .violations
            .push(format!("(3) {who} did not exit within 20 s of SIGTERM"));
    }
    if state_lives.len() > 1 {
        verdict.notes.push(format!(
            "the state key was created {} times (create revisions {state_lives:?})",
            state_lives.len()
        ));
    }

    // The report.
    let rel = |wall: u64| (wall as f64 - start as f64) / 1000.0;
    eprintln!("nemesis: faults, by the wall clock (t from the start):");
    for f in &world.faults {
        eprintln!(
            "  t={:7.2}s {:>13} {:<24} {:<22} {}",
            rel(f.wall),
            f.wall,
            f.kind,
            f.target,
            f.detail
        );
    }
    eprintln!("nemesis: requester lives:");
    for life in &world.lives {
        eprintln!(
            "  {} pid {} --require {} started t={:.2}s exit {:?} at {} by us {:?}; command {:?} alive at exit {:?} gone {}",
            life.who,
            life.pid,
            life.require,
            rel(life.started),
            life.code,
            life.exited.map(|w| format!("t={:.2}s", rel(w))).unwrap_or_else(|| "never".into()),
            life.by_us,
            life.command.map(|c| c.pid),
            life.command_alive_at_exit,
            life.command_gone.map(|w| format!("t={:.2}s", rel(w))).unwrap_or_else(|| "never".into()),
        );
    }
    eprintln!("nemesis: run events told:");
    for x in &told {
        if x.event != "pool_ready" && x.event != "readiness_lost" {
            eprintln!(
                "  t={:7.2}s {:<14} {}",
                rel(x.wall),
                x.who.to_string(),
                x.text
            );
        }
    }
    for term in &terms {
        if term.holder.starts_with("requester") {
            verdict.notes.push(format!(
                "{} held the leader key (seen {}): a `run` that cannot lead still campaigned",
                term.holder,
                format_args!("t={:.2}s", rel(term.first_seen))
            ));
        }
    }
    for m in moves_after_etcd.iter().chain(&moves_unexplained) {
        verdict.notes.push(m.clone());
    }
    // docs/failover.md §5: a leader that dies is replaced within the lease TTL plus
    // one second (noted: etcd's own elections renew every lease).
    let takeovers = takeovers(&terms, &world.faults, start);
    // The guard gap: a run committed when its leader was killed went
    // unguarded until the next term began (which restores and guards it
    // at once): the longest of those.
    let guard_gaps_s: Vec<f64> = takeovers
        .iter()
        .filter(|(kill, _, _)| committed_at(&told, *kill))
        .map(|(kill, next, _)| {
            let until = next.unwrap_or(replicas_stopped_at);
            ((until.saturating_sub(*kill)) as f64 / 10.0).round() / 100.0
        })
        .collect();
    let mut takeover_s = Vec::new();
    for (kill, next, etcd) in &takeovers {
        let took = next.map(|n| (n - kill) as f64 / 1000.0);
        takeover_s.push(took.map(|s| (s * 100.0).round() / 100.0));
        if took.is_none_or(|s| s > lease_s() as f64 + 1.0 + 0.1) {
            verdict.notes.push(format!(
                "the leader SIGKILLed at t={:.2}s was replaced {} (lease {} s + 1 s){}",
                rel(*kill),
                took.map_or("never".to_string(), |s| format!("after {s:.2} s")),
                lease_s(),
                if etcd.is_empty() {
                    String::new()
                } else {
                    format!("; etcd meanwhile: {etcd}")
                }
            ));
        }
    }
    for note in &verdict.notes {
        eprintln!("nemesis: note: {note}");
    }
    eprintln!(
        "nemesis: {} run_faulted naming a node no fault had harmed (a liveness fail-safe):",
        verdict.unharmed_faults.len()
    );
    for line in &verdict.unharmed_faults {
        eprintln!("  {line}");
    }
    for v in &verdict.violations {
        eprintln!("nemesis: VIOLATION {v}");
    }
    // Exits replicas made on their own, by what they said last.
    let mut replica_exits: BTreeMap<String, u64> = BTreeMap::new();
    for r in &world.replicas {
        for (_, code, last) in &r.exits {
            // The message without its timestamp.
            let said = last.split_once(' ').map_or(last.as_str(), |(_, m)| m);
            *replica_exits
                .entry(format!("exit {code}: {said}"))
                .or_default() += 1;
        }
    }
    let mut requester_exits: BTreeMap<String, u64> = BTreeMap::new();
    for life in &world.lives {
        let code = life.code.map_or("none".to_string(), |c| c.to_string());
        *requester_exits.entry(code).or_default() += 1;
    }
    let summary = json!({
        "seed": seed,
        "seconds": seconds,
        "elapsed_s": (began.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "faults": injected,
        "steps_skipped": skipped,
        "violations": verdict.violations.len(),
        "unharmed_run_faulted": verdict.unharmed_faults.len(),
        "epochs_told": verdict.epochs_told,
        "runs_committed": verdict.runs_committed,
        "requester_lives": world.lives.len(),
        "requester_exit_codes": requester_exits,
        "state_versions": state.len(),
        "stored_last_epoch": state.values().filter_map(|(_, s)| s.last_epoch).max(),
        "state_walked": walked_len,
        "leader_terms_polled": terms_by_holder,
        "takeovers_after_leader_kill_s": takeover_s,
        "guard_gaps_s": guard_gaps_s,
        "guard_gap_max_s": guard_gaps_s.iter().copied().fold(0.0_f64, f64::max),
        "leader_moves_after_etcd_faults_only": moves_after_etcd.len(),
        "leader_moves_after_no_fault": moves_unexplained.len(),
        "replica_exits": replica_exits,
        "healed_at_s": (rel(healed_at) * 10.0).round() / 10.0,
    });
    println!("{summary}");
    eprintln!("{summary}");
    if !verdict.violations.is_empty() {
        eprintln!("replica stderr:\n{}", tails(&dir, "replica"));
        eprintln!("requester stderr:\n{}", tails(&dir, "requester"));
    }
    assert!(
        verdict.violations.is_empty(),
        "nemesis seed {seed}: {} violation(s):\n{}",
        verdict.violations.len(),
        verdict.violations.join("\n")
    );
    drop(world);
    drop(cluster);
    drop(etcds);
    drop(cleanup);
}

/// Removes the test's folder when dropped (kept with `NEMESIS_KEEP`).
struct RemoveOnDrop(PathBuf, bool);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The last lines of each stderr log of `role` in `dir`.
fn tails(dir: &Path, role: &str) -> String {
    let mut out = String::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for path in files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(role) && name.ends_with(".err") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(15);
            out.push_str(&format!("--- {name}\n{}\n", lines[from..].join("\n")));
        }
    }
    out
}

/// The checker is not vacuous: a made-up history breaking each property
/// is flagged by the property it breaks.
#[test]
fn the_checker_flags_each_property_a_history_breaks() {
    let at = |ms: u64| 1_000_000 + ms;
    let replica = |slot| Who {
        role: Role::Replica,
        slot,
        life: 1,
    };
    let requester = Who {
        role: Role::Requester,
        slot: 0,
        life: 1,
    };
    let line = |ms, who, text: &str| Told {
        wall: at(ms),
        who,
        event: serde_json::from_str::<Value>(text).unwrap()["event"]
            .as_str()
            .unwrap()
            .to_string(),
        json: serde_json::from_str(text).unwrap(),
        text: text.to_string(),
    };
    let told = vec![
        line(1000, replica(0), r#"{"event":"pool_ready","epoch":1}"#),
        line(2000, replica(1), r#"{"event":"pool_ready","epoch":1}"#),
        line(
            3000,
            replica(0),
            r#"{"event":"run_committed","run":"r1","epoch":1}"#,
        ),
        line(
            3100,
            requester,
            r#"{"event":"run_committed","run":"r1","epoch":1}"#,
        ),
        line(
            4000,
            replica(0),
            r#"{"event":"run_faulted","run":"r1","node":"node-2","reason":"suspect"}"#,
        ),
        line(
            5000,
            replica(1),
            r#"{"event":"run_faulted","run":"r1","node":"node-3","reason":"dead"}"#,
        ),
        // node-4 killed while r2 was committed over it; r2 went on until
        // its requester ended it 40 s later.
        line(
            6000,
            replica(1),
            r#"{"event":"run_committed","run":"r2","epoch":2,"required":["node-4"]}"#,
        ),
        line(47000, replica(1), r#"{"event":"run_finished","run":"r2"}"#),
        // node-1 killed while r3 was committed over it: faulted.
        line(
            50000,
            replica(1),
            r#"{"event":"run_committed","run":"r3","epoch":3,"required":["node-1"]}"#,
        ),
        line(
            52000,
            replica(1),
            r#"{"event":"run_faulted","run":"r3","node":"node-1","reason":"faulted"}"#,
        ),
    ];
    let version = |revision, text: &str| {
        (
            revision,
            (
                Version {
                    mod_revision: revision,
                    create_revision: 10,
                    value: text.as_bytes().to_vec(),
                },
                stored_of(text.as_bytes()),
            ),
        )
    };
    let state: BTreeMap<i64, (Version, Stored)> = [
        version(10, r#"{"last_epoch":1,"run":null}"#),
        version(
            11,
            r#"{"last_epoch":1,"run":{"run":"r1","epoch":1,"committed":true}}"#,
        ),
        version(
            12,
            r#"{"last_epoch":0,"run":{"run":"r1","epoch":1,"committed":true}}"#,
        ),
    ]
    .into_iter()
    .collect();
    let lives = vec![RunLife {
        who: requester,
        require: "node-2".into(),
        pid_file: PathBuf::new(),
        pid: 1,
        started: at(0),
        exited: Some(at(4500)),
        code: Some(3),
        by_us: None,
        command: Some(ProcId { pid: 1, start: 0 }),
        command_gone_at_read: false,
        command_alive_at_exit: Some(true),
        command_gone: None,
        stops: Vec::new(),
        cuts: Vec::new(),
    }];
    let node_kills = vec![vec![at(51000)], Vec::new(), vec![at(4900)], vec![at(7000)]];
    // node-4 was also paused at 6.5 s, while r2 was committed: a pause
    // need not fault a run (rule 6 is about kills); it harms (rule 5).
    let mut node_harm = node_kills.clone();
    node_harm[3].insert(0, at(6500));
    let verdict = check(&Evidence {
        start: at(0),
        told: &told,
        lives: &lives,
        node_harm: &node_harm,
        node_kills: &node_kills,
        state: &state,
        walked: 3,
    });
    let flagged = |needle: &str| verdict.violations.iter().any(|v| v.contains(needle));
    for needle in [
        "(1) epoch 1 told 2 times",
        "(2) the stored last epoch went down",
        "(3) the end of run r1 told 2 times",
        "(3) run r1 was told ended",
        "still runs",
        "(4)",
        "(6) node-4 killed at t=7.00s while run r2 was committed",
    ] {
        assert!(
            flagged(needle),
            "{needle} not flagged: {:#?}",
            verdict.violations
        );
    }
    assert!(
        !flagged("(6) node-1") && !flagged("6.50s"),
        "r3 faulted: {:#?}",
        verdict.violations
    );
    assert_eq!(
        verdict.unharmed_faults.len(),
        1,
        "{:?}",
        verdict.unharmed_faults
    );
    assert!(verdict.unharmed_faults[0].contains("node-2"));
}
