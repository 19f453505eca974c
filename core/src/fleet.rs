//! What a fleet of pools shares (design §14): which pools hold each node as
//! a candidate, and which committed run each node serves. Values, no I/O:
//! the actor subsystem's `Fleet` keeps them and asks them.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::ids::{NodeId, PoolId, RunId};
use crate::run::Refusal;

/// The pools that hold each node as a candidate: one observation of a node
/// goes to these pools and no others.
#[derive(Debug, Default, Clone)]
pub struct Candidacy {
    /// Each node's pools, sorted (a short list: most nodes are in few),
    /// each list exactly as long as it is (a fleet-wide table: no spare
    /// capacity per node).
    pools_of: HashMap<NodeId, Box<[PoolId]>>,
    members_of: BTreeMap<PoolId, Vec<NodeId>>,
}

impl Candidacy {
    /// The pools that hold `node`, by id.
    pub fn pools_of(&self, node: &NodeId) -> impl Iterator<Item = &PoolId> {
        self.pools_of
            .get(node)
            .into_iter()
            .flat_map(|pools| pools.iter())
    }

    /// The pools, by id.
    pub fn pools(&self) -> impl Iterator<Item = &PoolId> {
        self.members_of.keys()
    }

    /// Whether `pool` is defined.
    pub fn has(&self, pool: &PoolId) -> bool {
        self.members_of.contains_key(pool)
    }

    /// The members of `pool`, if defined.
    pub fn members(&self, pool: &PoolId) -> Option<&[NodeId]> {
        self.members_of.get(pool).map(Vec::as_slice)
    }

    /// (Re)defines `pool` over `members`; returns the members it did not
    /// have before (none before: all of them).
    pub fn define(&mut self, pool: &PoolId, members: &[NodeId]) -> Vec<NodeId> {
        let before: HashSet<NodeId> = self.remove(pool).into_iter().collect();
        let mut added = Vec::new();
        for node in members {
            let pools = self.pools_of.entry(node.clone()).or_default();
            if let Err(at) = pools.binary_search(pool) {
                let mut grown = Vec::with_capacity(pools.len() + 1);
                grown.extend_from_slice(&pools[..at]);
                grown.push(pool.clone());
                grown.extend_from_slice(&pools[at..]);
                *pools = grown.into_boxed_slice();
            }
            if !before.contains(node) {
                added.push(node.clone());
            }
        }
        self.members_of.insert(pool.clone(), members.to_vec());
        added
    }

    /// Removes `pool`; returns its members.
    pub fn remove(&mut self, pool: &PoolId) -> Vec<NodeId> {
        let members = self.members_of.remove(pool).unwrap_or_default();
        for node in &members {
            if let Some(pools) = self.pools_of.get_mut(node) {
                let left: Box<[PoolId]> = pools.iter().filter(|p| *p != pool).cloned().collect();
                match left.is_empty() {
                    true => drop(self.pools_of.remove(node)),
                    false => *pools = left,
                }
            }
        }
        members
    }
}

/// Which committed run each node serves: a node serves one committed run
/// at a time, across every pool of the fleet.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reservations {
    held: HashMap<NodeId, (PoolId, RunId)>,
}

impl Reservations {
    /// Reserves every node of `required` for `run` of `pool`, or none: a
    /// node another run holds is refused `reserved` (the first such node,
    /// in `required`'s order). A node `run` of `pool` holds already is
    /// kept.
    pub fn reserve(
        &mut self,
        pool: &PoolId,
        run: &RunId,
        required: &[NodeId],
    ) -> Result<(), Refusal> {
        if let Some((node, (holder_pool, holder_run))) =
            self.first_held_by_another(pool, run, required)
        {
            return Err(Refusal::Reserved {
                node: node.clone(),
                run: holder_run.clone(),
                pool: holder_pool.clone(),
            });
        }
        for node in required {
            self.held.insert(node.clone(), (pool.clone(), run.clone()));
        }
        Ok(())
    }

    /// The first node of `required` held by a run other than `run` of
    /// `pool`, and who holds it.
    pub fn first_held_by_another<'a>(
        &'a self,
        pool: &PoolId,
        run: &RunId,
        required: &'a [NodeId],
    ) -> Option<(&'a NodeId, &'a (PoolId, RunId))> {
        required.iter().find_map(|node| {
            self.held
                .get(node)
                .filter(|(p, r)| p != pool || r != run)
                .map(|holder| (node, holder))
        })
    }

    /// Releases every node `run` of `pool` holds (its end, or a commit
    /// the pool refused); returns how many.
    pub fn release(&mut self, pool: &PoolId, run: &RunId) -> usize {
        let before = self.held.len();
        self.held.retain(|_, (p, r)| p != pool || r != run);
        before - self.held.len()
    }

    /// Releases every node a run of `pool` holds (the pool removed).
    pub fn release_pool(&mut self, pool: &PoolId) {
        self.held.retain(|_, (p, _)| p != pool);
    }

    /// Who holds `node`, if anyone.
    pub fn holder(&self, node: &NodeId) -> Option<&(PoolId, RunId)> {
        self.held.get(node)
    }

    /// How many nodes are reserved.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no node is reserved.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }
    fn p(s: &str) -> PoolId {
        PoolId::new(s).unwrap()
    }
    fn r(s: &str) -> RunId {
        RunId::new(s).unwrap()
    }

    #[test]
    fn a_node_serves_one_committed_run_and_a_commit_takes_all_or_none() {
        let mut held = Reservations::default();
        held.reserve(&p("a"), &r("r1"), &[n("n1"), n("n2")])
            .unwrap();
        let refused = held
            .reserve(&p("b"), &r("r2"), &[n("n3"), n("n2")])
            .unwrap_err();
        assert_eq!(refused.code(), "reserved");
        assert_eq!(
            refused.to_string(),
            "node n2 is reserved by run r1 of pool a"
        );
        assert_eq!(held.holder(&n("n3")), None, "all or none");
        // The same run again keeps what it holds.
        held.reserve(&p("a"), &r("r1"), &[n("n1")]).unwrap();
        // The same run id in another pool is another run.
        assert!(held.reserve(&p("b"), &r("r1"), &[n("n1")]).is_err());
        assert_eq!(held.release(&p("a"), &r("r1")), 2);
        held.reserve(&p("b"), &r("r2"), &[n("n3"), n("n2")])
            .unwrap();
        assert_eq!(held.len(), 2);
        held.release_pool(&p("b"));
        assert!(held.is_empty());
    }

    #[test]
    fn a_node_reaches_the_pools_that_hold_it_and_no_others() {
        let mut pools = Candidacy::default();
        assert_eq!(pools.define(&p("a"), &[n("n1"), n("n2")]).len(), 2);
        assert_eq!(pools.define(&p("b"), &[n("n2"), n("n3")]).len(), 2);
        let of = |pools: &Candidacy, node| pools.pools_of(&n(node)).cloned().collect::<Vec<_>>();
        assert_eq!(of(&pools, "n2"), [p("a"), p("b")]);
        assert_eq!(of(&pools, "n1"), [p("a")]);
        assert_eq!(pools.define(&p("a"), &[n("n2"), n("n4")]), [n("n4")]);
        assert!(of(&pools, "n1").is_empty());
        assert_eq!(pools.remove(&p("b")), [n("n2"), n("n3")]);
        assert_eq!(of(&pools, "n2"), [p("a")]);
        assert!(of(&pools, "n3").is_empty());
        assert_eq!(pools.pools().cloned().collect::<Vec<_>>(), [p("a")]);
    }
}
