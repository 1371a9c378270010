//! Workflows with real components on 127.0.0.1: a DAG whose sharded middle node joins once every
//! shard ended, outputs carried with the run, a failed node retried by hand, a killed run, and
//! the refusals of the API.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, backends, sample_job};

/// Creates the workflow `body` (in group 1); its id.
async fn create(app: &TestApp, body: Value) -> i64 {
    let (status, workflow) = app.api.post("/api/v1/workflows", body).await;
    assert_eq!(status, StatusCode::CREATED, "{workflow}");
    workflow["id"].as_i64().unwrap()
}

/// Triggers workflow `id`; the run's id.
async fn trigger(app: &TestApp, id: i64) -> i64 {
    let (status, run) = app.api.post(&format!("/api/v1/workflows/{id}/trigger"), json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    run["workflow_run_id"].as_i64().unwrap()
}

/// Workflow run `id` once it is in `state`.
async fn run_in(app: &TestApp, id: i64, state: &str) -> Value {
    app.api
        .wait_until(&format!("workflow run {id} is {state}"), || async {
            let (_, run) = app.api.get(&format!("/api/v1/workflow-runs/{id}")).await;
            (run["state"] == state).then_some(run)
        })
        .await
}

/// The node named `name` of workflow run `run`.
fn node<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["nodes"].as_array().unwrap().iter().find(|node| node["name"] == name).unwrap()
}

fn states(run: &Value) -> Vec<String> {
    let nodes = run["nodes"].as_array().unwrap();
    nodes
        .iter()
        .map(|node| {
            format!("{}={}", node["name"].as_str().unwrap(), node["state"].as_str().unwrap())
        })
        .collect()
}

fn ids(node: &Value) -> Vec<i64> {
    node["log_ids"].as_array().unwrap().iter().map(|id| id.as_i64().unwrap()).collect()
}

/// A three-level DAG with a broadcast middle node on two executors: the last node starts once,
/// after both shards ended, and the middle node's output holds both shards' messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_middle_node_joins_once_and_the_last_node_runs_once() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let second_dir = tempfile::tempdir().unwrap();
        let config = crate::support::app::executor_config(&api.base, second_dir.path().to_owned());
        let second = wasmjob::executor::start(config).await.unwrap();
        api.wait_for_executors(2).await;
        let extract = api.create_job(json!({"name": "extract", "param": "extract"})).await;
        let transform = api
            .create_job(json!({"name": "transform", "route_strategy": "SHARDING_BROADCAST"}))
            .await;
        let load = api.create_job(json!({"name": "load"})).await;
        for job in [extract, transform] {
            api.upload(job, sample_job("hello")).await;
        }
        api.upload(load, sample_job("joiner")).await;
        let workflow = create(
            &app,
            json!({
                "name": "etl", "group_id": 1,
                "nodes": [
                    {"name": "extract", "job_id": extract},
                    {"name": "transform", "job_id": transform, "param": "shard"},
                    {"name": "load", "job_id": load, "param": "load"},
                    {"name": "alert", "job_id": load, "param": "alert"},
                    {"name": "quiet", "job_id": load, "pass_inputs": false},
                ],
                "edges": [
                    {"from": "extract", "to": "transform"},
                    {"from": "transform", "to": "load"},
                    {"from": "transform", "to": "alert", "condition": "on_failure"},
                    {"from": "transform", "to": "quiet"},
                ],
            }),
        )
        .await;
        let id = trigger(&app, workflow).await;
        let run = run_in(&app, id, "success").await;
        assert_eq!(
            states(&run),
            [
                "extract=succeeded",
                "transform=succeeded",
                "load=succeeded",
                "alert=skipped",
                "quiet=succeeded"
            ],
            "{backend:?}: {run}"
        );
        let shards = ids(node(&run, "transform"));
        assert_eq!(shards.len(), 2, "{run}");
        let loads = ids(node(&run, "load"));
        assert_eq!(loads.len(), 1, "the join starts once: {run}");
        assert!(ids(node(&run, "alert")).is_empty());
        // The last node's run was created after every shard had ended.
        let (_, last) = api.get(&format!("/api/v1/logs/{}", loads[0])).await;
        assert_eq!(
            (last["trigger_type"].as_str(), last["param"].as_str()),
            (Some("WORKFLOW"), Some("load"))
        );
        for shard in &shards {
            let (_, shard) = api.get(&format!("/api/v1/logs/{shard}")).await;
            assert_eq!(shard["handle_code"], 200, "{shard}");
            assert!(
                shard["handle_time"].as_str() <= last["trigger_time"].as_str(),
                "{shard} {last}"
            );
        }
        let output = &node(&run, "transform")["output"];
        assert_eq!(
            output,
            &json!([{"shard": 0, "message": "hello, shard"}, {"shard": 1, "message": "hello, shard"}])
        );
        // The join got every shard's output through its `workflow` import; a node that does
        // not pass inputs got none.
        assert_eq!(
            last["handle_msg"], "transform/succeeded: 0=hello, shard,1=hello, shard",
            "{last}"
        );
        let quiet = ids(node(&run, "quiet"));
        let (_, quiet) = api.get(&format!("/api/v1/logs/{}", quiet[0])).await;
        assert_eq!(quiet["handle_msg"], "no inputs", "{quiet}");
        // Only this workflow's runs were created: one per node, two shards.
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={load}")).await;
        assert_eq!(page["total"], 2, "{page}");
        let (_, listed) = api.get(&format!("/api/v1/workflows/{workflow}/runs")).await;
        assert_eq!(listed["items"][0]["state"], "success", "{listed}");
        second.stop().await;
        app.stop().await;
    }
}

