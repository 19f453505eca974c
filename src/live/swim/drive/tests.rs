use super::*;
use crate::live::swim::member::SwimFoca;
use crate::live::swim::watch::WatchingCodec;
use crate::live::swim::SwimTimings;
use poolgate_actors::core::SwimState;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn identity(node: &str, port: u16) -> SwimIdentity {
    SwimIdentity::local(node, port)
}

/// The orchestrator's foca, alone.
fn orchestrators_foca() -> SwimFoca {
    judged_by(Default::default())
}

/// The orchestrator's foca, alone, deciding address conflicts by
/// `arbiter`.
fn judged_by(arbiter: crate::live::swim::identity::Arbiter) -> SwimFoca {
    let (codec, _changes) = WatchingCodec::watched(arbiter);
    foca::Foca::new(
        identity("orchestrator", 1),
        SwimTimings::default().foca_config(4),
        StdRng::seed_from_u64(1),
        codec,
    )
}

/// The orchestrator's foca probing node-4 (which never answers), and
/// the two timers that probe asked for, with their delays: its
/// `SendIndirectProbe` and the next `ProbeRandomMember`.
#[allow(clippy::type_complexity)]
fn probing() -> (
    SwimFoca,
    AccumulatingRuntime<SwimIdentity>,
    (Duration, Timer<SwimIdentity>),
    (Duration, Timer<SwimIdentity>),
) {
    let mut foca = orchestrators_foca();
    let mut runtime = AccumulatingRuntime::new();
    foca.apply_many(
        std::iter::once(Member::alive(identity("node-4", 2))),
        true,
        &mut runtime,
    )
    .unwrap();
    let asked = |runtime: &mut AccumulatingRuntime<SwimIdentity>| {
        let mut asked: Vec<_> = std::iter::from_fn(|| runtime.to_schedule()).collect();
        asked.sort_by_key(|(after, _)| *after);
        asked
    };
    let start = asked(&mut runtime)
        .into_iter()
        .find(|(_, t)| matches!(t, Timer::ProbeRandomMember(_)))
        .expect("probing starts");
    foca.handle_timer(start.1, &mut runtime).unwrap();
    let mut asked = asked(&mut runtime).into_iter();
    let (indirect, next) = (asked.next().unwrap(), asked.next().unwrap());
    assert!(matches!(indirect.1, Timer::SendIndirectProbe { .. }));
    assert!(matches!(next.1, Timer::ProbeRandomMember(_)));
    (foca, runtime, indirect, next)
}

#[test]
fn timers_that_came_late_and_out_of_order_reach_foca_in_the_order_they_were_due() {
    // A stall: the probe's `SendIndirectProbe` (due a round trip after
    // the ping) and the next `ProbeRandomMember` (due a probe period
    // after the last) both expired while the member was stopped, and
    // the runtime fired them the other way round.
    let late = Duration::from_millis(250);
    let stalled = std::time::Instant::now();
    let woke = stalled + Duration::from_secs(5);
    // As they fired: foca finds its probe cycle cut short, and the
    // probe of a member that never answered comes to nothing.
    let (mut foca, mut runtime, _, next) = probing();
    assert_eq!(
        foca.handle_timer(next.1, &mut runtime),
        Err(foca::Error::IncompleteProbeCycle)
    );
    let node4 = |foca: &SwimFoca| {
        foca.iter_membership_state()
            .find(|m| m.id().node == "node-4")
            .map(|m| m.state())
    };
    assert_eq!(node4(&foca), Some(State::Alive));
    // Held, and released in the order they were due.
    let (mut foca, mut runtime, indirect, next) = probing();
    let mut held = LateTimers::default();
    assert!(matches!(
        held.offer(next.1.clone(), stalled + next.0, woke, late),
        Offered::Held { first: true }
    ));
    assert!(matches!(
        held.offer(indirect.1.clone(), stalled + indirect.0, woke, late),
        Offered::Held { first: false }
    ));
    // One on time behind them waits its turn too.
    let on_time = Timer::RemoveDown(identity("node-9", 9));
    assert!(matches!(
        held.offer(on_time.clone(), woke, woke, late),
        Offered::Held { first: false }
    ));
    let released = held.release();
    assert_eq!(released, vec![indirect.1, next.1.clone(), on_time]);
    for timer in released.into_iter().take(2) {
        assert_eq!(foca.handle_timer(timer, &mut runtime), Ok(()));
    }
    // The probe ran its course: node-4, silent, is suspected.
    assert_eq!(node4(&foca), Some(State::Suspect));
    // Nothing held now: a timer on time runs at once.
    assert!(matches!(
        held.offer(next.1, woke, woke, late),
        Offered::Run(_)
    ));
}

