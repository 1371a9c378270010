//! The admin's side of the run lifecycle, one test per way a run used to be lost, stranded or
//! doubled: each puts a run in the state that broke and checks it now ends properly.
//!
//! Runs are placed in their starting state through storage and `lifecycle` (as a dispatcher
//! that then died would have left them); everything after that goes through the real admin:
//! its executor API, its sweep, its operator API.

use reqwest::StatusCode;
use serde_json::{Value, json};
use wasmjob::admin::{Admin, now_ms};
use wasmjob::lifecycle::Event;
use wasmjob::model::{RunState, TriggerType};
use wasmjob::storage::NewRun;

use crate::support::runs::{manual_run, running_run};
use crate::support::{ACCESS_TOKEN, Backend, TestApp, backends, sample_job};

fn admin(app: &TestApp) -> &Admin {
    app.admin.as_ref().unwrap()
}

async fn executor_api(app: &TestApp, path: &str, body: Value) -> Value {
    let reply = reqwest::Client::new()
        .post(app.api.url(path))
        .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    reply.json().await.unwrap()
}

/// An executor restarted at the same address forgets its runs; its first beat says what it
/// holds, and the admin ends the rest as lost, with their retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_an_executor_no_longer_holds_end_lost_and_retry() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "reconciled", "retry_count": 1})).await;
    let (_, version) = app.api.upload(job_id, sample_job("hello")).await;
    let db = &admin(&app).state.db;
    let restarted = "http://127.0.0.1:1";
    let long_ago = now_ms() - 60_000;
    let run = NewRun {
        version: Some((1, version["sha256"].as_str().unwrap().to_owned())),
        ..manual_run(job_id, long_ago)
    };
    let forgotten = running_run(db, &run, restarted, long_ago, 0).await;
    let held = running_run(db, &run, restarted, long_ago, 0).await;

    let beat = json!({"registryGroup": "EXECUTOR", "registryKey": "other", "registryValue": restarted, "heldRuns": [held]});
    let reply = executor_api(&app, "/api/registry", beat).await;
    assert_eq!(reply["code"], 200, "{reply}");

    let lost = app.api.finished_run(forgotten).await;
    assert_eq!(lost["state"], "lost", "{lost}");
    assert!(lost["handle_msg"].as_str().unwrap().contains("no longer holds it"), "{lost}");
    let (_, still) = app.api.get(&format!("/api/v1/logs/{held}")).await;
    assert_eq!(still["state"], "running", "a held run is left alone: {still}");
    // The retry follows the lost run and runs on the live executor.
    let retry = app
        .api
        .wait_until("the retry of the lost run succeeds", || async {
            let (_, page) =
                app.api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            page["items"].as_array().and_then(|items| {
                items.iter().find(|run| run["parent_run_id"].as_i64() == Some(forgotten)).cloned()
            })
        })
        .await;
    assert_eq!(
        (retry["trigger_type"].as_str(), retry["attempt"].as_i64()),
        (Some("RETRY"), Some(1))
    );
    app.stop().await;
}

/// The admin enforces the job's timeout itself: a run whose executor never reports ends timed
/// out once the timeout and the grace period have passed, even while that executor is online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_past_their_deadline_time_out() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "silent", "timeout_secs": 1})).await;
    let online = app.executor.as_ref().unwrap().address.clone();
    let db = &admin(&app).state.db;
    let at = now_ms() - 2_000 - wasmjob::admin::RESULT_GRACE_MS;
    // Grace 0 in the record above: the deadline is the send plus one second, long past.
    let id = running_run(db, &manual_run(job_id, at), &online, at, 1).await;
    let run = app.api.finished_run(id).await;
    assert_eq!(
        (run["state"].as_str(), run["handle_code"].as_i64()),
        (Some("timed_out"), Some(502))
    );
    app.stop().await;
}

/// A result that names another fire time than its run's (the result of an earlier run that had
/// the same id, in a database that lost commits) is acknowledged and not applied; the run's own
/// result then is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_of_another_fire_under_the_same_id_is_not_applied() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "reused id"})).await;
    let db = &admin(&app).state.db;
    let at = now_ms();
    let id = running_run(db, &manual_run(job_id, at), "http://127.0.0.1:1", at, 0).await;
    let earlier = at - 3_600_000;
    let stale =
        json!([{"logId": id, "logDateTim": earlier, "handleCode": 500, "handleMsg": "old"}]);
    let reply = executor_api(&app, "/api/callback", stale).await;
    assert_eq!(reply["code"], 200, "acknowledged, so that its executor forgets it: {reply}");
    let (_, run) = app.api.get(&format!("/api/v1/logs/{id}")).await;
    assert_eq!((run["state"].as_str(), run["handle_code"].as_i64()), (Some("running"), Some(0)));
    let own = json!([{"logId": id, "logDateTim": at, "handleCode": 200, "handleMsg": "its own"}]);
    let reply = executor_api(&app, "/api/callback", own).await;
    assert_eq!(reply["code"], 200, "{reply}");
    let (_, run) = app.api.get(&format!("/api/v1/logs/{id}")).await;
    assert_eq!(
        (run["state"].as_str(), run["handle_msg"].as_str()),
        (Some("success"), Some("its own"))
    );
    app.stop().await;
}

