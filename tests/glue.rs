//! GLUE source: Python and JavaScript handlers uploaded as text, built by the admin with the real
//! builders, run by real executors on 127.0.0.1, and contained like any other component; and
//! the builds themselves, which run the handler's top level, confined away from the admin's host
//! (an admin process of their own, started with the environment they set).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builders::{builders_dir, sample_source};
use crate::support::cluster::free_port;
use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, Api, Backend, TestApp, sample_job};

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

/// An admin process of its own, started with an environment a test chooses (the in-process
/// admin of [`TestApp`] shares the test binary's), with the builders and no executor: uploads
/// are built and answered, nothing runs.
struct OwnAdmin {
    api: Api,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl OwnAdmin {
    async fn start(builders: &Path, python: &Path, env: &[(&str, &OsStr)]) -> OwnAdmin {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("admin.log")).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wasmjob"));
        command
            .arg("admin")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--database-url")
            .arg(format!("sqlite:{}", dir.path().join("wasmjob.db").display()))
            .args(["--admin-token", ADMIN_TOKEN, "--access-token", ACCESS_TOKEN])
            .arg("--builders-dir")
            .arg(builders)
            .arg("--python")
            .arg(python)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("WASMJOB_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().copied());
        let child = command.spawn().unwrap();
        let api = Api {
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{port}"),
            token: ADMIN_TOKEN.to_owned(),
        };
        let mut admin = OwnAdmin { api, child, _dir: dir };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !admin.log().contains("listening on") {
            assert!(admin.child.try_wait().unwrap().is_none(), "admin exited:\n{}", admin.log());
            assert!(
                tokio::time::Instant::now() < deadline,
                "admin did not start:\n{}",
                admin.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (status, group) = admin
            .api
            .post(
                "/api/v1/groups",
                json!({"app_name": "default", "title": "Default", "address_type": "AUTO"}),
            )
            .await;
        assert_eq!(status, 201, "{group}");
        admin
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("admin.log")).unwrap_or_default()
    }
}

impl Drop for OwnAdmin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a probe source reported through its build's error: `name: done|denied` pairs.
fn probe_report(message: &str) -> Vec<(String, String)> {
    let report = message
        .lines()
        .filter_map(|line| line.split_once("probe report: ").map(|(_, report)| report))
        .find(|report| report.contains(": done") || report.contains(": denied"))
        .unwrap_or_else(|| panic!("no probe report in the build's error: {message}"));
    report
        .split("; ")
        .map(|pair| {
            let (name, outcome) = pair.split_once(": ").unwrap();
            (name.to_owned(), outcome.trim().to_owned())
        })
        .collect()
}

/// The files of `dir`, by name, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A Python handler's top level runs during the build (componentize-py's pre-initialization):
/// it must reach nothing of the admin's host. The admin runs from a virtual environment (its
/// `VIRTUAL_ENV` set, its `--python` the venv's), with a user site of its own and a secret in its
/// environment. A first build tries to write a `.pth` into every directory mounted for it, to
/// read the process's environment and `/etc/hostname`, and to connect to a listener here: every
/// attempt fails and no site-packages directory gains a file. A second build runs none of the
/// `.pth` files planted in the venv's and the user's site-packages (each would leave a marker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_builds_touch_nothing_of_the_host() {
    let Some(builders) = builders_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success(), "python3 -m venv: {made}");
    let lib = venv.join("lib");
    let venv_site = names_in(&lib)
        .iter()
        .map(|name| lib.join(name).join("site-packages"))
        .find(|path| path.is_dir())
        .expect("the venv's site-packages");
    let user_base = dir.path().join("user-base");
    let asked = std::process::Command::new(venv.join("bin/python3"))
        .args(["-c", "import site; print(site.getusersitepackages())"])
        .env("PYTHONUSERBASE", &user_base)
        .output()
        .unwrap();
    let user_site = PathBuf::from(String::from_utf8(asked.stdout).unwrap().trim());
    std::fs::create_dir_all(&user_site).unwrap();
    let marker = dir.path().join("marker");
    let planted = format!("import os; open({:?}, 'a').write('ran\\n')\n", marker.display());
    for site in [&venv_site, &user_site] {
        std::fs::write(site.join("wasmjob-planted.pth"), &planted).unwrap();
    }
    let before = [names_in(&venv_site), names_in(&user_site)];
    let secret = format!("wasmjob-secret-{}", std::process::id());
    let env: [(&str, &OsStr); 3] = [
        ("VIRTUAL_ENV", venv.as_os_str()),
        ("PYTHONUSERBASE", user_base.as_os_str()),
        ("PGPASSWORD", OsStr::new(&secret)),
    ];
    let admin = OwnAdmin::start(&builders, &venv.join("bin/python3"), &env).await;
    let api = &admin.api;
    let job_id = api.create_job(json!({"glue_type": "GLUE_PYTHON"})).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();

