//! Walks through the platform that more than one test takes.

use reqwest::StatusCode;
use serde_json::json;

use super::{Api, sample_job};

/// The walking skeleton's path: upload `hello`, fire it every second, read the runs and their
/// logs, then trigger it by hand with a param. Shared with the standalone-process test.
pub async fn cron_then_manual(api: &Api) {
    let job_id = api
        .create_job(json!({"name": "hello every second", "schedule_type": "CRON", "schedule_conf": "* * * * * ?", "param": "cron"}))
        .await;
    let (status, version) = api.upload(job_id, sample_job("hello")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    assert_eq!((version["version"].as_i64(), version["active"].as_bool()), (Some(1), Some(true)));
    let (status, job) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    assert_eq!((status, job["running"].as_bool()), (StatusCode::OK, Some(true)), "{job}");

    let succeeded = api
        .wait_until("two cron runs succeed", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            let items = page["items"].as_array().cloned().unwrap_or_default();
            (items.len() >= 2).then_some(items)
        })
        .await;
    for run in &succeeded {
        assert_eq!(run["handle_msg"], "hello, cron", "{run}");
        assert_eq!(run["trigger_type"], "CRON");
        // A fire may be sent ahead of its instant and held by the executor: it never starts
        // before it.
        let (due, started) = (run["trigger_time"].as_str().unwrap(), run["started_at"].as_str());
        assert!(started.is_some_and(|started| started >= due), "{run}");
        // Fires are on whole seconds: the record keeps the scheduled instant, not the send time.
        assert!(
            run["trigger_time"].as_str().unwrap().ends_with(":00.000Z")
                || run["trigger_time"].as_str().unwrap().ends_with(".000Z"),
            "{run}"
        );
        let log = api.log_content(run["id"].as_i64().unwrap()).await;
        assert!(log.contains("[INFO] hello, cron\n"), "{log}");
    }
    let (status, _) = api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    assert_eq!(status, StatusCode::OK);

    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "by hand"})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    let run = api.finished_run(log_id).await;
    assert_eq!(
        (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
        (Some(200), Some("hello, by hand")),
        "{run}"
    );
    assert_eq!(
        (run["trigger_type"].as_str(), run["param"].as_str()),
        (Some("MANUAL"), Some("by hand"))
    );
    // Lateness is visible: when the admin saw the executor accept the run (after the executor
    // may have started it already), and when the executor started it.
    let (dispatched, started) =
        (run["dispatched_at"].as_str().unwrap(), run["started_at"].as_str().unwrap());
    let triggered = run["trigger_time"].as_str().unwrap();
    assert!(triggered <= dispatched && triggered <= started, "{run}");
    // A short run's result usually reaches the admin before its acceptance is recorded: the
    // result's record then says where it was sent, as a recorded acceptance would.
    let sent_to = run["trigger_msg"].as_str().unwrap_or_default();
    assert!(sent_to.starts_with("sent to http://127.0.0.1:"), "{run}");
    let log = api.log_content(log_id).await;
    assert!(log.contains("hello, by hand"), "{log}");
}