#[test]
fn a_suspicion_learnt_by_gossip_is_timed_out_here_and_the_member_declared_down() {
    // A member that hears of B only as suspect (gossip, no probe of its
    // own failed) arms no timer in foca: B would stay suspect for good.
    let mut foca = orchestrators_foca();
    let mut runtime = AccumulatingRuntime::new();
    let b = identity("node-4", 2);
    let heard = [
        Member::new(b.clone(), 3, State::Alive),
        Member::new(b.clone(), 3, State::Suspect),
    ];
    foca.apply_many(heard.into_iter(), true, &mut runtime)
        .unwrap();
    let limit = Duration::from_secs(3);
    let mut repair = Repair::new(limit);
    let start = Duration::from_secs(100);
    assert!(
        repair
            .expired(foca.iter_membership_state(), start)
            .is_empty(),
        "not yet"
    );
    let later = start + limit - Duration::from_millis(1);
    assert!(repair
        .expired(foca.iter_membership_state(), later)
        .is_empty());
    let expired = repair.expired(foca.iter_membership_state(), start + limit);
    assert_eq!(expired.len(), 1);
    foca.apply_many(expired.into_iter(), true, &mut runtime)
        .unwrap();
    let state = foca
        .iter_membership_state()
        .find(|m| m.id() == &b)
        .map(|m| m.state());
    assert_eq!(state, Some(State::Down));
}

#[test]
fn the_drivers_repair_tick_declares_a_suspicion_held_past_its_limit_down_and_tells_it() {
    let config = SwimTimings::default().foca_config(4);
    let limit = config.suspect_to_down_after + config.probe_period;
    let (codec, _changes) = WatchingCodec::watched(Default::default());
    let mut driver = Driver::new(
        identity("orchestrator", 1),
        config,
        StdRng::seed_from_u64(1),
        codec,
    );
    let b = identity("node-4", 2);
    driver
        .apply(
            vec![
                Member::new(b.clone(), 3, State::Alive),
                Member::new(b.clone(), 3, State::Suspect),
            ],
            true,
        )
        .unwrap();
    let start = Duration::from_secs(100);
    assert_eq!(driver.expire_suspicions(start).unwrap(), 0, "first seen");
    let before = start + limit - Duration::from_millis(1);
    assert_eq!(driver.expire_suspicions(before).unwrap(), 0, "not yet");
    assert_eq!(driver.state_of(&b), Some(State::Suspect));
    assert_eq!(driver.expire_suspicions(start + limit).unwrap(), 1);
    assert_eq!(driver.state_of(&b), Some(State::Down));
    // The whole view then tells it (a fact the table keeps once).
    let mut tracker = MembershipTracker::default();
    let facts = driver.whole_view(&mut tracker);
    let told: Vec<_> = facts
        .iter()
        .map(|f| (f.update.node.to_string(), f.update.state))
        .collect();
    assert_eq!(told, vec![("node-4".to_string(), SwimState::Dead)]);
}

/// Every datagram lost; the timers asked for kept.
#[derive(Default)]
struct Lossy {
    timers: Vec<Timer<SwimIdentity>>,
}

impl Host for Lossy {
    fn send(&mut self, _: SwimIdentity, _: bytes::Bytes, _: Option<&foca::Header<SwimIdentity>>) {}

    fn schedule(&mut self, _: Duration, timer: Timer<SwimIdentity>) {
        self.timers.push(timer);
    }
}

