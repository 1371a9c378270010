//! Workflows: a DAG of jobs, and every decision about its graph.
//!
//! A workflow belongs to a group and has nodes and edges. A node runs a job of that group, with
//! its own parameter if it gives one. An edge makes its target wait for its source and says on
//! which of the source's ends the target may run ([`Condition`]):
//!
//! ```text
//!            on_success            on_failure
//! extract ──────────────▶ load    extract ──────────────▶ alert
//!                                      always
//!                         load    ──────────────▶ report
//! ```
//!
//! This module decides, purely:
//! - whether a [`WorkflowSpec`] is a graph we run ([`validate`], which returns the [`Graph`]);
//! - from each node's state, which nodes start now, which are skipped, and whether the
//!   workflow's run ended and how ([`decide`]);
//! - a node's state from the runs of its job ([`node_state`]);
//! - which nodes an operator's retry of a failed node sets back to waiting ([`reopen`]).
//!
//! It does no IO, reads no clock and stores nothing. Storage (`storage::workflow_runs`) asks
//! [`decide`] in the transaction that ends a node's run, and the dispatcher creates the runs of
//! the nodes it starts. Who may trigger each job is the HTTP layer's check, not this module's.
#![warn(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::UnknownValue;

mod run;
mod validate;

#[cfg(test)]
use run::{EdgeStatus, edge_status};
pub use run::{decide, node_state, reopen};
pub use validate::validate;

/// The most nodes a workflow may have.
pub const MAX_NODES: usize = 200;

/// The longest node name, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// A workflow as an operator writes it: the JSON document the API takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSpec {
    /// A human name.
    pub name: String,
    /// The group every node's job belongs to.
    pub group_id: i64,
    /// The nodes; their order is the order of [`Graph`]'s indices.
    pub nodes: Vec<NodeSpec>,
    /// The edges between nodes, by name.
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
}

/// One node: a job to run when its incoming edges allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Unique within the workflow; edges name nodes by it.
    pub name: String,
    /// The job it runs.
    pub job_id: i64,
    /// The parameter for the job's runs; `None` keeps the job's own.
    #[serde(default)]
    pub param: Option<String>,
    /// Whether the outputs of its upstream nodes are handed to the job (default true).
    #[serde(default = "yes")]
    pub pass_inputs: bool,
}

/// One edge: `to` waits for `from` and runs on the end of `from` that `condition` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// The upstream node's name.
    pub from: String,
    /// The downstream node's name.
    pub to: String,
    /// On which end of `from` the edge lets `to` run (default `on_success`).
    #[serde(default)]
    pub condition: Condition,
}

/// On which end of its upstream node an edge lets its downstream node run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// When the upstream node succeeded.
    #[default]
    OnSuccess,
    /// When the upstream node failed: the edge handles that failure.
    OnFailure,
    /// Whatever the upstream node's end: succeeded, failed or skipped.
    Always,
}

/// Where a node is in one run of its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Not started: its incoming edges are not all satisfied yet.
    Waiting,
    /// Its job's runs were created and not all of them ended.
    Running,
    /// Every shard of its job succeeded.
    Succeeded,
    /// A shard of its job did not succeed.
    Failed,
    /// It will not run in this workflow run: an incoming edge can no longer be satisfied.
    Skipped,
}

/// A validated workflow: its nodes by index, in the spec's order, and its edges by index.
///
/// Only [`validate`] makes one, so its edges name existing nodes and form no cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    name: String,
    group_id: i64,
    nodes: Vec<NodeSpec>,
    by_name: HashMap<String, usize>,
    /// Each node's incoming edges, by upstream index.
    incoming: Vec<Vec<Edge>>,
    /// Each node's outgoing edges, by downstream index.
    outgoing: Vec<Vec<Edge>>,
    /// Every node, each after all of its upstream nodes.
    topological: Vec<usize>,
}

/// An edge of a [`Graph`], between node indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Edge {
    /// The upstream node.
    pub from: usize,
    /// The downstream node.
    pub to: usize,
    /// On which end of `from` it lets `to` run.
    pub condition: Condition,
}