    let probe = PY_PROBE.replace("PORT", &port.to_string()).replace("SECRET", &secret);
    let (status, reply) = upload_source(api, job_id, PYTHON.content_type, &probe).await;
    assert_eq!(status, 422, "the probe always fails its build: {reply}");
    let report = probe_report(reply["message"].as_str().unwrap());
    let mut expected: Vec<(String, String)> =
        (1..=8).map(|n| (format!("/{n}"), "denied".to_owned())).collect();
    for name in ["environ", "hostname", "socket", "secret"] {
        expected.push((name.to_owned(), "denied".to_owned()));
    }
    assert_eq!(report, expected, "{reply}");
    assert!(listener.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock));
    assert_eq!([names_in(&venv_site), names_in(&user_site)], before);

    let hello = format!("# {secret}\n{}", sample_source(PYTHON.hello));
    let (status, version) = upload_source(api, job_id, PYTHON.content_type, &hello).await;
    assert_eq!(status, 201, "{version}\n{}", admin.log());
    assert!(!marker.exists(), "a planted .pth ran: {:?}", std::fs::read_to_string(&marker));
    assert_eq!([names_in(&venv_site), names_in(&user_site)], before);
}

/// The top level of [`python_builds_touch_nothing_of_the_host`]'s first build: every attempt
/// reported, then the build failed on purpose so the report comes back in its error.
const PY_PROBE: &str = r##"
import os

import wit_world


def attempt(name, action):
    try:
        action()
        return f"{name}: done"
    except BaseException:
        return f"{name}: denied"


def write(n):
    def go():
        with open(f"/{n}/wasmjob-probe.pth", "w") as file:
            file.write("# written by a build\n")
    return go


def read(path):
    return lambda: open(path, "rb").read()


def connect():
    import socket
    socket.create_connection(("127.0.0.1", PORT), timeout=5).close()


def secret():
    if not any("SECRET" in value for value in os.environ.values()):
        raise LookupError("not here")


OUTCOMES = [attempt(f"/{n}", write(n)) for n in range(1, 9)] + [
    attempt("environ", read("/proc/self/environ")),
    attempt("hostname", read("/etc/hostname")),
    attempt("socket", connect),
    attempt("secret", secret),
]
raise RuntimeError("probe report: " + "; ".join(OUTCOMES))


class WitWorld(wit_world.WitWorld):
    def run(self, t):
        return "unreachable"
"##;

/// A JavaScript handler's top level runs during the build (under Wizer): it sees neither the
/// admin's environment (a secret set there) nor the host's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_builds_read_nothing_of_the_host() {
    let Some(builders) = builders_dir() else { return };
    let secret = format!("wasmjob-secret-{}", std::process::id());
    let env: [(&str, &OsStr); 1] = [("PGPASSWORD", OsStr::new(&secret))];
    let admin = OwnAdmin::start(&builders, Path::new("python3"), &env).await;
    let api = &admin.api;
    let job_id = api.create_job(json!({"glue_type": "GLUE_JAVASCRIPT"})).await;
    let probe = JS_PROBE.replace("SECRET", &secret);
    let (status, reply) = upload_source(api, job_id, JAVASCRIPT.content_type, &probe).await;
    assert_eq!(status, 422, "the probe always fails its build: {reply}");
    let report = probe_report(reply["message"].as_str().unwrap());
    let expected: Vec<(String, String)> = ["env", "hostname", "environ", "fetch"]
        .iter()
        .map(|name| (name.to_string(), "denied".to_owned()))
        .collect();
    assert_eq!(report, expected, "{reply}");
}

/// The top level of [`javascript_builds_read_nothing_of_the_host`]'s build.
const JS_PROBE: &str = r##"
const report = [];
async function attempt(name, action) {
  try {
    await action();
    report.push(`${name}: done`);
  } catch {
    report.push(`${name}: denied`);
  }
}
await attempt("env", () => {
  const env = globalThis.process?.env ?? globalThis.Deno?.env?.toObject?.() ?? {};
  if (!JSON.stringify(env).includes("SECRET")) throw new Error("not here");
});
await attempt("hostname", () => import("/etc/hostname"));
await attempt("environ", () => import("/proc/self/environ"));
await attempt("fetch", async () => (await fetch("file:///etc/hostname")).text());
throw new Error("probe report: " + report.join("; "));
export function run(t) {
  return "unreachable";
}
"##;
