//! Retry intervals and backoff, through `wasmjob standalone` as a real process: a retry waits
//! out its job's interval as a pending run, that wait survives a killed admin, and the waits
//! grow as the job's backoff says.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use reqwest::StatusCode;

use crate::support::runs::{sent_ms, time_ms};
use crate::support::standalone::{spawn_standalone, stop_gracefully};
use crate::support::{Api, sample_job, wait_until};

fn api(base: String, data_dir: &std::path::Path) -> Api {
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    Api { http: reqwest::Client::new(), base, token: token.trim().to_owned() }
}

/// The job's runs, oldest first.
async fn runs_of(api: &Api, job_id: i64) -> Vec<Value> {
    let (status, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&limit=100")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let mut runs = page["items"].as_array().unwrap().clone();
    runs.sort_by_key(|run| run["id"].as_i64());
    runs
}

/// The wait a retry was given: from the end of the run it retries to its own instant.
fn wait_ms(failed: &Value, retry: &Value) -> i64 {
    time_ms(&retry["trigger_time"]) - time_ms(&failed["handle_time"])
}

fn kill_9(pid: u32) {
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

/// A failing job with two retries, 4 s apart and doubling: the first retry waits pending with
/// its due time while the standalone is SIGKILLed and restarted, then runs when due; the second
/// waits twice as long. Each wait is the interval less at most a tenth (the jitter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_out_their_backoff_across_a_killed_admin() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (standalone, url) = spawn_standalone(&data_dir);
    let api = api(url, &data_dir);
    let (status, job) = api
        .post(
            "/api/v1/jobs",
            json!({"group_id": 1, "name": "flaky", "schedule_type": "NONE", "retry_count": 2,
                   "retry_interval_secs": 4, "retry_backoff": "EXPONENTIAL",
                   "retry_max_interval_secs": 60}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(
        (&job["retry_interval_secs"], &job["retry_backoff"], &job["retry_max_interval_secs"]),
        (&json!(4), &json!("EXPONENTIAL"), &json!(60))
    );
    let job_id = job["id"].as_i64().unwrap();
    let (status, version) = api.upload(job_id, sample_job("fail")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let (status, trigger) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "down"})).await;
    assert!(status.is_success(), "{trigger}");

    // The first run fails; its retry waits, pending, with its due time in the run's JSON.
    let (failed, retry) = wait_until("the first retry waits", || async {
        match runs_of(&api, job_id).await.as_slice() {
            [failed, retry] if retry["state"] == "pending" => Some((failed.clone(), retry.clone())),
            _ => None,
        }
    })
    .await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!((&retry["trigger_type"], &retry["attempt"]), (&json!("RETRY"), &json!(1)));
    assert_eq!(retry["due_at"], retry["trigger_time"], "{retry}");
    let first_wait = wait_ms(&failed, &retry);
    assert!((3_500..=4_100).contains(&first_wait), "first wait {first_wait} ms: {retry}");

    // The admin dies while the retry waits; the retry is in the database, not in its memory.
    kill_9(standalone.id());
    drop(standalone);
    let (standalone, url) = spawn_standalone(&data_dir);
    let api = Api { base: url, ..api };

    let runs = wait_until("both retries end", || async {
        let runs = runs_of(&api, job_id).await;
        (runs.len() == 3 && runs.iter().all(|run| run["state"] == "failed")).then_some(runs)
    })
    .await;
    let (retry, second) = (&runs[1], &runs[2]);
    assert_eq!(retry["id"], runs[1]["id"], "the same retry run, not a new one");
    assert!(
        sent_ms(retry) >= time_ms(&retry["trigger_time"]),
        "the retry was sent only once due: {retry}"
    );
    assert!(retry.get("due_at").is_none(), "a sent run is no longer due: {retry}");
    assert_eq!((&second["attempt"], &second["parent_run_id"]), (&json!(2), &retry["id"]));
    let second_wait = wait_ms(retry, second);
    assert!((7_100..=8_100).contains(&second_wait), "second wait {second_wait} ms: {second}");
    assert!(sent_ms(second) >= time_ms(&second["trigger_time"]), "{second}");

    // No third retry: the job has two.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs_of(&api, job_id).await.len(), 3);
    stop_gracefully(standalone);
}
