//! The node's agent connection: rounds over the orchestrator's addresses
//! (which to try is `rotation`'s), and one session on the address that
//! answered: the whole state sent signed on connecting and on every
//! change, a heartbeat meanwhile, the replies read.

use super::rotation::{leader_named, Ended, First, Pointers, Rotation, Round};
use super::*;

pub(super) struct AnnounceTo {
    pub(super) agents: Vec<Endpoint>,
    pub(super) key: NodeKey,
    pub(super) label: String,
    pub(super) node: String,
    pub(super) sequences: Sequences,
    pub(super) heartbeat: Duration,
    pub(super) swim: Addr<SwimMember>,
    pub(super) seeds: Vec<Endpoint>,
    /// Up while a frame of the current connection was accepted (the
    /// node's `/readyz`).
    pub(super) link: Arc<crate::cli::health::NodeLink>,
    /// The SWIM member's questions: a member it probed in vain, and the
    /// probe (design §15). Asked beside the state; the orchestrator's
    /// answer goes back to the member.
    pub(super) asks: tokio::sync::mpsc::Receiver<(SwimIdentity, foca::ProbeNumber)>,
}

/// How many of the SWIM member's questions wait for the connection (one
/// per probe period is the most it asks; a full queue drops the newest).
pub(super) const ASKS_QUEUED: usize = 4;

/// The first wait before reconnecting, doubled after each round of
/// addresses that accepted nothing, up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait before reconnecting.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The longest wait before asking again while another process signing as
/// this node holds it (each try costs the leader one refused frame).
const HELD_OFF_EVERY: Duration = Duration::from_secs(1);

/// Why a session ended when the connection closed or was reset (the peer
/// is not frozen: it, or its host, closed it).
pub(super) const CLOSED: &str = "connection closed";

/// Why a session ended when the peer went silent for
/// [`HEARTBEATS_MISSED`] heartbeats (frozen, or cut off).
pub(super) const SILENT: &str = "no reply for 4 heartbeats";
/// Why a session ended: a frame could not be written for as long.
const STUCK: &str = "cannot write";

