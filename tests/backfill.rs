//! Backfills end to end: the `hello` and `sleeper` components run once per past instant with
//! that instant as trigger time, `max_concurrent` holds, a second backfill creates nothing,
//! pause, resume and cancel, a restart of `wasmjob standalone` midway, and the refusals
//! through the router. `ten_thousand_instants` is the large run, ignored by default.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wasmjob::admin::{AppState, router};
use wasmjob::model::TriggerType;
use wasmjob::storage::{Db, RunFilter};

use crate::support::standalone::{spawn_standalone, spawn_standalone_at, stop_gracefully};
use crate::support::{ADMIN_TOKEN, Api, TestApp, backends, sample_job};

/// The instant `rfc3339` names, in ms.
fn ms(rfc3339: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis()
}

/// Polls `probe` every 50 ms until it answers, for at most `limit`.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a backfill of `job` and returns its id.
async fn backfill(api: &Api, job: i64, body: Value) -> i64 {
    let (status, created) = api.post(&format!("/api/v1/jobs/{job}/backfill"), body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["id"].as_i64().unwrap()
}

/// Backfill `id` once it is done.
async fn done(api: &Api, id: i64) -> Value {
    wait_for(&format!("backfill {id} is done"), Duration::from_secs(60), || async {
        let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
        (backfill["state"] == "done").then_some(backfill)
    })
    .await
}

/// The BACKFILL runs of `job`, oldest first.
async fn backfill_runs(db: &Db, job: i64) -> Vec<wasmjob::model::RunRecord> {
    let filter = RunFilter { job_id: Some(job), limit: 100_000, ..RunFilter::default() };
    let mut runs = db.list_runs(&filter).await.unwrap().items;
    runs.retain(|run| run.trigger_type == TriggerType::Backfill);
    runs.reverse();
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_runs_each_past_instant_once() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let db = app.admin.as_ref().unwrap().state.db.clone();
        // Hourly, and stopped: a backfill runs whether the job's schedule runs or not.
        let job = api
            .create_job(
                json!({"name": "hourly", "schedule_type": "CRON", "schedule_conf": "0 0 * * * ?"}),
            )
            .await;
        api.upload(job, sample_job("hello")).await;
        let window = json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T09:30:00Z",
            "max_concurrent": 3});
        let first = backfill(api, job, window.clone()).await;
        let ended = done(api, first).await;
        assert_eq!(
            (
                &ended["total"],
                &ended["done"],
                &ended["failed"],
                &ended["skipped"],
                &ended["remaining"]
            ),
            (&json!(10), &json!(10), &json!(0), &json!(0), &json!(0)),
            "{ended}"
        );
        let runs = backfill_runs(&db, job).await;
        let instants: Vec<i64> =
            (0..10).map(|hour| ms("2026-01-01T00:00:00Z") + hour * 3_600_000).collect();
        let times: Vec<i64> = runs.iter().map(|run| run.trigger_time_ms).collect();
        assert_eq!(times, instants, "one run per instant, released in time order");
        assert!(runs.iter().all(|run| run.handle_code == 200 && run.handle_msg == "hello, world"));
        assert!(runs.iter().all(|run| run.fire_time_ms == Some(run.trigger_time_ms)));

        // The same window again: every instant has its run, so nothing is created.
        let second = backfill(api, job, window.clone()).await;
        let ended = done(api, second).await;
        assert_eq!((&ended["skipped"], &ended["done"]), (&json!(10), &json!(0)), "{ended}");
        assert_eq!(backfill_runs(&db, job).await.len(), 10);

        // With rerun, each instant runs once more.
        let mut rerun = window.clone();
        rerun["rerun"] = json!(true);
        let third = backfill(api, job, rerun).await;
        assert_eq!(done(api, third).await["done"], 10);
        let runs = backfill_runs(&db, job).await;
        assert_eq!(runs.len(), 20);
        let distinct: BTreeSet<i64> = runs.iter().map(|run| run.trigger_time_ms).collect();
        assert_eq!(distinct.len(), 10);

        let (_, list) = api.get(&format!("/api/v1/jobs/{job}/backfills")).await;
        let ids: Vec<i64> =
            list["items"].as_array().unwrap().iter().map(|b| b["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, [third, second, first]);
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_pause_resume_and_cancel_hold() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let db = app.admin.as_ref().unwrap().state.db.clone();
        let job = api
            .create_job(
                json!({"name": "sleepy", "schedule_type": "FIX_RATE", "schedule_conf": "60",
                "param": "150"}),
            )
            .await;
        api.upload(job, sample_job("sleeper")).await;
        // 30 minutes at one fire a minute: 31 instants, two at a time.
        let id = backfill(
            api,
            job,
            json!({"from": "2026-02-01T00:00:00Z", "to": "2026-02-01T00:30:00Z", "max_concurrent": 2}),
        )
        .await;
        let mut most = 0;
        let released_before_pause = loop {
            let unfinished =
                backfill_runs(&db, job).await.iter().filter(|run| run.handle_code == 0).count();
            most = most.max(unfinished);
            let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
            if backfill["done"].as_i64().unwrap() >= 4 {
                let (status, paused) =
                    api.post(&format!("/api/v1/backfills/{id}/pause"), json!({})).await;
                assert_eq!(
                    (status, &paused["state"]),
                    (StatusCode::OK, &json!("paused")),
                    "{paused}"
                );
                break paused["released"].as_i64().unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(most <= 2, "{most} runs of a backfill of max_concurrent 2 were unfinished at once");
        // Paused: what was released finishes, nothing more is.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let (_, paused) = api.get(&format!("/api/v1/backfills/{id}")).await;
        assert_eq!(paused["released"], released_before_pause, "{paused}");
        assert_eq!(paused["running"], 0, "{paused}");
        let (status, again) = api.post(&format!("/api/v1/backfills/{id}/pause"), json!({})).await;
        assert_eq!((status, &again["code"]), (StatusCode::CONFLICT, &json!("conflict")), "{again}");

        let (_, resumed) = api.post(&format!("/api/v1/backfills/{id}/resume"), json!({})).await;
        assert_eq!(resumed["state"], "running");
        wait_for("the backfill goes on", Duration::from_secs(30), || async {
            let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
            (backfill["released"].as_i64().unwrap() > released_before_pause + 2).then_some(())
        })
        .await;
        let (_, cancelled) = api.post(&format!("/api/v1/backfills/{id}/cancel"), json!({})).await;
        assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
        let released = cancelled["released"].as_i64().unwrap();
        assert!(released < 31, "{cancelled}");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let runs = backfill_runs(&db, job).await;
        assert_eq!(runs.len() as i64, released, "nothing is released after the cancel");
        let (status, _) = api.post(&format!("/api/v1/backfills/{id}/resume"), json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT);
        app.stop().await;
    }
}

/// Under `--max-unfinished-runs` 8 a backfill keeps to three quarters of it (6 runs), however
/// large its `max_concurrent`, and a manual trigger is still admitted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_leaves_a_quarter_of_the_bound_to_other_runs() {
    for backend in backends() {
        let app = TestApp::start_with(backend, |config| config.max_unfinished_runs = Some(8)).await;
        let api = &app.api;
        let db = app.admin.as_ref().unwrap().state.db.clone();
        let job = api
            .create_job(json!({"name": "slow", "schedule_type": "FIX_RATE", "schedule_conf": "60",
                "param": "100"}))
            .await;
        api.upload(job, sample_job("sleeper")).await;
        let other = api.create_job(json!({"name": "manual"})).await;
        api.upload(other, sample_job("hello")).await;
        let id = backfill(
            api,
            job,
            json!({"from": "2026-04-01T00:00:00Z", "to": "2026-04-01T00:19:00Z", "max_concurrent": 100}),
        )
        .await;
        let mut most = 0;
        let mut triggered = false;
        loop {
            let unfinished = db.count_unfinished_runs(100).await.unwrap();
            most = most.max(unfinished);
            if !triggered && unfinished >= 6 {
                let (status, answer) =
                    api.post(&format!("/api/v1/jobs/{other}/trigger"), json!({})).await;
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "a trigger is admitted during the backfill: {answer}"
                );
                triggered = true;
            }
            let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
            if backfill["state"] == "done" {
                assert_eq!(backfill["done"], 20, "{backfill}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(triggered, "the backfill never filled its share");
        assert!(most <= 7, "{most} unfinished runs: the backfill took more than its share");
        app.stop().await;
    }
}

/// `wasmjob standalone` stopped in the middle of a backfill and started again on its data
/// directory: the backfill goes on where it was, and every instant runs exactly once.
#[test]
fn a_backfill_survives_a_restart_of_the_admin() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let api = Api { http: reqwest::Client::new(), base: url, token };
    let (job, id) = runtime.block_on(async {
        let job = api
            .create_job(json!({"name": "minutely", "schedule_type": "CRON",
                "schedule_conf": "0 * * * * ?", "param": "100"}))
            .await;
        api.upload(job, sample_job("sleeper")).await;
        let id = backfill(
            &api,
            job,
            json!({"from": "2026-03-01T00:00:00Z", "to": "2026-03-01T00:39:59Z", "max_concurrent": 2}),
        )
        .await;
        wait_for("some instants ran", Duration::from_secs(30), || async {
            let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
            (backfill["done"].as_i64().unwrap() >= 5).then_some(())
        })
        .await;
        (job, id)
    });
    // Its executor comes back at the same address, as a restarted service does: runs claimed
    // for it and not sent before the stop are sent there after it.
    let executor = runtime.block_on(async {
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={job}&status=success&limit=1")).await;
        let address = page["items"][0]["executor_address"].as_str().unwrap().to_owned();
        address.trim_start_matches("http://").to_owned()
    });
    stop_gracefully(standalone);
    let (_standalone, url) = spawn_standalone_at(&data_dir, &executor);
    let api = Api { base: url, ..api };
    runtime.block_on(async {
        let ended = done(&api, id).await;
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={job}&limit=100")).await;
        assert_eq!((&ended["total"], &ended["done"]), (&json!(40), &json!(40)), "{ended} {page}");
        let runs = page["items"].as_array().unwrap();
        assert_eq!(runs.len(), 40, "{page}");
        let instants: BTreeSet<&str> =
            runs.iter().map(|run| run["trigger_time"].as_str().unwrap()).collect();
        assert_eq!(instants.len(), 40, "one run per instant");
        assert!(
            runs.iter().all(|run| run["trigger_type"] == "BACKFILL" && run["handle_code"] == 200)
        );
    });
}

/// `wasmjob job backfill … --follow` as a real process: the progress bar on stderr while it
/// follows, the backfill on stdout at its end, exit 0; the list; a refusal's exit code.
#[test]
fn the_cli_follows_a_backfill_with_a_progress_bar() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let api = Api { http: reqwest::Client::new(), base: url.clone(), token: token.clone() };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (job, delayed) = runtime.block_on(async {
        let job = api
            .create_job(
                json!({"name": "hourly", "schedule_type": "CRON", "schedule_conf": "0 0 * * * ?"}),
            )
            .await;
        api.upload(job, sample_job("hello")).await;
        let delayed = api
            .create_job(
                json!({"name": "delayed", "schedule_type": "FIX_DELAY", "schedule_conf": "60"}),
            )
            .await;
        (job.to_string(), delayed.to_string())
    });
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .args(args)
            .env("WASMJOB_ADMIN_URL", &url)
            .env("WASMJOB_TOKEN", &token)
            .output()
            .unwrap()
    };
    let window = ["--from", "2026-05-01T00:00:00Z", "--to", "2026-05-01T11:00:00Z"];
    let followed =
        cli(&[&["job", "backfill", &job], &window[..], &["--max-concurrent", "2", "--follow"]]
            .concat());
    let (stdout, stderr) =
        (String::from_utf8_lossy(&followed.stdout), String::from_utf8_lossy(&followed.stderr));
    assert!(followed.status.success(), "{followed:?}");
    assert!(stderr.contains("[##############################] 12/12  done 12"), "{stderr}");
    assert!(
        stdout.lines().any(|line| line.starts_with("done") && line.ends_with(" 12")),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|line| line.starts_with("state") && line.ends_with(" done")),
        "{stdout}"
    );
    let list = cli(&["job", "backfills", &job]);
    let table = String::from_utf8_lossy(&list.stdout);
    assert!(table.lines().next().unwrap().starts_with("ID  STATE"), "{table}");
    assert_eq!(table.lines().count(), 2, "{table}");
    // Refusals exit 5 with the admin's reason.
    let refused = cli(&[&["job", "backfill", &delayed], &window[..]].concat());
    assert_eq!(refused.status.code(), Some(5), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("FIX_DELAY"), "{refused:?}");
    let paused = cli(&["job", "backfill-pause", "1"]);
    assert_eq!(paused.status.code(), Some(5), "a done backfill cannot be paused: {paused:?}");
}