/// One result that the database would refuse (a NUL byte, for PostgreSQL) or that does not
/// parse cannot hold back the rest of its batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_result_does_not_block_its_batch() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let job_id = app.api.create_job(json!({"name": "poisoned"})).await;
        let db = &admin(&app).state.db;
        let now = now_ms();
        let a = running_run(db, &manual_run(job_id, now), "http://127.0.0.1:1", now, 0).await;
        let b = running_run(db, &manual_run(job_id, now), "http://127.0.0.1:1", now, 0).await;
        let body = format!(
            r#"[{{"logId":{a},"logDateTim":0,"handleCode":500,"handleMsg":"nul \u0000 and lone \ud800"}},
                {{"logId":"not a number"}},
                {{"logId":{b},"logDateTim":0,"handleCode":200,"handleMsg":"fine"}}]"#
        );
        let reply = reqwest::Client::new()
            .post(app.api.url("/api/callback"))
            .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        assert_eq!(reply["code"], 500, "the refused entry is reported: {reply}");
        let (_, first) = app.api.get(&format!("/api/v1/logs/{a}")).await;
        assert_eq!(
            (first["state"].as_str(), first["handle_msg"].as_str()),
            (Some("failed"), Some("nul \u{fffd} and lone \u{fffd}")),
            "{backend:?}"
        );
        let (_, second) = app.api.get(&format!("/api/v1/logs/{b}")).await;
        assert_eq!(second["state"], "success", "{backend:?}: {second}");
        app.stop().await;
    }
}

/// Runs on a MANUAL group's executors (which do not beat) used to fill the lost-run monitor's
/// first page for good; now each offline executor's runs are looked at through an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_long_runs_do_not_hide_a_lost_one() {
    let app = TestApp::start(Backend::Sqlite).await;
    let (status, group) = app
        .api
        .post(
            "/api/v1/groups",
            json!({"app_name": "static", "title": "Static", "address_type": "MANUAL", "addresses": ["http://127.0.0.1:2"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let manual_job = app
        .api
        .create_job(json!({"name": "static", "group_id": group["id"].as_i64().unwrap()}))
        .await;
    let job_id = app.api.create_job(json!({"name": "orphan"})).await;
    let db = &admin(&app).state.db;
    let long_ago = now_ms() - 120_000;
    for _ in 0..120 {
        running_run(db, &manual_run(manual_job, long_ago), "http://127.0.0.1:2", long_ago, 0).await;
    }
    let orphan =
        running_run(db, &manual_run(job_id, long_ago), "http://127.0.0.1:3", long_ago, 0).await;
    let run = app.api.finished_run(orphan).await;
    assert_eq!(run["state"], "lost", "{run}");
    let (_, page) =
        app.api.get(&format!("/api/v1/logs?job_id={manual_job}&status=running&limit=1")).await;
    assert_eq!(page["total"], 120, "a MANUAL group's runs are not judged by heartbeats");
    app.stop().await;
}

/// A fire committed just before its job was stopped ends skipped: not a failure, no retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_jobs_last_fire_is_skipped_not_failed() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app
        .api
        .create_job(json!({"name": "stopped", "schedule_type": "CRON", "schedule_conf": "0 0 0 1 1 ?", "retry_count": 3}))
        .await;
    let now = now_ms();
    let fire = NewRun {
        trigger_type: TriggerType::Cron,
        fire_time_ms: Some(now),
        ..manual_run(job_id, now)
    };
    let id = admin(&app).state.db.create_run(&fire, now).await.unwrap().unwrap();
    let run = app.api.finished_run(id).await;
    assert_eq!(
        (run["state"].as_str(), run["handle_code"].as_i64()),
        (Some("skipped"), Some(200)),
        "{run}"
    );
    let (_, page) = app.api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
    assert_eq!(page["total"], 1, "no retry follows a skip: {page}");
    app.stop().await;
}

/// A kill that arrives while a run is being sent is held until the executor has the run, instead
/// of ending the record while the run starts anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_the_send_waits_for_the_executor() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "in flight"})).await;
    let admin = admin(&app);
    let now = now_ms();
    let id = admin
        .state
        .db
        .create_run(&manual_run(job_id, now + 3_600_000), now)
        .await
        .unwrap()
        .unwrap();
    let claim =
        admin.state.db.claim_run(id, "sender", now, now + 3_600_000).await.unwrap().unwrap();

    let (status, reply) = app.api.post(&format!("/api/v1/logs/{id}/kill"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(reply["message"].as_str().unwrap().starts_with("kill requested"), "{reply}");
    let (_, run) = app.api.get(&format!("/api/v1/logs/{id}")).await;
    assert_eq!(
        (run["state"].as_str(), run["kill_requested"].as_bool()),
        (Some("dispatching"), Some(true))
    );

    // The sender's outcome decides: here no executor took it, so it ends killed, not failed.
    let not_sent = Event::NotSent { reason: "no executor online".to_owned() };
    let lease = Some(("sender", claim.fence));
    let ended = admin.state.dispatcher.apply(id, not_sent, lease, None).await.unwrap().unwrap();
    assert_eq!(ended.state, RunState::Killed);
    app.stop().await;
}

/// A job cannot list itself, or a job that leads back to it, as a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_job_cycles_are_refused() {
    let app = TestApp::start(Backend::Sqlite).await;
    let first = app.api.create_job(json!({"name": "first"})).await;
    let second = app.api.create_job(json!({"name": "second", "child_job_ids": [first]})).await;
    for children in [vec![second], vec![first]] {
        let reply = reqwest::Client::new()
            .put(app.api.url(&format!("/api/v1/jobs/{first}")))
            .bearer_auth(&app.api.token)
            .json(&json!({"group_id": 1, "name": "first", "schedule_type": "NONE", "child_job_ids": children}))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::BAD_REQUEST);
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["code"], "child_job_cycle", "{body}");
        assert!(body["message"].as_str().unwrap().contains(&format!("{first} →")), "{body}");
    }
    let (_, job) = app.api.get(&format!("/api/v1/jobs/{first}")).await;
    assert_eq!(job["child_job_ids"], json!([]), "nothing changed");
    app.stop().await;
}

