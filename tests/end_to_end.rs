use reqwest::StatusCode;
use serde_json::json;

use crate::support::scenarios::cron_then_manual;
use crate::support::{Backend, TestApp, backends, sample_job};

async fn each_backend<F, Fut>(test: F)
where
    F: Fn(Backend) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for backend in backends() {
        test(backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_and_manual_runs() {
    each_backend(|backend| async move {
        let app = TestApp::start(backend).await;
        cron_then_manual(&app.api).await;
        app.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_recorded_and_retried() {
    each_backend(|backend| async move {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let job_id = api.create_job(json!({"name": "fails", "retry_count": 1, "param": "p"})).await;
        api.upload(job_id, sample_job("fail")).await;
        let (_, triggered) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        let first = api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
        assert_eq!(first["handle_code"], 500, "{first}");
        assert_eq!(first["handle_msg"], "job failed: failed on purpose: p");
        let retry = api
            .wait_until("the retry ends", || async {
                let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
                let items = page["items"].as_array().cloned().unwrap_or_default();
                items.into_iter().find(|run| run["attempt"] == 1 && run["handle_code"] != 0)
            })
            .await;
        assert_eq!(
            (retry["trigger_type"].as_str(), retry["handle_code"].as_i64()),
            (Some("RETRY"), Some(500))
        );
        // retry_count 1: no third run.
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
        assert_eq!(page["total"], 2, "{page}");
        app.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_jobs_follow_success() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let child = api.create_job(json!({"name": "child", "param": "from parent"})).await;
    api.upload(child, sample_job("hello")).await;
    let parent = api.create_job(json!({"name": "parent", "child_job_ids": [child]})).await;
    api.upload(parent, sample_job("hello")).await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{parent}/trigger"), json!({})).await;
    api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    let child_run = api
        .wait_until("the child runs", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={child}&status=success")).await;
            page["items"].as_array().and_then(|items| items.first().cloned())
        })
        .await;
    assert_eq!(
        (child_run["trigger_type"].as_str(), child_run["handle_msg"].as_str()),
        (Some("PARENT"), Some("hello, from parent"))
    );
    app.stop().await;
}

/// A handler built against the job world as first released (`legacy-hello`, without the
/// `sharding` import) is accepted at upload and runs as it always did, alone or in a sharded job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_built_for_the_first_job_world_still_run() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let plain = api.create_job(json!({"name": "old handler", "param": "old"})).await;
    let sharded = api
        .create_job(json!({"name": "old handler, sharded", "param": "old", "sharding_total_count": 2,
            "sharding_item_parameters": "0=Beijing,1=Shanghai", "sharding_strategy": "AVERAGE_ALLOCATION"}))
        .await;
    for job_id in [plain, sharded] {
        let (status, version) = api.upload(job_id, sample_job("legacy_hello")).await;
        assert_eq!(status, StatusCode::CREATED, "{version}");
        let (_, triggered) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        let log_id = triggered["log_ids"][0].as_i64().unwrap();
        let run = api.finished_run(log_id).await;
        assert_eq!(
            (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
            (Some(200), Some("hello, old")),
            "{run}"
        );
        let log = api.log_content(log_id).await;
        assert!(log.contains("[INFO] hello, old\n"), "{log}");
    }
    app.stop().await;
}

/// A run whose executor vanished without a result ends lost instead of running forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_sent_to_an_executor_that_never_registered_end_lost() {
    let app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "orphan"})).await;
    let db = &app.admin.as_ref().unwrap().state.db;
    let long_ago = wasmjob::admin::now_ms() - 120_000;
    // Recorded as sent, two minutes ago, to an executor that never registered.
    let run = crate::support::runs::manual_run(job_id, long_ago);
    let id = crate::support::runs::running_run(db, &run, "http://127.0.0.1:9", long_ago, 0).await;
    let finished = app.api.finished_run(id).await;
    assert_eq!(
        (finished["handle_code"].as_i64(), finished["state"].as_str()),
        (Some(500), Some("lost"))
    );
    assert!(
        finished["handle_msg"].as_str().unwrap().starts_with("lost: executor http://127.0.0.1:9"),
        "{finished}"
    );
    app.stop().await;
}

/// `BEAN` jobs run a component the executor already has in its handlers dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bean_jobs_run_local_handlers() {
    let app = TestApp::start(Backend::Sqlite).await;
    std::fs::write(app.executor_dir().join("handlers").join("greeter.wasm"), sample_job("hello"))
        .unwrap();
    let job_id = app
        .api
        .create_job(json!({"name": "bean", "glue_type": "BEAN", "handler": "greeter"}))
        .await;
    let (_, triggered) =
        app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "bean"})).await;
    let run = app.api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    assert_eq!(run["handle_msg"], "hello, bean", "{run}");
    let missing = app
        .api
        .create_job(json!({"name": "nobody", "glue_type": "BEAN", "handler": "absent"}))
        .await;
    let (_, triggered) = app.api.post(&format!("/api/v1/jobs/{missing}/trigger"), json!({})).await;
    let run = app.api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    assert!(run["handle_msg"].as_str().unwrap().contains("BEAN handler `absent`"), "{run}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_rate_jobs_fire_once_a_rate_apart() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job_id =
        api.create_job(json!({"name": "rate", "schedule_type": "FIX_RATE", "schedule_conf": "1", "param": "rate"})).await;
    api.upload(job_id, sample_job("hello")).await;
    let (_, times) = api.get(&format!("/api/v1/jobs/{job_id}/next-fire-times?count=3")).await;
    assert_eq!(times["times"].as_array().unwrap().len(), 3, "{times}");
    api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    let page = api
        .wait_until("three fixed-rate runs succeed", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            (page["items"].as_array().map_or(0, Vec::len) >= 3).then_some(page)
        })
        .await;
    api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    // Each run is its own fire, and the fires are the rate apart.
    let mut fired: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            let at = run["trigger_time"].as_str().unwrap();
            chrono::DateTime::parse_from_rfc3339(at).unwrap().timestamp_millis()
        })
        .collect();
    fired.sort_unstable();
    let gaps: Vec<i64> = fired.windows(2).map(|pair| pair[1] - pair[0]).collect();
    assert!(gaps.iter().all(|gap| *gap == 1_000), "fires {fired:?}, gaps {gaps:?}");
    app.stop().await;
}

