//! The one input type of the gate: an observation about one node, or a
//! command for the pool.
//!
//! The embedding API takes the three kinds of observation through their own
//! types (design §6): [`MembershipUpdate`] from SWIM, [`AgentReport`] from a
//! node agent, [`RegistryFact`] from the orchestrator's registry. Each
//! converts into an [`Input`]; the scenario parser builds `Input`s directly.

use crate::identity::{IdentityMaterial, InvalidIdentity};
use crate::ids::{Epoch, NodeId, RunId};
use crate::node::{FaultReason, Observation, SwimState};
use crate::pool::PoolDefinition;

/// Anything the gate is fed.
#[derive(Debug, Clone)]
pub enum Input {
    /// A fact about one node, for that node's actor.
    Observation {
        /// The node it is about.
        node: NodeId,
        /// What was observed.
        observation: Observation,
    },
    /// A command for the pool.
    Command(Command),
}

/// What the orchestrator asks of the pool.
#[derive(Debug, Clone)]
pub enum Command {
    /// Replace the candidate pool (design §2).
    DefinePool(PoolDefinition),
    /// Begin planning a run on the ready pool (design §3).
    BeginPlanning {
        /// The run to plan.
        run: RunId,
        /// The epoch the caller saw ready, as proof, if it has one.
        epoch: Option<Epoch>,
    },
    /// Commit a run's plan: provisioning begins (design §3).
    CommitPlan {
        /// The planning run.
        run: RunId,
        /// The nodes the plan requires; never empty.
        required: Vec<NodeId>,
        /// The epoch the plan was made on, if the caller gives one.
        epoch: Option<Epoch>,
    },
    /// End a committed run.
    FinishRun {
        /// The committed run.
        run: RunId,
    },
    /// Withdraw a run that is planning (or suspended): its requester is
    /// gone, so nobody will commit it, and it would hold the pool.
    AbortPlanning {
        /// The planning run.
        run: RunId,
    },
}

/// Membership input: a SWIM fact about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipUpdate {
    /// The member.
    pub node: NodeId,
    /// Its state.
    pub state: SwimState,
    /// The incarnation the state was reported at.
    pub incarnation: u64,
}

/// Node-agent input: what a node says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentReport {
    /// `NodeAvailable`.
    Available {
        /// The reporting node.
        node: NodeId,
    },
    /// The node withdrew its availability.
    Unavailable {
        /// The reporting node.
        node: NodeId,
    },
    /// Data-plane identity material, new or rotated.
    Identity {
        /// The reporting node.
        node: NodeId,
        /// The material (only its fingerprint is ever shown).
        material: IdentityMaterial,
    },
    /// The node is faulted. Any wording is accepted: control characters
    /// become U+FFFD and it is cut to 1 KiB (a fault is never lost to its
    /// wording).
    Faulted {
        /// The reporting node.
        node: NodeId,
        /// Why, in the node's words.
        reason: String,
    },
    /// The node's fault is cleared.
    Recovered {
        /// The reporting node.
        node: NodeId,
    },
}

/// Registry input: what the orchestrator knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryFact {
    /// The orchestrator knows the node.
    Known {
        /// The registered node.
        node: NodeId,
    },
    /// The orchestrator forgot the node (its identity goes with it).
    Forgotten {
        /// The forgotten node.
        node: NodeId,
    },
}

impl AgentReport {
    /// An identity report from raw bytes, checked (1 byte to 16 KiB).
    pub fn identity(node: NodeId, bytes: Vec<u8>) -> Result<Self, InvalidIdentity> {
        Ok(AgentReport::Identity {
            node,
            material: IdentityMaterial::new(bytes)?,
        })
    }
}

impl MembershipUpdate {
    /// The node this is about, and the observation it makes.
    pub fn into_observation(self) -> (NodeId, Observation) {
        let observation = Observation::Swim {
            state: self.state,
            incarnation: self.incarnation,
        };
        (self.node, observation)
    }
}

impl AgentReport {
    /// The node this is about, and the observation it makes.
    pub fn into_observation(self) -> (NodeId, Observation) {
        match self {
            AgentReport::Available { node } => (node, Observation::Available),
            AgentReport::Unavailable { node } => (node, Observation::Unavailable),
            AgentReport::Identity { node, material } => {
                (node, Observation::Identity(material.fingerprint()))
            }
            AgentReport::Faulted { node, reason } => (
                node,
                Observation::Faulted {
                    reason: FaultReason::new(&reason),
                },
            ),
            AgentReport::Recovered { node } => (node, Observation::Recovered),
        }
    }
}

impl RegistryFact {
    /// The node this is about, and the observation it makes.
    pub fn into_observation(self) -> (NodeId, Observation) {
        match self {
            RegistryFact::Known { node } => (node, Observation::Known),
            RegistryFact::Forgotten { node } => (node, Observation::Forgotten),
        }
    }
}

impl From<(NodeId, Observation)> for Input {
    fn from((node, observation): (NodeId, Observation)) -> Input {
        Input::Observation { node, observation }
    }
}

impl From<MembershipUpdate> for Input {
    fn from(update: MembershipUpdate) -> Input {
        update.into_observation().into()
    }
}

impl From<AgentReport> for Input {
    fn from(report: AgentReport) -> Input {
        report.into_observation().into()
    }
}

impl From<RegistryFact> for Input {
    fn from(fact: RegistryFact) -> Input {
        fact.into_observation().into()
    }
}

impl From<Command> for Input {
    fn from(command: Command) -> Input {
        Input::Command(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_report_becomes_an_observation_with_its_wording_made_safe() {
        let node = NodeId::new("n").unwrap();
        let input = Input::from(AgentReport::Faulted {
            node: node.clone(),
            reason: "a\nb".into(),
        });
        match input {
            Input::Observation {
                node: n,
                observation: Observation::Faulted { reason },
            } => {
                assert_eq!(n, node);
                assert_eq!(reason.as_str(), "a\u{fffd}b");
            }
            other => panic!("{other:?}"),
        }
    }
}
