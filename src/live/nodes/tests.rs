use super::*;
use crate::live::swim::tracker::SwimFact;

fn observed(state: SwimState, incarnation: u64) -> SwimFact {
    SwimFact {
        update: MembershipUpdate {
            node: NodeId::new("node-4").unwrap(),
            state,
            incarnation,
        },
        addr: SocketAddr::from(([10, 0, 0, 4], 7946)),
        replaced: false,
    }
}

#[test]
fn a_suspicion_heard_before_the_first_frame_comes_after_the_alive_it_suspects() {
    // SWIM saw node-4 alive, then suspected it, all before node-4's
    // first frame signed its address: binding hands the gate both, in
    // order, so the suspicion counts (alone it would be a suspicion of
    // a member never seen, which the gate ignores as stale).
    let mut nodes = Nodes::default();
    assert_eq!(nodes.observe(observed(SwimState::Alive, 7)), Kept::Held);
    assert_eq!(nodes.observe(observed(SwimState::Suspect, 7)), Kept::Held);
    let node = NodeId::new("node-4").unwrap();
    let facts = nodes
        .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)), None)
        .unwrap();
    let states: Vec<SwimState> = facts.iter().map(|f| f.state).collect();
    assert_eq!(states, vec![SwimState::Alive, SwimState::Suspect]);
    // Bound already: nothing again.
    assert!(nodes
        .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)), None)
        .is_none());
}

fn at(state: SwimState, generation: u64, incarnation: u64) -> SwimFact {
    observed(state, (generation << 16) | incarnation)
}

fn node4() -> NodeId {
    NodeId::new("node-4").unwrap()
}

/// node-4 signing its address (and `generation`), seen alive at
/// generation 5, incarnation 3: the table and what the gate was told.
fn signed_alive(generation: Option<u64>) -> (Nodes, NodeId, SocketAddr, MembershipUpdate) {
    let (node, addr) = (node4(), SocketAddr::from(([10, 0, 0, 4], 7946)));
    let mut nodes = Nodes::default();
    nodes.bind(&node, addr, generation);
    let told = nodes
        .observe(at(SwimState::Alive, 5, 3))
        .for_gate()
        .unwrap();
    (nodes, node, addr, told)
}

#[test]
fn a_node_the_registry_drops_is_forgotten_whole() {
    // Signed, attached, sequenced, told alive: once dropped, nothing of
    // it is held, and its address no longer decides SWIM conflicts.
    let (mut nodes, node, addr, _) = signed_alive(Some(5));
    nodes.node_mut(&node).attached = Some(1);
    nodes.sequences_mut().insert(node.clone(), 9);
    assert!(nodes.signed_view().read().unwrap().contains_key(&addr));
    nodes.forget(&node);
    assert!(nodes.signed_view().read().unwrap().is_empty());
    assert!(!nodes.attached_on(&node, 1));
    assert!(nodes.sequences().is_empty());
    assert_eq!(nodes.told_incarnation(&node), None);
    // Registered again, its facts wait for its first frame to sign them.
    assert_eq!(nodes.observe(at(SwimState::Alive, 5, 3)), Kept::Held);
}

#[test]
fn a_heartbeat_of_a_node_forgotten_since_its_last_frame_is_told_whole() {
    // Unregistered and registered again between two frames of one
    // connection: the gate forgot what the node said, so its next frame,
    // a heartbeat to its connection, is told as a first.
    let (node, _, _) = node2();
    let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
    let mut nodes = Nodes::starting_now();
    nodes.take_frame(ready_frame(7, 1, 1), now, second, own());
    nodes.forget(&node);
    let mut heartbeat = ready_frame(7, 1, 2);
    heartbeat.accepted.repeats = true;
    let taken = nodes.take_frame(heartbeat, now, second, own());
    assert!(
        taken.observations.contains(&Observation::Available)
            && taken
                .observations
                .iter()
                .any(|o| matches!(o, Observation::Identity(_))),
        "{:?}",
        taken.observations
    );
    // Held again: the next heartbeat comes to nothing.
    let mut heartbeat = ready_frame(7, 1, 3);
    heartbeat.accepted.repeats = true;
    assert!(nodes
        .take_frame(heartbeat, now, second, own())
        .observations
        .is_empty());
}

