//! Workload (w): a workflow of `--levels` (10) levels of `--width` (10) nodes, each node a run of
//! the sample job, every node of a level waiting for every node of the level before, triggered
//! `--repeats` (5) times one after the other.
//!
//! It prints `w.trigger_to_end_p50_ms`/`_p99_ms` (the trigger's answer to the workflow run's
//! end, as the API shows it, polled every 10 ms), `w.node_lateness_p50_ms`/`_p99_ms` (from the end of a node's last
//! upstream run, as the admin recorded it, to the executor's start of the node's first run) and
//! `w.admin_cpu_ms_per_node` over the whole workload.

use std::time::Instant;

use serde_json::json;
use sqlx::Row;

use super::{Platform, fetch_all, print_percentiles};

pub async fn dag(platform: &Platform, levels: usize, width: usize, repeats: usize) {
    let body = json!({"group_id": 1, "name": "node", "schedule_type": "NONE", "param": "bench"});
    // One job per column: the nodes of a level run at once, each on its own job's queue.
    let jobs = platform.create_jobs(width, body, true).await;
    let name = |level: usize, column: usize| format!("l{level}c{column}");
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for level in 0..levels {
        for (column, job) in jobs.iter().enumerate() {
            nodes.push(json!({"name": name(level, column), "job_id": job}));
            if level == 0 {
                continue;
            }
            for from in 0..width {
                edges.push(json!({"from": name(level - 1, from), "to": name(level, column)}));
            }
        }
    }
    let spec = json!({"name": "bench", "group_id": 1, "nodes": nodes, "edges": edges});
    let workflow = platform.post("/api/v1/workflows", spec).await;
    let workflow = workflow["id"].as_i64().unwrap_or_else(|| panic!("creating: {workflow}"));

    let cpu_before = platform.cpu_secs().0;
    let mut ends = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..repeats {
        let started = Instant::now();
        let run = platform.post(&format!("/api/v1/workflows/{workflow}/trigger"), json!({})).await;
        let run = run["workflow_run_id"].as_i64().unwrap_or_else(|| panic!("trigger: {run}"));
        // The list of the workflow's runs is the cheap read of a run's state (the run's own
        // page reads its nodes and their runs), polled every 10 ms.
        loop {
            let runs = platform.get(&format!("/api/v1/workflows/{workflow}/runs")).await;
            let state = runs["items"].as_array().and_then(|items| {
                items.iter().find(|item| item["id"].as_i64() == Some(run)).cloned()
            });
            let state = state.unwrap_or_default();
            match state["state"].as_str() {
                Some("running") => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
                Some("success") => break,
                _ => panic!("workflow run {run} did not succeed: {state}"),
            }
            assert!(started.elapsed().as_secs() < 600, "workflow run {run} is still running");
        }
        ends.push(started.elapsed().as_millis() as i64);
        runs.push(run);
    }
    let cpu = platform.cpu_secs().0 - cpu_before;

    // Each node's first start, and each node's last end, per workflow run.
    let pool = platform.db().await;
    let rows = fetch_all(
        &pool,
        "select workflow_run_id, workflow_node, started_at, handle_time from runs
         where workflow_run_id is not null",
        &[],
    )
    .await
    .unwrap();
    let mut started: std::collections::HashMap<(i64, i64), i64> = Default::default();
    let mut ended: std::collections::HashMap<(i64, i64), i64> = Default::default();
    for row in rows {
        let key = (row.get::<i64, _>("workflow_run_id"), row.get::<i64, _>("workflow_node"));
        let (start, end): (i64, i64) = (row.get("started_at"), row.get("handle_time"));
        let first = started.entry(key).or_insert(start);
        *first = (*first).min(start);
        let last = ended.entry(key).or_insert(end);
        *last = (*last).max(end);
    }
    let mut lateness = Vec::new();
    for run in &runs {
        for level in 1..levels {
            for column in 0..width {
                let node = (level * width + column) as i64;
                let Some(start) = started.get(&(*run, node)) else { continue };
                let upstream = (0..width).filter_map(|from| {
                    ended.get(&(*run, ((level - 1) * width + from) as i64)).copied()
                });
                if let Some(last) = upstream.max() {
                    lateness.push(start - last);
                }
            }
        }
    }
    println!("w.workflow_runs: {repeats}");
    println!("w.nodes: {}", levels * width);
    print_percentiles("w.trigger_to_end", Some(ends));
    print_percentiles("w.node_lateness", Some(lateness));
    let per_node = cpu * 1000.0 / (repeats * levels * width) as f64;
    println!("w.admin_cpu_ms_per_node: {per_node:.2}");
}