/// One probe of `x` by a member that holds only `x`, its ping lost, as
/// the [`Driver`] runs it: `vouch` says whether `x`'s life is vouched for
/// when foca turns to indirect probes. Returns `x`'s state once the next
/// probe began.
fn one_lost_probe(vouch: bool) -> State {
    let (codec, _changes) = WatchingCodec::watched(Default::default());
    let mut driver = Driver::new(
        identity("orchestrator", 1),
        SwimTimings::default().foca_config(4),
        StdRng::seed_from_u64(1),
        codec,
    );
    let x = identity("node-4", 2);
    driver
        .apply(vec![Member::new(x.clone(), 0, State::Alive)], true)
        .unwrap();
    let take = |driver: &mut Driver| {
        let mut lossy = Lossy::default();
        driver.drain(&mut lossy);
        lossy.timers
    };
    let first = |timers: &[Timer<SwimIdentity>], probe: bool| {
        timers
            .iter()
            .find(|t| {
                matches!(t, Timer::ProbeRandomMember(_)) == probe
                    && matches!(
                        t,
                        Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. }
                    )
            })
            .cloned()
            .unwrap()
    };
    let never = |_: &SwimIdentity, _: foca::ProbeNumber| -> bool { panic!("no probe under way") };
    let scheduled = take(&mut driver);
    driver.timer(first(&scheduled, true), never).unwrap();
    let scheduled = take(&mut driver);
    let indirect = first(&scheduled, false);
    let next_probe = first(&scheduled, true);
    let mut asked = None;
    driver
        .timer(indirect, |probed, number| {
            asked = Some((probed.clone(), number));
            vouch
        })
        .unwrap();
    let (probed, number) = asked.expect("the ping went unanswered: the driver asks");
    assert_eq!(probed, x);
    take(&mut driver);
    driver.timer(next_probe, |_, _| false).unwrap();
    take(&mut driver);
    assert!(
        !driver.vouched(&probed, number).unwrap(),
        "an answer once the next probe began comes too late"
    );
    driver.state_of(&x).unwrap()
}

#[test]
fn a_lost_probe_of_a_member_vouched_for_raises_no_suspicion() {
    assert_eq!(one_lost_probe(false), State::Suspect, "unanswered: suspect");
    assert_eq!(one_lost_probe(true), State::Alive, "vouched for: alive");
}

#[test]
fn only_the_probe_under_way_unanswered_is_offered_for_vouching() {
    let (x, y) = (identity("node-4", 2), identity("node-5", 3));
    let header = |src: &SwimIdentity, dst: &SwimIdentity, message| foca::Header {
        src: src.clone(),
        src_incarnation: 0,
        dst: dst.clone(),
        message,
    };
    let own = identity("orchestrator", 1);
    let indirect = |probed: &SwimIdentity| Timer::SendIndirectProbe {
        probed_id: probed.clone(),
        token: 0,
    };
    let mut probes = Probes::default();
    assert_eq!(probes.unanswered(&indirect(&x)), None, "nothing pinged");
    probes.sent(&header(&own, &x, foca::Message::Ping(7)));
    assert_eq!(probes.unanswered(&indirect(&x)), Some((x.clone(), 7)));
    assert_eq!(probes.unanswered(&indirect(&y)), None, "another member");
    assert!(probes.is_current(&x, 7) && !probes.is_current(&x, 6));
    assert!(probes.awaits_ack());
    // An ack of another probe, or from another member, answers nothing.
    probes.received(&header(&x, &own, foca::Message::Ack(6)));
    probes.received(&header(&y, &own, foca::Message::Ack(7)));
    assert!(probes.unanswered(&indirect(&x)).is_some());
    probes.received(&header(&x, &own, foca::Message::Ack(7)));
    assert_eq!(probes.unanswered(&indirect(&x)), None, "answered");
    assert!(!probes.awaits_ack());
    // The next ping starts over.
    probes.sent(&header(&own, &y, foca::Message::Ping(8)));
    assert_eq!(probes.unanswered(&indirect(&y)), Some((y, 8)));
}

/// node-1 back from an absence joins the leader's member again; a
/// suspicion of it raised meanwhile by a third member, whose word
/// reached neither, then lands as that member's verdict (foca's
/// `Down` at the incarnation it suspected). Returns the leader's last
/// fact about node-1 before the verdict and the verdict, as its
/// tracker tells them to the gate. `again`: node-1 joins as
/// [`join_again`] has it; otherwise it only announces, as it did.
fn a_late_verdict(again: bool) -> [(SwimState, u64); 2] {
    let node = identity("node-1", 5);
    let (codec, changes) = WatchingCodec::watched(Default::default());
    let mut leader = foca::Foca::new(
        identity("orchestrator", 1),
        SwimTimings::default().foca_config(4),
        StdRng::seed_from_u64(1),
        codec,
    );
    let (codec, _) = WatchingCodec::watched(Default::default());
    let mut back = foca::Foca::new(
        node.clone(),
        SwimTimings::default().foca_config(4),
        StdRng::seed_from_u64(2),
        codec,
    );
    let (mut at_leader, mut at_node) = (AccumulatingRuntime::new(), AccumulatingRuntime::new());
    let mut probes = Probes::default();
    leader
        .apply_many(
            [Member::new(node.clone(), 0, State::Alive)].into_iter(),
            true,
            &mut at_leader,
        )
        .unwrap();
    let seed = SwimIdentity::seed(leader.identity().addr);
    if again {
        join_again(&mut back, probes.incarnation(), [seed], &mut at_node).unwrap();
    } else {
        back.announce(seed, &mut at_node).unwrap();
    }
    while let Some((to, data)) = at_node.to_send() {
        probes.sent(&header(&data).unwrap());
        if to.addr == leader.identity().addr {
            leader.handle_data(&data, &mut at_leader).unwrap();
        }
    }
    let mut tracker = MembershipTracker::default();
    let before = track(&mut tracker, &changes, leader.identity(), Vec::new());
    let verdict = Member::new(node.clone(), 0, State::Down);
    leader
        .apply_many([verdict].into_iter(), true, &mut at_leader)
        .unwrap();
    let after = track(&mut tracker, &changes, leader.identity(), Vec::new());
    let last = |facts: Vec<SwimFact>| {
        let fact = facts
            .into_iter()
            .rfind(|f| f.update.node.as_str() == "node-1")
            .unwrap();
        (fact.update.state, fact.update.incarnation)
    };
    [last(before), last(after)]
}

