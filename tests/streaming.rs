//! `GET /api/v1/logs/{id}/stream` end to end: a real executor pushes a running job's log
//! through the admin to an SSE client, which drops the connection mid-run and resumes.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::cluster::Cluster;
use crate::support::sse::open_stream;
use crate::support::{Api, Backend, TestApp, sample_job};

/// The milliseconds between the time a log line carries (written by the executor as the guest
/// logged it) and now, if the line was written after `opened_ms` (a line from before the
/// connection measures the reconnection, not the stream).
fn latency_ms(line: &str, opened_ms: i64) -> Option<i64> {
    let stamp = line.get(..23)?;
    let written = chrono::NaiveDateTime::parse_from_str(stamp, "%Y-%m-%d %H:%M:%S%.3f").ok()?;
    let written_ms = written.and_utc().timestamp_millis();
    (written_ms >= opened_ms).then(|| chrono::Utc::now().timestamp_millis() - written_ms)
}

#[tokio::test]
async fn a_running_jobs_log_streams_through_the_admin_and_resumes_without_a_gap() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job_id = api.create_job(json!({"name": "ticker", "timeout_secs": 60})).await;
    let (status, version) = api.upload(job_id, sample_job("ticker")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let ticks = 30;
    let (status, triggered) = api
        .post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": format!("{ticks},40")}))
        .await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    let log_id = triggered["log_ids"][0].as_i64().unwrap();

    // Follow until the run is a few lines in, then drop the connection mid-run.
    let mut lines: Vec<(i64, String)> = Vec::new();
    let mut latencies: Vec<i64> = Vec::new();
    let opened_ms = chrono::Utc::now().timestamp_millis();
    let mut stream = open_stream(api, log_id, None).await;
    while lines.iter().filter(|(_, line)| line.contains("tick ")).count() < 8 {
        let event = stream.next().await.expect("the stream ended before the run did");
        assert_eq!(event.event, None, "{event:?}");
        let id: i64 = event.id.unwrap().parse().unwrap();
        latencies.extend(latency_ms(&event.data, opened_ms));
        lines.push((id, event.data));
    }
    drop(stream);
    let run = api.get(&format!("/api/v1/logs/{log_id}")).await.1;
    assert_eq!(run["handle_code"], 0, "the run ended before the connection was dropped: {run}");

    // Resume after the last line received: the rest, then the result.
    let last = lines.last().unwrap().0.to_string();
    let opened_ms = chrono::Utc::now().timestamp_millis();
    let mut stream = open_stream(api, log_id, Some(&last)).await;
    let end = loop {
        let event = stream.next().await.expect("the stream ended without its end event");
        if event.event.as_deref() == Some("end") {
            break event;
        }
        let id: i64 = event.id.unwrap().parse().unwrap();
        latencies.extend(latency_ms(&event.data, opened_ms));
        lines.push((id, event.data));
    };
    assert!(stream.next().await.is_none(), "the stream ends after its end event");

    // Every line once, in order, numbered from 1, exactly the log the executor kept.
    let ids: Vec<i64> = lines.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=lines.len() as i64).collect::<Vec<_>>());
    let full_log = api.log_content(log_id).await;
    let streamed: Vec<&str> = lines.iter().map(|(_, line)| line.as_str()).collect();
    assert_eq!(streamed, full_log.lines().collect::<Vec<_>>());
    let tick_lines: Vec<String> = streamed
        .iter()
        .filter_map(|line| line.split_once("[INFO] tick ").map(|(_, tick)| tick.to_owned()))
        .collect();
    let expected: Vec<String> = (1..=ticks).map(|i| format!("{i} of {ticks}")).collect();
    assert_eq!(tick_lines, expected);
    let end: Value = serde_json::from_str(&end.data).unwrap();
    assert_eq!(
        end,
        json!({"state": "success", "handle_code": 200, "handle_msg": format!("ticked {ticks} times"), "last_line": lines.len()})
    );

    // A finished run's stream is its whole log, then the end event, at once.
    let mut again = open_stream(api, log_id, Some("0")).await;
    let mut count = 0;
    while let Some(event) = again.next().await {
        if event.event.as_deref() == Some("end") {
            break;
        }
        count += 1;
    }
    assert_eq!(count, lines.len());

    eprintln!("latencies in order of arrival (ms): {latencies:?}");
    latencies.sort_unstable();
    let percentile = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    eprintln!(
        "guest line → SSE client on 127.0.0.1: p50 {} ms, p99 {} ms, max {} ms over {} live lines",
        percentile(50),
        percentile(99),
        latencies.last().unwrap(),
        latencies.len()
    );
    app.stop().await;
}