/// A failed node retried by hand runs again with its job's current version, and the workflow
/// goes on from it; a killed workflow run kills its running node and starts nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_retried_by_hand_continues_and_a_kill_starts_nothing() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let first = api.create_job(json!({"name": "first"})).await;
    api.upload(first, sample_job("fail")).await;
    let second = api.create_job(json!({"name": "second", "param": "10000"})).await;
    api.upload(second, sample_job("sleeper")).await;
    let third = api.create_job(json!({"name": "third"})).await;
    api.upload(third, sample_job("hello")).await;
    let workflow = create(
        &app,
        json!({
            "name": "chain", "group_id": 1,
            "nodes": [
                {"name": "first", "job_id": first},
                {"name": "second", "job_id": second},
                {"name": "third", "job_id": third},
            ],
            "edges": [{"from": "first", "to": "second"}, {"from": "second", "to": "third"}],
        }),
    )
    .await;
    let id = trigger(&app, workflow).await;
    let failed = run_in(&app, id, "failed").await;
    assert_eq!(states(&failed), ["first=failed", "second=skipped", "third=skipped"]);

    // Only a failed node is retried.
    let (status, refused) =
        api.post(&format!("/api/v1/workflow-runs/{id}/nodes/second/retry"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let (status, _) =
        api.post(&format!("/api/v1/workflow-runs/{id}/nodes/nope/retry"), json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    api.upload(first, sample_job("hello")).await;
    let (status, retried) =
        api.post(&format!("/api/v1/workflow-runs/{id}/nodes/first/retry"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{retried}");
    assert_eq!(retried["state"], "running", "{retried}");
    let running = app
        .api
        .wait_until("the second node runs", || async {
            let (_, run) = api.get(&format!("/api/v1/workflow-runs/{id}")).await;
            let node = node(&run, "second");
            let started = !ids(node).is_empty();
            let (_, log) =
                api.get(&format!("/api/v1/logs/{}", ids(node).first().copied().unwrap_or(0))).await;
            (started && log["state"] == "running").then_some(run)
        })
        .await;
    assert_eq!(node(&running, "first")["round"], 2, "{running}");
    assert_eq!(node(&running, "first")["state"], "succeeded", "{running}");

    let (status, killed) = api.post(&format!("/api/v1/workflow-runs/{id}/kill"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{killed}");
    assert_eq!(killed["runs_killed"], 1, "{killed}");
    let (status, _) = api.post(&format!("/api/v1/workflow-runs/{id}/kill"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a killed run is killed once");
    let sleeping = ids(node(&running, "second"))[0];
    let ended = api.finished_run(sleeping).await;
    assert_ne!(ended["state"], "success", "{ended}");
    let run = app
        .api
        .wait_until("the second node ends", || async {
            let (_, run) = api.get(&format!("/api/v1/workflow-runs/{id}")).await;
            (node(&run, "second")["state"] == "failed").then_some(run)
        })
        .await;
    assert_eq!(run["state"], "killed");
    assert_eq!(states(&run), ["first=succeeded", "second=failed", "third=skipped"]);
    let (_, page) = api.get(&format!("/api/v1/logs?job_id={third}")).await;
    assert_eq!(page["total"], 0, "a killed workflow run starts nothing: {page}");
    let (status, _) =
        api.post(&format!("/api/v1/workflow-runs/{id}/nodes/second/retry"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing of a killed run starts again");
    app.stop().await;
}

/// What the API refuses, each time naming the culprit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_strangers_and_unknown_jobs_are_refused_by_name() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job = api.create_job(json!({"name": "one"})).await;
    let (_, group) = api.post("/api/v1/groups", json!({"app_name": "other"})).await;
    let other_group = group["id"].as_i64().unwrap();
    let stranger = api.create_job(json!({"name": "theirs", "group_id": other_group})).await;
    let nodes = json!([{"name": "a", "job_id": job}, {"name": "b", "job_id": job}, {"name": "c", "job_id": job}]);
    let cases = [
        (
            json!({"name": "loop", "group_id": 1, "nodes": nodes, "edges": [
                {"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "a"}]}),
            "the edges form a cycle: a → b → c → a",
        ),
        (
            json!({"name": "x", "group_id": 1, "nodes": [{"name": "a", "job_id": stranger}]}),
            &*format!(
                "node `a` runs job {stranger} of group {other_group}, not of the workflow's group 1"
            ),
        ),
        (
            json!({"name": "x", "group_id": 1, "nodes": [{"name": "a", "job_id": 999}]}),
            "node `a` runs job 999, which does not exist",
        ),
        (
            json!({"name": "x", "group_id": 1, "nodes": nodes, "edges": [{"from": "a", "to": "b", "condition": "sometimes"}]}),
            "edges[0].condition",
        ),
        (json!({"name": "x", "group_id": 1, "nodes": []}), "a workflow needs at least one node"),
        (json!({"name": " ", "group_id": 1, "nodes": nodes}), "name: 1 to 200 characters"),
        (
            json!({"name": "x", "group_id": 1, "nodes": [{"name": "a\0", "job_id": job}]}),
            "names hold no NUL character",
        ),
    ];
    for (body, message) in cases {
        let (status, refused) = api.post("/api/v1/workflows", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {refused}");
        assert_eq!(refused["code"], "invalid_workflow", "{refused}");
        assert!(refused["message"].as_str().unwrap().contains(message), "{refused}");
    }
    let (status, _) = api.post("/api/v1/workflows", json!({"name": "x"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = api.post("/api/v1/workflows/999/trigger", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.get("/api/v1/workflow-runs/999").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The document round-trips: what was created is what is read, for export and import.
    let body = json!({"name": "fan", "group_id": 1, "nodes": nodes, "edges": [
        {"from": "a", "to": "b"}, {"from": "a", "to": "c", "condition": "always"}]});
    let id = create(&app, body.clone()).await;
    let (_, read) = api.get(&format!("/api/v1/workflows/{id}")).await;
    for field in ["name", "group_id", "nodes", "edges"] {
        assert_eq!(read[field], body[field], "{field}: {read}");
    }
    let (_, listed) = api.get("/api/v1/workflows?group_id=1").await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    app.stop().await;
}

/// A workflow with a schedule fires on it once started, as a job does, and stops firing when
/// stopped; a schedule that is not one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_workflow_fires_on_its_schedule_until_stopped() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job = api.create_job(json!({"name": "tick"})).await;
    api.upload(job, sample_job("hello")).await;
    let nodes = json!([{"name": "tick", "job_id": job}]);
    for (schedule_type, conf, message) in [
        ("CRON", "not cron", "cron"),
        ("FIX_DELAY", "5", "FIX_DELAY is a job's only"),
        ("SOMETIMES", "", "schedule_type"),
        ("NONE", "\0", "no NUL character"),
    ] {
        let body = json!({"name": "x", "group_id": 1, "nodes": nodes,
            "schedule_type": schedule_type, "schedule_conf": conf});
        let (status, refused) = api.post("/api/v1/workflows", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert_eq!(refused["code"], "invalid_schedule", "{refused}");
        assert!(refused["message"].as_str().unwrap().contains(message), "{refused}");
    }
    let manual = create(&app, json!({"name": "by hand", "group_id": 1, "nodes": nodes})).await;
    let (status, _) = api.post(&format!("/api/v1/workflows/{manual}/start"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "NONE never fires on its own");

    let body = json!({"name": "every second", "group_id": 1, "nodes": nodes,
        "schedule_type": "CRON", "schedule_conf": "* * * * * ?"});
    let id = create(&app, body).await;
    let (_, read) = api.get(&format!("/api/v1/workflows/{id}")).await;
    assert_eq!(
        (read["running"].as_bool(), read["misfire_strategy"].as_str()),
        (Some(false), Some("DO_NOTHING"))
    );
    let (status, started) = api.post(&format!("/api/v1/workflows/{id}/start"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert!(started["next_fire"].is_string(), "{started}");
    let runs = api
        .wait_until("the workflow fires twice", || async {
            let (_, runs) = api.get(&format!("/api/v1/workflows/{id}/runs")).await;
            let items = runs["items"].as_array().cloned().unwrap_or_default();
            let ended = items.iter().filter(|run| run["state"] == "success").count();
            (ended >= 2).then_some(items)
        })
        .await;
    assert!(runs.iter().all(|run| run["trigger_type"] == "CRON"), "{runs:?}");
    let (status, stopped) = api.post(&format!("/api/v1/workflows/{id}/stop"), json!({})).await;
    assert_eq!((status, stopped["running"].as_bool()), (StatusCode::OK, Some(false)), "{stopped}");
    let (_, before) = api.get(&format!("/api/v1/workflows/{id}/runs")).await;
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let (_, after) = api.get(&format!("/api/v1/workflows/{id}/runs")).await;
    assert_eq!(before["items"].as_array().unwrap().len(), after["items"].as_array().unwrap().len());
    app.stop().await;
}
