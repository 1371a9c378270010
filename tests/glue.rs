//! GLUE source: Python and JavaScript handlers uploaded as text, built by the admin with the real
//! builders, run by real executors on 127.0.0.1, and contained like any other component.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builders::{builders_dir, sample_source};
use crate::support::{Api, Backend, TestApp, sample_job};

/// A language's glue type, content type, sample directory and a one-word change of its `hello`.
struct Lang {
    glue_type: &'static str,
    content_type: &'static str,
    hello: &'static str,
    hostile: &'static str,
    edit: (&'static str, &'static str),
}

const PYTHON: Lang = Lang {
    glue_type: "GLUE_PYTHON",
    content_type: "text/x-python",
    hello: "python/hello.py",
    hostile: "python/hostile.py",
    edit: ("f\"hello, {", "f\"hi, {"),
};

const JAVASCRIPT: Lang = Lang {
    glue_type: "GLUE_JAVASCRIPT",
    content_type: "text/javascript; charset=utf-8",
    hello: "js/hello.js",
    hostile: "js/hostile.js",
    edit: ("`hello, ${", "`hi, ${"),
};

/// Builds, compiles and a first run of an interpreter component take tens of seconds on a
/// loaded machine: the waits here are generous bounds, never expectations.
const PATIENCE: Duration = Duration::from_secs(600);

async fn upload_source(
    api: &Api,
    job_id: i64,
    content_type: &str,
    text: &str,
) -> (StatusCode, Value) {
    let reply = api
        .http
        .post(api.url(&format!("/api/v1/jobs/{job_id}/versions?remark=from+text")))
        .bearer_auth(&api.token)
        .header("content-type", content_type)
        .body(text.to_owned())
        .send()
        .await
        .unwrap();
    let status = reply.status();
    let text = reply.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn get_text(api: &Api, path: &str) -> (StatusCode, String, String) {
    let reply = api.http.get(api.url(path)).bearer_auth(&api.token).send().await.unwrap();
    let status = reply.status();
    let content_type = reply
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, content_type, reply.text().await.unwrap())
}

async fn trigger(api: &Api, job_id: i64, param: &str) -> i64 {
    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
    assert_eq!(status, 200, "{triggered}");
    triggered["log_ids"][0].as_i64().unwrap()
}

/// The run once it has a result, waiting up to [`PATIENCE`].
async fn finished(api: &Api, log_id: i64) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, run) = api.get(&format!("/api/v1/logs/{log_id}")).await;
        if run["handle_code"].as_i64() != Some(0) {
            return run;
        }
        assert!(tokio::time::Instant::now() < deadline, "run {log_id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run_to_end(api: &Api, job_id: i64, param: &str) -> (i64, String, String) {
    let log_id = trigger(api, job_id, param).await;
    let run = finished(api, log_id).await;
    let log = api.log_content(log_id).await;
    (run["handle_code"].as_i64().unwrap(), run["handle_msg"].as_str().unwrap().to_owned(), log)
}

async fn glue_app(builders: Option<std::path::PathBuf>) -> TestApp {
    TestApp::start_with(Backend::Sqlite, |config| {
        config.builders.dir = builders;
        config.max_module_bytes = 32 * 1024 * 1024;
    })
    .await
}

