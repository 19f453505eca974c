//! The agent listener (design §7–§8, §11): where node agents connect and
//! announce themselves. Each connection's frames are judged by a
//! [`Conversation`] (no I/O); here are the reading and writing, the
//! limits on connections ([`Admission`]), what an accepted frame becomes
//! for the gate, a connection's loss, and the `status` question.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use actix::Addr;
use poolgate_actors::core::{AgentReport, NodeId};
use poolgate_actors::Fleet;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::conversation::{Admitted, Conversation, Verdict};
use super::keys::PublicKey;
use super::nodes::{Frame, Nodes, Taken};
use super::status;
use super::swim::member::Join;
use super::swim::SwimMember;
use super::throttle::{Throttles, LOG_EVERY};
use super::wire::{self, Announcement, ReadError, Refused, Reply};
use crate::config::Config;

/// The registry as the listener and the sequence writer read it, and
/// [`Orchestrator::register`] changes it: node → pinned key.
pub(super) type Registry = Arc<std::sync::RwLock<std::collections::BTreeMap<NodeId, PublicKey>>>;

/// The key `registry` pins for `node`, if any.
pub(super) fn pinned(registry: &Registry, node: &NodeId) -> Option<PublicKey> {
    registry
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(node)
        .copied()
}

/// The mutex's value, whatever a panic left it in.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the listener does next with a connection's frame, once the node
/// table has judged it.
enum Next {
    /// Accepted and taken: acknowledge it.
    Take(Taken),
    /// The connection's first frame: answer with this challenge.
    Challenge(wire::Nonce),
    /// Refused: say why and close; whether another connection, still
    /// open, carried the node's latest accepted frame.
    Refuse(NodeId, Refused, bool),
}

/// The agent listener's socket, with a deep accept queue: a burst of
/// connections waits there instead of having its SYNs dropped.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// How long a node's agent connection may be gone (closed without
/// `leaving`, or silent for a few heartbeats) before the node is not
/// available: a reconnect within it changes nothing (design §11).
pub(crate) const LOST_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// How often a silent connection held back (see
/// [`Nodes::holds_back_silence`]) is looked at again.
const HELD_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a new agent connection has to send its first frame.
pub(crate) const FIRST_FRAME: std::time::Duration = std::time::Duration::from_secs(2);

/// How many connections one source address may hold before any of them
/// sent an accepted frame; a newer one evicts its oldest.
pub(crate) const UNAUTHENTICATED_PER_ADDRESS: usize = 64;

/// Which connections the listener holds: every one counts against
/// `[agents] max_connections`; those that never had a frame accepted are
/// also limited per source address, and are evicted, oldest first, to
/// make room for a new connection when the limit is reached, so an
/// outsider's idle sockets never keep a real node out.
#[derive(Debug)]
struct Admission {
    max: usize,
    open: usize,
    next: u64,
    /// Not yet authenticated, by age: source and the eviction signal.
    waiting: std::collections::BTreeMap<u64, (IpAddr, tokio::sync::oneshot::Sender<()>)>,
    waiting_from: HashMap<IpAddr, usize>,
    /// Authenticated: never evicted, only superseded by a newer
    /// connection of the same node.
    authenticated: HashMap<u64, tokio::sync::oneshot::Sender<()>>,
}

impl Admission {
    fn new(max: usize) -> Self {
        Admission {
            max,
            open: 0,
            next: 0,
            waiting: Default::default(),
            waiting_from: HashMap::new(),
            authenticated: Default::default(),
        }
    }