/// How one connection to an orchestrator ended.
pub(super) enum Session {
    /// No address could be connected to.
    Unreachable(std::io::Error),
    /// It closed, or went silent for [`HEARTBEATS_MISSED`] heartbeats;
    /// `accepted` tells whether any frame on it was accepted.
    Lost { accepted: bool, why: &'static str },
    /// The orchestrator refused a frame and said why; a follower replica
    /// also says where the leader is, when it knows.
    Refused {
        code: String,
        detail: String,
        leader: Option<String>,
        signed_elsewhere: bool,
    },
    /// The agent is stopping.
    Stopped,
}

impl Session {
    /// How the rotation weighs this end of a round.
    pub(super) fn weighed(&self) -> Ended {
        match self {
            Session::Lost {
                accepted: true,
                why: CLOSED,
            } => Ended::Reset,
            Session::Lost { .. } | Session::Refused { .. } => Ended::Shunned,
            Session::Unreachable(_) => Ended::Unreachable,
            Session::Stopped => Ended::Stopped,
        }
    }
}

/// Keeps an orchestrator told: the whole state on connecting, on every
/// change and every heartbeat, each frame acknowledged. Connects to every
/// address of `[orchestrator] agents` at once and keeps the first that
/// answers; after a round in which no frame was accepted it waits (100 ms
/// doubling to 2 s); a lost orchestrator also makes the node join SWIM
/// again through its seeds.
pub(super) async fn announce(
    mut to: AnnounceTo,
    mut updates: watch::Receiver<Announcement>,
    sent: Arc<AtomicU64>,
) {
    let mut backoff = BACKOFF_MIN;
    // One interval per kind of failure: a node that could not reach an
    // orchestrator and is then refused by one says so at once.
    let mut said = Throttles::new(LOG_EVERY, KINDS_SAID);
    let mut said_seeds = Throttle::new(LOG_EVERY);
    // The node taken back in the round before this one.
    let mut took_back = false;
    let mut rotation = Rotation::default();
    let mut pointers = Pointers::default();
    loop {
        let (addrs, failed) = lookup_all(&to.agents).await;
        if !failed.is_empty() {
            if let Some(held) = said.allow(&Said::Unresolved, std::time::Instant::now()) {
                tracing::warn!(node = %to.node, ?failed, held, "orchestrator.agents: not resolved");
            }
        }
        let (candidates, round) = rotation.candidates(addrs.clone());
        let outcome = match connect_first(&candidates, to.heartbeat * HEARTBEATS_MISSED).await {
            Ok((addr, stream)) => (
                addr,
                session(&mut to, addr, stream, &mut updates, &sent).await,
            ),
            Err(e) => (SocketAddr::from(([0, 0, 0, 0], 0)), Session::Unreachable(e)),
        };
        to.link.down();
        let now = std::time::Instant::now();
        let just_took_back = std::mem::replace(&mut took_back, false);
        rotation.ended(outcome.0, outcome.1.weighed());
        match outcome {
            (_, Session::Stopped) => return,
            (
                addr,
                Session::Lost {
                    accepted: true,
                    why,
                },
            ) => {
                tracing::warn!(node = %to.node, orchestrator = %addr, why, "orchestrator lost; trying every address, joining SWIM again");
                // Silent or stuck: this process stalled or its host was
                // cut off, and SWIM may have suspected it meanwhile; a
                // connection closed is the orchestrator's doing.
                let away = why == SILENT || why == STUCK;
                join(&to.swim, &to.seeds, &mut said_seeds, away).await;
                backoff = BACKOFF_MIN;
                pointers.reset();
                continue;
            }
            (
                addr,
                Session::Lost {
                    accepted: false,
                    why,
                },
            ) => {
                if let Some(held) = said.allow(&Said::NoFrame, now) {
                    tracing::warn!(node = %to.node, orchestrator = %addr, why, held, "orchestrator accepted no frame");
                }
                if why == SILENT {
                    // Four heartbeats of silence were the pause: the others
                    // now (a replica only stalled hears from the node again
                    // within its grace, §11, once a follower names it).
                    continue;
                }
            }
            (addr, Session::Refused { code, leader, .. }) if code == wire::NOT_LEADER => {
                // A follower replica (design §12): the leader is another of
                // the listed addresses. The one it names is tried next, at
                // once, even if it went silent: a leader that was only
                // stalled must hear from the node within its grace for a
                // lost connection (§11). Otherwise the others, at once
                // while some are left to try this round, then a pause.
                //
                // The pause does not start over here: while a dead
                // leader's lease holds, every follower names it and
                // nobody accepts, and the pauses grow as after any round
                // in which no frame was accepted.
                let named = leader_named(leader.as_deref(), addr, &to.agents, &addrs).await;
                let unlisted = |leader: &String| {
                    !to.agents.iter().any(|a| a.as_str() == leader)
                        && leader
                            .parse::<SocketAddr>()
                            .map_or(true, |a| !addrs.contains(&a))
                };
                if leader.is_none() {
                    // Nobody leads (the replicas' etcd out of their reach,
                    // or an election under way): said, or the node says
                    // nothing for as long as it lasts (an operator's
                    // trial: 36 s of silence with etcd's quorum lost).
                    if let Some(held) = said.allow(&Said::NoLeader, now) {
                        tracing::warn!(node = %to.node, orchestrator = %addr, held, "no replica leads: the followers name no leader (their etcd out of reach, or an election under way); this node keeps asking");
                    }
                }
                if let Some(leader) = leader.as_ref().filter(|l| unlisted(l)) {
                    if let Some(held) = said.allow(&Said::UnlistedLeader, now) {
                        tracing::warn!(node = %to.node, orchestrator = %addr, %leader, held, "a follower names a leader that is not in [orchestrator] agents: list every replica there, or this node never reaches it");
                    }
                }
                if let Some(leader) = named.filter(|_| pointers.follow()) {
                    tracing::debug!(node = %to.node, orchestrator = %addr, %leader, "not the leader; trying the one it names");
                    rotation.try_first(leader, First::Named);
                    continue;
                }
                tracing::debug!(node = %to.node, orchestrator = %addr, "not the leader; trying the others");
                if rotation.has_fresh(&addrs) && pointers.within_round() {
                    continue;
                }
            }
            (
                addr,
                Session::Refused {
                    code,
                    signed_elsewhere,
                    ..
                },
            ) if code == wire::REPLAYED => {
                to.link.held_off(signed_elsewhere);
                // The leader that refused is asked again first (the others
                // are not shunned for it: with one replica down, a round
                // over them cost the take-back a whole pause, an
                // operator's trial).
                rotation.try_first(addr, First::Again);
                match after_replay(signed_elsewhere, just_took_back) {
                    AfterReplay::Wait => {
                        // Asked again within a second: once the other
                        // stops, the node is taken back that much sooner.
                        backoff = backoff.min(HELD_OFF_EVERY);
                        if let Some(held) = said.allow(&Said::HeldOff, now) {
                            tracing::warn!(node = %to.node, orchestrator = %addr, held, "another process signs as this node (a copy of its config and key) and the orchestrator refuses this agent's frames as replays while it does; this agent takes the node back once it stops: stop the copy");
                        }
                    }
                    AfterReplay::TakeBack { at_once } => {
                        let generation = to.sequences.renew();
                        if let Some(held) = said.allow(&Said::TookBack, now) {
                            tracing::warn!(node = %to.node, orchestrator = %addr, generation, held, "this agent's frames were refused as replays while no other process signs as this node (one that signed ahead of it stopped): taking the node back under a new life of sequences and a new SWIM generation");
                        }
                        to.swim.do_send(Renew { generation });
                        join(&to.swim, &to.seeds, &mut said_seeds, false).await;
                        if at_once {
                            took_back = true;
                            pointers.reset();
                            continue;
                        }
                    }
                }
            }
            (_, Session::Unreachable(e)) if matches!(round, Round::Alone(_)) => {
                // The address tried again first is gone: the others, now.
                // A leader a follower named and gone is a failover under
                // way: said, or the node says nothing until it is over.
                if let (Round::Alone(First::Named), Some(leader)) = (round, candidates.first()) {
                    if let Some(held) = said.allow(&Said::LeaderGone, now) {
                        tracing::warn!(node = %to.node, %leader, error = %e, held, "the leader the followers name does not answer: a failover under way (another replica leads once its lease ends, [state] lease), or this host cut off from the leader alone; trying every address meanwhile");
                    }
                }
                continue;
            }
            (_, Session::Unreachable(e)) if round == Round::Fresh => {
                // Only those that refused nothing lately are gone: not "no
                // orchestrator reachable", since another answered a moment
                // ago (an operator's trial: refused by a new leader, the
                // node's next round, over the dead leader alone, said so
                // and sent the operator to the network instead of the
                // registry). Every address after the pause.
                tracing::debug!(node = %to.node, error = %e, "the addresses not tried lately are gone; every address after the pause");
            }
            (addr, Session::Refused { code, detail, .. }) => {
                if let Some(held) = said.allow(&Said::Refused(code.clone()), now) {
                    tracing::warn!(node = %to.node, orchestrator = %addr, code, detail, held, "the orchestrator refused this node's frames");
                }
            }
            (_, Session::Unreachable(e)) => {
                if let Some(held) = said.allow(&Said::Unreachable, now) {
                    let agents: Vec<&str> = to.agents.iter().map(Endpoint::as_str).collect();
                    tracing::warn!(node = %to.node, orchestrator = ?agents, error = %e, held, "no orchestrator reachable");
                }
            }
        }
        pointers.reset();
        // A fifth either way, so a fleet refused together does not come
        // back together.
        tokio::time::sleep(backoff.mul_f64(0.8 + 0.4 * rand::random::<f64>())).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// The kinds of failure an agent says, each at most once per
/// [`LOG_EVERY`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Said {
    Unresolved,
    Unreachable,
    NoFrame,
    UnlistedLeader,
    LeaderGone,
    NoLeader,
    /// Held behind another process signing as this node.
    HeldOff,
    /// The node taken back from a process that signed ahead of this one.
    TookBack,
    /// By the orchestrator's code: each reason said apart.
    Refused(String),
}

/// How many kinds of failure are remembered at once (the refusal codes
/// come from the network).
const KINDS_SAID: usize = 16;

/// What an agent does once its frame was refused as a replay.
#[derive(Debug, PartialEq, Eq)]
enum AfterReplay {
    /// Another process signs as this node now (a copy of its config and
    /// key) and holds it: taking it back would have the two swap for as
    /// long as both run (an operator's trial saw ten swaps a second), so
    /// this one waits a pause and asks again.
    Wait,
    /// Nobody else signs: the process that signed ahead of this one is
    /// gone (or this host's clock stepped back with its generation file
    /// lost). A new life of sequences above it, and a new SWIM generation
    /// too, so what the other left behind in SWIM (its leave) does not
    /// outrank this node; asked again at once, or the one that stopped
    /// (or another that waited) would get in first during the pause and
    /// be taken over a moment later (an operator's trial: the pool ready
    /// on the copy, then lost again). Refused again right after a take
    /// back, no life this host can take is above the last accepted yet (a
    /// clock stepped back): then the usual pauses.
    TakeBack { at_once: bool },
}

/// What to do after a replay refusal that said `signed_elsewhere`, when
/// the node was (`just_took_back`) or was not taken back in the round
/// before.
fn after_replay(signed_elsewhere: bool, just_took_back: bool) -> AfterReplay {
    if signed_elsewhere {
        AfterReplay::Wait
    } else {
        AfterReplay::TakeBack {
            at_once: !just_took_back,
        }
    }
}

/// Connects to every address at once; the first connection made (the
/// others are dropped), or the last error.
async fn connect_first(
    addrs: &[SocketAddr],
    limit: Duration,
) -> std::io::Result<(SocketAddr, TcpStream)> {
    let mut attempts = tokio::task::JoinSet::new();
    for addr in addrs.iter().copied() {
        attempts.spawn(async move {
            match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
                Ok(connected) => connected.map(|stream| (addr, stream)),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{addr}: no answer within {limit:?}"),
                )),
            }
        });
    }
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address resolved");
    while let Some(attempt) = attempts.join_next().await {
        match attempt {
            Ok(Ok(connected)) => return Ok(connected),
            Ok(Err(e)) => last = e,
            Err(e) => last = std::io::Error::other(e),
        }
    }
    Err(last)
}