/// Uploads are checked before anything is built: the language against the job's glue type, the
/// text itself, and the builder's presence (named, with how to install it). Nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_uploads_are_checked_and_need_the_builders() {
    let app = glue_app(None).await;
    let api = &app.api;
    let python = api.create_job(json!({"glue_type": "GLUE_PYTHON"})).await;
    let javascript = api.create_job(json!({"glue_type": "GLUE_JAVASCRIPT"})).await;
    let wasm = api.create_job(json!({})).await;
    let hello = sample_source("python/hello.py");
    let cases: Vec<(i64, &str, Vec<u8>, &str)> = vec![
        (python, "text/x-python", hello.clone().into_bytes(), "422 builder_missing"),
        (
            javascript,
            "text/javascript",
            b"export function run(t) {}".to_vec(),
            "422 builder_missing",
        ),
        (python, "text/javascript", b"export function run(t) {}".to_vec(), "400 wrong_glue_type"),
        (
            javascript,
            "text/x-python; charset=utf-8",
            hello.clone().into_bytes(),
            "400 wrong_glue_type",
        ),
        (wasm, "text/x-python", hello.clone().into_bytes(), "400 wrong_glue_type"),
        (python, "application/wasm", sample_job("hello"), "400 wrong_glue_type"),
        (python, "text/x-python", b"  \n".to_vec(), "400 invalid_body"),
        (python, "text/x-python", vec![0xff, 0xfe, b'x'], "400 invalid_body"),
        (python, "text/x-python", b"print(1)\0".to_vec(), "400 invalid_body"),
        (python, "text/plain", hello.clone().into_bytes(), "415 unsupported_media_type"),
    ];
    for (job_id, content_type, body, expected) in cases {
        let reply = api
            .http
            .post(api.url(&format!("/api/v1/jobs/{job_id}/versions")))
            .bearer_auth(&api.token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = reply.status();
        let body: Value = reply.json().await.unwrap();
        assert_eq!(
            format!("{} {}", status.as_u16(), body["code"].as_str().unwrap()),
            expected,
            "{body}"
        );
        if expected.ends_with("builder_missing") {
            let message = body["message"].as_str().unwrap();
            assert!(
                message.contains("componentize-") && message.contains("setup-builders"),
                "{message}"
            );
        }
    }
    for job_id in [python, javascript] {
        let (_, versions) = api.get(&format!("/api/v1/jobs/{job_id}/versions")).await;
        assert_eq!(versions, json!([]));
    }
    // A component version says what it is, and has no source to read or diff.
    let (status, version) = api.upload(wasm, sample_job("hello")).await;
    assert_eq!(status, 201, "{version}");
    assert_eq!((&version["language"], &version["has_source"]), (&json!("wasm"), &json!(false)));
    let (status, _, body) = get_text(api, &format!("/api/v1/jobs/{wasm}/versions/1/source")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("source_not_found"), "{body}");
    let (status, _, body) = get_text(api, &format!("/api/v1/jobs/{wasm}/versions/1/diff/1")).await;
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = get_text(api, &format!("/api/v1/jobs/{wasm}/versions/9/source")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("version_not_found"), "{body}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_handlers_run_and_roll_back() {
    handlers_run_and_roll_back(&PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_handlers_run_and_roll_back() {
    handlers_run_and_roll_back(&JAVASCRIPT).await;
}

/// Upload as text, run by hand and by cron, read logs and results; a second version, its diff,
/// a rollback, and the first version running again. The executor only ever hears of a digest.
async fn handlers_run_and_roll_back(lang: &Lang) {
    let Some(builders) = builders_dir() else { return };
    let app = glue_app(Some(builders)).await;
    let api = &app.api;
    let job_id = api
        .create_job(json!({
            "glue_type": lang.glue_type, "memory_limit_mb": 256, "timeout_secs": 600,
            "param": "cron",
        }))
        .await;
    let first = sample_source(lang.hello);
    let (status, v1) = upload_source(api, job_id, lang.content_type, &first).await;
    assert_eq!(status, 201, "{v1}");
    let language = lang.glue_type.trim_start_matches("GLUE_").to_lowercase();
    assert_eq!((&v1["language"], &v1["has_source"]), (&json!(language), &json!(true)), "{v1}");
    assert_eq!(v1["remark"], "from text");

    let (code, message, log) = run_to_end(api, job_id, "by hand").await;
    assert_eq!((code, message.as_str()), (200, "hello, by hand"), "{log}");
    assert!(log.contains("hello, by hand"), "{log}");
    // The trigger named the component by digest: the text stayed with the admin.
    let sha256 = v1["sha256"].as_str().unwrap();
    assert!(log.contains(&format!("GLUE_WASM {sha256}")), "{log}");
    let (code, message, _) = run_to_end(api, job_id, "fail").await;
    assert_eq!((code, message.as_str()), (500, "job failed: asked to fail"));

    // By cron: every second until one run has ended.
    let (status, job) = api
        .http
        .put(api.url(&format!("/api/v1/jobs/{job_id}")))
        .bearer_auth(&api.token)
        .json(&json!({
            "group_id": 1, "name": "test job", "glue_type": lang.glue_type,
            "schedule_type": "CRON", "schedule_conf": "* * * * * ?", "param": "cron",
            "memory_limit_mb": 256, "timeout_secs": 600,
        }))
        .send()
        .await
        .map(|reply| (reply.status(), reply))
        .unwrap();
    assert_eq!(status, 200, "{:?}", job.text().await);
    let (status, started) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
    assert_eq!(status, 200, "{started}");
    let cron_run = api
        .wait_until("a cron run ends", || async {
            let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
            let runs = page["items"].as_array()?;
            runs.iter()
                .find(|run| run["trigger_type"] == "CRON" && run["handle_code"] != 0)
                .cloned()
        })
        .await;
    api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
    assert_eq!(
        (&cron_run["handle_code"], &cron_run["handle_msg"]),
        (&json!(200), &json!("hello, cron"))
    );

    // A second version, its diff against the first, and a rollback.
    let second = first.replace(lang.edit.0, lang.edit.1);
    assert_ne!(first, second);
    let (status, v2) = upload_source(api, job_id, lang.content_type, &second).await;
    assert_eq!(status, 201, "{v2}");
    assert_eq!(run_to_end(api, job_id, "two").await.1, "hi, two");
    let (status, content_type, text) =
        get_text(api, &format!("/api/v1/jobs/{job_id}/versions/1/source")).await;
    assert_eq!((status, content_type.as_str()), (StatusCode::OK, "text/plain; charset=utf-8"));
    assert_eq!(text, first);
    let (status, _, diff) =
        get_text(api, &format!("/api/v1/jobs/{job_id}/versions/1/diff/2")).await;
    assert_eq!(status, 200, "{diff}");
    let changed: Vec<&str> = diff.lines().filter(|l| l.starts_with(['-', '+', '@'])).collect();
    assert_eq!(changed[..2], ["--- v1", "+++ v2"], "{diff}");
    assert_eq!(changed.len(), 5, "one hunk changing one line: {diff}");
    assert!(changed[3].starts_with('-') && changed[3].contains(lang.edit.0), "{diff}");
    assert!(changed[4].starts_with('+') && changed[4].contains(lang.edit.1), "{diff}");
    let (status, _, missing) =
        get_text(api, &format!("/api/v1/jobs/{job_id}/versions/1/diff/7")).await;
    assert_eq!(status, 404, "{missing}");
    let (status, activated) =
        api.post(&format!("/api/v1/jobs/{job_id}/versions/1/activate"), json!({})).await;
    assert_eq!(status, 200, "{activated}");
    assert_eq!(run_to_end(api, job_id, "again").await.1, "hello, again");
    let (_, versions) = api.get(&format!("/api/v1/jobs/{job_id}/versions")).await;
    let listed: Vec<(i64, bool, bool)> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["version"].as_i64().unwrap(), v["active"] == true, v["has_source"] == true))
        .collect();
    assert_eq!(listed, [(2, false, true), (1, true, true)]);
    app.stop().await;
}

/// A hostile Python script, one build, every case by its param: files, sockets and name lookup
/// give errors and no data, a loop ends at its deadline, a memory bomb at the cap, and a
/// sleeping script is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_python_is_contained() {
    let Some(builders) = builders_dir() else { return };
    let app = glue_app(Some(builders)).await;
    let api = &app.api;
    let job_id = hostile_job(api, &PYTHON).await;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let probes = [
        "open:/etc/passwd".to_owned(),
        "open:/etc/hostname".to_owned(),
        "listdir:/".to_owned(),
        "listdir:.".to_owned(),
        format!("tcp:{}", tcp.local_addr().unwrap().port()),
        format!("udp:{}", udp.local_addr().unwrap().port()),
        "dns:localhost".to_owned(),
    ];
    for probe in &probes {
        let (code, message, log) = run_to_end(api, job_id, probe).await;
        eprintln!("python {probe}: {code} {message}");
        let name = probe.split(':').next().unwrap();
        assert_eq!(code, 500, "{probe}: {message}\n{log}");
        assert!(
            message.starts_with(&format!("job failed: denied: {name}: ")),
            "{probe}: {message}"
        );
        assert!(!message.contains("root:") && !message.contains("connected"), "{message}");
    }
    assert!(tcp.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock));
    assert!(udp.recv(&mut [0; 64]).is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock));
    contained_runaways(api, job_id, &PYTHON, "sleep:3600000").await;
    app.stop().await;
}