    /// Admits a connection from `ip`, evicting the oldest unauthenticated
    /// one if the listener is full; `Err` with the reason when it cannot.
    fn admit(
        &mut self,
        ip: IpAddr,
    ) -> Result<(u64, tokio::sync::oneshot::Receiver<()>), &'static str> {
        let from_ip = self.waiting_from.get(&ip).copied().unwrap_or(0);
        let oldest = if from_ip >= UNAUTHENTICATED_PER_ADDRESS {
            // Its own oldest gives way: one source cannot crowd out others.
            self.waiting
                .iter()
                .find(|(_, (from, _))| *from == ip)
                .map(|(id, _)| *id)
        } else if self.open >= self.max {
            match self.waiting.keys().next() {
                Some(id) => Some(*id),
                None => return Err("max_connections"),
            }
        } else {
            None
        };
        if let Some((old_ip, evict)) = oldest.and_then(|id| self.waiting.remove(&id)) {
            self.unwait(old_ip);
            self.open -= 1;
            metrics::counter!("poolgate_agent_connections_evicted_total").increment(1);
            // The evicted task closes its socket when it sees this.
            let _ = evict.send(());
        }
        let id = self.next;
        self.next += 1;
        let (evict, evicted) = tokio::sync::oneshot::channel();
        self.waiting.insert(id, (ip, evict));
        *self.waiting_from.entry(ip).or_default() += 1;
        self.open += 1;
        Ok((id, evicted))
    }

    fn unwait(&mut self, ip: IpAddr) {
        if let Some(count) = self.waiting_from.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.waiting_from.remove(&ip);
            }
        }
    }

    /// Connection `id` had a frame accepted: it is no longer evictable.
    fn authenticated(&mut self, id: u64) {
        if let Some((ip, evict)) = self.waiting.remove(&id) {
            self.unwait(ip);
            self.authenticated.insert(id, evict);
        }
    }

    /// Closes authenticated connection `id`: a newer connection of its
    /// node took over (one connection per node, so a stolen key cannot
    /// hold the listener's slots).
    fn supersede(&mut self, id: u64) {
        if let Some(evict) = self.authenticated.remove(&id) {
            self.open -= 1;
            let _ = evict.send(());
        }
    }

    /// Evicts the oldest unauthenticated connection, if any (out of file
    /// descriptors: make room).
    fn evict_oldest(&mut self) -> bool {
        let Some((_, (ip, evict))) = self.waiting.pop_first() else {
            return false;
        };
        self.unwait(ip);
        self.open -= 1;
        metrics::counter!("poolgate_agent_connections_evicted_total").increment(1);
        let _ = evict.send(());
        true
    }

    /// Connection `id` ended (an evicted one was counted out already).
    fn release(&mut self, id: u64) {
        if let Some((ip, _)) = self.waiting.remove(&id) {
            self.unwait(ip);
            self.open -= 1;
        } else if self.authenticated.remove(&id).is_some() {
            self.open -= 1;
        }
    }
}

#[derive(Clone)]
pub(super) struct Listener {
    fleet: Fleet,
    swim: Addr<SwimMember>,
    registry: Registry,
    label: String,
    nodes: Arc<Mutex<Nodes>>,
    admission: Arc<Mutex<Admission>>,
    idle: std::time::Duration,
    /// Refusal lines, at most one per source address per interval.
    said: Arc<Mutex<Throttles<IpAddr>>>,
    /// Warnings of nodes signed from two processes, rate-limited per node.
    said_twice: Arc<Mutex<Throttles<NodeId>>>,
    /// One status answer at a time.
    answering: Arc<tokio::sync::Semaphore>,
    /// Which replica leads, for the status answer.
    leader: Arc<str>,
    /// This orchestrator's own SWIM address: a node that probed its
    /// member in vain is told it lives (it is answering).
    own_swim: std::net::SocketAddr,
}