/// One connection to the orchestrator at `addr`.
async fn session(
    to: &mut AnnounceTo,
    addr: SocketAddr,
    stream: TcpStream,
    updates: &mut watch::Receiver<Announcement>,
    sent: &AtomicU64,
) -> Session {
    let silence = to.heartbeat * HEARTBEATS_MISSED;
    wire::keep_alive(&stream, to.heartbeat.max(Duration::from_secs(1)));
    let (mut reader, mut writer) = stream.into_split();
    // Replies are read on a task of their own (a read is not cancel-safe
    // in a select), into a small channel.
    let (replies_to, mut replies) = tokio::sync::mpsc::channel(8);
    let reading = tokio::spawn(async move {
        loop {
            let reply = wire::read_reply(&mut reader).await;
            let end = !matches!(reply, Ok(Some(_)));
            if replies_to.send(reply).await.is_err() || end {
                return;
            }
        }
    });
    let _reading = AbortOnDrop(reading);
    let mut accepted = false;
    let mut heard = tokio::time::Instant::now();
    let mut send_now = true;
    let mut next_beat = tokio::time::Instant::now();
    // The orchestrator's challenge for this connection: the first frame
    // asks for it, every later one is signed over it.
    let mut challenge: Option<wire::Nonce> = None;
    let mut asked = false;
    // The SWIM member's question to send with the next frame.
    let mut question: Option<wire::Ask> = None;
    loop {
        // Nothing heard for the orchestrator's patience: lost, whatever
        // else is ready on waking from a stall (the select below picks
        // among ready branches at random, and a frame sent first would
        // carry on as if nothing happened while the orchestrator took
        // the node for gone), so the node joins again as one back from
        // an absence.
        if tokio::time::Instant::now() >= heard + silence {
            return Session::Lost {
                accepted,
                why: SILENT,
            };
        }
        if send_now && asked && challenge.is_none() {
            // Held until the challenge is read: a frame signed without it
            // would be skipped, and a few more refused (the hosts test saw
            // a restarting node refused `bad signature`). The challenge's
            // arrival sends the state as it is then.
            next_beat = tokio::time::Instant::now() + to.heartbeat;
            send_now = false;
        }
        if send_now {
            asked = true;
            let mut state = updates.borrow_and_update().clone();
            state.ask = question.take();
            let seq = to.sequences.take();
            let frame = fitting_frame(to, seq, challenge.as_ref(), state);
            match tokio::time::timeout(silence, writer.write_all(&frame)).await {
                Ok(Ok(())) => {}
                _ => {
                    return Session::Lost {
                        accepted,
                        why: STUCK,
                    }
                }
            }
            sent.fetch_add(1, Ordering::Relaxed);
            next_beat = tokio::time::Instant::now() + to.heartbeat;
            send_now = false;
        }
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    return Session::Stopped;
                }
                send_now = true;
            }
            _ = tokio::time::sleep_until(next_beat) => send_now = true,
            Some((probed, probe)) = to.asks.recv() => {
                // Asked once the connection is signed over its challenge
                // (before, the question would be skipped with the frame).
                if accepted && challenge.is_some() {
                    question = Some(wire::Ask {
                        node: probed.node,
                        swim: probed.addr,
                        generation: probed.generation,
                        probe,
                    });
                    send_now = true;
                }
            }
            _ = tokio::time::sleep_until(heard + silence) => {
                return Session::Lost { accepted, why: SILENT };
            }
            reply = replies.recv() => match reply {
                Some(Ok(Some(Reply::Accepted { vouch, .. }))) => {
                    if let Some(wire::Vouch { ask, alive }) = vouch {
                        let probed = SwimIdentity::new(ask.node, ask.swim, ask.generation);
                        to.swim.do_send(Vouched { probed, probe: ask.probe, alive });
                    }
                    if !accepted {
                        tracing::info!(node = %to.node, orchestrator = %addr, "announced to the orchestrator");
                    }
                    accepted = true;
                    to.link.up(addr);
                    heard = tokio::time::Instant::now();
                }
                Some(Ok(Some(Reply::Challenge { nonce }))) => {
                    let Some(nonce) = wire::challenge_nonce(&nonce).filter(|_| challenge.is_none()) else {
                        return Session::Lost { accepted, why: "unreadable reply" };
                    };
                    // The announcement again, at once, over the challenge.
                    challenge = Some(nonce);
                    heard = tokio::time::Instant::now();
                    send_now = true;
                }
                Some(Ok(Some(Reply::Refused { code, detail, leader, signed_elsewhere }))) => {
                    return Session::Refused { code, detail, leader, signed_elsewhere };
                }
                Some(Err(wire::ReadError::Refused(_))) => {
                    return Session::Lost { accepted, why: "unreadable reply" };
                }
                _ => return Session::Lost { accepted, why: CLOSED },
            },
        }
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The frame for `state`, checked against the orchestrator's limit before
/// it goes: a frame over [`wire::MAX_FRAME`] would be refused, and sent
/// again and again, and the fault in it lost. The reason is cut to 1 KiB
/// and identity material to 16 KiB before this, which keeps any frame far
/// below the limit; should one still be over, the reason goes short, and
/// the fault is still told.
fn fitting_frame(
    to: &AnnounceTo,
    seq: u64,
    challenge: Option<&wire::Nonce>,
    mut state: Announcement,
) -> Vec<u8> {
    let frame = wire::encode(&to.key, &to.label, &to.node, seq, challenge, &state);
    if frame.len() <= wire::MAX_FRAME + 4 {
        return frame;
    }
    tracing::error!(node = %to.node, bytes = frame.len(), "a frame over the limit: its fault reason shortened");
    if state.fault.is_some() {
        state.fault = Some("fault reason too long to send".into());
    }
    wire::encode(&to.key, &to.label, &to.node, seq, challenge, &state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_refusal_waits_behind_another_signer_and_takes_the_node_back_at_once_only_once() {
        assert_eq!(after_replay(true, false), AfterReplay::Wait);
        assert_eq!(after_replay(true, true), AfterReplay::Wait);
        assert_eq!(
            after_replay(false, false),
            AfterReplay::TakeBack { at_once: true }
        );
        // Refused again right after taking it back: the usual pauses.
        assert_eq!(
            after_replay(false, true),
            AfterReplay::TakeBack { at_once: false }
        );
    }
}