#[test]
fn a_key_pinned_anew_drops_the_nodes_sequence_only() {
    // Its connection's loss still counts, and SWIM facts of the identity
    // it signed still reach the gate.
    let (mut nodes, node, _, _) = signed_alive(Some(5));
    nodes.node_mut(&node).attached = Some(1);
    nodes.sequences_mut().insert(node.clone(), 9);
    nodes.key_pinned(&node);
    assert!(nodes.sequences().is_empty());
    assert!(nodes.attached_on(&node, 1));
    assert!(nodes
        .observe(at(SwimState::Suspect, 5, 3))
        .for_gate()
        .is_some());
}

#[test]
fn an_identity_the_node_did_not_sign_can_neither_outrank_nor_kill_it() {
    // Issue 20: a forged identity at node-4's signed address with a
    // higher generation replaced node-4; then its suspicion and death
    // were node-4's, and node-4 was never ready again.
    let node = NodeId::new("node-4").unwrap();
    let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
    let mut nodes = Nodes::default();
    assert_eq!(nodes.observe(at(SwimState::Alive, 5, 1)), Kept::Held);
    let facts = nodes.bind(&node, addr, Some(5)).unwrap();
    assert_eq!(facts.len(), 1);
    let forged = 5 + 1_000_000_000;
    for state in [SwimState::Alive, SwimState::Suspect, SwimState::Dead] {
        assert_eq!(
            nodes.observe(at(state, forged, 1)).for_gate(),
            None,
            "{state:?}"
        );
    }
    // foca's Rename of the signed identity by another at its address.
    let mut replaced = at(SwimState::Dead, 5, 1);
    replaced.replaced = true;
    assert_eq!(nodes.observe(replaced).for_gate(), None);
    // The node's own identity still counts, suspicion included.
    let suspect = nodes
        .observe(at(SwimState::Suspect, 5, 1))
        .for_gate()
        .unwrap();
    assert_eq!(suspect.state, SwimState::Suspect);
}

#[test]
fn a_renewed_identity_counts_once_the_node_signs_it() {
    let node = NodeId::new("node-4").unwrap();
    let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
    let mut nodes = Nodes::default();
    nodes.bind(&node, addr, Some(5));
    assert!(nodes
        .observe(at(SwimState::Alive, 5, 1))
        .for_gate()
        .is_some());
    // Declared down, the node rejoins at generation 6: held until signed.
    assert_eq!(nodes.observe(at(SwimState::Alive, 6, 0)), Kept::Held);
    let facts = nodes.bind(&node, addr, Some(6)).unwrap();
    assert_eq!(facts.len(), 1);
    assert_eq!(facts[0].incarnation, 6 << 16);
    assert_eq!(facts[0].state, SwimState::Alive);
}

#[test]
fn a_leaving_node_is_told_left_at_what_was_last_told_of_the_identity_it_signed() {
    // The incarnation a leave is told at comes from the one table of
    // SWIM facts held here: the latest of the signed identity, never
    // a forged identity's, nor a fact held for a generation not signed.
    assert_eq!(Nodes::default().told_incarnation(&node4()), None);
    let (mut nodes, node, addr, _) = signed_alive(Some(5));
    assert_eq!(nodes.observe(at(SwimState::Alive, 9_999, 7)), Kept::Held);
    assert_eq!(nodes.told_incarnation(&node), Some((5 << 16) | 3));
    // Signed anew at generation 6: its own fact, once heard.
    assert_eq!(nodes.observe(at(SwimState::Alive, 6, 1)), Kept::Held);
    nodes.bind(&node, addr, Some(6));
    assert_eq!(nodes.told_incarnation(&node), Some((6 << 16) | 1));
    // A leaving node's SWIM `dead` is its `left`.
    nodes.node_mut(&node).leaving = true;
    let left = nodes.observe(at(SwimState::Dead, 6, 1)).for_gate().unwrap();
    assert_eq!(
        (left.state, left.incarnation),
        (SwimState::Left, (6 << 16) | 1)
    );
}

