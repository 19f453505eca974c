//! Many pools over one fleet (docs/design.md §14): facts about nodes reach
//! every pool that has the node; a node serves one committed run at a time.

use std::time::Duration;

use poolgate::core::{
    Event, MembershipUpdate, NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId,
    Reason, RunId, SwimState, Time,
};
use poolgate::{Fleet, GateSettings};

use crate::common::{names, node, on_virtual_time};

const WINDOW_MS: u64 = 1000;

fn pool_id(id: &str) -> PoolId {
    PoolId::new(id).unwrap()
}

fn settings(id: &str, members: &[&str]) -> GateSettings {
    let definition =
        PoolDefinition::new(pool_id(id), members.iter().map(|m| node(m)).collect()).unwrap();
    let policy = PlanningPolicy {
        on_readiness_lost: OnReadinessLost::Wait,
        wait_timeout: None,
    };
    GateSettings::new(definition, Duration::from_millis(WINDOW_MS), policy).unwrap()
}

async fn ready(fleet: &Fleet, name: &str) {
    let identity = format!("key-{name}").into_bytes();
    poolgate_actors::testing::make_ready_in(fleet, &node(name), &identity)
        .await
        .unwrap();
}

fn alive(name: &str, incarnation: u64) -> MembershipUpdate {
    MembershipUpdate {
        node: node(name),
        state: SwimState::Alive,
        incarnation,
    }
}

fn dead(name: &str) -> MembershipUpdate {
    MembershipUpdate {
        node: node(name),
        state: SwimState::Dead,
        incarnation: 1,
    }
}

async fn advance_to(fleet: &Fleet, ms: u64) {
    tokio::time::sleep_until(fleet.clock().instant(Time::from_millis(ms))).await;
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

/// Plans and commits `run` on `pool` over `required`.
async fn commit(
    fleet: &Fleet,
    pool: &str,
    id: &str,
    required: &[&str],
) -> Result<(), poolgate::GateError> {
    let gate = fleet.pool(&pool_id(pool)).unwrap();
    let ready = gate.wait_ready().await?;
    gate.begin_planning(run(id), Some(ready.epoch)).await?;
    let required: Vec<NodeId> = required.iter().map(|n| node(n)).collect();
    gate.commit_plan(run(id), required, Some(ready.epoch)).await
}

fn drain(events: &mut poolgate::EventStream) -> Vec<Event> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

fn of_pool<'a>(events: &'a [Event], pool: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.pool().as_str() == pool)
        .collect()
}

#[test]
fn a_fault_faults_only_the_run_of_the_pool_that_requires_the_node() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![
            settings("a", &["n1", "n2"]),
            settings("b", &["n3", "n4"]),
        ])
        .unwrap();
        let mut events = fleet.subscribe();
        for n in ["n1", "n2", "n3", "n4"] {
            ready(&fleet, n).await;
        }
        advance_to(&fleet, WINDOW_MS + 1).await;
        commit(&fleet, "a", "ra", &["n1", "n2"]).await.unwrap();
        commit(&fleet, "b", "rb", &["n3", "n4"]).await.unwrap();
        fleet.membership(dead("n3")).await.unwrap();
        advance_to(&fleet, WINDOW_MS + 2).await;
        let seen = drain(&mut events);
        let faults: Vec<_> = seen
            .iter()
            .filter_map(|e| match e {
                Event::RunFaulted {
                    pool, run, node, ..
                } => Some((pool.as_str(), run.as_str(), node.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(faults, [("b", "rb", "n3")]);
        // A's run is still guarded: n1's loss faults it.
        fleet.membership(dead("n1")).await.unwrap();
        advance_to(&fleet, WINDOW_MS + 3).await;
        let seen = drain(&mut events);
        assert!(
            seen.iter().any(
                |e| matches!(e, Event::RunFaulted { pool, run, reason: Reason::Dead, .. }
                if pool.as_str() == "a" && run.as_str() == "ra")
            ),
            "{seen:?}"
        );
    });
}

#[test]
fn a_node_held_by_one_pools_run_is_refused_to_another_until_that_run_ends() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![
            settings("a", &["n1", "n2", "n3"]),
            settings("b", &["n2", "n3", "n4"]),
        ])
        .unwrap();
        let mut events = fleet.subscribe();
        for n in ["n1", "n2", "n3", "n4"] {
            ready(&fleet, n).await;
        }
        advance_to(&fleet, WINDOW_MS + 1).await;
        let ready_pools: Vec<_> = drain(&mut events)
            .into_iter()
            .filter(|e| e.name() == "pool_ready")
            .map(|e| e.pool().to_string())
            .collect();
        assert_eq!(ready_pools, ["a", "b"], "overlapping pools are both ready");
        commit(&fleet, "a", "ra", &["n1", "n2"]).await.unwrap();
        assert_eq!(
            fleet.reserved_by(&node("n2")),
            Some((pool_id("a"), run("ra")))
        );
        let refused = commit(&fleet, "b", "rb", &["n2", "n4"]).await.unwrap_err();
        assert_eq!(refused.code(), "reserved");
        assert_eq!(
            refused.to_string(),
            "node n2 is reserved by run ra of pool a"
        );
        assert_eq!(fleet.reserved_by(&node("n4")), None, "all or nothing");
        // Readiness of the overlapping pool is unaffected.
        let b = fleet.pool(&pool_id("b")).unwrap();
        assert!(matches!(
            b.report().await.unwrap().phase,
            poolgate::core::PoolPhase::Ready { .. }
        ));
        fleet
            .pool(&pool_id("a"))
            .unwrap()
            .finish_run(run("ra"))
            .await
            .unwrap();
        assert_eq!(fleet.reserved_by(&node("n2")), None, "the end releases");
        let ready = b.wait_ready().await.unwrap();
        b.commit_plan(run("rb"), vec![node("n2"), node("n4")], Some(ready.epoch))
            .await
            .unwrap();
        let told = drain(&mut events);
        assert_eq!(
            names(&of_pool(&told, "b").into_iter().cloned().collect::<Vec<_>>()),
            ["planning_started", "run_committed"]
        );
    });
}

