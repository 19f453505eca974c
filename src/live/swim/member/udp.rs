//! The member's UDP side: probes sent twice, copies and replays dropped
//! ([`Recent`]), and foca's requests carried out over the socket
//! ([`UdpHost`]).

use super::*;

/// How long after a probe datagram (ping, ack, and the indirect probe's
/// four) the same sealed bytes go out again. Each probe message is sent
/// twice and the receiver drops the copy it already has ([`Recent`]), so a
/// probe leg is lost only when both copies are: at 15% random loss a
/// direct probe then fails 4.4% of the time instead of 28%, and an
/// indirect path of four legs 8.7% instead of 48%. the gate faults a committed
/// run at the first suspicion of a required node and foca has no fallback
/// of its own (memberlist probes over TCP when UDP probes fail); on the
/// multi-host rig at 15% loss the copies took poolgate from one false
/// fault in 10 minutes to none (BENCHMARKS.md, "Separate hosts"). The
/// copy waits a little so that a burst that took the first may have
/// passed; gossip and joins are not copied (they are repeated anyway).
pub const PROBE_COPY_AFTER: Duration = Duration::from_millis(15);

/// Whether a foca message is part of a probe (its loss can make a live
/// member suspect).
pub(super) fn is_probe(message: &foca::Message<SwimIdentity>) -> bool {
    use foca::Message;
    matches!(
        message,
        Message::Ping(_)
            | Message::Ack(_)
            | Message::PingReq { .. }
            | Message::IndirectPing { .. }
            | Message::IndirectAck { .. }
            | Message::ForwardedAck { .. }
    )
}

/// Sends one datagram. UDP: a datagram that cannot be sent now is lost,
/// as on the wire; SWIM tolerates loss.
pub(super) fn send(socket: &std::net::UdpSocket, datagram: &[u8], to: SocketAddr) {
    if let Err(e) = socket.send_to(datagram, to) {
        tracing::debug!(%to, error = %e, "datagram not sent");
    }
}

/// The datagrams received lately, to drop a second copy (see
/// [`PROBE_COPY_AFTER`]) or a replay within about [`Recent::SPAN`]. Only
/// datagrams that opened are remembered, so garbage cannot push real ones
/// out. Bounded: two sets of at most [`Recent::CAPACITY`] keyed hashes.
pub struct Recent {
    current: std::collections::HashSet<u64>,
    previous: std::collections::HashSet<u64>,
    since: std::time::Instant,
    hasher: std::hash::RandomState,
}

impl Recent {
    /// How long a datagram is remembered, at least (at most twice this).
    pub const SPAN: Duration = Duration::from_secs(1);
    /// How many datagrams one set holds; a fuller set starts a new span.
    pub const CAPACITY: usize = 16_384;

    /// Nothing remembered yet.
    pub fn new(now: std::time::Instant) -> Self {
        Self {
            current: std::collections::HashSet::new(),
            previous: std::collections::HashSet::new(),
            since: now,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// The key `datagram` is remembered under.
    pub fn key(&self, datagram: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, datagram)
    }

    /// Whether a datagram with `key` was remembered lately.
    pub fn seen(&self, key: u64) -> bool {
        self.current.contains(&key) || self.previous.contains(&key)
    }

    /// Remembers a datagram that opened.
    pub fn remember(&mut self, key: u64, now: std::time::Instant) {
        if now.duration_since(self.since) >= Self::SPAN || self.current.len() >= Self::CAPACITY {
            self.previous = std::mem::take(&mut self.current);
            self.since = now;
        }
        self.current.insert(key);
    }
}

/// The live member's side of foca's requests: datagrams sealed and sent
/// over UDP (probes twice), timers on the actor's context.
pub(super) struct UdpHost<'a, 'c> {
    pub(super) sender: &'a std::net::UdpSocket,
    pub(super) keyring: &'a RwLock<Keyring>,
    pub(super) ctx: &'c mut Context<SwimMember>,
    pub(super) node: &'a str,
    pub(super) rejoins: &'a mut crate::live::throttle::Throttle,
    pub(super) own_generation: Option<&'a tokio::sync::watch::Sender<u64>>,
    pub(super) bound: &'a mut crate::live::swim::reflect::SendBound,
    pub(super) leaving: bool,
    /// When the member started.
    pub(super) started: std::time::Instant,
}

impl drive::Host for UdpHost<'_, '_> {
    fn send(
        &mut self,
        to: SwimIdentity,
        data: bytes::Bytes,
        header: Option<&foca::Header<SwimIdentity>>,
    ) {
        // A ping withheld is still noted as sent (by the driver):
        // unanswered, it may be vouched for.
        if !self.bound.may_send(to.addr, std::time::Instant::now()) {
            metrics::counter!("poolgate_swim_sends_withheld_total").increment(1);
            return;
        }
        let sealed = read(self.keyring).seal(&data);
        send(self.sender, &sealed, to.addr);
        if header.is_some_and(|h| is_probe(&h.message)) {
            self.ctx.run_later(PROBE_COPY_AFTER, move |member, _| {
                if member.bound.may_send(to.addr, std::time::Instant::now()) {
                    send(&member.sender, &sealed, to.addr)
                } else {
                    metrics::counter!("poolgate_swim_sends_withheld_total").increment(1);
                }
            });
        }
    }