#[test]
fn without_a_signed_generation_the_address_alone_binds() {
    let node = NodeId::new("node-4").unwrap();
    let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
    let mut nodes = Nodes::default();
    nodes.bind(&node, addr, None);
    assert!(nodes
        .observe(at(SwimState::Alive, 5, 1))
        .for_gate()
        .is_some());
    assert!(nodes
        .observe(at(SwimState::Alive, 6, 0))
        .for_gate()
        .is_some());
}

/// A frame on connection `connection` from `peer`, in life 1.
fn frame(
    connection: u64,
    peer: SocketAddr,
    identity: (Option<SocketAddr>, Option<u64>),
    heartbeat: std::time::Duration,
) -> FrameHeard {
    FrameHeard {
        connection,
        peer,
        life: 1,
        identity,
        heartbeat,
    }
}

#[test]
fn a_first_frame_of_another_life_than_the_store_held_is_a_process_replaced_unheard() {
    // Design §9: the store held node-1's sequence in life 7 and
    // node-2's in life 3 when the term began.
    let (one, two, three) = (
        NodeId::new("node-1").unwrap(),
        NodeId::new("node-2").unwrap(),
        NodeId::new("node-3").unwrap(),
    );
    let mut nodes = Nodes::default();
    let counter = 1 << crate::live::wire::COUNTER_BITS;
    nodes.restore_sequences(
        [(one.clone(), 7 * counter + 41), (two.clone(), 3 * counter)]
            .into_iter()
            .collect(),
    );
    assert_eq!(nodes.last_seq[&one], 7 * counter + 41, "replay protection");
    let peer = SocketAddr::from(([10, 0, 0, 2], 40000));
    let in_life = |life| FrameHeard {
        life,
        ..frame(1, peer, (None, None), std::time::Duration::from_secs(1))
    };
    // The same process reconnected: its life.
    assert!(!nodes.replaced_since_stored(&one, &in_life(7)));
    // Only a node's first frame in the term answers: later lives are
    // told by `new_process`.
    assert!(!nodes.replaced_since_stored(&one, &in_life(8)));
    // Started again while nobody heard: another life.
    assert!(nodes.replaced_since_stored(&two, &in_life(5)));
    assert!(!nodes.replaced_since_stored(&two, &in_life(5)));
    // Nothing stored of a node: nothing to tell it from.
    assert!(!nodes.replaced_since_stored(&three, &in_life(1)));
}

/// node-2's SWIM address, and where its agent connects from.
fn node2() -> (NodeId, SocketAddr, SocketAddr) {
    (
        NodeId::new("node-2").unwrap(),
        SocketAddr::from(([10, 0, 0, 2], 7946)),
        SocketAddr::from(([10, 0, 0, 2], 40000)),
    )
}

/// A frame of node-2 as its agent sends it: ready, signing SWIM
/// generation `generation`, on connection `connection`, in the life
/// of sequences `life`.
fn ready_frame(generation: u64, connection: u64, life: u64) -> Frame {
    let (node, addr, peer) = node2();
    let announcement = Announcement {
        available: true,
        identity: Some(crate::live::wire::identity_text(b"data-plane key")),
        swim: Some(addr),
        generation: Some(generation),
        fault: None,
        leaving: false,
        heartbeat_ms: Some(1000),
        ask: None,
    };
    let accepted = Accepted {
        node,
        seq: (life << crate::live::wire::COUNTER_BITS) + 1,
        announcement,
        repeats: false,
        first: false,
        ask: None,
    };
    Frame {
        accepted,
        connection,
        peer,
    }
}

/// Where this orchestrator's own SWIM member answers (the tests'
/// `own_swim`).
fn own() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 7946))
}

