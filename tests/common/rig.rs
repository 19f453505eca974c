//! The multi-host rig: hosts as Linux network namespaces, each with its
//! own address on a bridge that lives in a namespace of its own (nothing is
//! added to the machine's own namespace), each running real `poolgate`
//! processes started as docs/operator.md deploys them. Faults: nftables inside a
//! host's namespace (random loss, a partition between two hosts, all of a
//! host's traffic dropped) and links set down.
//!
//! Hostnames: `ip netns exec` lays `/etc/netns/<ns>/hosts` over
//! `/etc/hosts`, so every host resolves `host-1` … to the rig's addresses.
//!
//! Everything the rig makes is removed when it is dropped, also when a test
//! fails (unwinding); namespaces left by an interrupted run (their process
//! gone) are removed by the next rig.
//!
//! Needs root, `ip netns` and `nft`. Elsewhere [`Rig::new`] prints one line
//! saying why and returns `None`; with `CI` set it fails instead, so a CI
//! run can never pass by skipping the rig.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PREFIX: &str = "pgrig";

static RIGS: AtomicU32 = AtomicU32::new(0);

/// One host: a network namespace with one address.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its hostname (`host-1` …), resolvable on every host of the rig.
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address on the rig's bridge.
    pub addr: Ipv4Addr,
}

/// A process the rig started on one of its hosts.
pub struct Process {
    /// What it is, for messages.
    pub label: String,
    /// On which host.
    pub host: usize,
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    /// Its stderr.
    pub log: PathBuf,
    seen: Vec<String>,
}

