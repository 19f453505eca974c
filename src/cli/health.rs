//! What `--metrics ADDR` serves, for an operator's probes and scrapers
//! (design §15), on the orchestrator (`watch`, `run`) and the node agent:
//!
//! - `/metrics`: every metric, Prometheus text format;
//! - `/healthz`: 200 while the process works (its runtime answers);
//! - `/readyz`: 200 while it leads and can write (an orchestrator: its
//!   own listener answers as the leader, its last state write succeeded),
//!   or, for a node, while its agent connection is up (a frame of it
//!   accepted); 503 with the reason otherwise;
//! - `/status`: the `poolgate status --json` answer (an orchestrator), or
//!   the node's connection (a node), as JSON;
//!
//! and 404 for any other path (405 for a method other than GET or HEAD).
//! One request per connection, read within [`READ_WAIT`] and
//! [`MAX_REQUEST`] bytes. At most [`MAX_CONNECTIONS`] are read at once: a
//! new connection past them evicts the oldest still sending its request,
//! so idle connections (a slow client, or a slowloris) never keep a probe
//! out; at most [`ANSWERING`] are answered at once, more get 503.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::live::{status, LiveError};

/// The longest request read (its line and headers), in bytes.
pub const MAX_REQUEST: usize = 8 * 1024;

/// How long a request has to arrive whole.
pub const READ_WAIT: Duration = Duration::from_secs(5);

/// Connections whose request is being read at once; a new one past them
/// evicts the oldest.
pub const MAX_CONNECTIONS: usize = 32;

/// Requests answered at once (a `/status` asks the listener, for up to a
/// few seconds); more are answered 503.
pub const ANSWERING: usize = 8;

/// How often the histograms' windows are kept (the exporter's upkeep).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Whose process this is, and so what `/readyz` and `/status` answer.
#[derive(Debug, Clone)]
pub enum Face {
    /// An orchestrator: asked through its agent listener at this address,
    /// as `poolgate status` asks.
    Orchestrator(SocketAddr),
    /// A node agent: its connection to an orchestrator.
    Node(Arc<NodeLink>),
}

/// A node agent's connection to an orchestrator, as its probes see it.
#[derive(Debug)]
pub struct NodeLink {
    node: String,
    up: Mutex<Option<SocketAddr>>,
    /// Refused as a replay while another process signs as this node (a
    /// copy of its config and key): the agent waits for it to stop.
    held_off: std::sync::atomic::AtomicBool,
}

