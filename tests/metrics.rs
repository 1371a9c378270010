//! `/metrics` on the admin and the executor: scraped over HTTP, parsed strictly as the
//! OpenMetrics text format, and watched as runs happen.
//!
//! Counters are the process's, and other tests run in this process at the same time, so
//! counters are checked to move by at least what this test did; levels (gauges) belong to
//! this test's admin and executor and are checked exactly.

use std::collections::{BTreeMap, HashMap};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{ACCESS_TOKEN, Api, Backend, TestApp, sample_job};

/// A parsed exposition: each sample (`name{labels}` with labels sorted) and its value.
#[derive(Debug)]
pub struct Scrape {
    pub samples: HashMap<String, f64>,
    pub types: HashMap<String, String>,
}

impl Scrape {
    /// The value of `series` (`name` or `name{k="v"}`), 0 when absent.
    pub fn value(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }
}

/// Parses the OpenMetrics text format, panicking on anything it does not allow: metadata
/// before the samples of its family, a known type for every family, `_total` on counter
/// samples, well-formed names, labels and values, cumulative histogram buckets, `# EOF` last.
pub fn parse(text: &str) -> Scrape {
    let mut scrape = Scrape { samples: HashMap::new(), types: HashMap::new() };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition ends with # EOF");
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, name, rest) =
                (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap_or(""));
            assert!(is_name(name), "bad metric name in {line:?}");
            match kind {
                "HELP" | "UNIT" => {}
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram", "info", "stateset", "unknown"]
                            .contains(&rest),
                        "bad type in {line:?}"
                    );
                    let known = scrape.types.insert(name.to_owned(), rest.to_owned());
                    assert!(known.is_none(), "{name} typed twice");
                }
                other => panic!("unknown metadata {other:?} in {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            number => number.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"));
                (name, parse_labels(labels, line))
            }
            None => (series, Vec::new()),
        };
        assert!(is_name(name), "bad sample name in {line:?}");
        let family = scrape
            .types
            .iter()
            .filter(|(family, _)| name.starts_with(family.as_str()))
            .max_by_key(|(family, _)| family.len())
            .map(|(family, kind)| (family.clone(), kind.clone()))
            .unwrap_or_else(|| panic!("sample before its family's TYPE: {line:?}"));
        let suffix = &name[family.0.len()..];
        let allowed: &[&str] = match family.1.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        assert!(allowed.contains(&suffix), "{name} does not fit a {} family", family.1);
        if suffix == "_bucket" {
            let le = labels.iter().find(|(key, _)| key == "le").expect("a bucket has le");
            let bound = if le.1 == "+Inf" { f64::INFINITY } else { le.1.parse().unwrap() };
            let others: Vec<_> = labels.iter().filter(|(key, _)| key != "le").collect();
            buckets.entry(format!("{name}{others:?}")).or_default().push((bound, value));
        }
        let mut labels = labels;
        labels.sort();
        let key = if labels.is_empty() {
            name.to_owned()
        } else {
            let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            format!("{name}{{{}}}", inner.join(","))
        };
        assert!(scrape.samples.insert(key, value).is_none(), "sample twice: {line:?}");
    }
    for (histogram, bounds) in buckets {
        let ordered = bounds.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1);
        assert!(ordered, "{histogram}: buckets not cumulative: {bounds:?}");
        assert_eq!(bounds.last().map(|b| b.0), Some(f64::INFINITY), "{histogram} lacks +Inf");
    }
    scrape
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(text: &str, line: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad labels: {line:?}"));
        assert!(is_name(key), "bad label name in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => panic!("bad escape in {line:?}"),
                },
                Some((at, '"')) => break at,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line:?}"),
            }
        };
        labels.push((key.to_owned(), value));
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    labels
}

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

pub async fn scrape_executor(http: &reqwest::Client, url: &str) -> Scrape {
    let reply = http.get(format!("{url}/metrics")).bearer_auth(ACCESS_TOKEN).send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
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
        ("wasmjob_executors_online", "gauge"),
        ("wasmjob_runs_unfinished", "gauge"),
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