#[test]
fn a_frame_comes_to_what_it_says_in_order_and_a_heartbeat_to_nothing() {
    // Design §8: one frame, one input, in order at one instant: the
    // SWIM facts held for the identity it newly signs, its identity
    // material, its fault or recovery, its availability; the member
    // is asked to join the address it signed. A heartbeat that
    // repeats the state comes to nothing but its acknowledgement.
    let (node, addr, _) = node2();
    let second = std::time::Duration::from_secs(1);
    let now = std::time::Instant::now();
    let mut nodes = Nodes::starting_now();
    let alive = MembershipUpdate {
        node: node.clone(),
        state: SwimState::Alive,
        incarnation: 7 << 16,
    };
    let heard = nodes.observe(SwimFact {
        update: alive.clone(),
        addr,
        replaced: false,
    });
    assert_eq!(heard, Kept::Held, "not signed yet");
    let taken = nodes.take_frame(ready_frame(7, 1, 1), now, second, own());
    let fingerprint = IdentityMaterial::new(b"data-plane key".to_vec())
        .unwrap()
        .fingerprint();
    assert_eq!(
        taken.observations,
        vec![
            alive.into_observation().1,
            Observation::Identity(fingerprint),
            Observation::Recovered,
            Observation::Available,
        ]
    );
    assert_eq!(taken.join, Some(addr));
    assert_eq!(
        (taken.superseded, taken.twin, taken.seq),
        (None, None, (1 << 20) + 1)
    );
    let mut heartbeat = ready_frame(7, 1, 1);
    heartbeat.accepted.repeats = true;
    let taken = nodes.take_frame(heartbeat, now, second, own());
    assert!(taken.observations.is_empty() && taken.join.is_none());
    // The same state on a new connection: the old one is superseded,
    // and the identity already bound asks nobody to join.
    let taken = nodes.take_frame(ready_frame(7, 2, 1), now, second, own());
    assert_eq!(taken.superseded, Some(1));
    assert_eq!(taken.join, None);
    assert_eq!(taken.observations.last(), Some(&Observation::Available));
}

#[test]
fn a_replay_is_signed_elsewhere_only_while_another_open_connection_carried_the_last_frame() {
    let (node, _, _) = node2();
    let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
    let after_grace = now + TERM_GRACE + second;
    let mut nodes = Nodes::starting_now();
    // Not heard yet in a term just begun: whoever signed ahead may be
    // reconnecting still; past the term's grace, nobody holds the node.
    assert!(nodes.signed_elsewhere(&node, 1, now));
    assert!(!nodes.signed_elsewhere(&node, 1, after_grace));
    assert!(!Nodes::default().signed_elsewhere(&node, 1, now), "no term");
    // The real process on connection 1, then a copy on connection 2
    // (a later life, another SWIM generation) signing ahead of it.
    nodes.take_frame(ready_frame(7, 1, 7), now, second, own());
    nodes.take_frame(ready_frame(9, 2, 9), now, second, own());
    for at in [now, after_grace] {
        assert!(nodes.signed_elsewhere(&node, 1, at), "the copy holds it");
        assert!(nodes.signed_elsewhere(&node, 3, at), "on any connection");
        assert!(!nodes.signed_elsewhere(&node, 2, at), "not on its own");
    }
    // The copy stopped: its connection ended, and nobody holds the node,
    // in the term's grace or after it.
    nodes.connection_closed(&node, 2);
    for at in [now, after_grace] {
        assert!(!nodes.signed_elsewhere(&node, 1, at));
        assert!(!nodes.signed_elsewhere(&node, 3, at));
    }
}

#[test]
fn a_leaving_frame_is_the_nodes_own_left_at_what_the_gate_was_told() {
    let (node, addr, _) = node2();
    let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
    let mut nodes = Nodes::starting_now();
    nodes.take_frame(ready_frame(7, 1, 1), now, second, own());
    let incarnation = (7 << 16) + 3;
    let told = nodes.observe(SwimFact {
        update: MembershipUpdate {
            node: node.clone(),
            state: SwimState::Alive,
            incarnation,
        },
        addr,
        replaced: false,
    });
    assert!(matches!(told, Kept::ForGate(_)));
    let mut leaving = ready_frame(7, 1, 1);
    leaving.accepted.announcement.leaving = true;
    let taken = nodes.take_frame(leaving, now, second, own());
    let tail = &taken.observations[taken.observations.len() - 4..];
    assert_eq!(
        tail,
        [
            Observation::Swim {
                state: SwimState::Left,
                incarnation
            },
            tail[1].clone(),
            Observation::Recovered,
            Observation::Unavailable,
        ]
    );
    assert!(matches!(tail[1], Observation::Identity(_)));
    // SWIM's `dead` of it from now on is its `left`.
    let dead = nodes.observe(SwimFact {
        update: MembershipUpdate {
            node,
            state: SwimState::Dead,
            incarnation: incarnation + 1,
        },
        addr,
        replaced: false,
    });
    assert!(matches!(dead, Kept::ForGate(u) if u.state == SwimState::Left));
}