impl Process {
    /// Waits until `deadline` for a stdout line `pick` accepts.
    pub fn wait_for<T>(
        &mut self,
        limit: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(found) = pick(&line) {
                        return Some(found);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Waits for a JSON event line with `"event":"<event>"` and every
    /// `"key":value` pair of `fields` (values as JSON text).
    pub fn wait_event(
        &mut self,
        limit: Duration,
        event: &str,
        fields: &[(&str, &str)],
    ) -> Option<serde_json::Value> {
        self.wait_for(limit, |line| {
            let value: serde_json::Value = serde_json::from_str(line).ok()?;
            if value.get("event")?.as_str()? != event {
                return None;
            }
            for (key, want) in fields {
                let want: serde_json::Value = serde_json::from_str(want).ok()?;
                if value.get(*key)? != &want {
                    return None;
                }
            }
            Some(value)
        })
    }

    /// Takes every stdout line waiting, without blocking.
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Every stdout line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `limit` for it to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Some(status.code().unwrap_or(-1));
                }
            } else {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends it `signal`.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A rig of hosts on one bridge.
pub struct Rig {
    bridge: String,
    /// The hosts, `host-1` first.
    pub hosts: Vec<Host>,
    /// Files of the rig (one folder per host, logs), removed on drop.
    pub dir: PathBuf,
    /// Its share of the machine, given back once the rig is removed.
    _share: Share,
}

/// Rigs of one test binary share the machine, but a rig that measures
/// what timing tolerates (stalls, starvation) has it to itself: no other
/// rig's processes compete for the cores meanwhile.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Share {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

/// Why the rig cannot run on this machine, if it cannot (found out once
/// per process: the tests of one binary make their rigs at once).
pub fn unavailable() -> Option<String> {
    static FOUND: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(probe).clone()
}

fn probe() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` is not installed (iproute2, nftables)"));
        }
    }
    let probe = format!("{PREFIX}-probe-{}", std::process::id());
    let made = run(&["ip", "netns", "add", &probe]);
    let _ = run(&["ip", "netns", "del", &probe]);
    if let Err(e) = made {
        return Some(format!("`ip netns add` fails here: {e}"));
    }
    None
}

fn run(argv: &[&str]) -> Result<String, String> {
    let output = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn must(argv: &[&str]) {
    if let Err(e) = run(argv) {
        panic!("rig: {e}");
    }
}

/// Removes namespaces an interrupted run left (their process is gone).
fn sweep() {
    let Ok(list) = run(&["ip", "netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = ns.strip_prefix(&format!("{PREFIX}-")) else {
            continue;
        };
        let pid: Option<i32> = rest.split('-').next().and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            kill_inside(ns);
            let _ = run(&["ip", "netns", "del", ns]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
        }
    }
}

impl Rig {
    /// A rig of `hosts` hosts, or `None` (after one line saying why) where
    /// the machine cannot make one; under CI that is a failure.
    pub fn new(hosts: usize) -> Option<Rig> {
        Self::made(hosts, false)
    }

    /// As [`Rig::new`], once no other rig of this process runs, and none
    /// starts until this one is removed.
    pub fn alone(hosts: usize) -> Option<Rig> {
        Self::made(hosts, true)
    }

    fn made(hosts: usize, alone: bool) -> Option<Rig> {
        if let Some(why) = unavailable() {
            if std::env::var_os("CI").is_some() {
                panic!("the multi-host rig must run in CI, but cannot: {why}");
            }
            // Straight to stderr, past the test harness's capture, so the
            // line is seen though the test passes.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the multi-host rig needs root, ip netns and nft: {why}"
            );
            return None;
        }
        let share = match alone {
            true => Share::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner())),
            false => Share::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner())),
        };
        sweep();
        let n = RIGS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("rig folder");
        let bridge = format!("{tag}-br");
        let mut rig = Rig {
            bridge: bridge.clone(),
            hosts: Vec::new(),
            dir,
            _share: share,
        };
        must(&["ip", "netns", "add", &bridge]);
        must(&["ip", "-n", &bridge, "link", "set", "lo", "up"]);
        must(&["ip", "-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        must(&["ip", "-n", &bridge, "link", "set", "br0", "up"]);
        for i in 0..hosts {
            let ns = format!("{tag}-{}", i + 1);
            let addr = Ipv4Addr::new(10, 99, 0, u8::try_from(i + 1).expect("at most 250 hosts"));
            must(&["ip", "netns", "add", &ns]);
            rig.hosts.push(Host {
                name: format!("host-{}", i + 1),
                ns: ns.clone(),
                addr,
            });
            let port = format!("p{}", i + 1);
            must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            must(&[
                "ip", "-n", &bridge, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            must(&["ip", "-n", &bridge, "link", "set", &port, "master", "br0"]);
            must(&["ip", "-n", &bridge, "link", "set", &port, "up"]);
            must(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        }
        let mut hosts_file = String::from("127.0.0.1 localhost\n");
        for host in &rig.hosts {
            hosts_file.push_str(&format!("{} {}\n", host.addr, host.name));
        }
        for host in &rig.hosts {
            let etc = PathBuf::from(format!("/etc/netns/{}", host.ns));
            std::fs::create_dir_all(&etc).expect("/etc/netns");
            std::fs::write(etc.join("hosts"), &hosts_file).expect("/etc/netns/…/hosts");
        }
        Some(rig)
    }

    /// A folder of host `i`'s own (its `/etc/poolgate`).
    pub fn host_dir(&self, i: usize) -> PathBuf {
        let dir = self.dir.join(&self.hosts[i].name);
        std::fs::create_dir_all(&dir).expect("host folder");
        dir
    }

    /// Runs `argv` on host `i` to its end (setup commands); its stdout.
    pub fn exec(&self, i: usize, argv: &[&str]) -> Result<String, String> {
        let mut full = vec!["ip", "netns", "exec", self.hosts[i].ns.as_str()];
        full.extend_from_slice(argv);
        run(&full)
    }

    /// Starts `argv` on host `i` with `env`; stdout is read line by line,
    /// stderr goes to `<dir>/<label>.log`.
    pub fn spawn(&self, i: usize, label: &str, argv: &[&str], env: &[(&str, &str)]) -> Process {
        let log = self.dir.join(format!("{label}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.hosts[i].ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        for (key, value) in env {
            command.env(key, value);
        }
        // `ip netns exec` execs the program: this pid is the program's.
        let mut child = command.spawn().expect("ip netns exec");
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Process {
            label: label.into(),
            host: i,
            child: Some(child),
            lines,
            log,
            seen: Vec::new(),
        }
    }

    /// Applies an nftables `script` inside host `i`.
    pub fn nft(&self, i: usize, script: &str) {
        let path = self.dir.join(format!("nft-{}-{}.nft", i, rand_suffix()));
        std::fs::write(&path, script).expect("nft script");
        let applied = self.exec(i, &["nft", "-f", &path.display().to_string()]);
        let _ = std::fs::remove_file(&path);
        if let Err(e) = applied {
            panic!("rig: {e}");
        }
    }

    /// Drops every packet to and from host `i` (its loopback still works).
    pub fn isolate(&self, i: usize) {
        self.nft(
            i,
            "table inet rig_isolate {\n\
             chain input { type filter hook input priority -10; policy drop; iifname \"lo\" accept; }\n\
             chain output { type filter hook output priority -10; policy drop; oifname \"lo\" accept; }\n\
             }\n",
        );
    }

    /// Undoes [`Rig::isolate`].
    pub fn heal(&self, i: usize) {
        let _ = self.exec(i, &["nft", "delete", "table", "inet", "rig_isolate"]);
    }

    /// Drops `percent`% of the UDP datagrams host `i` receives, at random
    /// (0 removes the rule).
    pub fn udp_loss(&self, i: usize, percent: u32) {
        let _ = self.exec(i, &["nft", "delete", "table", "inet", "rig_loss"]);
        if percent == 0 {
            return;
        }
        self.nft(
            i,
            &format!(
                "table inet rig_loss {{\n\
                 chain input {{ type filter hook input priority -5; policy accept; \
                 meta l4proto udp numgen random mod 100 < {percent} drop; }}\n\
                 }}\n"
            ),
        );
    }

    /// Cuts hosts `a` and `b` off from each other, both ways.
    pub fn partition(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let other = self.hosts[to].addr;
            self.nft(
                from,
                &format!(
                    "table inet rig_part_{to} {{\n\
                     chain input {{ type filter hook input priority -8; policy accept; ip saddr {other} drop; }}\n\
                     chain output {{ type filter hook output priority -8; policy accept; ip daddr {other} drop; }}\n\
                     }}\n"
                ),
            );
        }
    }

    /// Sets host `i`'s link up or down.
    pub fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        must(&["ip", "-n", &self.hosts[i].ns, "link", "set", "eth0", state]);
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    hasher.finish()
}

/// SIGKILLs every process left inside namespace `ns` (by pid).
fn kill_inside(ns: &str) {
    if let Ok(pids) = run(&["ip", "netns", "pids", ns]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for host in &self.hosts {
            // What a process started inside left behind (a guarded
            // command, say) goes too.
            kill_inside(&host.ns);
            let _ = run(&["ip", "netns", "del", &host.ns]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", host.ns));
        }
        let _ = run(&["ip", "netns", "del", &self.bridge]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process held to a share of a core by a cgroup of its own (the
/// `cpu` controller: cgroup v1's quota, or v2's `cpu.max`), let go when
/// dropped.
pub struct Starved {
    group: std::path::PathBuf,
    /// Where the process goes back to.
    root: std::path::PathBuf,
    pid: u32,
}

impl Starved {
    /// `pid` held to `quota_us` of every 100 ms; why it cannot be, if not.
    pub fn hold(pid: u32, quota_us: u64) -> Result<Starved, String> {
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpu");
        let v2 = std::path::Path::new("/sys/fs/cgroup");
        let name = format!("poolgate-starve-{}-{pid}", std::process::id());
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let (root, group) = if v1.join("cpu.cfs_quota_us").exists() {
            let group = v1.join(&name);
            std::fs::create_dir_all(&group).map_err(|e| io("cgroup", e))?;
            std::fs::write(group.join("cpu.cfs_period_us"), "100000")
                .map_err(|e| io("cpu.cfs_period_us", e))?;
            std::fs::write(group.join("cpu.cfs_quota_us"), quota_us.to_string())
                .map_err(|e| io("cpu.cfs_quota_us", e))?;
            (v1.to_path_buf(), group)
        } else if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        {
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
            let group = v2.join(&name);
            std::fs::create_dir_all(&group).map_err(|e| io("cgroup", e))?;
            std::fs::write(group.join("cpu.max"), format!("{quota_us} 100000"))
                .map_err(|e| io("cpu.max", e))?;
            (v2.to_path_buf(), group)
        } else {
            return Err("no cgroup cpu controller (v1 or v2)".into());
        };
        std::fs::write(group.join("cgroup.procs"), pid.to_string())
            .map_err(|e| io("cgroup.procs", e))?;
        Ok(Starved { group, root, pid })
    }
}

impl Drop for Starved {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.group);
    }
}
