//! Concurrency caps through the real admin and executor on 127.0.0.1, on each database: runs
//! past a job's or a group's cap wait at the admin, held, and are released in order; the block
//! strategy decides what a cap means (`SERIAL_EXECUTION` waits, `DISCARD_LATER` skips,
//! `COVER_EARLY` kills the oldest).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::runs::{sent_ms, time_ms};
use crate::support::{Api, TestApp, backends, sample_job};

/// A `sleeper` job with `fields`, its component uploaded.
async fn sleeper(api: &Api, fields: Value) -> i64 {
    let job_id = api.create_job(fields).await;
    let (status, version) = api.upload(job_id, sample_job("sleeper")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    job_id
}

async fn trigger(api: &Api, job_id: i64, param: &str) -> i64 {
    let (status, reply) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply["log_ids"][0].as_i64().unwrap()
}

async fn run(api: &Api, id: i64) -> Value {
    let (status, run) = api.get(&format!("/api/v1/logs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    run
}

/// Waits until run `id` is pending and held by its cap.
async fn held(api: &Api, id: i64) -> Value {
    api.wait_until(&format!("run {id} is held"), || async {
        let run = run(api, id).await;
        (run["state"] == "pending" && run["held"] == true).then_some(run)
    })
    .await
}

/// A job capped at one: three runs triggered at once run one after the other, in order, each
/// sent only after the one before it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_at_its_cap_runs_one_at_a_time_in_order() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let job_id = sleeper(api, json!({"name": "one at a time", "max_concurrent_runs": 1})).await;
        let first = trigger(api, job_id, "600").await;
        let second = trigger(api, job_id, "100").await;
        let third = trigger(api, job_id, "100").await;
        held(api, third).await;
        let runs = [api.finished_run(first).await, api.finished_run(second).await];
        let last = api.finished_run(third).await;
        for (before, after) in runs.iter().zip(runs.iter().skip(1).chain([&last])) {
            assert_eq!((&before["state"], &after["state"]), (&json!("success"), &json!("success")));
            assert!(
                sent_ms(after) >= time_ms(&before["handle_time"]),
                "run {} went out before run {} ended:\n{before}\n{after}",
                after["id"],
                before["id"]
            );
            assert_eq!(after["held"], false, "{after}");
        }
        app.stop().await;
    }
}

/// `DISCARD_LATER` at the cap ends the new run skipped, with the reason, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_later_at_the_cap_skips_the_new_run() {
    let app = TestApp::start(crate::support::Backend::Sqlite).await;
    let api = &app.api;
    let fields =
        json!({"name": "discarding", "max_concurrent_runs": 1, "block_strategy": "DISCARD_LATER"});
    let job_id = sleeper(api, fields).await;
    let first = trigger(api, job_id, "1500").await;
    api.wait_until("the first run is in flight", || async {
        matches!(run(api, first).await["state"].as_str(), Some("dispatching" | "running"))
            .then_some(())
    })
    .await;
    let second = trigger(api, job_id, "100").await;
    let skipped = api.finished_run(second).await;
    assert_eq!(skipped["state"], "skipped", "{skipped}");
    assert!(skipped["handle_msg"].as_str().unwrap().contains("its cap"), "{skipped}");
    assert!(skipped["executor_address"].is_null(), "never sent: {skipped}");
    assert_eq!(api.finished_run(first).await["state"], "success");
    app.stop().await;
}

/// `COVER_EARLY` at the cap kills the oldest run, and the new one runs once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cover_early_at_the_cap_kills_the_oldest_run() {
    let app = TestApp::start(crate::support::Backend::Sqlite).await;
    let api = &app.api;
    let fields =
        json!({"name": "covering", "max_concurrent_runs": 1, "block_strategy": "COVER_EARLY"});
    let job_id = sleeper(api, fields).await;
    let old = trigger(api, job_id, "20000").await;
    api.wait_until("the old run is running", || async {
        (run(api, old).await["state"] == "running").then_some(())
    })
    .await;
    let new = trigger(api, job_id, "100").await;
    let killed = api.finished_run(old).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    let ran = api.finished_run(new).await;
    assert_eq!(ran["state"], "success", "{ran}");
    assert!(sent_ms(&ran) >= time_ms(&killed["handle_time"]), "{killed}\n{ran}");
    app.stop().await;
}

/// A group's cap counts the runs of all its jobs; a held run is released when a run of another
/// job of the group ends, and a cap raised through the API makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_cap_spans_its_jobs() {
    let app = TestApp::start(crate::support::Backend::Sqlite).await;
    let api = &app.api;
    let (status, group) = api.get("/api/v1/groups/1").await;
    assert_eq!(status, StatusCode::OK, "{group}");
    let mut body = json!({"app_name": group["app_name"], "title": group["title"],
                          "address_type": group["address_type"], "addresses": group["addresses"],
                          "max_concurrent_runs": 1});
    let reply = api.http.put(api.url("/api/v1/groups/1")).bearer_auth(&api.token).json(&body);
    let reply = reply.send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let a = sleeper(api, json!({"name": "a"})).await;
    let b = sleeper(api, json!({"name": "b"})).await;
    let first = trigger(api, a, "800").await;
    let second = trigger(api, b, "100").await;
    held(api, second).await;
    let ended = api.finished_run(first).await;
    let released = api.finished_run(second).await;
    assert!(sent_ms(&released) >= time_ms(&ended["handle_time"]), "{ended}\n{released}");

    // Two held runs, then the cap goes up to 3: both are released at once.
    let long = trigger(api, a, "20000").await;
    let (x, y) = (trigger(api, b, "100").await, trigger(api, b, "100").await);
    held(api, y).await;
    body["max_concurrent_runs"] = json!(3);
    let reply = api.http.put(api.url("/api/v1/groups/1")).bearer_auth(&api.token).json(&body);
    assert_eq!(reply.send().await.unwrap().status(), StatusCode::OK);
    // The change releases them while the long run still runs.
    for id in [x, y] {
        assert_eq!(api.finished_run(id).await["state"], "success");
    }
    let long_run = run(api, long).await;
    let in_flight = matches!(long_run["state"].as_str(), Some("dispatching" | "running"));
    assert!(in_flight, "the raised cap made room: {long_run}");
    let (status, reply) = api.post(&format!("/api/v1/logs/{long}/kill"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (status, reply) = api.get("/api/v1/groups/1").await;
    assert_eq!((status, &reply["max_concurrent_runs"]), (StatusCode::OK, &json!(3)));
    app.stop().await;
}