#[test]
fn a_renewed_identity_is_the_same_process_and_a_restarted_one_is_not() {
    // Design §11: a node's new generation counts as a new process
    // (unavailable until seen alive) only when it comes neither on the
    // connection nor in the life of sequences of the node's last frame.
    let second = std::time::Duration::from_secs(1);
    let start = std::time::Instant::now();
    let mut nodes = Nodes::default();
    let restarted = |nodes: &mut Nodes, frame: Frame| {
        let taken = nodes.take_frame(frame, start, second, own());
        taken.observations.first() == Some(&Observation::Unavailable)
    };
    assert!(
        !restarted(&mut nodes, ready_frame(100, 1, 7)),
        "the first signature"
    );
    assert!(
        !restarted(&mut nodes, ready_frame(100, 1, 7)),
        "a heartbeat"
    );
    // Renewed after SWIM declared it down: the same connection and life.
    assert!(!restarted(&mut nodes, ready_frame(101, 1, 7)));
    // Renewed, and reconnected (a takeover): the same life.
    assert!(!restarted(&mut nodes, ready_frame(102, 2, 7)));
    // Its counter wrapped into the next life, on the same connection.
    assert!(!restarted(&mut nodes, ready_frame(103, 2, 8)));
    // Restarted: a new connection, a new life, however soon.
    assert!(restarted(&mut nodes, ready_frame(200, 3, 9)));
    // Its frames after that are that process's.
    assert!(!restarted(&mut nodes, ready_frame(200, 3, 9)));
    // An agent that signs no generation never names a new process.
    let mut unsigned = ready_frame(0, 4, 10);
    unsigned.accepted.announcement.generation = None;
    assert!(!restarted(&mut nodes, unsigned));
}

#[test]
fn a_question_about_this_orchestrators_own_member_is_answered_alive() {
    // A node's probe of the orchestrator's member went unanswered over
    // UDP: the orchestrator answering says it lives. An impostor's
    // name at that address, or another address, is not it.
    let (second, now) = (std::time::Duration::from_secs(1), std::time::Instant::now());
    let mut nodes = Nodes::default();
    let asking = |name: &str, swim: SocketAddr| {
        let mut frame = ready_frame(7, 1, 1);
        frame.accepted.ask = Some(Box::new(crate::live::wire::Ask {
            node: name.into(),
            swim,
            generation: 1,
            probe: 3,
        }));
        frame
    };
    let orchestrator = super::super::swim::member::ORCHESTRATOR;
    let answer = |nodes: &mut Nodes, frame| {
        let vouch = nodes.take_frame(frame, now, second, own()).vouch.unwrap();
        assert_eq!(vouch.ask.probe, 3, "the probe named back");
        vouch.alive
    };
    assert!(answer(&mut nodes, asking(orchestrator, own())));
    let elsewhere = SocketAddr::from(([10, 0, 0, 9], 7946));
    assert!(!answer(&mut nodes, asking(orchestrator, elsewhere)));
    assert!(!answer(&mut nodes, asking("node-9", own())));
}

