//! Whether a [`WorkflowSpec`] is a workflow we run, and its [`Graph`] when it is.
//!
//! The checks are structural (names, edges, cycles) and about the jobs' existence and group,
//! through a lookup the caller passes. Whether the caller may trigger each job is checked by
//! the HTTP layer, not here.

use std::collections::{HashMap, HashSet};

use super::{Edge, Graph, MAX_NAME_CHARS, MAX_NODES, WorkflowError, WorkflowSpec};

/// How many characters of a name too long to show whole a message shows.
const PREFIX_CHARS: usize = 24;

/// The graph of `spec`, or the first reason it is refused, the culprit first met in the spec's
/// order: its nodes, then its edges, then its nodes' jobs, then a cycle.
///
/// `job_group` gives the group of a job by id, `None` when no such job exists.
pub fn validate(
    spec: &WorkflowSpec,
    job_group: impl Fn(i64) -> Option<i64>,
) -> Result<Graph, WorkflowError> {
    if spec.nodes.is_empty() {
        return Err(WorkflowError::NoNodes);
    }
    if spec.nodes.len() > MAX_NODES {
        return Err(WorkflowError::TooManyNodes { count: spec.nodes.len() });
    }
    let count = spec.nodes.len();

    let mut by_name = HashMap::with_capacity(count);
    for (index, node) in spec.nodes.iter().enumerate() {
        // A blank name could not be told apart in an edge or a message.
        if node.name.trim().is_empty() {
            return Err(WorkflowError::EmptyNodeName { index });
        }
        let chars = node.name.chars().count();
        if chars > MAX_NAME_CHARS {
            let prefix = node.name.chars().take(PREFIX_CHARS).collect();
            return Err(WorkflowError::NodeNameTooLong { index, prefix, chars });
        }
        if by_name.insert(node.name.clone(), index).is_some() {
            return Err(WorkflowError::DuplicateNodeName { name: node.name.clone() });
        }
    }

    let mut incoming = vec![Vec::new(); count];
    let mut outgoing = vec![Vec::new(); count];
    let mut seen = HashSet::with_capacity(spec.edges.len());
    for edge in &spec.edges {
        let index_of = |name: &String| {
            by_name.get(name).copied().ok_or_else(|| WorkflowError::UnknownNode {
                from: edge.from.clone(),
                to: edge.to.clone(),
                unknown: name.clone(),
            })
        };
        let from = index_of(&edge.from)?;
        let to = index_of(&edge.to)?;
        if from == to {
            return Err(WorkflowError::SelfEdge { name: edge.from.clone() });
        }
        if !seen.insert((from, to)) {
            return Err(WorkflowError::DuplicateEdge {
                from: edge.from.clone(),
                to: edge.to.clone(),
            });
        }
        let edge = Edge { from, to, condition: edge.condition };
        incoming[to].push(edge);
        outgoing[from].push(edge);
    }
    for edges in &mut incoming {
        edges.sort_unstable_by_key(|edge| edge.from);
    }
    for edges in &mut outgoing {
        edges.sort_unstable_by_key(|edge| edge.to);
    }

    for node in &spec.nodes {
        match job_group(node.job_id) {
            None => {
                return Err(WorkflowError::UnknownJob {
                    node: node.name.clone(),
                    job_id: node.job_id,
                });
            }
            Some(job_group) if job_group != spec.group_id => {
                return Err(WorkflowError::JobInOtherGroup {
                    node: node.name.clone(),
                    job_id: node.job_id,
                    job_group,
                    group_id: spec.group_id,
                });
            }
            Some(_) => {}
        }
    }

    let topological = match topological_order(&outgoing) {
        Ok(order) => order,
        Err(cycle) => {
            let cycle = cycle.into_iter().map(|index| spec.nodes[index].name.clone()).collect();
            return Err(WorkflowError::Cycle { cycle });
        }
    };

    // Every node has a path from a root, so there is nothing left to check. Walk any node's
    // incoming edges backwards: without a cycle the walk never meets a node twice, so in a
    // finite graph it stops, and it stops only at a node without incoming edges, a root. A
    // node no root reaches therefore sits behind a cycle, and the cycle is refused above
    // (`tests::validation::a_cycle_no_root_reaches_is_refused_as_a_cycle`).

    Ok(Graph {
        name: spec.name.clone(),
        group_id: spec.group_id,
        nodes: spec.nodes.clone(),
        by_name,
        incoming,
        outgoing,
        topological,
    })
}

/// The nodes in an order where each comes after all of its upstream nodes, or a cycle: its
/// nodes in edge order, the last with an edge back to the first.
///
/// A depth-first search from each node in index order, following edges in downstream index
/// order, so that the same graph always names the same cycle. The reverse of the order in which
/// the search leaves nodes is topological.
fn topological_order(outgoing: &[Vec<Edge>]) -> Result<Vec<usize>, Vec<usize>> {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mark {
        New,
        OnPath,
        Left,
    }
    let mut marks = vec![Mark::New; outgoing.len()];
    let mut left = Vec::with_capacity(outgoing.len());
    for start in 0..outgoing.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // The search's path: each node with the position of its next edge to follow.
        let mut path = vec![(start, 0)];
        marks[start] = Mark::OnPath;
        while let Some(top) = path.last_mut() {
            let (node, position) = *top;
            let Some(edge) = outgoing[node].get(position) else {
                marks[node] = Mark::Left;
                left.push(node);
                path.pop();
                continue;
            };
            top.1 += 1;
            match marks[edge.to] {
                Mark::New => {
                    marks[edge.to] = Mark::OnPath;
                    path.push((edge.to, 0));
                }
                Mark::OnPath => {
                    let first = path.iter().position(|&(on_path, _)| on_path == edge.to);
                    let cycle = path[first.unwrap_or(0)..].iter().map(|&(on_path, _)| on_path);
                    return Err(cycle.collect());
                }
                Mark::Left => {}
            }
        }
    }
    left.reverse();
    Ok(left)
}