#[tokio::test]
async fn refusals_say_why() {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("api.db").display())).await.unwrap();
    db.ensure_group("default", "Default", 0).await.unwrap();
    let state = AppState::new(db, crate::support::app::admin_config(String::new())).unwrap();
    let app = router(state);
    let send = |method: &'static str, path: String, body: Value| {
        let app = app.clone();
        async move {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status.as_u16(), serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
        }
    };
    // BEAN jobs need no version; the GLUE_WASM one has none yet.
    let mut jobs = Vec::new();
    for (kind, conf, glue) in [
        ("CRON", "* * * * * ?", "BEAN"),
        ("FIX_DELAY", "60", "BEAN"),
        ("NONE", "", "BEAN"),
        ("CRON", "0 0 * * * ?", "GLUE_WASM"),
    ] {
        let body = json!({"group_id": 1, "name": kind, "schedule_type": kind, "schedule_conf": conf,
            "glue_type": glue, "handler": "hello"});
        let (status, job) = send("POST", "/api/v1/jobs".to_owned(), body).await;
        assert_eq!(status, 201, "{job}");
        jobs.push(job["id"].as_i64().unwrap());
    }
    let (every_second, fix_delay, none, no_version) = (jobs[0], jobs[1], jobs[2], jobs[3]);
    let window = |from: &str, to: &str| json!({"from": from, "to": to});
    let day = window("2026-01-01T00:00:00Z", "2026-01-01T23:59:59Z");
    let cases = [
        (no_version, day.clone(), "409 conflict"),
        (fix_delay, day.clone(), "422 schedule_not_backfillable"),
        (none, day.clone(), "422 schedule_not_backfillable"),
        (999, day.clone(), "404 job_not_found"),
        (
            every_second,
            window("2026-01-01T00:00:00Z", "2026-01-02T23:59:59Z"),
            "422 backfill_too_large",
        ),
        (
            every_second,
            window("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
            "400 invalid_backfill",
        ),
        (every_second, window("yesterday", "2026-01-01T00:00:00Z"), "400 invalid_backfill"),
        (
            every_second,
            window("2026-01-01T00:00:00Z", "2999-01-01T00:00:00Z"),
            "400 invalid_backfill",
        ),
        (
            every_second,
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z", "max_concurrent": 0}),
            "400 invalid_backfill",
        ),
        (
            every_second,
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z", "colour": "red"}),
            "422 invalid_field",
        ),
        // A day of seconds is 86,400 instants: within the bound.
        (every_second, day.clone(), "201 -"),
    ];
    let mut failures = Vec::new();
    for (job, body, expected) in cases {
        let (status, answer) =
            send("POST", format!("/api/v1/jobs/{job}/backfill"), body.clone()).await;
        let got = format!("{status} {}", answer["code"].as_str().unwrap_or("-"));
        if got != expected {
            failures.push(format!("job {job} {body}: expected {expected}, got {got} {answer}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // Each refusal says why.
    let (_, answer) = send("POST", format!("/api/v1/jobs/{fix_delay}/backfill"), day.clone()).await;
    assert!(answer["message"].as_str().unwrap().contains("FIX_DELAY"), "{answer}");
    let two_days = window("2026-01-01T00:00:00Z", "2026-01-02T23:59:59Z");
    let (_, answer) = send("POST", format!("/api/v1/jobs/{every_second}/backfill"), two_days).await;
    assert!(answer["message"].as_str().unwrap().contains("100000"), "{answer}");
    let (status, _) = send("GET", "/api/v1/backfills/7".to_owned(), Value::Null).await;
    assert_eq!(status, 404);
    let (status, _) = send("POST", "/api/v1/backfills/7/pause".to_owned(), json!({})).await;
    assert_eq!(status, 404);
}

/// 10,000 instants of `hello` (one a second for 10,000 seconds), 200 at a time: exactly 10,000
/// successful runs, one per instant. Prints how long it took. Ignored by default for CI time:
/// `main-… backfill::ten_thousand_instants --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the 10,000-instant run takes a while; run it on purpose"]
async fn ten_thousand_instants() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let db = app.admin.as_ref().unwrap().state.db.clone();
        let job = api
            .create_job(json!({"name": "every second", "schedule_type": "CRON", "schedule_conf": "* * * * * ?"}))
            .await;
        api.upload(job, sample_job("hello")).await;
        let from = "2026-01-01T00:00:00Z";
        let to = "2026-01-01T02:46:39Z";
        let started = Instant::now();
        let id = backfill(api, job, json!({"from": from, "to": to, "max_concurrent": 200})).await;
        let ended = wait_for("10,000 instants ran", Duration::from_secs(1_800), || async {
            let (_, backfill) = api.get(&format!("/api/v1/backfills/{id}")).await;
            (backfill["state"] == "done").then_some(backfill)
        })
        .await;
        let elapsed = started.elapsed();
        assert_eq!((&ended["total"], &ended["done"]), (&json!(10_000), &json!(10_000)), "{ended}");
        let runs = backfill_runs(&db, job).await;
        assert_eq!(runs.len(), 10_000);
        assert!(runs.iter().all(|run| run.handle_code == 200));
        let distinct: BTreeSet<i64> = runs.iter().map(|run| run.trigger_time_ms).collect();
        assert_eq!(distinct.len(), 10_000);
        assert_eq!(
            (distinct.first().copied(), distinct.last().copied()),
            (Some(ms(from)), Some(ms(to)))
        );
        eprintln!(
            "{backend:?}: 10,000 instants backfilled in {:.1} s ({:.0} runs/s)",
            elapsed.as_secs_f64(),
            10_000.0 / elapsed.as_secs_f64()
        );
        // The same job's runs from 1,000 manual triggers, for comparison: an executor runs one
        // job's runs one after another, so this is the rate the backfill can reach.
        let started = Instant::now();
        let path = format!("/api/v1/jobs/{job}/trigger");
        for _ in 0..20 {
            let posts = (0..50).map(|_| api.post(&path, json!({})));
            for (status, answer) in futures_util::future::join_all(posts).await {
                assert_eq!(status, StatusCode::OK, "{answer}");
            }
        }
        wait_for("1,000 manual runs ended", Duration::from_secs(600), || async {
            let filter = RunFilter { job_id: Some(job), limit: 1, ..RunFilter::default() };
            let page = db.list_runs(&RunFilter { count_up_to: None, ..filter }).await.unwrap();
            let unfinished = db.count_unfinished_runs(1).await.unwrap();
            (page.total == 11_000 && unfinished == 0).then_some(())
        })
        .await;
        let manual = started.elapsed();
        eprintln!(
            "{backend:?}: 1,000 manual runs of the same job in {:.1} s ({:.0} runs/s)",
            manual.as_secs_f64(),
            1_000.0 / manual.as_secs_f64()
        );
        app.stop().await;
    }
}