#[test]
fn an_orchestrator_hearing_nobody_since_a_node_was_due_doubts_itself() {
    // Cut off, it would accuse every node, and the news, once healed,
    // would make every node renew. A node is accused only when another
    // spoke after its own frame was due; one silent among live ones is
    // accused, every one silent at once is not.
    let heartbeat = std::time::Duration::from_millis(500);
    let ms = std::time::Duration::from_millis;
    let start = std::time::Instant::now();
    let mut nodes = Nodes::default();
    let member = |i: u8| {
        crate::live::swim::SwimIdentity::new(
            format!("node-{i}"),
            SocketAddr::from(([10, 0, 0, i], 7946)),
            5,
        )
    };
    let hear = |nodes: &mut Nodes, i: u8, at| {
        let node = NodeId::new(&format!("node-{i}")).unwrap();
        let peer = SocketAddr::from(([10, 0, 0, i], 40000));
        let identity = (Some(member(i).addr), Some(5));
        nodes.heard_from(
            &node,
            frame(u64::from(i), peer, identity, heartbeat),
            at,
            heartbeat * 4,
        );
        nodes.node_mut(&node).attached = Some(u64::from(i));
    };
    for i in 1..=3 {
        hear(&mut nodes, i, start);
    }
    let silent = start + heartbeat + VOUCH_SLACK + ms(1);
    // node-2 and node-3 still speak: node-1 alone went silent.
    hear(&mut nodes, 2, silent);
    hear(&mut nodes, 3, silent);
    assert!(!nodes.vouches(&member(1), silent));
    assert!(nodes.vouches(&member(2), silent));
    // Then every connection went silent at once: the fault is likelier here.
    let later = silent + heartbeat + VOUCH_SLACK + ms(1);
    for i in 2..=3 {
        assert!(nodes.vouches(&member(i), later), "node-{i}");
    }
    // node-1 went silent first, while the others spoke: still accused.
    assert!(!nodes.vouches(&member(1), later));
    // The operator's trial: the cut comes between heartbeats, so when
    // the probe of node-2 goes unanswered its frame is 0.9 s old and
    // node-3's only 0.56 s (still fresh). Nobody spoke after node-2
    // was due: not its own silence.
    let cut = later + ms(100);
    hear(&mut nodes, 2, cut - ms(388));
    hear(&mut nodes, 3, cut - ms(39));
    let probed = cut + ms(517);
    assert!(nodes.vouches(&member(2), probed));
    // Connections closed since (for their silence, or by their peer)
    // change nothing: a node accused is one that went silent while
    // another spoke.
    for i in [2u8, 3] {
        nodes
            .node_mut(&NodeId::new(&format!("node-{i}")).unwrap())
            .attached = None;
    }
    let closed = cut + heartbeat * 5;
    assert!(nodes.vouches(&member(2), closed));
    assert!(nodes.vouches(&member(3), closed));
    // node-3 speaks again, past node-2's due: node-2's silence is its own.
    hear(&mut nodes, 3, closed);
    assert!(!nodes.vouches(&member(2), closed));
    // An identity the node did not sign is vouched for only when
    // nobody is heard at all.
    let impostor = {
        let same = member(3);
        crate::live::swim::SwimIdentity::new(same.node, same.addr, 9)
    };
    assert!(!nodes.vouches(&impostor, closed));
    assert!(nodes.vouches(&impostor, closed + heartbeat * 2));
    // One node heard in all: nothing to compare with.
    let mut alone = Nodes::default();
    hear(&mut alone, 1, start);
    assert!(!alone.vouches(&member(1), start + heartbeat * 3));
}

#[test]
fn silence_is_held_back_only_among_replicas_whose_term_is_in_doubt_and_every_connection_silent() {
    let heartbeat = std::time::Duration::from_millis(500);
    let start = std::time::Instant::now();
    let mut nodes = Nodes::default();
    for i in 1..=2u8 {
        let node = NodeId::new(&format!("node-{i}")).unwrap();
        let peer = SocketAddr::from(([10, 0, 0, i], 40000));
        let identity = (Some(SocketAddr::from(([10, 0, 0, i], 7946))), Some(5));
        nodes.heard_from(
            &node,
            frame(u64::from(i), peer, identity, heartbeat),
            start,
            heartbeat * 4,
        );
        nodes.node_mut(&node).attached = Some(u64::from(i));
    }
    let silent = start + heartbeat * 4;
    // Alone: never (nothing tells its own cut from the nodes').
    assert!(!nodes.holds_back_silence(silent));
    let doubt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::clone(&doubt);
    nodes.term_in_doubt = TermInDoubt(Some(std::sync::Arc::new(move || {
        seen.load(std::sync::atomic::Ordering::Relaxed)
    })));
    // A replica whose lease renews: the nodes are gone, not it.
    assert!(!nodes.holds_back_silence(silent));
    doubt.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(nodes.holds_back_silence(silent));
    // One connection that speaks: the others are really silent.
    assert!(!nodes.holds_back_silence(start));
}

