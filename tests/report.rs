//! The daily report and the dashboard summary against a real platform on 127.0.0.1: counts
//! match the runs made, per state, and bad ranges get a 400.

use reqwest::StatusCode;
use serde_json::{Value, json};

use wasmjob::model::RunState;
use wasmjob::storage::RunFilter;

use crate::support::{Backend, TestApp, backends, sample_job};

/// Runs `count` manual runs of a job running `sample`; the job's id once they all ended.
async fn runs_of(app: &TestApp, name: &str, sample: &str, count: usize) -> i64 {
    let api = &app.api;
    let job_id = api.create_job(json!({"name": name})).await;
    assert_eq!(api.upload(job_id, sample_job(sample)).await.0, StatusCode::CREATED);
    for _ in 0..count {
        let (status, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{triggered}");
        api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    }
    job_id
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

fn counts(day: &Value) -> Vec<i64> {
    ["success", "failed", "timed_out", "killed", "lost", "skipped", "running", "total"]
        .iter()
        .map(|key| day[key].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_and_the_dashboard_count_the_runs_made() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        runs_of(&app, "greeter", "hello", 3).await;
        let failing = runs_of(&app, "breaker", "fail", 2).await;

        let today = today();
        let (status, report) = api.get(&format!("/api/v1/report?from={today}&to={today}")).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        let days = report["days"].as_array().unwrap();
        assert_eq!(days.len(), 1, "{report}");
        assert_eq!(days[0]["day"], today.as_str());
        assert_eq!(counts(&days[0]), [3, 2, 0, 0, 0, 0, 0, 5], "{report}");

        // A week ending today: one entry per day, oldest first, zeros included.
        let week_ago =
            (chrono::Utc::now() - chrono::Duration::days(6)).format("%Y-%m-%d").to_string();
        let (_, week) = api.get(&format!("/api/v1/report?from={week_ago}&to={today}")).await;
        let week = week["days"].as_array().unwrap();
        assert_eq!(week.len(), 7);
        assert_eq!(week[0]["day"], week_ago.as_str());
        assert_eq!(week[6], days[0]);
        assert!(week[..6].iter().all(|day| day["total"] == 0), "{week:?}");

        let (status, dashboard) = api.get("/api/v1/dashboard").await;
        assert_eq!(status, StatusCode::OK, "{dashboard}");
        assert_eq!(
            (dashboard["jobs"].as_i64(), dashboard["jobs_started"].as_i64()),
            (Some(2), Some(0))
        );
        assert_eq!(dashboard["executors_online"], 1);
        assert_eq!(dashboard["runs_today"], days[0]);
        assert_eq!(
            dashboard["top_failing"],
            json!([{"job_id": failing, "name": "breaker", "failures": 2}])
        );
        app.stop().await;
    }
}

/// The dashboard's failing jobs are counted as the runs end, not read from the run table: they
/// equal a recount of the run table after real runs, and stay when retention deletes the runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_jobs_are_counted_as_runs_end_and_outlive_retention() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        runs_of(&app, "greeter", "hello", 2).await;
        let breaker = runs_of(&app, "breaker", "fail", 3).await;
        let flaky = runs_of(&app, "flaky", "fail", 1).await;
        let db = &app.admin.as_ref().unwrap().state.db;
        let mut recount = Vec::new();
        for job_id in [breaker, flaky] {
            let mut failures = 0;
            for state in [RunState::Failed, RunState::TimedOut, RunState::Lost] {
                let filter = RunFilter {
                    job_id: Some(job_id),
                    state: Some(state),
                    limit: 1,
                    ..RunFilter::default()
                };
                failures += db.list_runs(&filter).await.unwrap().total;
            }
            recount.push(json!({"job_id": job_id, "failures": failures}));
        }
        let failing = |dashboard: &Value| -> Vec<Value> {
            dashboard["top_failing"]
                .as_array()
                .unwrap()
                .iter()
                .map(|job| json!({"job_id": job["job_id"], "failures": job["failures"]}))
                .collect()
        };
        let (status, dashboard) = api.get("/api/v1/dashboard").await;
        assert_eq!(status, StatusCode::OK, "{dashboard}");
        assert_eq!(failing(&dashboard), recount, "{dashboard}");
        assert_eq!(recount[0]["failures"], 3);

        // Retention deletes every ended run; the counts stay, as the daily report's do.
        let deleted = db.delete_ended_runs(wasmjob::admin::now_ms() + 1, 1_000).await.unwrap();
        assert_eq!(deleted, 6);
        let (_, dashboard) = api.get("/api/v1/dashboard").await;
        assert_eq!(failing(&dashboard), recount, "{dashboard}");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_asks_for_a_range_of_at_most_366_days() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    for query in [
        "",
        "from=2026-11-17",
        "to=2026-11-17",
        "from=2026-11-17&to=2026-11-16",
        "from=2025-01-01&to=2026-01-02",
        "from=17.11.2026&to=2026-11-17",
        "from=2026-02-30&to=2026-03-01",
        "from=1969-12-31&to=1970-01-01",
    ] {
        let (status, error) = api.get(&format!("/api/v1/report?{query}")).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_range")),
            "{query}: {error}"
        );
    }
    let (status, error) = api.get("/api/v1/report?from=2026-01-01&to=2026-01-02&x=1").await;
    assert_eq!((status, error["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_query")));
    // 2024 is a leap year: 366 days is the most.
    let (status, report) = api.get("/api/v1/report?from=2024-01-01&to=2024-12-31").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let days = report["days"].as_array().unwrap();
    assert_eq!((days.len(), days[365]["day"].as_str()), (366, Some("2024-12-31")));
    app.stop().await;
}
