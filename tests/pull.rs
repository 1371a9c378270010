//! Executors that pull their runs (`wasmjob executor --pull`): no address the admin can call,
//! and every call the admin makes to a push executor (runs, kills, log reads, probes) made over
//! the executor's own long polls. (Kills of pulling executor processes are the fault harness's:
//! `fault::pulling_executor_killed_mid_run`.)

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wasmjob::admin;
use wasmjob::executor::{self, Executor};

use crate::support::app::executor_config;
use crate::support::{ACCESS_TOKEN, Api, Backend, TestApp, sample_job};
use wasmjob::protocol::ACCESS_TOKEN_HEADER;

/// A pull executor beside the test app's push executor, under the same group.
async fn start_pulling(app: &TestApp, dir: &std::path::Path, name: &str) -> Executor {
    // By name: each address the name resolves to gets a poll (the admin answers at one).
    let by_name = app.api.base.replace("127.0.0.1", "localhost");
    let mut config = executor_config(&by_name, dir.join(name));
    config.pull = true;
    config.address = Some(format!("pull://{name}"));
    // A beat a second, so that the admin sees it online and offline quickly.
    config.heartbeat_interval = Duration::from_secs(1);
    executor::start(config).await.unwrap()
}

async fn job_with(api: &Api, sample: &str, fields: Value) -> i64 {
    let mut body = json!({"name": sample, "glue_type": "GLUE_WASM"});
    for (key, value) in fields.as_object().unwrap() {
        body[key] = value.clone();
    }
    let id = api.create_job(body).await;
    let (status, version) = api.upload(id, sample_job(sample)).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    id
}

/// Posts `registration` to the executor-facing `/api/registry`, as an executor would.
async fn register(api: &Api, registration: &Value) -> Value {
    let reply = api.http.post(api.url("/api/registry")).header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN);
    reply.json(registration).send().await.unwrap().json().await.unwrap()
}

async fn trigger(api: &Api, job_id: i64, param: &str) -> Vec<i64> {
    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    triggered["log_ids"].as_array().unwrap().iter().map(|id| id.as_i64().unwrap()).collect()
}

/// Two pull executors and a push one in one group: the API says which is which;
/// runs go to a pull executor by route and by broadcast, their logs are read through the
/// executor's polls, a kill reaches a pulled run, and a pull executor that stops polling is
/// no longer sent anything while the others still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_executors_run_log_and_kill_like_push_executors() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let dir = tempfile::tempdir().unwrap();
    let first = start_pulling(&app, dir.path(), "first").await;
    let second = start_pulling(&app, dir.path(), "second").await;
    assert_eq!(first.address, "pull://first");
    api.wait_for_executors(3).await;

    // The registry says which executors pull, and that they poll this admin.
    let (_, executors) = api.get("/api/v1/executors").await;
    let modes: Vec<(String, String, Value)> = executors
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let address = e["address"].as_str().unwrap().to_owned();
            (address, e["mode"].as_str().unwrap().to_owned(), e["polling_this_admin"].clone())
        })
        .collect();
    for (address, mode, polling) in &modes {
        match address.starts_with("pull://") {
            true => assert_eq!((mode.as_str(), polling), ("pull", &json!(true)), "{executors}"),
            false => assert_eq!((mode.as_str(), polling), ("push", &Value::Null), "{executors}"),
        }
    }

    // A broadcast reaches all three executors, each shard once; the pulled shards' logs are
    // read through their executors' polls.
    let broadcast = job_with(api, "hello", json!({"route_strategy": "SHARDING_BROADCAST"})).await;
    let shards = trigger(api, broadcast, "everyone").await;
    assert_eq!(shards.len(), 3);
    let mut went_to = Vec::new();
    for log_id in &shards {
        let run = api.finished_run(*log_id).await;
        assert_eq!(run["handle_code"], json!(200), "{run}");
        went_to.push(run["executor_address"].as_str().unwrap().to_owned());
        let (status, page) = api.get(&format!("/api/v1/logs/{log_id}/content?from_line=1")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page["content"].as_str().unwrap().contains("everyone"), "{page}");
    }
    went_to.sort();
    assert!(went_to[1..] == ["pull://first", "pull://second"], "{went_to:?}");

    // A run routed to a pull executor, killed while it sleeps: the kill goes over the poll too.
    let sleeper = job_with(api, "sleeper", json!({"route_strategy": "LAST"})).await;
    let log_id = trigger(api, sleeper, "3600000").await[0];
    api.wait_until("the sleeper sleeps", || async {
        let (_, page) = api.get(&format!("/api/v1/logs/{log_id}/content?from_line=1")).await;
        page["content"].as_str().is_some_and(|text| text.contains("sleeping")).then_some(())
    })
    .await;
    let (_, run) = api.get(&format!("/api/v1/logs/{log_id}")).await;
    assert!(run["executor_address"].as_str().unwrap().starts_with("pull://"), "{run}");
    let (status, body) = api.post(&format!("/api/v1/logs/{log_id}/kill"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["scope"], "run", "{body}");
    let run = api.finished_run(log_id).await;
    assert_eq!(run["handle_msg"], json!("killed: the run was stopped on request"), "{run}");

    // The second pull executor stops: it deregisters and stops polling, and broadcasts go to
    // the two left.
    second.stop().await;
    api.wait_for_executors(2).await;
    let shards = trigger(api, broadcast, "two left").await;
    assert_eq!(shards.len(), 2);
    for log_id in shards {
        let run = api.finished_run(log_id).await;
        assert_eq!(run["handle_code"], json!(200), "{run}");
        assert_ne!(run["executor_address"], json!("pull://second"), "{run}");
    }
    first.stop().await;
    app.stop().await;
}

