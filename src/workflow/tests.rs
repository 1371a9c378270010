//! Workflow decisions as tables: one edge under every upstream state and condition, cases of
//! several nodes, node states from runs, reopening, and a large DAG driven to its end.

use std::fmt::Write as _;

use expect_test::{Expect, expect};

use crate::model::RunState;

use super::*;

mod validation;

/// A spec of group 1 whose node `i` runs job `i + 1`. `nodes` are names separated by spaces;
/// an edge is `"a -> b"`, optionally followed by its condition (`"a -> b on_failure"`).
fn spec(nodes: &str, edges: &[&str]) -> WorkflowSpec {
    let nodes = nodes
        .split_whitespace()
        .zip(1..)
        .map(|(name, job_id)| NodeSpec {
            name: name.to_owned(),
            job_id,
            param: None,
            pass_inputs: true,
        })
        .collect();
    let edges = edges
        .iter()
        .map(|edge| {
            let words: Vec<&str> = edge.split_whitespace().collect();
            let condition = words.get(3).map_or(Condition::OnSuccess, |word| word.parse().unwrap());
            assert_eq!(words[1], "->", "{edge}");
            EdgeSpec { from: words[0].to_owned(), to: words[2].to_owned(), condition }
        })
        .collect();
    WorkflowSpec { name: "test".to_owned(), group_id: 1, nodes, edges }
}

fn graph(nodes: &str, edges: &[&str]) -> Graph {
    validate(&spec(nodes, edges), |_| Some(1)).unwrap()
}

/// Every node's state from `"a=succeeded b=running"`; the nodes not named are waiting.
fn states(graph: &Graph, text: &str) -> Vec<NodeState> {
    let mut states = vec![NodeState::Waiting; graph.node_count()];
    for word in text.split_whitespace() {
        let (name, state) = word.split_once('=').unwrap();
        states[graph.node(name).unwrap()] = state.parse().unwrap();
    }
    states
}

fn names(graph: &Graph, indices: impl IntoIterator<Item = usize>) -> String {
    let names: Vec<&str> =
        indices.into_iter().map(|index| graph.nodes()[index].name.as_str()).collect();
    if names.is_empty() { "-".to_owned() } else { names.join(" ") }
}

fn render_decision(graph: &Graph, decision: &Decision) -> String {
    let end = match decision.end {
        None => "none",
        Some(Outcome::Success) => "success",
        Some(Outcome::Failed) => "failed",
    };
    format!(
        "start {}; skip {}; end {end}",
        names(graph, decision.start.iter().copied()),
        names(graph, decision.skip.iter().copied()),
    )
}

/// The state each node is in once `decision` is applied: started nodes run.
fn applied(states: &[NodeState], decision: &Decision) -> Vec<NodeState> {
    let mut after = states.to_vec();
    for &index in &decision.start {
        after[index] = NodeState::Running;
    }
    for &index in &decision.skip {
        after[index] = NodeState::Skipped;
    }
    after
}