#[test]
fn one_observation_reaches_the_pools_that_have_the_node_and_no_others() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![
            settings("a", &["n1", "n2"]),
            settings("b", &["n2", "n3"]),
        ])
        .unwrap();
        assert_eq!(fleet.membership(alive("n2", 1)).await.unwrap(), 2);
        assert_eq!(fleet.membership(alive("n1", 1)).await.unwrap(), 1);
        assert_eq!(fleet.membership(alive("n9", 1)).await.unwrap(), 0);
        assert_eq!(fleet.pools(), [pool_id("a"), pool_id("b")]);
    });
}

#[test]
fn a_pool_defined_later_starts_from_what_the_fleet_knows_of_its_members() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![settings("a", &["n1"])]).unwrap();
        let mut events = fleet.subscribe();
        for n in ["n1", "n2"] {
            ready(&fleet, n).await;
        }
        advance_to(&fleet, 10).await;
        fleet
            .define_pool(settings("b", &["n1", "n2"]))
            .await
            .unwrap();
        // Nothing new is said: the window from its definition is enough.
        advance_to(&fleet, 10 + WINDOW_MS + 1).await;
        let b_ready: Vec<_> = drain(&mut events)
            .into_iter()
            .filter(|e| e.pool().as_str() == "b" && e.name() == "pool_ready")
            .map(|e| e.at().as_millis())
            .collect();
        assert_eq!(b_ready, [10 + WINDOW_MS]);
    });
}

#[test]
fn a_pool_is_removed_only_when_no_run_of_it_is_committed() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![settings("a", &["n1"]), settings("b", &["n2"])]).unwrap();
        let mut events = fleet.subscribe();
        for n in ["n1", "n2"] {
            ready(&fleet, n).await;
        }
        advance_to(&fleet, WINDOW_MS + 1).await;
        commit(&fleet, "a", "ra", &["n1"]).await.unwrap();
        let refused = fleet.remove_pool(&pool_id("a")).await.unwrap_err();
        assert_eq!(refused.code(), "run_committed");
        let a = fleet.pool(&pool_id("a")).unwrap();
        a.finish_run(run("ra")).await.unwrap();
        fleet.remove_pool(&pool_id("a")).await.unwrap();
        assert_eq!(fleet.pools(), [pool_id("b")]);
        assert!(a.is_stopped());
        let unknown = fleet.remove_pool(&pool_id("a")).await.unwrap_err();
        assert_eq!(unknown.code(), "unknown_pool");
        // The fleet's stream goes on with the other pool.
        drain(&mut events);
        fleet.membership(dead("n2")).await.unwrap();
        advance_to(&fleet, WINDOW_MS + 2).await;
        let after = drain(&mut events);
        assert_eq!(names(&after), ["readiness_lost"]);
        assert_eq!(after[0].pool().as_str(), "b");
    });
}

#[test]
fn a_pool_stopped_under_the_fleet_does_not_keep_a_fact_from_the_others() {
    on_virtual_time(async {
        let fleet = Fleet::try_start(vec![settings("a", &["n1"]), settings("b", &["n1"])]).unwrap();
        let mut events = fleet.subscribe();
        // A's gate stops (as a removal in flight would leave it).
        fleet.pool(&pool_id("a")).unwrap().stop();
        ready(&fleet, "n1").await;
        advance_to(&fleet, WINDOW_MS + 1).await;
        let told: Vec<_> = drain(&mut events)
            .into_iter()
            .filter(|e| e.name() == "pool_ready")
            .map(|e| e.pool().to_string())
            .collect();
        assert_eq!(told, ["b"], "B heard every fact");
    });
}
