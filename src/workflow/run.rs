//! One run of a workflow: what to do next given each node's state, a node's state from its
//! job's runs, and what an operator's retry of a failed node reopens.
//!
//! Everything here is a function of the [`Graph`] and the states the caller read; the caller
//! applies the answer (creates runs, records states) and asks again when something ends.

use std::collections::BTreeMap;

use crate::model::RunState;

use super::{Condition, Decision, Graph, NodeState, Outcome, WorkflowError};

/// What to do now in a workflow run whose node `i` is in `states[i]`.
///
/// An incoming edge is satisfied once its upstream node is done with the end its condition
/// names (`always`: any end, skipped included). It can no longer be satisfied once its upstream
/// node is done with another end. A waiting node starts when all its incoming edges are
/// satisfied (a root at once), and is skipped as soon as one of them can no longer be.
///
/// Skips propagate within the call: the nodes are taken in topological order, each after all
/// of its upstream nodes, with the nodes skipped and started before it counted as skipped and
/// running. So one pass reaches the fixpoint: `skip` holds every node skipped now, and `start`
/// the nodes those skips let start (the target of an `always` edge from a skipped node).
///
/// `end` is set whenever the run is over, so a caller that calls again after the end gets it
/// again. A node with no entry in `states` counts as waiting, like a node without runs.
pub fn decide(graph: &Graph, states: &[NodeState]) -> Decision {
    let mut now: Vec<NodeState> = (0..graph.node_count())
        .map(|index| states.get(index).copied().unwrap_or(NodeState::Waiting))
        .collect();
    let mut decision = Decision::default();
    for &index in &graph.topological {
        if now[index] != NodeState::Waiting {
            continue;
        }
        let mut ready = true;
        let mut dead = false;
        for edge in graph.incoming(index) {
            match edge_status(edge.condition, now[edge.from]) {
                EdgeStatus::Satisfied => {}
                EdgeStatus::Pending => ready = false,
                EdgeStatus::Dead => dead = true,
            }
        }
        if dead {
            now[index] = NodeState::Skipped;
            decision.skip.push(index);
        } else if ready {
            now[index] = NodeState::Running;
            decision.start.push(index);
        }
    }
    decision.start.sort_unstable();
    decision.skip.sort_unstable();
    if now.iter().all(|state| state.is_done()) {
        let unhandled = (0..now.len()).any(|index| {
            now[index] == NodeState::Failed
                && !graph.outgoing(index).iter().any(|edge| edge.condition == Condition::OnFailure)
        });
        decision.end = Some(if unhandled { Outcome::Failed } else { Outcome::Success });
    }
    decision
}

/// A node's state from the runs of its job in this workflow run: one `(shard index, attempt,
/// state)` per run, a run per shard and a further attempt per retry of a shard.
///
/// No runs: waiting. A run not ended (of any attempt): running. Otherwise each shard ends as
/// its latest attempt did, so a shard that failed and then succeeded on a retry counts as
/// succeeded: the node succeeded when every shard's latest attempt is `success`, and failed
/// when one is anything else (`failed`, `timed_out`, `killed`, `lost`, or `skipped`: a run
/// skipped because its job was stopped or at its cap did not do the node's work).
///
/// Which shards a fire has is the caller's to know: a fire creates all of its shards' runs at
/// once, so the runs given are all there are.
pub fn node_state(runs: &[(i64, i64, RunState)]) -> NodeState {
    if runs.is_empty() {
        return NodeState::Waiting;
    }
    if runs.iter().any(|&(_, _, state)| !state.is_terminal()) {
        return NodeState::Running;
    }
    // Each shard's latest attempt, and whether every run of that attempt succeeded (a shard
    // has one run per attempt; should it have two, both must succeed).
    let mut latest: BTreeMap<i64, (i64, bool)> = BTreeMap::new();
    for &(shard, attempt, state) in runs {
        let success = state == RunState::Success;
        let entry = latest.entry(shard).or_insert((attempt, success));
        if attempt > entry.0 {
            *entry = (attempt, success);
        } else if attempt == entry.0 {
            entry.1 &= success;
        }
    }
    if latest.values().all(|&(_, success)| success) {
        NodeState::Succeeded
    } else {
        NodeState::Failed
    }
}

/// The nodes to set back to waiting when an operator retries the failed node `node`: the node
/// itself and the skipped nodes downstream of it, in index order. With those set, [`decide`]
/// starts the node again and goes on from there.
///
/// Only skipped nodes are walked through. A node downstream that ran (or runs) keeps its state
/// and its result, and so does anything behind it: a skipped node reached only through nodes
/// that ran was skipped because of them, and [`decide`] would skip it again at once.
pub fn reopen(
    graph: &Graph,
    states: &[NodeState],
    node: usize,
) -> Result<Vec<usize>, WorkflowError> {
    let Some(spec) = graph.nodes.get(node) else {
        return Err(WorkflowError::NoSuchNode { index: node });
    };
    let state_of = |index: usize| states.get(index).copied().unwrap_or(NodeState::Waiting);
    if state_of(node) != NodeState::Failed {
        return Err(WorkflowError::NotFailed { node: spec.name.clone(), state: state_of(node) });
    }
    let mut reopened = vec![false; graph.node_count()];
    reopened[node] = true;
    let mut stack = vec![node];
    while let Some(index) = stack.pop() {
        for next in graph.downstream(index) {
            if !reopened[next] && state_of(next) == NodeState::Skipped {
                reopened[next] = true;
                stack.push(next);
            }
        }
    }
    Ok((0..reopened.len()).filter(|&index| reopened[index]).collect())
}

/// Where an edge stands given its upstream node's state.
pub(super) enum EdgeStatus {
    /// Its upstream ended the way its condition names.
    Satisfied,
    /// Its upstream has not ended.
    Pending,
    /// Its upstream ended another way: it will never be satisfied in this run.
    Dead,
}

pub(super) fn edge_status(condition: Condition, upstream: NodeState) -> EdgeStatus {
    if !upstream.is_done() {
        return EdgeStatus::Pending;
    }
    let satisfied = match condition {
        Condition::OnSuccess => upstream == NodeState::Succeeded,
        Condition::OnFailure => upstream == NodeState::Failed,
        Condition::Always => true,
    };
    if satisfied { EdgeStatus::Satisfied } else { EdgeStatus::Dead }
}
