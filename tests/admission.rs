//! The bound on unfinished runs against a real platform on 127.0.0.1: at the bound, triggers
//! get 503 `overloaded` with `Retry-After` and the scheduler holds its fires; once runs end,
//! both go on.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, TestApp, backends, sample_job};

async fn trigger(api: &Api, job_id: i64, param: &str) -> reqwest::Response {
    api.http
        .post(api.url(&format!("/api/v1/jobs/{job_id}/trigger")))
        .bearer_auth(&api.token)
        .json(&json!({"param": param}))
        .send()
        .await
        .unwrap()
}

async fn runs_of(api: &Api, job_id: i64) -> Vec<Value> {
    let (status, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"].as_array().cloned().unwrap_or_default()
}

/// The value of the admin's `wasmjob_admission_refusals_total` for `source` (0 before any).
async fn refusals(api: &Api, source: &str) -> f64 {
    let reply = api.http.get(api.url("/metrics")).bearer_auth(&api.token).send().await.unwrap();
    let text = reply.text().await.unwrap();
    let wanted = format!("wasmjob_admission_refusals_total{{source=\"{source}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_bound_triggers_are_refused_and_fires_held_until_runs_end() {
    for backend in backends() {
        let app = TestApp::start_with(backend, |config| config.max_unfinished_runs = Some(2)).await;
        let api = &app.api;
        let hello = api.create_job(json!({"name": "hello"})).await;
        assert_eq!(api.upload(hello, sample_job("hello")).await.0, StatusCode::CREATED);

        // Two sleeping runs, of two jobs, fill the bound; the next trigger is refused, saying
        // why and when to come back, and creates no run.
        let mut long_runs = Vec::new();
        for name in ["sleeper one", "sleeper two"] {
            let sleeper = api.create_job(json!({"name": name})).await;
            assert_eq!(api.upload(sleeper, sample_job("sleeper")).await.0, StatusCode::CREATED);
            let reply = trigger(api, sleeper, "3600000").await;
            assert_eq!(reply.status(), StatusCode::OK);
            let body: Value = reply.json().await.unwrap();
            long_runs.push(body["log_ids"][0].as_i64().unwrap());
        }
        let refused = trigger(api, hello, "refused").await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()["retry-after"], "1");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "overloaded", "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("--max-unfinished-runs"), "{message}");
        assert_eq!(runs_of(api, hello).await, Vec::<Value>::new());

        // A job firing every second is held: the scheduler counts the held passes and makes
        // no run while the bound stands.
        let every_second = api
            .create_job(json!({"name": "every second", "schedule_type": "CRON", "schedule_conf": "* * * * * ?"}))
            .await;
        assert_eq!(api.upload(every_second, sample_job("hello")).await.0, StatusCode::CREATED);
        let before = refusals(api, "schedule").await;
        let (status, job) =
            api.post(&format!("/api/v1/jobs/{every_second}/start"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{job}");
        api.wait_until("the scheduler holds a pass", || async {
            (refusals(api, "schedule").await > before).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(runs_of(api, every_second).await, Vec::<Value>::new());

        // The long runs are killed: triggers are admitted again and the job fires again.
        for run in &long_runs {
            let (status, body) = api.post(&format!("/api/v1/logs/{run}/kill"), json!({})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(api.finished_run(*run).await["state"], "killed");
        }
        api.wait_until("the job fires again", || async {
            let runs = runs_of(api, every_second).await;
            runs.iter().any(|run| run["state"] == "success").then_some(())
        })
        .await;
        let (status, _) = api.post(&format!("/api/v1/jobs/{every_second}/stop"), json!({})).await;
        assert_eq!(status, StatusCode::OK);
        let again = api
            .wait_until("a trigger is admitted", || async {
                let reply = trigger(api, hello, "admitted").await;
                (reply.status() == StatusCode::OK).then_some(reply)
            })
            .await;
        let body: Value = again.json().await.unwrap();
        let run = api.finished_run(body["log_ids"][0].as_i64().unwrap()).await;
        assert_eq!(run["handle_msg"], "hello, admitted", "{run}");
        app.stop().await;
    }
}
