//! Workflow scenarios: workflow runs triggered every few hundred milliseconds through the API
//! while an admin dies where a join is decided and its runs are created, or an executor of a
//! sharded node dies mid-run; then the run checker's figures and the workflow figures
//! (`checker::workflows`), every one 0.
//!
//! The workflow: `root` → `wide` (a broadcast over every executor, each shard sleeping half a
//! second) → `join` (the `joiner`
//! sample, whose message must hold both shards' outputs) → `tail`, and `root` → `alert` on
//! failure.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use wasmjob::admin::now_ms;

use super::{
    Crash, Plan, Role, SERIAL, TERMINAL_BOUND_MS, TIMEOUT_SECS, inflict, jitter, process, settle,
    upload,
};
use crate::support::checker::workflows::check_workflows;
use crate::support::checker::{self, Check};
use crate::support::cluster::Cluster;
use crate::support::{Api, sample_job};

/// The single admin on SQLite dies where a join's runs are about to be created (the decision
/// committed, the runs not), mid-callback and at random; workflow runs keep being triggered
/// through it whenever it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_while_joins_are_decided() {
    let crashes: &[(Role, &[Crash])] = &[(
        Role::Admin(0),
        &[
            Crash::at("workflow.before_start=abort@6", 6_000),
            Crash::sigkill(3_000),
            Crash::at("callback.mid_batch=abort@10", 6_000),
            Crash::at("workflow.before_start=abort@9", 6_000),
        ],
    )];
    run(None, 1, 0, crashes, "workflow joins through admin kills").await;
}

/// An executor that runs a shard of the broadcast node is killed again and again: its shards
/// are lost, their node fails, and what follows is skipped, never started twice or early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_killed_in_a_sharded_node() {
    let crashes: &[(Role, &[Crash])] = &[(
        Role::Executor(1),
        &[Crash::sigkill(3_000), Crash::sigkill(4_000), Crash::sigkill(3_500)],
    )];
    run(None, 1, 0, crashes, "workflow shards through executor kills").await;
}

/// [`executor_killed_in_a_sharded_node`] with executors that pull their runs: the shards reach
/// them over their polls, and the killed one polls again under the same `pull://` address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulling_executor_killed_in_a_sharded_node() {
    let crashes: &[(Role, &[Crash])] = &[(
        Role::Executor(1),
        &[Crash::sigkill(3_000), Crash::sigkill(4_000), Crash::sigkill(3_500)],
    )];
    let name = "workflow shards through kills of pulling executors";
    run_pulling(None, 1, 0, crashes, name, true).await;
}

/// Two admins on PostgreSQL share the workflow runs: the results of one node's shards reach
/// either, and one of them is killed again and again, also where joins are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_on_postgres_one_killed_while_joins_are_decided() {
    let Some(url) = wasmjob::storage::testing::postgres_database("wffault").await.unwrap() else {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping the two-admin workflow scenario");
        return;
    };
    let crashes: &[(Role, &[Crash])] = &[(
        Role::Admin(0),
        &[
            Crash::sigkill(3_000),
            Crash::at("workflow.before_start=abort@4", 5_000),
            Crash::sigkill(3_500),
            Crash::at("callback.mid_batch=abort@6", 5_000),
        ],
    )];
    run(Some(url), 2, 1, crashes, "workflow joins on two admins on PostgreSQL, one killed").await;
}

/// Runs one scenario: `admins` admins (the API spoken to `api_admin`), two executors.
async fn run(
    url: Option<String>,
    admins: usize,
    api_admin: usize,
    crashes: &[(Role, &[Crash])],
    name: &str,
) {
    run_pulling(url, admins, api_admin, crashes, name, false).await;
}

