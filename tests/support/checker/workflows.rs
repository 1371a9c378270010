//! The workflow figures of the fault tests, read from the workflow tables and the runs of their
//! nodes after a scenario: every one must be 0.
//!
//! The scenarios retry no node by hand, so each node that ran has one round.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::Value;
use sqlx::Row;
use wasmjob::storage::testing::fetch_all;

/// What the workflow tables say.
#[derive(Debug, Default)]
pub struct WorkflowReport {
    /// Workflow runs, by state.
    pub workflow_runs: BTreeMap<String, u64>,
    /// Nodes that have runs.
    pub nodes_started: u64,
    /// Workflow runs still `running`.
    pub unfinished_workflow_runs: u64,
    /// Nodes started in more than one round, or with two first attempts of one shard.
    pub nodes_started_twice: u64,
    /// Nodes whose first run was created before a run of an upstream node had ended.
    pub nodes_started_early: u64,
    /// Skipped nodes with runs.
    pub skipped_nodes_run: u64,
    /// Nodes whose state is not what their runs say, or that wait in an ended workflow run,
    /// and workflow runs whose end is not what their nodes say.
    pub states_not_matching_runs: u64,
    /// Successful runs of a `join` node whose message does not hold every upstream output.
    pub joins_missing_inputs: u64,
    /// A few offending cases per figure.
    pub examples: BTreeMap<&'static str, Vec<String>>,
}

impl WorkflowReport {
    /// Panics, showing the report, if a figure is not 0.
    pub fn assert_clean(&self, scenario: &str) {
        let bad = [
            self.unfinished_workflow_runs,
            self.nodes_started_twice,
            self.nodes_started_early,
            self.skipped_nodes_run,
            self.states_not_matching_runs,
            self.joins_missing_inputs,
        ];
        assert!(bad.iter().all(|n| *n == 0), "{scenario}: workflow faults found:\n{self}");
    }

    fn note(&mut self, figure: &'static str, example: String) {
        let list = self.examples.entry(figure).or_default();
        if list.len() < 5 {
            list.push(example);
        }
    }
}

impl fmt::Display for WorkflowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs: Vec<String> =
            self.workflow_runs.iter().map(|(state, n)| format!("{state} {n}")).collect();
        writeln!(f, "workflow runs: {}", runs.join(", "))?;
        let figures = [
            ("nodes_started", self.nodes_started),
            ("unfinished_workflow_runs", self.unfinished_workflow_runs),
            ("nodes_started_twice", self.nodes_started_twice),
            ("nodes_started_early", self.nodes_started_early),
            ("skipped_nodes_run", self.skipped_nodes_run),
            ("states_not_matching_runs", self.states_not_matching_runs),
            ("joins_missing_inputs", self.joins_missing_inputs),
        ];
        for (name, value) in figures {
            writeln!(f, "{name}: {value}")?;
            if let Some(examples) = self.examples.get(name) {
                writeln!(f, "  e.g. {}", examples.join("; "))?;
            }
        }
        Ok(())
    }
}

/// A node's run.
struct NodeRun {
    round: i64,
    shard: i64,
    attempt: i64,
    state: String,
    created_at: i64,
    handle_time: i64,
    message: String,
}

/// A node of a workflow run.
#[derive(Default)]
struct Node {
    state: String,
    round: i64,
    output: String,
    runs: Vec<NodeRun>,
}