impl NodeLink {
    /// No connection yet, for node `node`.
    pub fn new(node: &str) -> Arc<NodeLink> {
        Arc::new(NodeLink {
            node: node.to_string(),
            up: Mutex::new(None),
            held_off: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether another process signing as this node holds it off (its
    /// frames refused as replays meanwhile): set on each such refusal,
    /// cleared by the next accepted frame.
    pub fn held_off(&self, held: bool) {
        self.held_off
            .store(held, std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("poolgate_agent_held_off").set(if held { 1.0 } else { 0.0 });
    }

    fn is_held_off(&self) -> bool {
        self.held_off.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A frame on the connection to `orchestrator` was accepted.
    pub fn up(&self, orchestrator: SocketAddr) {
        if let Ok(mut up) = self.up.lock() {
            *up = Some(orchestrator);
        }
        if self.is_held_off() {
            self.held_off(false);
        }
        metrics::gauge!("poolgate_agent_connected").set(1.0);
        metrics::counter!("poolgate_agent_frames_acked_total").increment(1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        metrics::gauge!("poolgate_agent_last_ack_timestamp_seconds").set(now);
    }

    /// The connection ended.
    pub fn down(&self) {
        if let Ok(mut up) = self.up.lock() {
            *up = None;
        }
        metrics::gauge!("poolgate_agent_connected").set(0.0);
    }

    /// The orchestrator whose connection is up, if one is.
    pub fn orchestrator(&self) -> Option<SocketAddr> {
        self.up.lock().ok().and_then(|up| *up)
    }
}

/// Installs the Prometheus recorder and serves `face` on `addr` (on the
/// running tokio runtime). An address that cannot be bound is an error
/// here, at start.
pub fn serve(addr: SocketAddr, face: Face) -> Result<(), LiveError> {
    let bind = |source: std::io::Error| LiveError::Bind {
        socket: "metrics (HTTP)",
        addr,
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(bind)?;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| bind(std::io::Error::other(e.to_string())))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    let reading = Arc::new(Mutex::new(Reading::default()));
    let answering = Arc::new(tokio::sync::Semaphore::new(ANSWERING));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, a reset before accept: the next one.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let id = lock(&reading).admit();
            let (face, handle) = (face.clone(), handle.clone());
            let (read, answer_slots) = (Arc::clone(&reading), Arc::clone(&answering));
            let task = tokio::spawn(async move {
                let exchange = exchange(stream, &face, &handle, || {
                    lock(&read).done(id);
                    answer_slots.try_acquire_owned().ok()
                });
                let _ = tokio::time::timeout(READ_WAIT * 2, exchange).await;
                lock(&read).done(id);
            });
            lock(&reading).reads(id, task.abort_handle());
        }
    });
    Ok(())
}

/// The connections whose request is being read, oldest first.
#[derive(Default)]
struct Reading {
    next: u64,
    open: std::collections::VecDeque<(u64, Option<tokio::task::AbortHandle>)>,
}

impl Reading {
    /// A new connection's id; past [`MAX_CONNECTIONS`] the oldest is
    /// evicted (its task aborted: the socket closes).
    fn admit(&mut self) -> u64 {
        while self.open.len() >= MAX_CONNECTIONS {
            if let Some((_, Some(task))) = self.open.pop_front() {
                task.abort();
            }
        }
        let id = self.next;
        self.next += 1;
        self.open.push_back((id, None));
        id
    }

    /// Connection `id` is read by `task`.
    fn reads(&mut self, id: u64, task: tokio::task::AbortHandle) {
        if let Some(entry) = self.open.iter_mut().find(|(i, _)| *i == id) {
            entry.1 = Some(task);
        }
    }

    /// Connection `id`'s request is read (or it ended): no longer evicted.
    fn done(&mut self, id: u64) {
        self.open.retain(|(i, _)| *i != id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An answer: status code, content type, body.
type Answer = (u16, &'static str, String);

/// Reads one request on `stream` and answers it; `read` is called once
/// the request is read, and gives a turn to answer (none: 503).
async fn exchange(
    mut stream: TcpStream,
    face: &Face,
    handle: &PrometheusHandle,
    read: impl FnOnce() -> Option<tokio::sync::OwnedSemaphorePermit>,
) -> std::io::Result<()> {
    let head = read_head(&mut stream).await;
    let Some(_turn) = read() else {
        return answer(&mut stream, false, (503, TEXT, "busy\n".into())).await;
    };
    let Some(head) = head? else {
        return answer(&mut stream, false, (400, TEXT, "bad request\n".into())).await;
    };
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz" | "/status");
    let head_only = method == "HEAD";
    let reply = if !known {
        (404, TEXT, "not found\n".to_string())
    } else if method != "GET" && !head_only {
        (405, TEXT, "only GET and HEAD\n".to_string())
    } else {
        route(path, face, handle).await
    };
    answer(&mut stream, head_only, reply).await
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// The answer for a known `path`.
async fn route(path: &str, face: &Face, handle: &PrometheusHandle) -> Answer {
    match path {
        "/metrics" => (200, "text/plain; version=0.0.4", handle.render()),
        "/healthz" => (200, TEXT, "ok\n".to_string()),
        "/readyz" => match readiness(face).await {
            Ok(why) => (200, TEXT, format!("{why}\n")),
            Err(why) => (503, TEXT, format!("{why}\n")),
        },
        _ => match status_of(face).await {
            Ok(value) => (200, JSON, format!("{value}\n")),
            Err(why) => (503, JSON, format!("{}\n", json!({ "error": why }))),
        },
    }
}

/// Whether the process is ready: `Ok` with what says so, `Err` with why not.
pub async fn readiness(face: &Face) -> Result<String, String> {
    match face {
        Face::Orchestrator(_) => {
            let answer = status_of(face).await?;
            match answer["phase"].as_str() {
                Some("following") => Err(format!(
                    "not leading; the leader is {}",
                    answer["leader"].as_str().unwrap_or("unknown")
                )),
                _ if answer["writing"] == false => Err(
                    "leading, but its state store refuses its writes: it tells no new epoch nor outcome until one succeeds"
                        .to_string(),
                ),
                _ => Ok(format!(
                    "leading (pool {}: {})",
                    answer["pool"].as_str().unwrap_or(""),
                    answer["phase"].as_str().unwrap_or("")
                )),
            }
        }
        Face::Node(link) => match link.orchestrator() {
            Some(orchestrator) => Ok(format!("connected to the orchestrator at {orchestrator}")),
            None if link.is_held_off() => Err("another process signs as this node (a copy of its config and key) and holds it; this agent waits for it to stop".to_string()),
            None => Err("no orchestrator connection up".to_string()),
        },
    }
}

/// The `/status` answer.
async fn status_of(face: &Face) -> Result<Value, String> {
    match face {
        Face::Orchestrator(listener) => status::ask(*listener).await,
        Face::Node(link) => Ok(json!({
            "node": link.node,
            "connected": link.orchestrator().is_some(),
            "orchestrator": link.orchestrator().map(|a| a.to_string()),
            "held_off_by_another_process": link.is_held_off(),
        })),
    }
}

/// The request's line and headers, up to the blank line; `None` when they
/// are not whole within [`MAX_REQUEST`] bytes and [`READ_WAIT`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut bytes = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let read = async {
        loop {
            if bytes.windows(4).any(|w| w == b"\r\n\r\n") || bytes.windows(2).any(|w| w == b"\n\n")
            {
                return Ok(true);
            }
            if bytes.len() >= MAX_REQUEST {
                return Ok(false);
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(false);
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
    };
    match tokio::time::timeout(READ_WAIT, read).await {
        Ok(Ok(true)) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Ok(Ok(false)) | Err(_) => Ok(None),
        Ok(Err(e)) => Err(e),
    }
}

/// Writes `reply` and closes (one request per connection).
async fn answer(stream: &mut TcpStream, head_only: bool, reply: Answer) -> std::io::Result<()> {
    let (code, kind, body) = reply;
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(&body);
    }
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}