/// An executor without wasmjob's `/runs` (an XXL-JOB executor answers that it has no such
/// mapping) gets one `/run` per run, and its runs run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_without_the_batch_extension_gets_one_run_per_request() {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;

    #[derive(Clone, Default)]
    struct XxlExecutor {
        paths: Arc<Mutex<Vec<String>>>,
        runs: Arc<Mutex<Vec<i64>>>,
    }
    async fn batch(State(executor): State<XxlExecutor>) -> axum::Json<Value> {
        executor.paths.lock().unwrap().push("runs".to_owned());
        axum::Json(json!({"code": 500, "msg": "invalid request, uri-mapping(/runs) not found."}))
    }
    async fn run(
        State(executor): State<XxlExecutor>,
        axum::Json(param): axum::Json<Value>,
    ) -> axum::Json<Value> {
        executor.paths.lock().unwrap().push("run".to_owned());
        executor.runs.lock().unwrap().push(param["logId"].as_i64().unwrap());
        axum::Json(json!({"code": 200, "msg": null}))
    }
    let executor = XxlExecutor::default();
    let router = axum::Router::new()
        .route("/runs", post(batch))
        .route("/run", post(run))
        .with_state(executor.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let app = TestApp::start(Backend::Sqlite).await;
    let (status, group) = app
        .api
        .post(
            "/api/v1/groups",
            json!({"app_name": "xxl", "address_type": "MANUAL", "addresses": [address]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let job_id = app
        .api
        .create_job(json!({"name": "legacy", "group_id": group["id"], "glue_type": "BEAN", "handler": "demoJobHandler"}))
        .await;
    let mut log_ids = Vec::new();
    for _ in 0..3 {
        let (status, triggered) =
            app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{triggered}");
        let log_id = triggered["log_ids"][0].as_i64().unwrap();
        log_ids.push(log_id);
        app.api
            .wait_until("the run is recorded as running", || async {
                let (_, run) = app.api.get(&format!("/api/v1/logs/{log_id}")).await;
                (run["state"] == "running").then_some(())
            })
            .await;
    }
    let mut received = executor.runs.lock().unwrap().clone();
    received.sort_unstable();
    assert_eq!(received, log_ids);
    // Asked for `/runs` once; after its refusal, single `/run`s only.
    let paths = executor.paths.lock().unwrap().clone();
    assert_eq!(paths.iter().filter(|path| *path == "runs").count(), 1, "{paths:?}");
    app.stop().await;
}