#[test]
fn a_member_joining_again_outranks_a_suspicion_raised_while_it_was_away() {
    use poolgate_actors::core::Membership;
    let admitted = |[(state, incarnation), (verdict, at)]: [(SwimState, u64); 2]| {
        Membership::Seen { state, incarnation }.admits(verdict, at)
    };
    // As it was: the gate holds node-1 alive at the incarnation the
    // verdict names, and takes the verdict for a death.
    let announced = a_late_verdict(false);
    assert_eq!(announced[1].0, SwimState::Dead);
    assert!(admitted(announced), "{announced:?}");
    // Joined again: alive at a higher incarnation, the verdict stale.
    let joined = a_late_verdict(true);
    assert_eq!(joined[0].0, SwimState::Alive);
    assert!(joined[0].1 > announced[0].1, "{joined:?}");
    assert!(!admitted(joined), "{joined:?}");
}

/// A ping from `src` at `incarnation` to `dst`, as a datagram.
fn ping(src: SwimIdentity, incarnation: foca::Incarnation, dst: &SwimIdentity) -> Vec<u8> {
    let header = foca::Header {
        src,
        src_incarnation: incarnation,
        dst: dst.clone(),
        message: foca::Message::Ping(3),
    };
    let mut datagram = Vec::new();
    foca::Codec::encode_header(&mut foca::PostcardCodec, &header, &mut datagram).unwrap();
    datagram
}

/// What `foca` asks to send, by message, and what [`drain`] sends of
/// it.
fn asked_and_sent(
    foca: &SwimFoca,
    runtime: &mut AccumulatingRuntime<SwimIdentity>,
) -> (
    Vec<foca::Message<SwimIdentity>>,
    Vec<foca::Message<SwimIdentity>>,
) {
    struct Sent(Vec<foca::Message<SwimIdentity>>);
    impl Host for Sent {
        fn send(
            &mut self,
            _: SwimIdentity,
            _: bytes::Bytes,
            header: Option<&foca::Header<SwimIdentity>>,
        ) {
            self.0.extend(header.map(|h| h.message.clone()));
        }
        fn schedule(&mut self, _: Duration, _: Timer<SwimIdentity>) {}
    }
    let mut copy = AccumulatingRuntime::new();
    let mut asked = Vec::new();
    while let Some((to, data)) = runtime.to_send() {
        asked.extend(header(&data).map(|h| h.message));
        foca::Runtime::send_to(&mut copy, to, &data);
    }
    let mut sent = Sent(Vec::new());
    drain(&mut copy, &mut sent, foca);
    (asked, sent.0)
}