/// SHARDING_BROADCAST: one run per online executor, each with its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_shards_over_every_executor() {
    let app = TestApp::start(Backend::Sqlite).await;
    let second_dir = tempfile::tempdir().unwrap();
    let config = crate::support::app::executor_config(&app.api.base, second_dir.path().to_owned());
    let second = wasmjob::executor::start(config).await.unwrap();
    app.api.wait_for_executors(2).await;
    let job_id =
        app.api.create_job(json!({"name": "shards", "route_strategy": "SHARDING_BROADCAST"})).await;
    app.api.upload(job_id, sample_job("hello")).await;
    let (_, triggered) = app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
    let ids: Vec<i64> =
        triggered["log_ids"].as_array().unwrap().iter().map(|id| id.as_i64().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{triggered}");
    let mut shards = Vec::new();
    for id in ids {
        let run = app.api.finished_run(id).await;
        assert_eq!(run["handle_code"], 200, "{run}");
        shards.push((
            run["shard_index"].as_i64().unwrap(),
            run["shard_total"].as_i64().unwrap(),
            run["executor_address"].clone(),
        ));
    }
    shards.sort_by_key(|shard| shard.0);
    assert_eq!((shards[0].0, shards[1].0, shards[0].1), (0, 1, 2));
    assert_ne!(shards[0].2, shards[1].2);
    second.stop().await;
    app.stop().await;
}

/// FAILOVER probes `/beat` and skips a dead executor; FIRST sends to it and fails visibly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_skips_dead_executors() {
    let app = TestApp::start(Backend::Sqlite).await;
    let live = app.executor.as_ref().unwrap().address.clone();
    let (status, group) = app
        .api
        .post("/api/v1/groups", json!({"app_name": "pinned", "address_type": "MANUAL", "addresses": ["http://127.0.0.1:9", live]}))
        .await;
    assert_eq!(status, 201, "{group}");
    let group_id = group["id"].as_i64().unwrap();
    for (strategy, code) in [("FAILOVER", 200), ("FIRST", 500)] {
        let job_id = app
            .api
            .create_job(json!({"name": strategy, "group_id": group_id, "route_strategy": strategy}))
            .await;
        app.api.upload(job_id, sample_job("hello")).await;
        let (_, triggered) =
            app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        let run = app.api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
        assert_eq!(run["handle_code"].as_i64(), Some(code), "{strategy}: {run}");
        if code == 500 {
            assert!(run["handle_msg"].as_str().unwrap().starts_with("trigger failed: "), "{run}");
        }
    }
    app.stop().await;
}