#[test]
fn frames_of_one_node_on_two_live_connections_are_told_apart_from_a_reconnect() {
    let node = NodeId::new("node-4").unwrap();
    let (a, b) = (
        SocketAddr::from(([10, 0, 0, 4], 40000)),
        SocketAddr::from(([10, 0, 0, 9], 40000)),
    );
    let within = std::time::Duration::from_secs(1);
    let start = std::time::Instant::now();
    let (one, two) = ((Some(a), Some(5)), (Some(b), Some(7)));
    let mut nodes = Nodes::default();
    // As the listener does: each accepted frame's connection attached.
    let heard = |nodes: &mut Nodes, id: u64, peer, identity, at| {
        let twin = nodes.heard_from(&node, frame(id, peer, identity, within), at, within);
        nodes.node_mut(&node).attached = Some(id);
        twin
    };
    assert_eq!(heard(&mut nodes, 1, a, one, start), None);
    let half = start + within / 2;
    assert_eq!(heard(&mut nodes, 1, a, one, half), None);
    // The same process on a second connection: one identity.
    assert_eq!(heard(&mut nodes, 2, a, one, half), None);
    // Another identity while the first still speaks: two signers.
    let soon = half + std::time::Duration::from_millis(10);
    assert_eq!(heard(&mut nodes, 3, b, two, soon), Some(a));
    // A restart after the first went quiet is not.
    let later = soon + within * 2;
    assert_eq!(heard(&mut nodes, 4, a, one, later), None);
    // Nor one at once after the earlier connection closed (a process
    // killed and started again, or stopped after saying it leaves:
    // its new generation on a new one), though the closed connection
    // stays attached (the lost-connection grace, or for good after
    // `leaving`). An operator's trial: every quick restart raised the
    // alarm.
    nodes.connection_closed(&node, 4);
    let again = later + std::time::Duration::from_millis(10);
    assert_eq!(heard(&mut nodes, 5, a, (Some(a), Some(6)), again), None);
    // Closing another connection than the last heard changes nothing:
    // a second signer on a third connection while 5 speaks.
    nodes.connection_closed(&node, 4);
    let soon = again + std::time::Duration::from_millis(10);
    assert_eq!(heard(&mut nodes, 6, b, two, soon), Some(a));
}

#[test]
fn a_member_is_vouched_for_only_by_its_own_fresh_frames_on_its_live_connection() {
    let node = NodeId::new("node-4").unwrap();
    let addr = SocketAddr::from(([10, 0, 0, 4], 7946));
    let probed = crate::live::swim::SwimIdentity::new("node-4", addr, 5);
    let heartbeat = std::time::Duration::from_millis(500);
    let start = std::time::Instant::now();
    let mut nodes = Nodes::default();
    assert!(!nodes.vouches(&probed, start), "never heard");
    let peer = SocketAddr::from(([10, 0, 0, 4], 40000));
    // A frame of node-4 signing `probed` on connection 1, at `start`.
    let hear = |nodes: &mut Nodes, heartbeat: std::time::Duration| {
        let signed = frame(1, peer, (Some(addr), Some(5)), heartbeat);
        nodes.heard_from(&node, signed, start, heartbeat * 4);
    };
    hear(&mut nodes, heartbeat);
    assert!(!nodes.vouches(&probed, start), "no connection attached");
    nodes.node_mut(&node).attached = Some(1);
    assert!(nodes.vouches(&probed, start));
    // A heartbeat late by the slack still vouches; later, not.
    assert!(nodes.vouches(&probed, start + heartbeat + VOUCH_SLACK));
    let late = start + heartbeat + VOUCH_SLACK + std::time::Duration::from_millis(1);
    assert!(!nodes.vouches(&probed, late), "the frames stopped");
    // Not heard from in a term that just began: vouched for a while.
    let unheard = crate::live::swim::SwimIdentity::new("node-9", probed.addr, probed.generation);
    assert!(!nodes.vouches(&unheard, start), "no term");
    nodes.term_started = Some(start);
    assert!(nodes.vouches(&unheard, start + TERM_GRACE / 2));
    assert!(!nodes.vouches(&unheard, start + TERM_GRACE));
    // A node with a long heartbeat is vouched for within the limit only.
    let slow = std::time::Duration::from_secs(10);
    hear(&mut nodes, slow);
    let past_limit = start + VOUCH_HEARTBEAT_LIMIT + VOUCH_SLACK;
    assert!(nodes.vouches(&probed, past_limit));
    let later = past_limit + std::time::Duration::from_millis(1);
    assert!(
        !nodes.vouches(&probed, later),
        "a frozen node with a 10 s heartbeat"
    );
    hear(&mut nodes, heartbeat);
    // Another identity at the address (an impostor, an older life).
    for other in [6, 4] {
        let impostor = {
            let same = probed.clone();
            crate::live::swim::SwimIdentity::new(same.node, same.addr, other)
        };
        assert!(!nodes.vouches(&impostor, start));
    }
    // The frames came on a connection since replaced, or closed.
    nodes.node_mut(&node).attached = Some(2);
    assert!(!nodes.vouches(&probed, start));
    nodes.node_mut(&node).attached = None;
    assert!(!nodes.vouches(&probed, start));
}