/// A pull executor whose admin restarts polls again when it is back, and runs what it is sent;
/// a run sent to a pull executor that does not poll is not delivered and fails at once, as a run
/// sent to a push executor whose port is closed does; a pull address must be a plain name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_executor_reconnects_and_one_gone_is_not_sent_to() {
    let mut app = TestApp::start(Backend::Sqlite).await;
    // Only the pull executor is in the group: the push one is stopped first.
    app.executor.take().unwrap().stop().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = app.admin.take().unwrap();
    let config = (*admin.state.config).clone();
    let puller = start_pulling(&app, dir.path(), "only").await;
    app.api.wait_for_executors(1).await;
    let job = job_with(&app.api, "hello", json!({})).await;
    let log_id = trigger(&app.api, job, "before").await[0];
    assert_eq!(app.api.finished_run(log_id).await["handle_code"], json!(200));

    // The admin restarts on the same port and database; the executor's polls fail meanwhile,
    // then reach the new admin.
    let listen = admin.local_addr;
    admin.stop().await;
    let config = wasmjob::config::AdminConfig { listen, ..config };
    let admin = admin::start(config).await.unwrap();
    app.api
        .wait_until("the pull executor polls the restarted admin", || async {
            let (_, executors) = app.api.get("/api/v1/executors").await;
            (executors[0]["polling_this_admin"] == json!(true)).then_some(())
        })
        .await;
    let log_id = trigger(&app.api, job, "after").await[0];
    let run = app.api.finished_run(log_id).await;
    assert_eq!(run["handle_code"], json!(200), "{run}");

    // An executor registered as pull://ghost that never polls: a run sent to it is not
    // delivered, and its trigger says so at once (as a refused connection would).
    puller.stop().await;
    let ghost = json!({"registryGroup": "EXECUTOR", "registryKey": "default",
        "registryValue": "pull://ghost"});
    let reply = register(&app.api, &ghost).await;
    assert_eq!(reply["code"], json!(200), "{reply}");
    app.api.wait_for_executors(1).await;
    let log_id = trigger(&app.api, job, "ghost").await[0];
    let run = app.api.finished_run(log_id).await;
    assert_eq!(run["executor_address"], json!("pull://ghost"), "{run}");
    assert_ne!(run["handle_code"], json!(200), "{run}");
    let said = run["trigger_msg"].as_str().unwrap_or_default();
    assert!(said.contains("not connected to this admin"), "{run}");

    // A pull address that is not a plain name is refused at registration.
    let mut bad = ghost.clone();
    bad["registryValue"] = json!("pull://a/b");
    let reply = register(&app.api, &bad).await;
    assert_eq!(reply["code"], json!(500), "{reply}");
    assert!(reply["msg"].as_str().unwrap().contains("found `/`"), "{reply}");
    admin.stop().await;
}