/// A hostile JavaScript script, one build, every case by its param: no `require`, `process`,
/// `Deno` or `Bun` in reach (and no `wasi:http` import behind `fetch`, or upload validation
/// would have refused the component), a loop ends at its deadline, a memory bomb at the cap, and a script
/// spinning on the clock is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_javascript_is_contained() {
    let Some(builders) = builders_dir() else { return };
    let app = glue_app(Some(builders)).await;
    let api = &app.api;
    let job_id = hostile_job(api, &JAVASCRIPT).await;
    // componentize-js defines `fetch` whatever its features; with no `wasi:http` import it
    // has nothing to reach the network through.
    let (code, message, log) = run_to_end(api, job_id, "reach").await;
    assert_eq!((code, message.as_str()), (200, "reach: fetch"), "{log}");
    let (code, message, _) = run_to_end(api, job_id, "nothing").await;
    assert_eq!((code, message.as_str()), (500, "job failed: unknown probe `nothing`"));
    contained_runaways(api, job_id, &JAVASCRIPT, "wait:3600000").await;
    app.stop().await;
}

/// The hostile job, with a timeout long enough for its component's first compilation on the
/// executor (which the admin's deadline for the run includes).
async fn hostile_job(api: &Api, lang: &Lang) -> i64 {
    let job_id = api.create_job(hostile_fields(lang, 600)).await;
    let (status, version) =
        upload_source(api, job_id, lang.content_type, &sample_source(lang.hostile)).await;
    assert_eq!(status, 201, "{version}");
    job_id
}

