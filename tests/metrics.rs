//! `/metrics` on the admin and the executor: scraped over HTTP, parsed strictly as the
//! OpenMetrics text format, and watched as runs happen.
//!
//! Counters are the process's, and other tests run in this process at the same time, so
//! counters are checked to move by at least what this test did; levels (gauges) belong to
//! this test's admin and executor and are checked exactly.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::metrics::{Scrape, parse, scrape_executor};
use crate::support::{Api, Backend, TestApp, sample_job};

async fn scrape_admin(api: &Api) -> Scrape {
    let reply = api.http.get(api.url("/metrics")).bearer_auth(&api.token).send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    assert!(
        reply.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    parse(&reply.text().await.unwrap())
}

#[tokio::test]
async fn metrics_are_scraped_parsed_and_move_as_runs_happen() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let executor_url = format!("http://{}", app.executor.as_ref().unwrap().local_addr);

    // Both refuse a scrape without their token.
    let anonymous = api.http.get(api.url("/metrics")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let anonymous = api.http.get(format!("{executor_url}/metrics")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let wrong = api.http.get(format!("{executor_url}/metrics")).bearer_auth("wrong").send();
    assert_eq!(wrong.await.unwrap().status(), StatusCode::UNAUTHORIZED);

    let admin_before = scrape_admin(api).await;
    let executor_before = scrape_executor(&api.http, &executor_url).await;
    assert_eq!(admin_before.value("wasmjob_executors_online{group=\"default\"}"), 1.0);
    for kind in [
        ("wasmjob_fires", "counter"),
        ("wasmjob_fire_lateness_seconds", "histogram"),
        ("wasmjob_dispatch_failures", "counter"),
        ("wasmjob_run_fuel_used", "histogram"),
        ("wasmjob_callback_batch_size", "histogram"),
        ("wasmjob_callback_results_recorded", "counter"),
        ("wasmjob_callback_results_unapplied", "gauge"),
        ("wasmjob_executors_online", "gauge"),
        ("wasmjob_runs_unfinished", "gauge"),
        ("wasmjob_workflow_runs_started", "counter"),
        ("wasmjob_workflow_runs", "gauge"),
        ("wasmjob_workflow_node_lateness_seconds", "histogram"),
        ("wasmjob_partitions_held", "gauge"),
        ("wasmjob_partition_handovers", "counter"),
    ] {
        assert_eq!(admin_before.types.get(kind.0).map(String::as_str), Some(kind.1), "{kind:?}");
    }
    for kind in [
        ("wasmjob_executor_module_compile_seconds", "histogram"),
        ("wasmjob_executor_queue_depth", "gauge"),
        ("wasmjob_executor_runs_in_flight", "gauge"),
        ("wasmjob_executor_outbox_depth", "gauge"),
        ("wasmjob_executor_outbox_oldest_age_seconds", "gauge"),
    ] {
        assert_eq!(executor_before.types.get(kind.0).map(String::as_str), Some(kind.1), "{kind:?}");
    }

    // A cron job fires twice and succeeds; a run by hand fails.
    let job_id = api
        .create_job(
            json!({"name": "hello", "schedule_type": "CRON", "schedule_conf": "* * * * * ?"}),
        )
        .await;
    api.upload(job_id, sample_job("hello")).await;
    api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    api.wait_until("two cron runs succeed", || async {
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
        (page["total"].as_i64() >= Some(2)).then_some(())
    })
    .await;
    api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    let failing = api.create_job(json!({"name": "fail"})).await;
    api.upload(failing, sample_job("fail")).await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{failing}/trigger"), json!({})).await;
    api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;

    let admin_after = scrape_admin(api).await;
    // Families with labels appear with their first member.
    assert_eq!(admin_after.types["wasmjob_runs_ended"], "counter");
    let moved = |series: &str| admin_after.value(series) - admin_before.value(series);
    assert!(moved("wasmjob_fires_total") >= 2.0);
    assert!(moved("wasmjob_fire_lateness_seconds_count") >= 2.0);
    assert!(moved("wasmjob_runs_ended_total{state=\"success\"}") >= 2.0);
    assert!(moved("wasmjob_runs_ended_total{state=\"failed\"}") >= 1.0);
    assert!(moved("wasmjob_run_fuel_used_count") >= 2.0);
    assert!(moved("wasmjob_callback_batch_size_count") >= 1.0);
    assert_eq!(admin_after.types["wasmjob_db_transaction_seconds"], "histogram");
    assert!(moved("wasmjob_db_transaction_seconds_count{kind=\"fire\"}") >= 2.0);
    assert!(moved("wasmjob_db_transaction_seconds_count{kind=\"batch\"}") >= 1.0);
    let executor_after = scrape_executor(&api.http, &executor_url).await;
    assert_eq!(executor_after.types["wasmjob_executor_module_cache_lookups"], "counter");
    let moved = |series: &str| executor_after.value(series) - executor_before.value(series);
    assert!(moved("wasmjob_executor_module_cache_lookups_total{result=\"miss\"}") >= 2.0);
    assert!(moved("wasmjob_executor_module_cache_lookups_total{result=\"hit\"}") >= 1.0);
    assert!(moved("wasmjob_executor_module_compile_seconds_count") >= 2.0);

    // A run that no executor can take is a dispatch failure.
    let (_, group) =
        api.post("/api/v1/groups", json!({"app_name": "empty", "address_type": "AUTO"})).await;
    let orphan = api.create_job(json!({"name": "orphan", "group_id": group["id"]})).await;
    api.upload(orphan, sample_job("hello")).await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{orphan}/trigger"), json!({})).await;
    api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    let admin_last = scrape_admin(api).await;
    assert!(
        admin_last.value("wasmjob_dispatch_failures_total")
            > admin_before.value("wasmjob_dispatch_failures_total")
    );
    assert_eq!(admin_last.value("wasmjob_executors_online{group=\"empty\"}"), 0.0);

    // Levels: a sleeping run is in flight, and after it nothing is.
    let sleeper = api.create_job(json!({"name": "sleeper", "timeout_secs": 60})).await;
    api.upload(sleeper, sample_job("sleeper")).await;
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{sleeper}/trigger"), json!({"param": "1500"})).await;
    api.wait_until("the sleeper is in flight, as both see it", || async {
        let executor = scrape_executor(&api.http, &executor_url).await;
        let admin = scrape_admin(api).await;
        let in_flight = executor.value("wasmjob_executor_runs_in_flight") == 1.0
            && admin.value("wasmjob_runs_unfinished{state=\"running\"}") == 1.0;
        in_flight.then_some(())
    })
    .await;
    api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
    api.wait_until("the executor is idle and acknowledged", || async {
        let scrape = scrape_executor(&api.http, &executor_url).await;
        let idle = ["queue_depth", "runs_in_flight", "outbox_depth", "outbox_oldest_age_seconds"]
            .iter()
            .all(|level| scrape.value(&format!("wasmjob_executor_{level}")) == 0.0);
        idle.then_some(())
    })
    .await;
    app.stop().await;
}

#[test]
fn the_parser_refuses_what_the_format_does_not_allow() {
    let good = "# TYPE a counter\na_total 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n# EOF\n";
    assert_eq!(parse(good).value("h_count"), 2.0);
    for bad in [
        "# TYPE a counter\na_total 1\n",       // no EOF
        "a_total 1\n# EOF\n",                  // no TYPE
        "# TYPE a counter\na 1\n# EOF\n",      // counter without _total
        "# TYPE a gauge\na{x=\"1} 1\n# EOF\n", // unterminated label
        "# TYPE a gauge\na one\n# EOF\n",      // bad value
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n# EOF\n", // not cumulative
    ] {
        assert!(std::panic::catch_unwind(|| parse(bad)).is_err(), "accepted {bad:?}");
    }
}
