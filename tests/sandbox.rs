use std::time::Instant;

use serde_json::{Value, json};

use crate::support::{Api, Backend, TestApp, sample_job};

/// Creates a job for the sample `name` with `fields`, uploads it, triggers it with `param`.
async fn trigger_sample(api: &Api, name: &str, param: &str, fields: Value) -> i64 {
    let mut body = json!({"name": name});
    for (key, value) in fields.as_object().unwrap() {
        body[key] = value.clone();
    }
    let job_id = api.create_job(body).await;
    let (status, version) = api.upload(job_id, sample_job(name)).await;
    assert_eq!(status, 201, "{version}");
    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
    assert_eq!(status, 200, "{triggered}");
    triggered["log_ids"][0].as_i64().unwrap()
}

async fn hello_still_runs(api: &Api) {
    let log_id = trigger_sample(api, "hello", "after", json!({})).await;
    let run = api.finished_run(log_id).await;
    assert_eq!(run["handle_msg"], "hello, after", "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_jobs_end_with_their_outcome() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let cases: &[(&str, &str, Value, i64, &str)] = &[
        ("spin", "", json!({"timeout_secs": 2}), 502, "timeout: the run passed its deadline"),
        (
            "sleeper",
            "3600000",
            json!({"timeout_secs": 2}),
            502,
            "timeout: the run passed its deadline",
        ),
        (
            "hog",
            "",
            json!({"timeout_secs": 2, "memory_limit_mb": 32}),
            500,
            "resource limit: memory limit of 32 MiB reached",
        ),
        ("deep", "", json!({"timeout_secs": 2}), 500, "trap (stack overflow)"),
        ("crash", "boom", json!({"timeout_secs": 2}), 500, "crash requested: boom"),
        ("fail", "x", json!({"timeout_secs": 2}), 500, "job failed: failed on purpose: x"),
        ("chatty", "25", json!({"timeout_secs": 2}), 200, "wrote 25 lines"),
        // The filesystem is linked with no directory in it: a read fails, and returns no data.
        ("reader", "/etc/passwd", json!({"timeout_secs": 2}), 500, "job failed: /etc/passwd: "),
    ];
    for (name, param, fields, code, message) in cases {
        let started = Instant::now();
        let log_id = trigger_sample(api, name, param, fields.clone()).await;
        let run = api.finished_run(log_id).await;
        eprintln!("{name}: ended in {} ms: {}", started.elapsed().as_millis(), run["handle_msg"]);
        assert_eq!(run["handle_code"].as_i64(), Some(*code), "{name}: {run}");
        assert!(run["handle_msg"].as_str().unwrap().contains(message), "{name}: {run}");
        assert!(!run["handle_msg"].as_str().unwrap().contains("root:"), "{name}: {run}");
        hello_still_runs(api).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_keep_guest_lines_and_stdout() {
    let app = TestApp::start(Backend::Sqlite).await;
    let log_id = trigger_sample(&app.api, "chatty", "25", json!({})).await;
    let run = app.api.finished_run(log_id).await;
    assert_eq!(run["handle_code"], 200);
    assert!(run["fuel_used"].as_i64().is_some_and(|fuel| fuel > 0), "{run}");
    let log = app.api.log_content(log_id).await;
    assert!(log.contains("[INFO] line 25\n"), "{log}");
    assert!(log.contains("[INFO] stdout 20\n"), "{log}");
    let (_, page) = app.api.get(&format!("/api/v1/logs/{log_id}/content?from_line=3")).await;
    assert_eq!((page["from_line"].as_i64(), page["is_end"].as_bool()), (Some(3), Some(true)));

    // A guest far past the log cap (1 MiB here) still succeeds; its log is cut once.
    let log_id = trigger_sample(&app.api, "chatty", "200000", json!({})).await;
    let run = app.api.finished_run(log_id).await;
    assert_eq!(
        (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
        (Some(200), Some("wrote 200000 lines"))
    );
    let mut truncations = 0;
    let mut from_line = 1;
    loop {
        let (_, page) =
            app.api.get(&format!("/api/v1/logs/{log_id}/content?from_line={from_line}")).await;
        truncations += page["content"].as_str().unwrap().matches("log truncated").count();
        if page["is_end"] == true {
            break;
        }
        from_line = page["to_line"].as_i64().unwrap() + 1;
    }
    assert_eq!(truncations, 1);
    app.stop().await;
}

/// A run waiting in a host call for an hour stops when killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_stops_a_sleeping_run() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let log_id = trigger_sample(api, "sleeper", "3600000", json!({})).await;
    api.wait_until("the sleeper sleeps", || async {
        api.log_content(log_id).await.contains("sleeping").then_some(())
    })
    .await;
    let asked = Instant::now();
    let (status, body) = api.post(&format!("/api/v1/logs/{log_id}/kill"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    // Our executor stops the one run the kill names.
    assert_eq!(body["scope"], "run", "{body}");
    let run = api.finished_run(log_id).await;
    eprintln!("kill: the sleeping run ended {} ms after the request", asked.elapsed().as_millis());
    assert_eq!(
        (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
        (Some(500), Some("killed: the run was stopped on request"))
    );
    hello_still_runs(api).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_strategies() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    for (strategy, first_msg, second_code, second_msg) in [
        ("COVER_EARLY", "killed: the run was stopped on request", 200, "slept 10 ms"),
        ("DISCARD_LATER", "", 500, "DISCARD_LATER"),
    ] {
        let first = trigger_sample(
            api,
            "sleeper",
            "3600000",
            json!({"block_strategy": strategy, "timeout_secs": 30}),
        )
        .await;
        api.wait_until("the first run sleeps", || async {
            api.log_content(first).await.contains("sleeping").then_some(())
        })
        .await;
        let job_id = api.get(&format!("/api/v1/logs/{first}")).await.1["job_id"].as_i64().unwrap();
        let (_, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "10"})).await;
        let second = api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
        assert_eq!(second["handle_code"].as_i64(), Some(second_code), "{strategy}: {second}");
        assert!(
            second["handle_msg"].as_str().unwrap().contains(second_msg),
            "{strategy}: {second}"
        );
        if first_msg.is_empty() {
            api.post(&format!("/api/v1/logs/{first}/kill"), json!({})).await;
        }
        let first = api.finished_run(first).await;
        if !first_msg.is_empty() {
            assert_eq!(first["handle_msg"], first_msg, "{strategy}");
        }
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_executor_runs_from_its_cache() {
    let mut app = TestApp::start(Backend::Sqlite).await;
    let log_id = trigger_sample(&app.api, "hello", "first", json!({})).await;
    app.api.finished_run(log_id).await;
    let executor = app.executor.take().unwrap();
    assert_eq!(executor.cache_stats().compiled, 1);
    executor.stop().await;

    let admin_url = app.api.base.clone();
    let data_dir = app.executor_dir();
    let restarted =
        wasmjob::executor::start(crate::support::app::executor_config(&admin_url, data_dir))
            .await
            .unwrap();
    app.api.wait_for_executors(1).await;
    let job_id = app.api.get(&format!("/api/v1/logs/{log_id}")).await.1["job_id"].as_i64().unwrap();
    let (_, triggered) =
        app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "again"})).await;
    let run = app.api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    assert_eq!(run["handle_msg"], "hello, again");
    let stats = restarted.cache_stats();
    assert_eq!((stats.compiled, stats.loaded_from_disk), (0, 1), "{stats:?}");
    app.executor = Some(restarted);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_share_blobs_and_refuse_artifacts() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job_id = api.create_job(json!({"name": "twice"})).await;
    let (_, one) = api.upload(job_id, sample_job("hello")).await;
    let (_, two) = api.upload(job_id, sample_job("hello")).await;
    assert_eq!((one["version"].as_i64(), two["version"].as_i64()), (Some(1), Some(2)));
    assert_eq!(one["sha256"], two["sha256"]);
    let db = &app.admin.as_ref().unwrap().state.db;
    assert_eq!(db.count_modules().await.unwrap(), 1);

    let engine = wasmtime::Engine::default();
    let artifact = engine.precompile_component(&sample_job("hello")).unwrap();
    let (status, body) = api.upload(job_id, artifact).await;
    assert_eq!((status.as_u16(), body["code"].as_str()), (422, Some("wrong_kind")), "{body}");
    let (_, versions) = api.get(&format!("/api/v1/jobs/{job_id}/versions")).await;
    assert_eq!(versions.as_array().unwrap().len(), 2);

    // Rollback: version 1 becomes active again.
    let (status, active) =
        api.post(&format!("/api/v1/jobs/{job_id}/versions/1/activate"), json!({})).await;
    assert_eq!((status.as_u16(), active["active"].as_bool()), (200, Some(true)));
    app.stop().await;
}