fn hostile_fields(lang: &Lang, timeout_secs: i64) -> Value {
    json!({
        "group_id": 1, "name": "hostile", "schedule_type": "NONE", "glue_type": lang.glue_type,
        "memory_limit_mb": 128, "timeout_secs": timeout_secs,
    })
}

/// A loop stopped at the deadline, a memory bomb at the cap, a long wait killed. The job's
/// component is compiled on the executor already (an earlier run), so its timeout can be short.
async fn contained_runaways(api: &Api, job_id: i64, lang: &Lang, sleep: &str) {
    let reply = api
        .http
        .put(api.url(&format!("/api/v1/jobs/{job_id}")))
        .bearer_auth(&api.token)
        .json(&hostile_fields(lang, 5))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200, "{:?}", reply.text().await);
    let (code, message, _) = run_to_end(api, job_id, "loop").await;
    eprintln!("loop: {code} {message}");
    assert_eq!(code, 502, "{message}");
    assert!(message.starts_with("timeout: the run passed its deadline"), "{message}");
    let (code, message, log) = run_to_end(api, job_id, "bomb").await;
    eprintln!("bomb: {code} {message}");
    assert_eq!(code, 500, "{message}\n{log}");
    assert!(message.to_lowercase().contains("memory"), "{message}\n{log}");

    let log_id = trigger(api, job_id, sleep).await;
    let probe = format!("probing {}", sleep.split(':').next().unwrap());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !log_text(api, log_id).await.contains(&probe) {
        assert!(tokio::time::Instant::now() < deadline, "the script never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = api.post(&format!("/api/v1/logs/{log_id}/kill"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let run = finished(api, log_id).await;
    assert_eq!(
        (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
        (Some(500), Some("killed: the run was stopped on request"))
    );
}

/// The log of a run so far (empty while the executor has none).
async fn log_text(api: &Api, log_id: i64) -> String {
    let (_, page) = api.get(&format!("/api/v1/logs/{log_id}/content?from_line=1")).await;
    page["content"].as_str().unwrap_or_default().to_owned()
}