#[test]
fn only_a_member_held_down_is_told_it_is_down() {
    let mut foca = orchestrators_foca();
    let mut runtime = AccumulatingRuntime::new();
    let x = identity("node-1", 2);
    let state = |incarnation, state| [Member::new(x.clone(), incarnation, state)].into_iter();
    foca.apply_many(state(0, State::Suspect), true, &mut runtime)
        .unwrap();
    // Refuted; then the suspicion at 0 times out.
    foca.apply_many(state(1, State::Alive), true, &mut runtime)
        .unwrap();
    asked_and_sent(&foca, &mut runtime);
    let timer = Timer::ChangeSuspectToDown {
        member_id: x.clone(),
        incarnation: 0,
        token: foca::TimerToken::default(),
    };
    foca.handle_timer(timer, &mut runtime).unwrap();
    let (asked, sent) = asked_and_sent(&foca, &mut runtime);
    assert!(
        asked.contains(&foca::Message::TurnUndead),
        "foca asks to tell the member it is down: {asked:?}"
    );
    assert!(!sent.contains(&foca::Message::TurnUndead), "{sent:?}");
    let held = foca.iter_membership_state().find(|m| m.id() == &x);
    assert_eq!(held.map(Member::state), Some(State::Alive));
    // Held down, and still speaking: told.
    foca.apply_many(state(1, State::Down), true, &mut runtime)
        .unwrap();
    asked_and_sent(&foca, &mut runtime);
    let datagram = ping(x.clone(), 1, foca.identity());
    foca.handle_data(&datagram, &mut runtime).unwrap();
    let (_, sent) = asked_and_sent(&foca, &mut runtime);
    assert!(sent.contains(&foca::Message::TurnUndead), "{sent:?}");
}

/// At the leader, a node's renewed identity loses the address
/// conflict to the one the node signed until its next frame signs
/// the new one: foca answers it "you are down", and each answer made
/// it renew again. It is not told.
#[test]
fn a_renewed_identity_not_signed_yet_is_not_told_it_is_down() {
    use crate::live::swim::identity::{Arbiter, SignedView};
    let arbiter = Arbiter::default();
    let mut foca = judged_by(arbiter.clone());
    let mut runtime = AccumulatingRuntime::new();
    let signed = identity("node-1", 2);
    let renewed = SwimIdentity::new(signed.node.clone(), signed.addr, 2);
    let view: SignedView = Default::default();
    view.write()
        .unwrap()
        .insert(signed.addr, ("node-1".into(), signed.generation));
    arbiter.by_signed(view, None);
    foca.apply_many(
        [Member::new(signed.clone(), 0, State::Alive)].into_iter(),
        true,
        &mut runtime,
    )
    .unwrap();
    asked_and_sent(&foca, &mut runtime);
    let datagram = ping(renewed, 0, foca.identity());
    foca.handle_data(&datagram, &mut runtime).unwrap();
    let (asked, sent) = asked_and_sent(&foca, &mut runtime);
    assert!(asked.contains(&foca::Message::TurnUndead), "{asked:?}");
    assert!(!sent.contains(&foca::Message::TurnUndead), "{sent:?}");
    let held = foca
        .iter_membership_state()
        .find(|m| m.id().addr == signed.addr);
    assert_eq!(
        held.map(|m| (m.id().clone(), m.state())),
        Some((signed, State::Alive))
    );
}

#[test]
fn a_refuted_suspicion_starts_over() {
    let b = identity("node-4", 2);
    let limit = Duration::from_secs(3);
    let mut repair = Repair::new(limit);
    let start = Duration::ZERO;
    let suspect = |incarnation| vec![Member::new(b.clone(), incarnation, State::Suspect)];
    repair.expired(suspect(3).iter(), start);
    // Refuted, then suspected again at the new incarnation: its own clock.
    let soon = start + Duration::from_secs(2);
    repair.expired(suspect(4).iter(), soon);
    assert!(repair.expired(suspect(4).iter(), start + limit).is_empty());
    assert_eq!(repair.expired(suspect(4).iter(), soon + limit).len(), 1);
    // Alive again: nothing held.
    let alive = [Member::new(b.clone(), 5, State::Alive)];
    assert!(repair.expired(alive.iter(), soon + limit * 2).is_empty());
    assert_eq!(repair.held(), 0);
}

#[test]
fn the_whole_view_gives_each_name_and_address_once_at_its_newest_generation() {
    let own = identity("orchestrator", 1);
    let old = identity("node-4", 2);
    let new = SwimIdentity::new(old.node.clone(), old.addr, 2);
    let members = [
        Member::new(own.clone(), 0, State::Alive),
        Member::new(old.clone(), 7, State::Down),
        Member::new(new.clone(), 0, State::Alive),
    ];
    let mut tracker = MembershipTracker::default();
    let facts = whole_view(&mut tracker, members.iter(), &own);
    assert_eq!(facts.len(), 1, "{facts:?}");
    assert_eq!(facts[0].update.node.as_str(), "node-4");
    assert_eq!(
        facts[0].update.state,
        poolgate_actors::core::SwimState::Alive
    );
}