/// Reads the workflow tables and counts.
pub async fn check_workflows(database_url: &str) -> WorkflowReport {
    let pool = super::connect(database_url).await;
    let mut report = WorkflowReport::default();
    let mut specs: HashMap<i64, (String, Value)> = HashMap::new();
    for row in fetch_all(&pool, "select id, state, spec from workflow_runs", &[]).await.unwrap() {
        let state: String = row.get("state");
        *report.workflow_runs.entry(state.clone()).or_default() += 1;
        let spec: String = row.get("spec");
        specs.insert(row.get("id"), (state, serde_json::from_str(&spec).unwrap()));
    }
    let mut nodes: BTreeMap<(i64, i64), Node> = BTreeMap::new();
    let sql = "select workflow_run_id, node, state, round, output from workflow_nodes";
    for row in fetch_all(&pool, sql, &[]).await.unwrap() {
        let node = Node {
            state: row.get("state"),
            round: row.get("round"),
            output: row.get("output"),
            runs: Vec::new(),
        };
        nodes.insert((row.get("workflow_run_id"), row.get("node")), node);
    }
    let sql = "select workflow_run_id, workflow_node, workflow_round, shard_index, attempt, state,
        created_at, handle_time, handle_msg from runs where workflow_run_id is not null";
    for row in fetch_all(&pool, sql, &[]).await.unwrap() {
        let key = (row.get("workflow_run_id"), row.get("workflow_node"));
        let run = NodeRun {
            round: row.get("workflow_round"),
            shard: row.get("shard_index"),
            attempt: row.get("attempt"),
            state: row.get("state"),
            created_at: row.get("created_at"),
            handle_time: row.get("handle_time"),
            message: row.get("handle_msg"),
        };
        nodes.entry(key).or_default().runs.push(run);
    }
    pool.close().await;

    for (&id, (state, spec)) in &specs {
        let names: Vec<&str> =
            spec["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        let index = |name: &str| names.iter().position(|n| *n == name).unwrap() as i64;
        let edges: Vec<(i64, i64, &str)> = spec["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let condition = e["condition"].as_str().unwrap_or("on_success");
                (index(e["from"].as_str().unwrap()), index(e["to"].as_str().unwrap()), condition)
            })
            .collect();
        if state == "running" {
            report.unfinished_workflow_runs += 1;
            report.note("unfinished_workflow_runs", format!("workflow run {id}"));
        }
        let mut unhandled_failure = false;
        for (at, name) in names.iter().enumerate() {
            let at = at as i64;
            let Some(node) = nodes.get(&(id, at)) else { continue };
            let what = format!("workflow run {id} node {name}");
            if !node.runs.is_empty() {
                report.nodes_started += 1;
            }
            let mut first_attempts = BTreeMap::new();
            for run in node.runs.iter().filter(|run| run.attempt == 0) {
                *first_attempts.entry((run.round, run.shard)).or_insert(0) += 1;
            }
            if node.round > 1
                || first_attempts.values().any(|n| *n > 1)
                || node.runs.iter().any(|run| run.round != node.round)
            {
                report.nodes_started_twice += 1;
                report.note("nodes_started_twice", format!("{what}: round {}", node.round));
            }
            if node.state == "skipped" && !node.runs.is_empty() {
                report.skipped_nodes_run += 1;
                report.note("skipped_nodes_run", what.clone());
            }
            let started = node.runs.iter().map(|run| run.created_at).min();
            for &(from, _, _) in edges.iter().filter(|(_, to, _)| *to == at) {
                let upstream = nodes.get(&(id, from));
                let ended = upstream.and_then(|up| up.runs.iter().map(|run| run.handle_time).max());
                if let (Some(started), Some(ended)) = (started, ended)
                    && started < ended
                {
                    report.nodes_started_early += 1;
                    report.note("nodes_started_early", format!("{what}: {started} < {ended}"));
                }
            }
            let expected = expected_state(node, state == "killed");
            if expected.as_deref().is_some_and(|expected| expected != node.state) {
                report.states_not_matching_runs += 1;
                report.note(
                    "states_not_matching_runs",
                    format!("{what}: {} but runs say {expected:?}", node.state),
                );
            }
            if node.state == "failed"
                && !edges.iter().any(|(from, _, c)| *from == at && *c == "on_failure")
            {
                unhandled_failure = true;
            }
            if *name == "join" {
                count_join(&mut report, &what, node, &names, &edges, at, |from| {
                    nodes.get(&(id, from))
                });
            }
        }
        let expected_end = if unhandled_failure { "failed" } else { "success" };
        if state != "running" && state != "killed" && state != expected_end {
            report.states_not_matching_runs += 1;
            report.note(
                "states_not_matching_runs",
                format!("workflow run {id}: {state}, nodes say {expected_end}"),
            );
        }
    }
    report
}

/// What a node's state should be once its workflow run ended, from its runs; `None` when its
/// runs do not decide it (it has none).
fn expected_state(node: &Node, killed: bool) -> Option<String> {
    if node.runs.is_empty() {
        // Waiting or starting in an ended workflow run is never right; skipped or failed
        // without runs (a job gone) is.
        return match node.state.as_str() {
            "waiting" | "starting" | "running" if !killed => Some("done".to_owned()),
            _ => None,
        };
    }
    if node
        .runs
        .iter()
        .any(|run| ["pending", "dispatching", "running"].contains(&run.state.as_str()))
    {
        return Some("running".to_owned());
    }
    let mut latest: BTreeMap<i64, (i64, &str)> = BTreeMap::new();
    for run in node.runs.iter().filter(|run| run.round == node.round) {
        let entry = latest.entry(run.shard).or_insert((run.attempt, &run.state));
        if run.attempt > entry.0 {
            *entry = (run.attempt, &run.state);
        }
    }
    let succeeded = latest.values().all(|(_, state)| *state == "success");
    Some(if succeeded { "succeeded" } else { "failed" }.to_owned())
}

/// A successful `join` run's message must be its upstream nodes' stored outputs, as the
/// `joiner` sample writes them.
fn count_join<'a>(
    report: &mut WorkflowReport,
    what: &str,
    node: &Node,
    names: &[&str],
    edges: &[(i64, i64, &str)],
    at: i64,
    upstream: impl Fn(i64) -> Option<&'a Node>,
) {
    let mut entries = Vec::new();
    for &(from, _, _) in edges.iter().filter(|(_, to, _)| *to == at) {
        let Some(up) = upstream(from) else { continue };
        let outputs: Vec<Value> = serde_json::from_str(&up.output).unwrap_or_default();
        let shards: Vec<String> = outputs
            .iter()
            .map(|o| format!("{}={}", o["shard"], o["message"].as_str().unwrap_or_default()))
            .collect();
        entries.push(format!("{}/{}: {}", names[from as usize], up.state, shards.join(",")));
    }
    let expected = entries.join("; ");
    for run in node.runs.iter().filter(|run| run.state == "success") {
        if run.message != expected {
            report.joins_missing_inputs += 1;
            report.note(
                "joins_missing_inputs",
                format!("{what}: `{}`, expected `{expected}`", run.message),
            );
        }
    }
}
