//! The bound on unfinished runs against a real platform on 127.0.0.1: at the bound, triggers
//! get 503 `overloaded` with `Retry-After` and the scheduler holds the fires of jobs with runs
//! in flight, not of the others; once runs end, both go on.

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
async fn at_the_bound_triggers_are_refused_and_jobs_with_runs_in_flight_held() {
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

        // Past the bound, a job whose runs pile up is held, and one whose runs finish keeps
        // its schedule: a job that sleeps an hour every second fires once and then waits, the
        // scheduler counting its held passes, while a job of `hello` every second goes on.
        let piling = api
            .create_job(json!({"name": "piling up", "schedule_type": "CRON",
                "schedule_conf": "* * * * * ?", "param": "3600000"}))
            .await;
        assert_eq!(api.upload(piling, sample_job("sleeper")).await.0, StatusCode::CREATED);
        let every_second = api
            .create_job(json!({"name": "every second", "schedule_type": "CRON", "schedule_conf": "* * * * * ?"}))
            .await;
        assert_eq!(api.upload(every_second, sample_job("hello")).await.0, StatusCode::CREATED);
        let before = refusals(api, "schedule").await;
        for job in [piling, every_second] {
            let (status, body) = api.post(&format!("/api/v1/jobs/{job}/start"), json!({})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        api.wait_until("the job whose runs finish fires past the bound", || async {
            let runs = runs_of(api, every_second).await;
            (runs.iter().filter(|run| run["state"] == "success").count() >= 3).then_some(())
        })
        .await;
        assert!(refusals(api, "schedule").await > before);
        let piled = runs_of(api, piling).await;
        assert_eq!(piled.len(), 1, "{piled:?}");
        assert_eq!(piled[0]["state"], "running", "{piled:?}");
        long_runs.push(piled[0]["id"].as_i64().unwrap());

        // The long runs are killed: the held job fires again, and triggers are admitted again.
        for run in &long_runs {
            let (status, body) = api.post(&format!("/api/v1/logs/{run}/kill"), json!({})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(api.finished_run(*run).await["state"], "killed");
        }
        api.wait_until("the held job fires again", || async {
            (runs_of(api, piling).await.len() >= 2).then_some(())
        })
        .await;
        let (status, _) = api.post(&format!("/api/v1/jobs/{piling}/stop"), json!({})).await;
        assert_eq!(status, StatusCode::OK);
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