/// What to do now in one run of a workflow, from [`decide`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// The waiting nodes to start (create their job's runs), in index order.
    pub start: Vec<usize>,
    /// The waiting nodes to mark skipped, in index order.
    pub skip: Vec<usize>,
    /// Set when, once `start` and `skip` are applied, no node waits or runs: the run is over.
    pub end: Option<Outcome>,
}

/// Where a workflow run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// A node waits or runs.
    Running,
    /// It ended [`Outcome::Success`].
    Success,
    /// It ended [`Outcome::Failed`].
    Failed,
    /// An operator killed it: its running nodes were killed and no node starts.
    Killed,
}

/// How a workflow run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Every node that failed has an `on_failure` edge: its failure was handled.
    Success,
    /// Some node failed and no edge handles its failure.
    Failed,
}

/// Why a workflow is refused, or a node cannot be reopened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkflowError {
    /// The spec has no node.
    #[error("a workflow needs at least one node")]
    NoNodes,
    /// The spec has more than [`MAX_NODES`] nodes.
    #[error("the workflow has {count} nodes, more than the limit of {MAX_NODES}")]
    TooManyNodes {
        /// How many it has.
        count: usize,
    },
    /// A node's name is empty or only whitespace.
    #[error("nodes[{index}] has an empty name")]
    EmptyNodeName {
        /// The node's position in the spec.
        index: usize,
    },
    /// A node's name is longer than [`MAX_NAME_CHARS`].
    #[error(
        "nodes[{index}]'s name `{prefix}…` is {chars} characters long, more than the limit of \
         {MAX_NAME_CHARS}"
    )]
    NodeNameTooLong {
        /// The node's position in the spec.
        index: usize,
        /// The name's first characters.
        prefix: String,
        /// The name's length in characters.
        chars: usize,
    },
    /// Two nodes have the same name.
    #[error("two nodes are named `{name}`")]
    DuplicateNodeName {
        /// The name.
        name: String,
    },
    /// An edge names a node that the spec does not have.
    #[error("the edge from `{from}` to `{to}` names `{unknown}`, which is no node of the workflow")]
    UnknownNode {
        /// The edge's upstream name.
        from: String,
        /// The edge's downstream name.
        to: String,
        /// The name that is no node's.
        unknown: String,
    },
    /// An edge goes from a node to itself.
    #[error("the edge from `{name}` to itself would make it wait for itself")]
    SelfEdge {
        /// The node's name.
        name: String,
    },
    /// Two edges go from the same node to the same node (whatever their conditions).
    #[error("the edge from `{from}` to `{to}` is given twice (use `always` for both ends)")]
    DuplicateEdge {
        /// The upstream name.
        from: String,
        /// The downstream name.
        to: String,
    },
    /// A node's job does not exist.
    #[error("node `{node}` runs job {job_id}, which does not exist")]
    UnknownJob {
        /// The node's name.
        node: String,
        /// The job it names.
        job_id: i64,
    },
    /// A node's job belongs to another group than the workflow.
    #[error(
        "node `{node}` runs job {job_id} of group {job_group}, not of the workflow's group {group_id}"
    )]
    JobInOtherGroup {
        /// The node's name.
        node: String,
        /// The job it names.
        job_id: i64,
        /// The job's group.
        job_group: i64,
        /// The workflow's group.
        group_id: i64,
    },
    /// The edges form a cycle.
    #[error("the edges form a cycle: {}", cycle_text(.cycle))]
    Cycle {
        /// The cycle's nodes in edge order, from the first one met in the spec's order; the
        /// last has an edge back to the first.
        cycle: Vec<String>,
    },
    /// [`reopen`] was asked for a node index the graph does not have.
    #[error("the workflow has no node {index}")]
    NoSuchNode {
        /// The index asked for.
        index: usize,
    },
    /// [`reopen`] was asked for a node that did not fail.
    #[error("node `{node}` is {state}; only a failed node can be retried")]
    NotFailed {
        /// The node's name.
        node: String,
        /// Its state.
        state: NodeState,
    },
}