/// ElasticJob sharding items over three executors: every fire runs each item exactly once, with
/// its parameter, on the executor AVERAGE_ALLOCATION gives it; a failed run retries alone, with
/// the same items on the same executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharding_items_run_once_per_fire_with_their_parameters() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let mut others = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::support::app::executor_config(&api.base, dir.path().to_owned());
        others.push(wasmjob::executor::start(config).await.unwrap());
        dirs.push(dir);
    }
    api.wait_for_executors(3).await;
    let mut addresses: Vec<String> = others.iter().map(|e| e.address.clone()).collect();
    addresses.push(app.executor.as_ref().unwrap().address.clone());
    addresses.sort();
    let parameters = ["Beijing", "Shanghai", "Guangzhou", "Shenzhen", "Hangzhou"];
    let item_parameters: Vec<String> =
        parameters.iter().enumerate().map(|(item, name)| format!("{item}={name}")).collect();
    let sharding = json!({
        "sharding_total_count": 5,
        "sharding_item_parameters": item_parameters.join(","),
        "sharding_strategy": "AVERAGE_ALLOCATION",
    });
    let mut fields = json!({"name": "cities", "schedule_type": "CRON", "schedule_conf": "* * * * * ?", "param": "city"});
    fields.as_object_mut().unwrap().extend(sharding.as_object().unwrap().clone());
    let job_id = api.create_job(fields).await;
    api.upload(job_id, sample_job("hello")).await;
    api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    // Two whole fires, of three runs each (every executor gets items).
    let runs = api
        .wait_until("two fires' runs succeed", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&limit=100")).await;
            let items = page["items"].as_array().cloned().unwrap_or_default();
            let mut fires: std::collections::BTreeMap<String, Vec<serde_json::Value>> =
                Default::default();
            for run in items.into_iter().filter(|run| run["state"] == "success") {
                fires
                    .entry(run["trigger_time"].as_str().unwrap().to_owned())
                    .or_default()
                    .push(run);
            }
            let whole: Vec<_> = fires.into_values().filter(|runs| runs.len() == 3).collect();
            (whole.len() >= 2).then_some(whole)
        })
        .await;
    api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    // AVERAGE_ALLOCATION, 5 items over 3 executors sorted by address: [0,3] [1,4] [2].
    let expected = [vec![0, 3], vec![1, 4], vec![2]];
    for fire in &runs {
        let mut seen = Vec::new();
        for run in fire {
            let address = run["executor_address"].as_str().unwrap();
            let position = addresses.iter().position(|a| a == address).unwrap();
            let items: Vec<i64> = run["sharding_items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|item| {
                    let number = item["item"].as_i64().unwrap();
                    assert_eq!(item["parameter"], parameters[number as usize], "{run}");
                    number
                })
                .collect();
            assert_eq!(items, expected[position], "{run}");
            assert_eq!(run["shard_total"], 3, "{run}");
            let echoed: Vec<String> =
                items.iter().map(|item| format!("{item}={}", parameters[*item as usize])).collect();
            assert_eq!(run["handle_msg"], format!("hello, city; items {}", echoed.join(",")));
            seen.extend(items);
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4], "every item exactly once per fire: {fire:?}");
    }

    // A sharded job that fails: each run is retried once, alone, with its own items.
    let mut fields = json!({"name": "failing cities", "retry_count": 1});
    fields.as_object_mut().unwrap().extend(sharding.as_object().unwrap().clone());
    let failing = api.create_job(fields).await;
    api.upload(failing, sample_job("fail")).await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{failing}/trigger"), json!({})).await;
    assert_eq!(triggered["log_ids"].as_array().unwrap().len(), 3, "{triggered}");
    let all = api
        .wait_until("three runs and their three retries end", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={failing}&limit=100")).await;
            let items = page["items"].as_array().cloned().unwrap_or_default();
            let ended = items.iter().filter(|run| run["state"] == "failed").count();
            (items.len() == 6 && ended == 6).then_some(items)
        })
        .await;
    for retry in all.iter().filter(|run| run["attempt"] == 1) {
        let parent = all.iter().find(|run| run["id"] == retry["parent_run_id"]).unwrap();
        assert_eq!(
            (&retry["sharding_items"], &retry["executor_address"]),
            (&parent["sharding_items"], &parent["executor_address"]),
            "{retry}"
        );
    }
    for executor in others {
        executor.stop().await;
    }
    app.stop().await;
}