    fn schedule(&mut self, after: Duration, timer: Timer<SwimIdentity>) {
        let due = std::time::Instant::now() + after;
        self.ctx.notify_later(FocaTimer { timer, due }, after);
    }

    fn notified(&mut self, notification: OwnedNotification<SwimIdentity>) {
        match notification {
            OwnedNotification::Defunct if self.leaving => {
                tracing::info!(node = %self.node, "left the SWIM cluster")
            }
            OwnedNotification::Defunct => {
                tracing::warn!(node = %self.node, "declared down; identity defunct")
            }
            OwnedNotification::Rejoin(renewed) => {
                metrics::counter!("poolgate_swim_rejoins_total").increment(1);
                let now = std::time::Instant::now();
                if now.saturating_duration_since(self.started) < JUST_STARTED {
                    // An operator's trial: a node just started read this
                    // line, as if it had been declared down.
                    tracing::debug!(node = %renewed.node, generation = renewed.generation, "rejoined at start under a renewed identity (the cluster still held one of this address as down)");
                } else if let Some(held) = self.rejoins.allow(now) {
                    tracing::info!(node = %renewed.node, generation = renewed.generation, held, "declared down by the others: rejoined under a renewed identity (its probes went unanswered: heavy packet loss, this process stalled, or, when it repeats every few seconds on a sound network, another member claiming this address: a second process with this node's config, or an insider)");
                }
                if let Some(own) = self.own_generation {
                    own.send_replace(renewed.generation);
                }
            }
            other => tracing::debug!(node = %self.node, ?other, "foca"),
        }
    }
}

/// A rejoin this soon after the member started is its start's, not a
/// declaration that it is down.
const JUST_STARTED: std::time::Duration = std::time::Duration::from_secs(2);

pub(super) fn read(keyring: &RwLock<Keyring>) -> std::sync::RwLockReadGuard<'_, Keyring> {
    keyring
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(node: &str, port: u16) -> SwimIdentity {
        SwimIdentity::local(node, port)
    }

    #[test]
    fn only_probe_datagrams_are_copied() {
        use foca::{Codec, Header, Message};
        let me = identity("node-1", 1);
        let encoded = |message| {
            let mut buf = Vec::new();
            let header = Header {
                src: me.clone(),
                src_incarnation: 0,
                dst: identity("node-2", 2),
                message,
            };
            foca::PostcardCodec
                .encode_header(&header, &mut buf)
                .unwrap();
            buf
        };
        // What `send` decides by: the datagram's header.
        let is_probe = |data: &[u8]| drive::header(data).is_some_and(|h| is_probe(&h.message));
        assert!(is_probe(&encoded(Message::Ping(1))));
        assert!(is_probe(&encoded(Message::Ack(1))));
        let forwarded = Message::ForwardedAck {
            origin: me.clone(),
            probe_number: 1,
        };
        assert!(is_probe(&encoded(forwarded)));
        assert!(!is_probe(&encoded(Message::Gossip)));
        assert!(!is_probe(&encoded(Message::Announce)));
        assert!(!is_probe(b"\xff garbage"));
    }

    #[test]
    fn a_datagram_seen_lately_is_recognised_and_forgotten_after_two_spans() {
        let start = std::time::Instant::now();
        let mut recent = Recent::new(start);
        let (a, b) = (recent.key(b"first"), recent.key(b"second"));
        assert_ne!(a, b);
        assert!(!recent.seen(a));
        recent.remember(a, start);
        assert!(recent.seen(a));
        assert!(!recent.seen(b));
        // Into the previous set at the next span, gone at the one after.
        recent.remember(b, start + Recent::SPAN);
        assert!(recent.seen(a) && recent.seen(b));
        recent.remember(b, start + Recent::SPAN * 2);
        assert!(!recent.seen(a));
        assert!(recent.seen(b));
    }

    #[test]
    fn remembering_is_bounded() {
        let start = std::time::Instant::now();
        let mut recent = Recent::new(start);
        for i in 0..(Recent::CAPACITY * 3) {
            recent.remember(recent.key(&i.to_le_bytes()), start);
        }
        assert!(recent.current.len() <= Recent::CAPACITY);
        assert!(recent.previous.len() <= Recent::CAPACITY);
    }
}