/// [`run`], with executors that pull their runs when `pull` is true.
async fn run_pulling(
    url: Option<String>,
    admins: usize,
    api_admin: usize,
    crashes: &[(Role, &[Crash])],
    name: &str,
    pull: bool,
) {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start_pulling(url, admins, 2, pull).await;
    let api = cluster.api_of(api_admin);
    api.wait_for_executors(2).await;
    let workflow = create_workflow(&api).await;

    let mut plans = Vec::new();
    for (role, planned) in crashes {
        let first = planned.first().map_or("", |crash| crash.failpoints);
        process(&mut cluster, *role).restart(first).await;
        plans.push(Plan {
            role: *role,
            queue: planned.iter().copied().collect(),
            since: Instant::now(),
            jitter_ms: jitter(),
        });
    }
    api.wait_for_executors(2).await;

    // Triggers go on whatever dies: a trigger the admin could not take is not counted.
    let chaos_for = Duration::from_secs(18);
    let trigger_url = format!("{}/api/v1/workflows/{workflow}/trigger", api.base);
    let (http, token) = (api.http.clone(), api.token.clone());
    let triggers = tokio::spawn(async move {
        let until = Instant::now() + chaos_for;
        let mut accepted = 0u64;
        while Instant::now() < until {
            let sent = http.post(&trigger_url).bearer_auth(&token).json(&json!({})).send().await;
            if sent.is_ok_and(|reply| reply.status() == 201) {
                accepted += 1;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        accepted
    });
    for plan in &mut plans {
        plan.since = Instant::now();
    }
    let mut log = String::new();
    let unplanned = inflict(&mut cluster, &mut plans, chaos_for, &mut log).await;
    let accepted = triggers.await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    settle(&cluster.database_url).await;
    // A node left starting by a death is started by the sweep (every 5 s, after 10 s).
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut workflows = check_workflows(&cluster.database_url).await;
    while workflows.unfinished_workflow_runs > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        settle(&cluster.database_url).await;
        workflows = check_workflows(&cluster.database_url).await;
    }
    let check = Check {
        database_url: cluster.database_url.clone(),
        executor_dirs: cluster.executor_dirs(),
        executor_deaths: cluster.executors.iter().map(|proc| proc.deaths.clone()).collect(),
        windows: Vec::new(),
        end_margin_ms: 0,
        terminal_bound_ms: TERMINAL_BOUND_MS,
        now_ms: now_ms(),
    };
    let report = checker::check(&check).await;
    eprintln!("== fault scenario: {name}\n{log}triggers accepted: {accepted}\n{report}{workflows}");
    let total: u64 = workflows.workflow_runs.values().sum();
    cluster.finish().await;
    assert!(unplanned.is_empty(), "{name}: unplanned deaths: {unplanned:?}");
    assert!(accepted > 10, "{name}: only {accepted} workflow runs were triggered");
    assert!(
        total >= accepted,
        "{name}: {accepted} triggers accepted, {total} workflow runs stored"
    );
    report.assert_clean(name);
    workflows.assert_clean(name);
}

/// The scenario's jobs and workflow; its id.
async fn create_workflow(api: &Api) -> i64 {
    let mut jobs = Vec::new();
    // The broadcast node's shards take half a second, so that kills land while they run.
    for (name, sample, route, param) in [
        ("root", "hello", "ROUND", "root"),
        ("wide", "sleeper", "SHARDING_BROADCAST", "500"),
        ("join", "joiner", "ROUND", ""),
        ("tail", "hello", "ROUND", "tail"),
        ("alert", "hello", "ROUND", "alert"),
    ] {
        let fields = json!({"name": name, "route_strategy": route, "timeout_secs": TIMEOUT_SECS, "param": param});
        let job = api.create_job(fields).await;
        upload(api, job, sample_job(sample)).await;
        jobs.push(job);
    }
    let nodes: Vec<_> = ["root", "wide", "join", "tail", "alert"]
        .iter()
        .zip(&jobs)
        .map(|(name, job)| json!({"name": name, "job_id": job}))
        .collect();
    let body = json!({
        "name": "fault", "group_id": 1, "nodes": nodes,
        "edges": [
            {"from": "root", "to": "wide"},
            {"from": "wide", "to": "join"},
            {"from": "join", "to": "tail"},
            {"from": "root", "to": "alert", "condition": "on_failure"},
        ],
    });
    let (status, workflow) = api.post("/api/v1/workflows", body).await;
    assert_eq!(status, 201, "{workflow}");
    workflow["id"].as_i64().unwrap()
}