/// FIX_DELAY: the next fire comes the delay after the previous run ended, never during it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_delay_fires_after_the_previous_run_ended() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job_id = api
        .create_job(json!({"name": "delay", "schedule_type": "FIX_DELAY", "schedule_conf": "1", "param": "700"}))
        .await;
    api.upload(job_id, sample_job("sleeper")).await;
    let (_, times) = api.get(&format!("/api/v1/jobs/{job_id}/next-fire-times?count=3")).await;
    assert_eq!(
        times["times"].as_array().unwrap().len(),
        1,
        "only the first fire is known: {times}"
    );
    api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    let runs = api
        .wait_until("three runs succeed", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            let items = page["items"].as_array().cloned().unwrap_or_default();
            (items.len() >= 3).then_some(items)
        })
        .await;
    api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    let ms = |run: &serde_json::Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(run[field].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    // Newest first: each fire is one second after the end its predecessor recorded.
    for pair in runs.windows(2) {
        let (later, earlier) = (&pair[0], &pair[1]);
        assert_eq!(later["trigger_type"], "CRON", "{later}");
        assert!(
            ms(later, "trigger_time") >= ms(earlier, "handle_time") + 1_000,
            "{earlier} {later}"
        );
    }
    app.stop().await;
}

/// ONCE: one fire at its instant, then the job stops and stays defined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_fires_once_then_stops() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    // Far enough ahead that creating, uploading and starting on a loaded machine ends first.
    let at = chrono::Utc::now() + chrono::TimeDelta::seconds(6);
    let instant = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let job_id = api
        .create_job(json!({"name": "once", "schedule_type": "ONCE", "schedule_conf": instant, "param": "once"}))
        .await;
    api.upload(job_id, sample_job("hello")).await;
    let (_, job) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    assert_eq!(job["next_fire_time"], instant, "{job}");
    let run = api
        .wait_until("the run succeeds", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            page["items"].as_array().and_then(|items| items.first().cloned())
        })
        .await;
    assert_eq!(
        (run["trigger_type"].as_str(), run["trigger_time"].as_str()),
        (Some("CRON"), Some(instant.as_str()))
    );
    let (_, job) = api.get(&format!("/api/v1/jobs/{job_id}")).await;
    assert_eq!(
        (job["running"].as_bool(), job["next_fire_time"].is_null()),
        (Some(false), true),
        "{job}"
    );
    let (status, refused) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    assert_eq!((status.as_u16(), refused["code"].as_str()), (400, Some("no_fire_time")));
    app.stop().await;
}

/// Each job's misfire threshold: a fire 10 s late is on time for a job that allows 60 s, and a
/// skipped misfire for one with the default 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misfire_thresholds_are_per_job() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let db = &app.admin.as_ref().unwrap().state.db;
    let yearly = json!({"schedule_type": "CRON", "schedule_conf": "0 0 0 1 1 ?", "misfire_strategy": "DO_NOTHING"});
    let mut lenient = yearly.clone();
    lenient["name"] = json!("lenient");
    lenient["misfire_threshold_ms"] = json!(60_000);
    let lenient = api.create_job(lenient).await;
    let mut strict = yearly;
    strict["name"] = json!("strict");
    let strict = api.create_job(strict).await;
    let late = wasmjob::admin::now_ms() - 10_000;
    for job_id in [lenient, strict] {
        api.upload(job_id, sample_job("hello")).await;
        db.set_job_running(job_id, Some(late), late).await.unwrap();
    }
    let run = api
        .wait_until("the lenient job fires its late fire", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={lenient}")).await;
            page["items"].as_array().and_then(|items| items.first().cloned())
        })
        .await;
    let ms = chrono::DateTime::parse_from_rfc3339(run["trigger_time"].as_str().unwrap()).unwrap();
    assert_eq!((run["trigger_type"].as_str(), ms.timestamp_millis()), (Some("CRON"), late));
    api.wait_until("the strict job moves past its misfire", || async {
        let job = db.get_job(strict).await.unwrap().unwrap();
        (job.next_fire_ms != late).then_some(())
    })
    .await;
    let (_, page) = api.get(&format!("/api/v1/logs?job_id={strict}")).await;
    assert_eq!(page["total"], 0, "a skipped misfire makes no run: {page}");
    app.stop().await;
}