#[test]
fn one_edge_under_every_upstream_state_and_condition() {
    let mut out = String::new();
    for &condition in Condition::ALL {
        let graph = graph("a b", &[&format!("a -> b {condition}")]);
        for &upstream in NodeState::ALL {
            let decision = decide(&graph, &[upstream, NodeState::Waiting]);
            let fate = if decision.start.contains(&1) {
                "starts"
            } else if decision.skip.contains(&1) {
                "is skipped"
            } else {
                "waits"
            };
            writeln!(out, "a {upstream:<9} --{condition:-<10}--> b {fate}").unwrap();
        }
    }
    expect![[r#"
        a waiting   --on_success--> b waits
        a running   --on_success--> b waits
        a succeeded --on_success--> b starts
        a failed    --on_success--> b is skipped
        a skipped   --on_success--> b is skipped
        a waiting   --on_failure--> b waits
        a running   --on_failure--> b waits
        a succeeded --on_failure--> b is skipped
        a failed    --on_failure--> b starts
        a skipped   --on_failure--> b is skipped
        a waiting   --always------> b waits
        a running   --always------> b waits
        a succeeded --always------> b starts
        a failed    --always------> b starts
        a skipped   --always------> b starts
    "#]]
    .assert_eq(&out);
}

#[test]
fn several_nodes() {
    // (what the case shows, nodes, edges, states before the decision)
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("a fresh run starts the roots", "a b c", &["a -> c", "b -> c"], ""),
        (
            "diamond: a succeeded, so b starts and its failure branch c is skipped",
            "a b c d",
            &["a -> b", "a -> c on_failure", "b -> d always", "c -> d always"],
            "a=succeeded",
        ),
        (
            "diamond: a failed, so c handles it and b is skipped",
            "a b c d",
            &["a -> b", "a -> c on_failure", "b -> d always", "c -> d always"],
            "a=failed",
        ),
        (
            "diamond: d waits for c although b's edge is satisfied",
            "a b c d",
            &["a -> b", "a -> c on_failure", "b -> d always", "c -> d always"],
            "a=failed b=skipped c=running",
        ),
        (
            "diamond: d starts after the handler of a's failure",
            "a b c d",
            &["a -> b", "a -> c on_failure", "b -> d always", "c -> d always"],
            "a=failed b=skipped c=succeeded",
        ),
        (
            "diamond, d on_success from both: one skipped parent skips d",
            "a b c d",
            &["a -> b", "a -> c on_failure", "b -> d", "c -> d"],
            "a=succeeded",
        ),
        (
            "a failure skips the whole on_success chain at once, and ends the run",
            "a b c d",
            &["a -> b", "b -> c", "c -> d"],
            "a=failed",
        ),
        (
            "skips propagate whatever the order of the nodes in the spec",
            "d c b a",
            &["a -> b", "b -> c", "c -> d always"],
            "a=failed",
        ),
        (
            "an always edge after a skipped node starts its target",
            "a b c",
            &["a -> b", "b -> c always"],
            "a=failed",
        ),
        (
            "an on_failure edge from a skipped node is dead",
            "a b c",
            &["a -> b", "b -> c on_failure"],
            "a=failed",
        ),
        (
            "two parents: one edge dead is enough to skip, while the other runs",
            "a b c",
            &["a -> c", "b -> c"],
            "a=failed b=running",
        ),
        (
            "two parents: one satisfied, the other still running: c waits",
            "a b c",
            &["a -> c", "b -> c"],
            "a=succeeded b=running",
        ),
        (
            "end success: the failure of a is handled by b, and c is skipped",
            "a b c",
            &["a -> b on_failure", "a -> c"],
            "a=failed b=succeeded",
        ),
        (
            "end failed: the handler of a's failure failed too, unhandled",
            "a b",
            &["a -> b on_failure"],
            "a=failed b=failed",
        ),
        (
            "end failed: a failure with only an always edge is not handled",
            "a b",
            &["a -> b always"],
            "a=failed b=succeeded",
        ),
        (
            "end success: a failure with an on_failure edge counts as handled, even when the \
             edge's target h is skipped because of its other parent b",
            "x y b a h",
            &["x -> y on_failure", "x -> b", "a -> h on_failure", "b -> h"],
            "x=failed y=succeeded a=failed",
        ),
        (
            "end none while something runs, even with everything else decided",
            "a b c",
            &["a -> b", "a -> c on_failure"],
            "a=succeeded b=running",
        ),
        (
            "running and done nodes are never started or skipped",
            "a b c",
            &["a -> b", "a -> c"],
            "a=failed b=running c=succeeded",
        ),
        ("end again when asked after the end", "a b", &["a -> b"], "a=succeeded b=succeeded"),
        ("a single node that failed: end failed", "a", &[], "a=failed"),
    ];
    let mut out = String::new();
    for (label, nodes, edges, before) in cases {
        let graph = graph(nodes, edges);
        let decision = decide(&graph, &states(&graph, before));
        writeln!(out, "{label}\n    {}", render_decision(&graph, &decision)).unwrap();
    }
    expect![[r#"
        a fresh run starts the roots
            start a b; skip -; end none
        diamond: a succeeded, so b starts and its failure branch c is skipped
            start b; skip c; end none
        diamond: a failed, so c handles it and b is skipped
            start c; skip b; end none
        diamond: d waits for c although b's edge is satisfied
            start -; skip -; end none
        diamond: d starts after the handler of a's failure
            start d; skip -; end none
        diamond, d on_success from both: one skipped parent skips d
            start b; skip c d; end none
        a failure skips the whole on_success chain at once, and ends the run
            start -; skip b c d; end failed
        skips propagate whatever the order of the nodes in the spec
            start d; skip c b; end none
        an always edge after a skipped node starts its target
            start c; skip b; end none
        an on_failure edge from a skipped node is dead
            start -; skip b c; end failed
        two parents: one edge dead is enough to skip, while the other runs
            start -; skip c; end none
        two parents: one satisfied, the other still running: c waits
            start -; skip -; end none
        end success: the failure of a is handled by b, and c is skipped
            start -; skip c; end success
        end failed: the handler of a's failure failed too, unhandled
            start -; skip -; end failed
        end failed: a failure with only an always edge is not handled
            start -; skip -; end failed
        end success: a failure with an on_failure edge counts as handled, even when the edge's target h is skipped because of its other parent b
            start -; skip b h; end success
        end none while something runs, even with everything else decided
            start -; skip c; end none
        running and done nodes are never started or skipped
            start -; skip -; end none
        end again when asked after the end
            start -; skip -; end success
        a single node that failed: end failed
            start -; skip -; end failed
    "#]].assert_eq(&out);
}

/// Every combination of states of a graph with every condition, checked against the rules
/// rather than a table: the decision is a fixpoint, and it only moves waiting nodes.
#[test]
fn every_decision_of_a_mixed_graph_is_a_fixpoint() {
    let graph = graph(
        "a b c d e",
        &["a -> b", "a -> c on_failure", "b -> d always", "c -> d", "b -> e on_failure", "d -> e"],
    );
    let n = graph.node_count();
    let status = |edge: &Edge, states: &[NodeState]| edge_status(edge.condition, states[edge.from]);
    for combination in 0..NodeState::ALL.len().pow(n as u32) {
        let before: Vec<NodeState> = (0..n)
            .map(|index| NodeState::ALL[combination / NodeState::ALL.len().pow(index as u32) % 5])
            .collect();
        let decision = decide(&graph, &before);
        let after = applied(&before, &decision);
        let context = format!("{before:?} -> {decision:?}");
        assert!(decision.start.is_sorted() && decision.skip.is_sorted(), "{context}");
        for &index in decision.start.iter().chain(&decision.skip) {
            assert_eq!(before[index], NodeState::Waiting, "{context}");
        }
        assert!(decision.start.iter().all(|index| !decision.skip.contains(index)), "{context}");
        for (index, &state) in before.iter().enumerate() {
            let incoming = graph.incoming(index);
            let dead = incoming.iter().any(|edge| matches!(status(edge, &after), EdgeStatus::Dead));
            let ready =
                incoming.iter().all(|edge| matches!(status(edge, &after), EdgeStatus::Satisfied));
            if decision.skip.contains(&index) {
                assert!(dead, "{context}: node {index} skipped without a dead edge");
            } else if decision.start.contains(&index) {
                assert!(ready, "{context}: node {index} started before its edges allow");
            } else if state == NodeState::Waiting {
                assert!(!dead && !ready, "{context}: node {index} left waiting");
            }
        }
        assert_eq!(decision.end.is_some(), after.iter().all(|state| state.is_done()), "{context}");
        let again = decide(&graph, &after);
        assert_eq!((again.start.len(), again.skip.len()), (0, 0), "{context}: not a fixpoint");
    }
}

fn check_node_state(cases: &[&[(i64, i64, RunState)]], expect: Expect) {
    let mut out = String::new();
    for runs in cases {
        let runs_text: Vec<String> = runs
            .iter()
            .map(|(shard, attempt, state)| format!("shard {shard} try {attempt} {state}"))
            .collect();
        let runs_text = if runs.is_empty() { "no runs".to_owned() } else { runs_text.join(", ") };
        writeln!(out, "{runs_text} -> {}", node_state(runs)).unwrap();
    }
    expect.assert_eq(&out);
}

#[test]
fn node_states_from_runs() {
    use RunState::*;
    check_node_state(
        &[
            &[],
            &[(0, 0, Pending)],
            &[(0, 0, Dispatching)],
            &[(0, 0, Running)],
            &[(0, 0, Success)],
            &[(0, 0, Failed)],
            &[(0, 0, TimedOut)],
            &[(0, 0, Killed)],
            &[(0, 0, Lost)],
            &[(0, 0, Skipped)],
            // Shards.
            &[(0, 0, Success), (1, 0, Success), (2, 0, Success)],
            &[(0, 0, Success), (1, 0, Failed), (2, 0, Success)],
            &[(0, 0, Success), (1, 0, Running), (2, 0, Failed)],
            // Retries: a failure then a success on retry counts as a success.
            &[(0, 0, Failed), (0, 1, Success)],
            &[(0, 1, Success), (0, 0, Failed)],
            &[(0, 0, Failed), (0, 1, Failed), (0, 2, Success)],
            &[(0, 0, Failed), (0, 1, TimedOut)],
            // A retry not sent yet: still running.
            &[(0, 0, Failed), (0, 1, Pending)],
            &[(0, 0, Success), (1, 0, Lost), (1, 1, Success)],
            &[(0, 0, Success), (1, 0, Lost), (1, 1, Dispatching)],
            &[(0, 0, Failed), (1, 0, Success), (1, 1, Success)],
        ],
        expect![[r#"
            no runs -> waiting
            shard 0 try 0 pending -> running
            shard 0 try 0 dispatching -> running
            shard 0 try 0 running -> running
            shard 0 try 0 success -> succeeded
            shard 0 try 0 failed -> failed
            shard 0 try 0 timed_out -> failed
            shard 0 try 0 killed -> failed
            shard 0 try 0 lost -> failed
            shard 0 try 0 skipped -> failed
            shard 0 try 0 success, shard 1 try 0 success, shard 2 try 0 success -> succeeded
            shard 0 try 0 success, shard 1 try 0 failed, shard 2 try 0 success -> failed
            shard 0 try 0 success, shard 1 try 0 running, shard 2 try 0 failed -> running
            shard 0 try 0 failed, shard 0 try 1 success -> succeeded
            shard 0 try 1 success, shard 0 try 0 failed -> succeeded
            shard 0 try 0 failed, shard 0 try 1 failed, shard 0 try 2 success -> succeeded
            shard 0 try 0 failed, shard 0 try 1 timed_out -> failed
            shard 0 try 0 failed, shard 0 try 1 pending -> running
            shard 0 try 0 success, shard 1 try 0 lost, shard 1 try 1 success -> succeeded
            shard 0 try 0 success, shard 1 try 0 lost, shard 1 try 1 dispatching -> running
            shard 0 try 0 failed, shard 1 try 0 success, shard 1 try 1 success -> failed
        "#]],
    );
}

#[test]
fn reopening_a_failed_node_reopens_the_nodes_its_failure_skipped() {
    // a → b → c → d with a handler h of b's failure, and e behind h.
    let graph = graph(
        "a b c d h e x",
        &["a -> b", "b -> c", "c -> d", "b -> h on_failure", "h -> e on_failure", "a -> x always"],
    );
    let mut states =
        states(&graph, "a=succeeded b=failed c=skipped d=skipped h=succeeded e=skipped x=running");
    let mut out = String::new();
    for node in ["b", "a", "h", "c", "x"] {
        let res = reopen(&graph, &states, graph.node(node).unwrap());
        let line = match res {
            Ok(reopened) => format!("reopen {node}: {}", names(&graph, reopened)),
            Err(error) => format!("reopen {node}: {error}"),
        };
        writeln!(out, "{line}").unwrap();
    }
    writeln!(out, "reopen node 99: {}", reopen(&graph, &states, 99).unwrap_err()).unwrap();
    expect![[r#"
        reopen b: b c d
        reopen a: node `a` is succeeded; only a failed node can be retried
        reopen h: node `h` is succeeded; only a failed node can be retried
        reopen c: node `c` is skipped; only a failed node can be retried
        reopen x: node `x` is running; only a failed node can be retried
        reopen node 99: the workflow has no node 99
    "#]]
    .assert_eq(&out);

    // The caller sets the reopened nodes to waiting; decide goes on from b.
    for index in reopen(&graph, &states, 1).unwrap() {
        states[index] = NodeState::Waiting;
    }
    let mut out = String::new();
    for step in ["", "b=succeeded", "c=succeeded x=succeeded", "d=succeeded"] {
        for word in step.split_whitespace() {
            let (name, state) = word.split_once('=').unwrap();
            states[graph.node(name).unwrap()] = state.parse().unwrap();
        }
        let decision = decide(&graph, &states);
        let label = if step.is_empty() { "(b c d reopened)" } else { step };
        writeln!(out, "{label:<24} {}", render_decision(&graph, &decision)).unwrap();
        states = applied(&states, &decision);
    }
    expect![[r#"
        (b c d reopened)         start b; skip -; end none
        b=succeeded              start c; skip -; end none
        c=succeeded x=succeeded  start d; skip -; end none
        d=succeeded              start -; skip -; end success
    "#]]
    .assert_eq(&out);
}

#[test]
fn ten_levels_of_ten_nodes_run_to_the_end() {
    const LEVELS: usize = 10;
    const WIDTH: usize = 10;
    let nodes: Vec<String> =
        (0..LEVELS * WIDTH).map(|index| format!("n{}_{}", index / WIDTH, index % WIDTH)).collect();
    let mut edges = Vec::new();
    for level in 1..LEVELS {
        for to in 0..WIDTH {
            for from in 0..WIDTH {
                edges.push(format!("n{}_{from} -> n{level}_{to}", level - 1));
            }
        }
    }
    let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
    let graph = graph(&nodes.join(" "), &edges);
    assert_eq!(graph.roots().count(), WIDTH);

    let mut states = vec![NodeState::Waiting; graph.node_count()];
    let mut started = vec![0; graph.node_count()];
    let mut decisions = 0;
    let end = loop {
        let decision = decide(&graph, &states);
        decisions += 1;
        assert!(decision.skip.is_empty(), "{decision:?}");
        for &index in &decision.start {
            started[index] += 1;
            for upstream in graph.upstream(index) {
                assert_eq!(states[upstream], NodeState::Succeeded, "{} too early", nodes[index]);
            }
            states[index] = NodeState::Running;
        }
        if let Some(end) = decision.end {
            break end;
        }
        // One node ends per decision, the highest index running first: most decisions see a
        // level partly ended, and must start nothing of the next.
        let running = (0..states.len()).rev().find(|&index| states[index] == NodeState::Running);
        states[running.unwrap()] = NodeState::Succeeded;
    };
    assert_eq!(end, Outcome::Success);
    assert!(started.iter().all(|&count| count == 1), "{started:?}");
    assert_eq!(decisions, LEVELS * WIDTH + 1);
}

#[test]
fn spellings_round_trip() {
    for &condition in Condition::ALL {
        assert_eq!(condition.as_str().parse::<Condition>(), Ok(condition));
        let json = serde_json::to_string(&condition).unwrap();
        assert_eq!(json, format!("\"{condition}\""));
    }
    for &state in NodeState::ALL {
        assert_eq!(state.as_str().parse::<NodeState>(), Ok(state));
        assert_eq!(state.is_done(), !matches!(state, NodeState::Waiting | NodeState::Running));
    }
    expect![[r#"
        unknown Condition `on-success`, expected one of: on_success, on_failure, always
        unknown NodeState `done`, expected one of: waiting, running, succeeded, failed, skipped"#]]
    .assert_eq(&format!(
        "{}\n{}",
        "on-success".parse::<Condition>().unwrap_err(),
        "done".parse::<NodeState>().unwrap_err()
    ));
}
