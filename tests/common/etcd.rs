//! A real etcd server for a test: on 127.0.0.1 with free ports, or inside
//! a rig host; its data in a folder of its own; SIGKILLed and removed on
//! drop. Where the `etcd` binary is missing, tests say so in one line and
//! do nothing (under `CI` they fail instead: `.ci/run` installs it).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why `program` (run with `version`, to see it answer) is missing here,
/// if it is: named with its Debian `package`. Under `CI` a failure
/// instead: `.ci/run` installs it, and a CI run that skipped its tests
/// would prove nothing.
fn missing_command(program: &str, version: &str, package: &str) -> Option<String> {
    let found = Command::new(program)
        .arg(version)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return None;
    }
    let why = format!("`{program}` is not installed (Debian: {package})");
    assert!(
        std::env::var_os("CI").is_none(),
        "under CI these tests must run: {why}"
    );
    Some(why)
}

/// Why etcd cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    missing_command("etcd", "--version", "etcd-server")
}

/// Skips the calling test with one line if etcd is missing.
#[macro_export]
macro_rules! need_etcd {
    () => {
        if let Some(why) = $crate::etcd::missing() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// A free TCP port on 127.0.0.1.
/// Two distinct free ports on 127.0.0.1 (both held while picked: two
/// picks one after the other may name the same port).
pub fn free_ports() -> (u16, u16) {
    let pick = || std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let (a, b) = (pick(), pick());
    let port = |l: &std::net::TcpListener| l.local_addr().expect("bound").port();
    (port(&a), port(&b))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One etcd member on 127.0.0.1.
pub struct Etcd {
    child: Option<Child>,
    /// What it was started with, to start it again.
    command: Vec<std::ffi::OsString>,
    dir: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl Etcd {
    /// The client port.
    pub fn port(&self) -> u16 {
        self.endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    /// Starts a one-member cluster and waits until it answers.
    pub fn start(name: &str) -> Etcd {
        Etcd::start_with(name, None)
    }

    /// Starts a one-member cluster serving its clients over TLS with the
    /// server certificate of `certs`, asking each client for a
    /// certificate its CA signed (`--client-cert-auth`).
    pub fn start_tls(name: &str, certs: &Certs) -> Etcd {
        Etcd::start_with(name, Some(certs))
    }

    fn start_with(name: &str, tls: Option<&Certs>) -> Etcd {
        // A port picked free may be taken by another process before etcd
        // binds it: then again, on other ports.
        for _ in 0..4 {
            if let Some(etcd) = Etcd::try_start(name, tls) {
                return etcd;
            }
        }
        panic!("etcd lost its ports to other processes four times");
    }

    /// Starts it on free ports; `None` when it lost one of them.
    fn try_start(name: &str, tls: Option<&Certs>) -> Option<Etcd> {
        let dir = std::env::temp_dir().join(format!("poolgate-etcd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd folder");
        let (client, peer) = free_ports();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let mut command = Command::new("etcd");
        command.stdin(Stdio::null()).stdout(Stdio::null());
        if let Some(certs) = tls {
            command
                .arg("--cert-file")
                .arg(certs.dir.join("server.pem"))
                .arg("--key-file")
                .arg(certs.dir.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(certs.dir.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        command
            .args(["--name", "e0", "--data-dir"])
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("e0={peer_url}")]);
        let args = command.get_args().map(ToOwned::to_owned).collect();
        let child = command
            .stderr(Stdio::from(log))
            .spawn()
            .expect("etcd starts");
        let mut etcd = Etcd {
            child: Some(child),
            command: args,
            dir,
            endpoint,
        };
        let client = poolgate::ha::etcd::Etcd::new(
            std::slice::from_ref(&etcd.endpoint),
            Duration::from_millis(500),
        )
        .expect("endpoint");
        let client = match tls {
            Some(certs) => client.with_tls(&certs.client()).expect("tls files"),
            None => client,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.get(b"probe").is_err() {
            let exited = etcd
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited && etcd.log().contains("address already in use") {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not start: {}",
                etcd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(etcd)
    }

    /// SIGKILLs it (its data kept: [`Etcd::restart`] starts it again).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs it and starts it again on its data, without waiting for
    /// it to answer: its raft term rises, and etcd gives every lease a
    /// fresh TTL.
    pub fn restart(&mut self) {
        self.stop();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log");
        let child = Command::new("etcd")
            .args(&self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("etcd starts again");
        self.child = Some(child);
    }

    /// A client of it.
    pub fn client(&self) -> poolgate::ha::etcd::Etcd {
        poolgate::ha::etcd::Etcd::new(std::slice::from_ref(&self.endpoint), Duration::from_secs(2))
            .expect("endpoint")
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why `openssl` cannot make certificates here, if it cannot.
pub fn openssl_missing() -> Option<String> {
    missing_command("openssl", "version", "openssl")
}

/// A test CA of its own, a server certificate for 127.0.0.1 and a client
/// certificate, all made by `openssl` in a folder removed on drop, valid
/// for a day.
pub struct Certs {
    /// The folder: `ca.pem`, `server.{pem,key}`, `client.{pem,key}`.
    pub dir: PathBuf,
}

impl Certs {
    /// Makes them, under `name`.
    pub fn make(name: &str) -> Certs {
        let dir =
            std::env::temp_dir().join(format!("poolgate-certs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("certs folder");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=poolgate test CA",
        ]);
        openssl(&ca);
        for (who, usage) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(dir.join(format!("{who}.ext")), usage).expect("ext");
            let (key, csr, pem, ext, subject) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.ext"),
                format!("/CN={who}"),
            );
            let mut req = vec!["req", "-new"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            openssl(&req);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "1",
                "-extfile",
                &ext,
            ]);
        }
        Certs { dir }
    }

    /// What a client of `start_tls`'s etcd is given: the CA, its
    /// certificate and key.
    pub fn client(&self) -> poolgate::ha::etcd::TlsFiles {
        poolgate::ha::etcd::TlsFiles {
            ca_file: Some(self.dir.join("ca.pem")),
            cert_file: Some(self.dir.join("client.pem")),
            key_file: Some(self.dir.join("client.key")),
        }
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cluster of etcd members on 127.0.0.1, each restartable on its data.
pub struct Cluster {
    members: Vec<Member>,
    dir: PathBuf,
    initial: String,
}

struct Member {
    name: String,
    client: String,
    peer: String,
    child: Option<Child>,
}

impl Cluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(name: &str, n: usize) -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("poolgate-etcds-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd folder");
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let (client, peer) = free_ports();
                Member {
                    name: format!("e{i}"),
                    client: format!("http://127.0.0.1:{client}"),
                    peer: format!("http://127.0.0.1:{peer}"),
                    child: None,
                }
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            members,
            dir,
            initial,
        };
        for i in 0..n {
            cluster.restart(i);
        }
        let client = cluster.client(Duration::from_millis(500));
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.get(b"probe").is_err() {
            assert!(Instant::now() < deadline, "the etcd cluster did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// A client of the whole cluster.
    pub fn client(&self, timeout: Duration) -> poolgate::ha::etcd::Etcd {
        poolgate::ha::etcd::Etcd::new(&self.endpoints(), timeout).expect("endpoints")
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` (again) on its data.
    pub fn restart(&mut self, i: usize) {
        let member = &self.members[i];
        let log =
            std::fs::File::create(self.dir.join(format!("{}.log", member.name))).expect("log");
        let child = Command::new("etcd")
            .args(["--name", &member.name, "--data-dir"])
            .arg(self.dir.join(&member.name))
            .args([
                "--listen-client-urls",
                &member.client,
                "--advertise-client-urls",
                &member.client,
            ])
            .args([
                "--listen-peer-urls",
                &member.peer,
                "--initial-advertise-peer-urls",
                &member.peer,
            ])
            .args([
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-state",
                "new",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("etcd starts");
        self.members[i].child = Some(child);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A replica's config over `endpoints`: pool `pool-a` of `node-1`, SWIM
/// and the agent listener on free loopback ports, cluster `label`, then
/// `extra` TOML after `[state]`'s etcd and lease.
pub fn replica_config(
    endpoints: &[String],
    label: &str,
    window: &str,
    lease: &str,
    extra: &str,
) -> poolgate::Config {
    let endpoint = endpoints.join("\", \"");
    poolgate::Config::parse(
        &format!(
            "[pool]\nid = \"pool-a\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"{window}\"\n\
             [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\nlabel = \"{label}\"\n\
             [agents]\nlisten = \"127.0.0.1:0\"\n\
             [state]\netcd = [\"{endpoint}\"]\nlease = \"{lease}\"\ninsecure = true\n{extra}"
        ),
        "config.toml",
    )
    .expect("config")
}

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};

/// A TCP proxy to etcd that refuses everything while cut, and passes
/// nothing on (answering nothing, as etcd without a quorum) while stalled.
pub struct Proxy {
    port: u16,
    cut: std::sync::Arc<AtomicBool>,
    stalled: std::sync::Arc<AtomicBool>,
}

impl Proxy {
    /// Starts a proxy to etcd's client port `to`.
    pub fn start(to: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = std::sync::Arc::new(AtomicBool::new(false));
        let stalled = std::sync::Arc::new(AtomicBool::new(false));
        let (cutting, stalling) = (std::sync::Arc::clone(&cut), std::sync::Arc::clone(&stalled));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cutting.load(Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let cut = std::sync::Arc::clone(&cutting);
                let stalled = std::sync::Arc::clone(&stalling);
                std::thread::spawn(move || pipe(client, to, &cut, &stalled));
            }
        });
        Proxy { port, cut, stalled }
    }

    /// `http://127.0.0.1:<port>` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Refuses (and cuts) every connection while `cut`.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }

    /// Passes nothing on, either way, while `stalled`.
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }
}

/// Copies both ways until either side closes, or the proxy is cut.
fn pipe(client: TcpStream, to: u16, cut: &AtomicBool, stalled: &AtomicBool) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
        return;
    };
    let copy = |mut from: TcpStream, mut into: TcpStream, cut: &AtomicBool| {
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = [0u8; 16 * 1024];
        loop {
            if cut.load(Ordering::Relaxed) {
                let _ = into.shutdown(std::net::Shutdown::Both);
                return;
            }
            if stalled.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => {
                    let _ = into.shutdown(std::net::Shutdown::Write);
                    return;
                }
                Ok(n) => {
                    // Read as the stall began: held until it ends.
                    while stalled.load(Ordering::Relaxed) && !cut.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if into.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    std::thread::scope(|scope| {
        scope.spawn(|| copy(client, s2, cut));
        scope.spawn(|| copy(server, c2, cut));
    });
}