impl Condition {
    /// Every condition, in declaration order.
    pub const ALL: &'static [Condition] =
        &[Condition::OnSuccess, Condition::OnFailure, Condition::Always];

    /// The spelling of the JSON document and of storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::OnSuccess => "on_success",
            Condition::OnFailure => "on_failure",
            Condition::Always => "always",
        }
    }
}

impl FromStr for Condition {
    type Err = UnknownValue;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Condition::ALL.iter().copied().find(|condition| condition.as_str() == text).ok_or_else(
            || UnknownValue {
                kind: "Condition",
                value: text.to_owned(),
                expected: &["on_success", "on_failure", "always"],
            },
        )
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl NodeState {
    /// Every state, in declaration order.
    pub const ALL: &'static [NodeState] = &[
        NodeState::Waiting,
        NodeState::Running,
        NodeState::Succeeded,
        NodeState::Failed,
        NodeState::Skipped,
    ];

    /// The spelling of storage and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Waiting => "waiting",
            NodeState::Running => "running",
            NodeState::Succeeded => "succeeded",
            NodeState::Failed => "failed",
            NodeState::Skipped => "skipped",
        }
    }

    /// Whether the node is over for this run: succeeded, failed or skipped.
    pub fn is_done(self) -> bool {
        matches!(self, NodeState::Succeeded | NodeState::Failed | NodeState::Skipped)
    }
}

impl FromStr for NodeState {
    type Err = UnknownValue;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        NodeState::ALL.iter().copied().find(|state| state.as_str() == text).ok_or_else(|| {
            UnknownValue {
                kind: "NodeState",
                value: text.to_owned(),
                expected: &["waiting", "running", "succeeded", "failed", "skipped"],
            }
        })
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl RunState {
    /// Every state, in declaration order.
    pub const ALL: &'static [RunState] =
        &[RunState::Running, RunState::Success, RunState::Failed, RunState::Killed];

    /// The spelling of storage and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Success => "success",
            RunState::Failed => "failed",
            RunState::Killed => "killed",
        }
    }
}

impl From<Outcome> for RunState {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Success => RunState::Success,
            Outcome::Failed => RunState::Failed,
        }
    }
}

impl FromStr for RunState {
    type Err = UnknownValue;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        RunState::ALL.iter().copied().find(|state| state.as_str() == text).ok_or_else(|| {
            UnknownValue {
                kind: "workflow RunState",
                value: text.to_owned(),
                expected: &["running", "success", "failed", "killed"],
            }
        })
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Graph {
    /// The graph of a spec that [`validate`] accepted before, when it was stored: its
    /// structure is checked again, its jobs are not (they may have been deleted since, which
    /// fails their node when it starts).
    pub fn of_stored(spec: &WorkflowSpec) -> Result<Graph, WorkflowError> {
        validate(spec, |_| Some(spec.group_id))
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group of the workflow and of every node's job.
    pub fn group_id(&self) -> i64 {
        self.group_id
    }

    /// How many nodes it has (at least one).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The nodes, by index.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The index of the node named `name`.
    pub fn node(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Node `index`'s edges from its upstream nodes, in upstream index order.
    pub fn incoming(&self, index: usize) -> &[Edge] {
        self.incoming.get(index).map_or(&[], Vec::as_slice)
    }

    /// Node `index`'s edges to its downstream nodes, in downstream index order.
    pub fn outgoing(&self, index: usize) -> &[Edge] {
        self.outgoing.get(index).map_or(&[], Vec::as_slice)
    }

    /// The nodes node `index` waits for, in index order.
    pub fn upstream(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.incoming(index).iter().map(|edge| edge.from)
    }

    /// The nodes that wait for node `index`, in index order.
    pub fn downstream(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.outgoing(index).iter().map(|edge| edge.to)
    }

    /// The nodes that wait for nothing, in index order: they start first.
    pub fn roots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&index| self.incoming(index).is_empty())
    }
}

fn cycle_text(cycle: &[String]) -> String {
    let mut text = cycle.join(" → ");
    if let Some(first) = cycle.first() {
        text.push_str(" → ");
        text.push_str(first);
    }
    text
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests;