#[tokio::test]
async fn streams_of_unknown_runs_and_bad_resume_points_are_refused() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let (status, body) = api.get("/api/v1/logs/999/stream").await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("log_not_found")));

    let job_id = api.create_job(json!({"name": "ticker"})).await;
    api.upload(job_id, sample_job("ticker")).await;
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "1,0"})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    for bad in ["abc", "-1"] {
        let reply = api
            .http
            .get(api.url(&format!("/api/v1/logs/{log_id}/stream")))
            .bearer_auth(&api.token)
            .header("last-event-id", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["code"], "invalid_last_event_id");
    }
    let reply = api.http.get(api.url(&format!("/api/v1/logs/{log_id}/stream"))).send().await;
    assert_eq!(reply.unwrap().status(), StatusCode::UNAUTHORIZED);
    app.stop().await;
}

/// An executor without `/log/stream` (XXL-JOB's: a stand-in here, serving `/run` and `/log`
/// from lines the test adds) is polled through `/log`: the stream still gets every line once,
/// in order, then the result the executor calls back.
#[tokio::test]
async fn an_executor_without_push_is_polled() {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;

    #[derive(Clone, Default)]
    struct XxlExecutor {
        lines: Arc<Mutex<Vec<String>>>,
        ended: Arc<Mutex<bool>>,
    }
    async fn run() -> axum::Json<Value> {
        axum::Json(json!({"code": 200, "msg": null}))
    }
    async fn log(
        State(executor): State<XxlExecutor>,
        axum::Json(param): axum::Json<Value>,
    ) -> axum::Json<Value> {
        let from = param["fromLineNum"].as_i64().unwrap().max(1);
        let lines = executor.lines.lock().unwrap().clone();
        let page: Vec<String> =
            lines.iter().skip(from as usize - 1).map(|l| format!("{l}\n")).collect();
        let is_end = *executor.ended.lock().unwrap();
        axum::Json(json!({"code": 200, "content": {
            "fromLineNum": from,
            "toLineNum": from - 1 + page.len() as i64,
            "logContent": page.concat(),
            "isEnd": is_end,
        }}))
    }
    let executor = XxlExecutor::default();
    let router = axum::Router::new()
        .route("/run", post(run))
        .route("/log", post(log))
        .with_state(executor.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let (status, group) = api
        .post(
            "/api/v1/groups",
            json!({"app_name": "xxl", "address_type": "MANUAL", "addresses": [address]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let job_id = api
        .create_job(json!({"name": "legacy", "group_id": group["id"], "glue_type": "BEAN", "handler": "demoJobHandler"}))
        .await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();

    let mut stream = open_stream(api, log_id, None).await;
    let mut received = Vec::new();
    for batch in [&["one", "two"][..], &["three"][..]] {
        executor.lines.lock().unwrap().extend(batch.iter().map(|line| line.to_string()));
        for _ in batch {
            let event = stream.next().await.unwrap();
            received.push((event.id.unwrap(), event.data));
        }
    }
    *executor.ended.lock().unwrap() = true;
    let callback =
        json!([{"logId": log_id, "logDateTim": 0, "handleCode": 200, "handleMsg": "done"}]);
    let reply = api
        .http
        .post(api.url("/api/callback"))
        .header("XXL-JOB-ACCESS-TOKEN", crate::support::ACCESS_TOKEN)
        .json(&callback)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let end = stream.next().await.unwrap();
    assert_eq!(end.event.as_deref(), Some("end"), "{end:?}");
    let end: Value = serde_json::from_str(&end.data).unwrap();
    assert_eq!((end["state"].as_str(), end["last_line"].as_i64()), (Some("success"), Some(3)));
    let expected: Vec<(String, String)> = ["one", "two", "three"]
        .iter()
        .enumerate()
        .map(|(i, line)| ((i + 1).to_string(), line.to_string()))
        .collect();
    assert_eq!(received, expected);
    app.stop().await;
}

/// The milliseconds run `run` took on its executor, from its start to its result.
fn run_ms(run: &Value) -> i64 {
    let at = |field: &str| {
        let text = run[field].as_str().unwrap_or_else(|| panic!("no {field} in {run}"));
        chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
    };
    at("handle_time") - at("started_at")
}

/// A thousand clients follow one running job's log at once: each gets every line once, in
/// order, and then the result, while the run's executor serves one log stream for them all.
/// The admin and the executor are processes of their own, as deployed; the run's time with the
/// clients watching is printed beside its time alone (reported, not asserted: the machine is
/// shared).
#[tokio::test]
async fn a_thousand_subscribers_each_get_every_line_of_the_run_they_watch() {
    const SUBSCRIBERS: usize = 1000;
    let cluster = Cluster::start(None, 1, 1).await;
    // No overall timeout: a stream lasts as long as its run.
    let api = &Api { http: reqwest::Client::new(), ..cluster.api() };
    let job_id = api.create_job(json!({"name": "ticker", "timeout_secs": 120})).await;
    let (status, version) = api.upload(job_id, sample_job("ticker")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let ticks = 60;
    let param = json!({"param": format!("{ticks},50")});
    let trigger = || async {
        let (status, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), param.clone()).await;
        assert_eq!(status, StatusCode::OK, "{triggered}");
        triggered["log_ids"][0].as_i64().unwrap()
    };
    let executor_url = cluster.executors[0].url();
    let streams_served = || async {
        let scrape = crate::support::metrics::scrape_executor(&api.http, &executor_url).await;
        scrape.value("wasmjob_executor_log_streams_total")
    };

    let alone = api.finished_run(trigger().await).await;
    let log_id = trigger().await;
    let follow = |_| async move {
        let mut stream = open_stream(api, log_id, None).await;
        let mut ids = Vec::new();
        loop {
            let event = stream.next().await.expect("the stream ended without its end event");
            if event.event.as_deref() == Some("end") {
                return (ids, event.data);
            }
            ids.push(event.id.unwrap().parse::<i64>().unwrap());
        }
    };
    let followed = futures_util::future::join_all((0..SUBSCRIBERS).map(follow)).await;
    let watched = api.finished_run(log_id).await;
    assert_eq!(watched["state"], "success", "{watched}");

    let lines = api.log_content(log_id).await.lines().count() as i64;
    assert!(lines >= ticks, "{lines} lines");
    for (ids, end) in &followed {
        assert_eq!(ids, &(1..=lines).collect::<Vec<_>>());
        let end: Value = serde_json::from_str(end).unwrap();
        assert_eq!(end["state"], "success", "{end}");
        assert_eq!(end["last_line"], lines, "{end}");
    }
    // The executor pushed the run's log once, to the feed that all the clients share.
    let served = streams_served().await;
    assert!(served <= 2.0, "the executor served {served} log streams for one watched run");
    eprintln!(
        "a run of {ticks} ticks 50 ms apart took {} ms alone and {} ms with {SUBSCRIBERS} \
         subscribers; its executor served {served} log stream(s)",
        run_ms(&alone),
        run_ms(&watched)
    );
    cluster.finish().await;
}

/// Open log streams end when the admin stops, instead of holding its graceful shutdown for as
/// long as their runs last.
#[tokio::test]
async fn an_admin_stops_within_two_seconds_with_log_streams_open() {
    let mut app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let job_id = api.create_job(json!({"name": "sleeper", "timeout_secs": 60})).await;
    let (status, version) = api.upload(job_id, sample_job("sleeper")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "10000"})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = open_stream(api, log_id, None).await;
        let first = stream.next().await.expect("the stream ended before the run did");
        assert_eq!(first.event, None, "{first:?}");
        streams.push(stream);
    }

    let admin = app.admin.take().unwrap();
    let started = std::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(10), admin.stop()).await;
    let elapsed = started.elapsed();
    eprintln!("the admin stopped in {elapsed:?} with {} log streams open", streams.len());
    assert!(
        stopped.is_ok() && elapsed < Duration::from_secs(2),
        "the admin took {elapsed:?} to stop (gave up at 10 s) with log streams open"
    );
    // Each stream gives what it had queued, then ends without an `end` event: the run has not.
    for mut stream in streams {
        let mut events = 0;
        while let Some(event) = stream.next().await {
            assert_eq!(event.event, None, "{event:?}");
            events += 1;
            assert!(events < 100, "a stream outlived its admin");
        }
    }
    app.stop().await;
}