#[test]
fn facts_kept_per_node_are_bounded_evicting_the_oldest_generation() {
    let node = NodeId::new("node-4").unwrap();
    let mut nodes = Nodes::default();
    for generation in 0..1_000 {
        nodes.observe(at(SwimState::Alive, generation, 0));
    }
    let held = &nodes.each[&node].swim.identities;
    assert_eq!(held.len(), ADDRESSES_PER_NODE);
    assert!(held
        .keys()
        .all(|(_, g)| *g >= 1_000 - ADDRESSES_PER_NODE as u64));
}

/// Whether a gate holding `told` of the node applies a `left` at
/// `incarnation` (design §1: one at a lower incarnation is stale).
fn gate_admits_left(told: &MembershipUpdate, incarnation: u64) -> bool {
    poolgate_actors::core::Membership::Seen {
        state: told.state,
        incarnation: told.incarnation,
    }
    .admits(SwimState::Left, incarnation)
}

/// As the orchestrator tells a leave.
fn left_at(nodes: &Nodes, node: &NodeId) -> u64 {
    nodes.told_incarnation(node).unwrap_or(0)
}

/// Eight members calling themselves node-4 at other addresses, at
/// later generations: none of it for the gate.
fn invent_eight(nodes: &mut Nodes) {
    for i in 0..8u8 {
        let mut fake = at(SwimState::Alive, 1_000 + u64::from(i), 0);
        fake.addr = SocketAddr::from(([10, 0, 9, i], 7946));
        assert_eq!(nodes.observe(fake).for_gate(), None, "impostor {i}");
    }
}

#[test]
fn a_leave_is_not_made_stale_by_identities_an_insider_invents_elsewhere() {
    // Adversary finding: eight members calling themselves node-4 at
    // other addresses evicted the signed identity's facts, and its
    // leave was told at 0, stale for the gate (design §7: it sees left).
    let (mut nodes, node, _, told) = signed_alive(Some(5));
    invent_eight(&mut nodes);
    assert!(gate_admits_left(&told, left_at(&nodes, &node)));
    // The signed identity's facts are still held: a repeat stops here.
    assert_eq!(nodes.observe(at(SwimState::Alive, 5, 3)), Kept::Repeat);
}

#[test]
fn a_leave_signed_at_a_generation_swim_has_not_heard_of_yet_is_not_stale() {
    // Adversary finding: restarted at generation 6, the node's first
    // frame says it leaves before SWIM here heard of generation 6.
    let (mut nodes, node, addr, told) = signed_alive(Some(5));
    assert_eq!(nodes.bind(&node, addr, Some(6)), Some(vec![]));
    assert!(gate_admits_left(&told, left_at(&nodes, &node)));
}

#[test]
fn a_replaced_node_that_signs_no_generation_is_told_dead_whatever_impostors_invent() {
    // Adversary finding: the Rename of a node signing no generation
    // was dropped once invented identities had evicted its facts.
    let (mut nodes, ..) = signed_alive(None);
    invent_eight(&mut nodes);
    // foca's Rename, as the tracker gives it: dead at the floor of
    // the generation, raised to what was held.
    let mut replaced = at(SwimState::Dead, 5, 0);
    replaced.replaced = true;
    let dead = nodes.observe(replaced).for_gate().unwrap();
    assert_eq!(
        (dead.state, dead.incarnation),
        (SwimState::Dead, (5 << 16) | 3)
    );
}