impl Listener {
    pub(super) async fn serve(self, listener: TcpListener) {
        // Connections end with the listener (aborting it drops the set).
        let mut connections = tokio::task::JoinSet::new();
        let mut accept_failed = super::throttle::Throttle::new(LOG_EVERY);
        loop {
            while connections.try_join_next().is_some() {}
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: make room by evicting the
                    // oldest unauthenticated connection, and do not spin.
                    let evicted = lock(&self.admission).evict_oldest();
                    if let Some(held) = accept_failed.allow(std::time::Instant::now()) {
                        tracing::warn!(error = %e, evicted, held, "agent listener: accept failed");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let admitted = lock(&self.admission).admit(peer.ip());
            let (id, evicted) = match admitted {
                Ok(admitted) => admitted,
                Err(reason) => {
                    metrics::counter!("poolgate_agent_connections_refused_total", "reason" => reason)
                        .increment(1);
                    if let Some(held) =
                        lock(&self.said).allow(&peer.ip(), std::time::Instant::now())
                    {
                        tracing::warn!(%peer, reason, held, "agent listener: connection limit reached; closed");
                    }
                    continue;
                }
            };
            let this = self.clone();
            connections.spawn_local(async move {
                tokio::select! {
                    _ = this.connection(stream, peer, id) => {}
                    Ok(()) = evicted => tracing::debug!(%peer, "unauthenticated agent connection evicted"),
                }
                lock(&this.admission).release(id);
            });
        }
    }

    /// Serves one agent connection; when it ends (closed, silent for a few
    /// heartbeats, failed) without the node's `leaving`, the node is made
    /// not available unless a newer connection of it is accepted within
    /// [`LOST_GRACE`] (design §11): a node the orchestrator cannot hear
    /// cannot stay ready on the state it last announced.
    async fn connection(&self, stream: TcpStream, peer: SocketAddr, id: u64) {
        let mut silent = None;
        let Some((node, last)) = self.serve_connection(stream, peer, id, &mut silent).await else {
            return;
        };
        lock(&self.nodes).connection_closed(&node, id);
        if last.leaving {
            return;
        }
        let (fleet, nodes) = (self.fleet.clone(), Arc::clone(&self.nodes));
        actix::spawn(async move {
            tokio::time::sleep(LOST_GRACE).await;
            // Silent while every connection is, and this replica's term in
            // doubt: the leader is the one cut off; held back until either
            // is over (a new connection of the node ends it too).
            let mut held = false;
            while silent.is_some() && !fleet.is_stopped() {
                let holds = lock(&nodes).holds_back(&node, id, std::time::Instant::now());
                if !holds {
                    break;
                }
                if !held {
                    held = true;
                    metrics::counter!("poolgate_agent_silence_held_total").increment(1);
                    tracing::info!(%node, %peer, "agent connection silent while every connection is and this replica's term is in doubt: this replica is the one cut off; the node is not made unavailable for it");
                }
                tokio::time::sleep(HELD_LOOK_EVERY).await;
            }
            if held && fleet.is_stopped() {
                // The term ended: the next leader guards the runs.
                return;
            }
            // Healed: the node, whose own side gave the connection up
            // meanwhile, is given as long to come back as its connection
            // was given to speak.
            if let (true, Some(silence)) = (held, silent) {
                let until = tokio::time::Instant::now() + silence;
                while tokio::time::Instant::now() < until && lock(&nodes).attached_on(&node, id) {
                    tokio::time::sleep(HELD_LOOK_EVERY).await;
                }
            }
            if !lock(&nodes).detach(&node, id) {
                return;
            }
            tracing::warn!(%node, %peer, "agent connection lost and not reopened: the node is not available until it announces again");
            if let Err(e) = fleet
                .agent(AgentReport::Unavailable { node: node.clone() })
                .await
            {
                tracing::warn!(%node, error = %e, "connection loss not applied");
            }
        });
    }

    /// Serves one agent connection until it ends; the node's last
    /// announcement on it, and in `silent`, if it ended for its silence
    /// (not closed by its peer, nor failed), how long it was let be
    /// silent.
    async fn serve_connection(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        id: u64,
        silent: &mut Option<std::time::Duration>,
    ) -> Option<(NodeId, Announcement)> {
        wire::keep_alive(&stream, std::time::Duration::from_secs(5));
        // What its frames come to: the I/O, counting and telling are here.
        let mut talk = Conversation::new();
        let keys = |node: &NodeId| pinned(&self.registry, node);
        loop {
            // Until a frame is accepted: the first-frame deadline; then the
            // node's heartbeats (a few missed = gone), within the idle timeout.
            let silence = talk.silence(FIRST_FRAME, self.idle);
            let read =
                tokio::time::timeout(silence, wire::read_prefixed(&mut stream, wire::MAX_FRAME));
            let bytes = match read.await {
                Err(_) => {
                    tracing::debug!(%peer, "agent connection silent; closed");
                    *silent = Some(silence);
                    return talk.into_last();
                }
                Ok(Ok(Some(bytes))) if talk.is_new() && status::is_status_query(&bytes) => {
                    let local = stream.local_addr().map(|a| a.ip());
                    if local.is_ok_and(|local| status::answers(peer.ip(), local)) {
                        let pool = status::status_query(&bytes).flatten();
                        self.status(&mut stream, pool).await;
                    } else {
                        metrics::counter!("poolgate_status_refused_total").increment(1);
                        let refusal = wire::encode_reply(&Reply::Refused {
                            code: "status_local_only".into(),
                            detail: "status is answered to processes on the orchestrator's own host only".into(),
                            leader: None,
                            signed_elsewhere: false,
                        });
                        let _ = tokio::time::timeout(FIRST_FRAME, stream.write_all(&refusal)).await;
                    }
                    return None;
                }
                Ok(Ok(Some(bytes))) => bytes,
                Ok(Ok(None)) => return talk.into_last(),
                Ok(Err(ReadError::Io(e))) => {
                    tracing::debug!(%peer, error = %e, "agent connection failed");
                    return talk.into_last();
                }
                Ok(Err(ReadError::Refused(refused))) => {
                    self.refuse(&mut stream, peer, None, &refused, false).await;
                    return talk.into_last();
                }
            };
            let opened = match talk.open(&bytes, keys, &self.label) {
                Verdict::Opened(opened) => opened,
                Verdict::Skip => continue,
                Verdict::Refuse { node, refused } => {
                    self.refuse(&mut stream, peer, node.as_ref(), &refused, false)
                        .await;
                    return talk.into_last();
                }
            };
            // One lock for all the frame changes: its sequence, then what
            // it comes to (the node table's one entry for a frame).
            let next = {
                let mut nodes = lock(&self.nodes);
                match talk.admit(opened, nodes.sequences_mut(), keys, rand::random) {
                    Admitted::Accepted(accepted) => {
                        let frame = Frame {
                            accepted,
                            connection: id,
                            peer,
                        };
                        let now = std::time::Instant::now();
                        Next::Take(nodes.take_frame(frame, now, silence, self.own_swim))
                    }
                    Admitted::Challenge(nonce) => Next::Challenge(nonce),
                    Admitted::Refuse { node, refused } => {
                        let elsewhere = matches!(refused, Refused::Replayed { .. })
                            && nodes.signed_elsewhere(&node, id, std::time::Instant::now());
                        Next::Refuse(node, refused, elsewhere)
                    }
                }
            };
            let taken = match next {
                Next::Take(taken) => taken,
                Next::Challenge(nonce) => {
                    let reply = wire::encode_reply(&wire::challenge(&nonce));
                    let written = tokio::time::timeout(FIRST_FRAME, stream.write_all(&reply)).await;
                    if !matches!(written, Ok(Ok(()))) {
                        return talk.into_last();
                    }
                    continue;
                }
                Next::Refuse(node, refused, elsewhere) => {
                    self.refuse(&mut stream, peer, Some(&node), &refused, elsewhere)
                        .await;
                    return talk.into_last();
                }
            };
            let node = taken.node;
            metrics::counter!("poolgate_agent_frames_total").increment(1);
            lock(&self.admission).authenticated(id);
            if let Some(other) = taken.twin {
                metrics::counter!("poolgate_agent_duplicate_signers_total").increment(1);
                if let Some(held) = lock(&self.said_twice).allow(&node, std::time::Instant::now()) {
                    tracing::warn!(%node, first = %other, second = %peer, held, "two live processes sign as this node (a copied config or a stolen key): the newer connection replaces the older; the other one's frames are refused as replays while this one's connection is open, and it takes the node back once this one stops; stop the copy (or register a new key for the node)");
                }
            }
            if let Some(previous) = taken.superseded {
                lock(&self.admission).supersede(previous);
            }
            if taken.first {
                tracing::info!(%node, %peer, "agent connected: first frame accepted");
            }
            if let Some(addr) = taken.join {
                // A node this member may not know (it restarted, or this
                // orchestrator did): ask it to join us.
                self.swim.do_send(Join { seeds: vec![addr] });
            }
            if !taken.observations.is_empty() {
                let observations = taken.observations;
                if let Err(e) = self.fleet.observe_all(node.clone(), observations).await {
                    tracing::warn!(%node, error = %e, "announcement not applied");
                    return talk.into_last();
                }
            }
            let ack = wire::encode_reply(&Reply::Accepted {
                seq: taken.seq,
                vouch: taken.vouch,
            });
            let written = tokio::time::timeout(FIRST_FRAME, stream.write_all(&ack)).await;
            if !matches!(written, Ok(Ok(()))) {
                tracing::debug!(%peer, %node, "agent connection does not take replies; closed");
                return talk.into_last();
            }
        }
    }

    /// Answers `poolgate status`, one question at a time (a flood of them
    /// costs one answer's memory; the others are closed unanswered).
    async fn status(&self, stream: &mut TcpStream, pool: Option<String>) {
        let Ok(_turn) = Arc::clone(&self.answering).try_acquire_owned() else {
            metrics::counter!("poolgate_status_refused_total").increment(1);
            return;
        };
        let Ok(reports) = self.fleet.reports().await else {
            return;
        };
        let answer = status::answer_all(
            &reports,
            pool.as_deref(),
            self.fleet.clock().now(),
            &self.leader,
            !self.fleet.writes_failing(),
        );
        let _ = tokio::time::timeout(FIRST_FRAME, status::write_answer(stream, &answer)).await;
    }

    /// Tells the peer why its frame was refused (and, for a replay,
    /// whether another process signs as its node now: `signed_elsewhere`),
    /// counts it, logs it (at most once per source address per interval),
    /// and closes.
    async fn refuse(
        &self,
        stream: &mut TcpStream,
        peer: SocketAddr,
        node: Option<&NodeId>,
        refused: &Refused,
        signed_elsewhere: bool,
    ) {
        metrics::counter!("poolgate_agent_frames_refused_total", "reason" => refused.code())
            .increment(1);
        let name = node.map(NodeId::as_str).unwrap_or("?");
        if let Some(held) = lock(&self.said).allow(&peer.ip(), std::time::Instant::now()) {
            tracing::warn!(%peer, node = name, reason = %refused, held, "agent frame refused; connection closed");
        }
        let detail = match (refused, node) {
            (Refused::UnknownNode, Some(node)) => {
                format!("node {node} is not in the orchestrator's [registry]")
            }
            // What the orchestrator last accepted from a node is not told
            // to whoever sent a copy of one of its frames (the log has it).
            (Refused::Replayed { .. }, _) => refused.detail_for_peer(),
            _ => refused.to_string(),
        };
        let reply = wire::encode_reply(&Reply::Refused {
            code: refused.code().to_string(),
            detail,
            leader: None,
            signed_elsewhere,
        });
        let _ = tokio::time::timeout(FIRST_FRAME, stream.write_all(&reply)).await;
    }
}

impl Listener {
    /// The listener of an orchestrator over `gate`, `swim`, `registry`
    /// and `nodes`, with `config`'s `[agents]` limits and label; `leader`
    /// is what `status` says of who leads; `own_swim` its SWIM member's
    /// address.
    pub(super) fn new(
        fleet: Fleet,
        (swim, own_swim): (Addr<SwimMember>, std::net::SocketAddr),
        registry: Registry,
        config: &Config,
        nodes: Arc<Mutex<Nodes>>,
        leader: Arc<str>,
    ) -> Listener {
        Listener {
            fleet,
            swim,
            registry,
            label: config.swim.label.clone(),
            nodes,
            admission: Arc::new(Mutex::new(Admission::new(config.agents.max_connections))),
            idle: config.agents.idle_timeout,
            said: Arc::new(Mutex::new(Throttles::new(LOG_EVERY, 4096))),
            said_twice: Arc::new(Mutex::new(Throttles::new(LOG_EVERY, 4096))),
            answering: Arc::new(tokio::sync::Semaphore::new(1)),
            leader,
            own_swim,
        }
    }
}
