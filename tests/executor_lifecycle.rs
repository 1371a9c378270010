//! The executor's side of a run's lifecycle, through real executors on 127.0.0.1: a `logId` is
//! accepted once, also across a restart and a `SIGKILL`; heartbeats list the runs held; the
//! outbox quarantines unreadable entries and still delivers the rest; queues are bounded, runs
//! beyond the instance pool wait for a slot, and a stop follows its order.
//!
//! Triggers are sent with the executor protocol directly, so a test chooses its run ids and
//! can send one again, the way an admin that lost track of a send does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use wasmjob::executor::{self, Executor};
use wasmjob::protocol::{
    self, ACCESS_TOKEN_HEADER, CallbackBody, JobIdParam, LogParam, LogResult, RegistryParam,
    ReturnT, TriggerParam, run_reply,
};

use wasmjob::config::ExecutorConfig;

use crate::support::app::executor_config;
use crate::support::{ACCESS_TOKEN, Backend, TestApp, sample_job, wait_until};

/// The trigger time of the runs sent directly: now, so that log retention keeps their logs.
fn trigger_time_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The trigger time of every run `bean` makes: the first call's now, so that a run sent again
/// is sent with its own trigger time, as an admin does (an executor refuses a known `logId` with
/// another one).
fn run_time_ms() -> i64 {
    static AT: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *AT.get_or_init(trigger_time_ms)
}

/// A `BEAN` trigger of the handler `handler` (a sample job copied into the handlers dir).
fn bean(job_id: i64, log_id: i64, handler: &str, param: &str) -> TriggerParam {
    TriggerParam {
        job_id,
        log_id,
        executor_handler: handler.to_owned(),
        executor_params: param.to_owned(),
        executor_block_strategy: "SERIAL_EXECUTION".to_owned(),
        log_date_time: run_time_ms(),
        glue_type: "BEAN".to_owned(),
        broadcast_total: 1,
        ..TriggerParam::default()
    }
}

fn install_handlers(data_dir: &Path, names: &[&str]) {
    let handlers = data_dir.join("handlers");
    std::fs::create_dir_all(&handlers).unwrap();
    for name in names {
        std::fs::write(handlers.join(format!("{name}.wasm")), sample_job(name)).unwrap();
    }
}

/// `POST {executor}/run`: the whole envelope.
async fn send_run(executor_url: &str, param: &TriggerParam) -> ReturnT<String> {
    let reply = reqwest::Client::new()
        .post(protocol::join_url(executor_url, "run"))
        .header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(param)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    reply.json().await.unwrap()
}

/// Sends `param` and checks the answer's `content`, and for a duplicate its message.
async fn expect_run_reply(executor_url: &str, param: &TriggerParam, content: &str) {
    let reply = send_run(executor_url, param).await;
    assert_eq!((reply.code, reply.content.as_deref()), (200, Some(content)), "{reply:?}");
    if content != run_reply::ACCEPTED {
        let msg = format!("duplicate logId {}: {content}", param.log_id);
        assert_eq!(reply.msg.as_deref(), Some(msg.as_str()));
    }
}

async fn run_log(executor_url: &str, run: &TriggerParam) -> String {
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(5)).unwrap();
    let param = LogParam { log_date_tim: run.log_date_time, log_id: run.log_id, from_line_num: 1 };
    let page: Option<LogResult> = client.call(executor_url, "log", &param).await.unwrap();
    page.unwrap().log_content
}

async fn kill_job(executor_url: &str, job_id: i64) {
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(5)).unwrap();
    let param = JobIdParam { job_id, log_id: None };
    client.call::<_, String>(executor_url, "kill", &param).await.unwrap();
}

/// Kills the one run `run` (wasmjob's `logId` on `/kill`).
async fn kill_run(executor_url: &str, run: &TriggerParam) {
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(5)).unwrap();
    let param = JobIdParam { job_id: run.job_id, log_id: Some(run.log_id) };
    client.call::<_, String>(executor_url, "kill", &param).await.unwrap();
}

/// Every line of the executor's run journal, in file order.
fn journal_lines(data_dir: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir.join("journal"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect()
}

/// How many journal lines are `<kind> <log_id> …`.
fn journal_count(data_dir: &Path, kind: &str, log_id: i64) -> usize {
    let prefix = format!("{kind} {log_id} ");
    journal_lines(data_dir).iter().filter(|line| line.starts_with(&prefix)).count()
}

fn executor_url(executor: &Executor) -> String {
    format!("http://{}", executor.local_addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_trigger_is_answered_with_the_run_state_and_not_run_again() {
    let app = TestApp::start(Backend::Sqlite).await;
    let api = &app.api;
    let data_dir = app.executor_dir();
    let url = executor_url(app.executor.as_ref().unwrap());

    // A run the admin sent, ran and reported; the admin then sends it again.
    let job_id = api.create_job(json!({"name": "hello"})).await;
    let (_, version) = api.upload(job_id, sample_job("hello")).await;
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "once"})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    let run = api.finished_run(log_id).await;
    assert_eq!(run["handle_msg"], "hello, once");
    let trigger_time = run["trigger_time"].as_str().unwrap();
    let trigger_time = chrono::DateTime::parse_from_rfc3339(trigger_time).unwrap();
    let again = TriggerParam {
        job_id,
        log_id,
        log_date_time: trigger_time.timestamp_millis(),
        executor_params: "twice".to_owned(),
        executor_block_strategy: "SERIAL_EXECUTION".to_owned(),
        glue_type: protocol::GLUE_WASM.to_owned(),
        glue_source: version["sha256"].as_str().unwrap().to_owned(),
        broadcast_total: 1,
        ..TriggerParam::default()
    };
    expect_run_reply(&url, &again, run_reply::REPORTED).await;
    assert_eq!(journal_count(&data_dir, "accepted", log_id), 1);
    assert_eq!(journal_count(&data_dir, "started", log_id), 1);

    // The same logId for another job or fire time is another run (an admin reused the id): it
    // is refused as a conflict, an error the admin records, and not run.
    for other in [
        TriggerParam { job_id: job_id + 1, ..again.clone() },
        TriggerParam { log_date_time: again.log_date_time + 1_000, ..again.clone() },
    ] {
        let reply = send_run(&url, &other).await;
        assert_eq!(reply.code, 500, "{reply:?}");
        let msg = reply.msg.unwrap_or_default();
        assert!(msg.starts_with(&format!("run id conflict: logId {log_id} ")), "{msg}");
    }
    assert_eq!(journal_count(&data_dir, "accepted", log_id), 1);
    assert_eq!(journal_count(&data_dir, "started", log_id), 1);
    expect_run_reply(&url, &again, run_reply::REPORTED).await;

    // Queued and running runs answer with where they are.
    install_handlers(&data_dir, &["sleeper"]);
    let running = bean(900, 1_000_001, "sleeper", "3600000");
    let queued = bean(900, 1_000_002, "sleeper", "3600000");
    expect_run_reply(&url, &running, run_reply::ACCEPTED).await;
    expect_run_reply(&url, &queued, run_reply::ACCEPTED).await;
    wait_until("the first sleeper sleeps", || async {
        run_log(&url, &running).await.contains("sleeping").then_some(())
    })
    .await;
    expect_run_reply(&url, &running, run_reply::RUNNING).await;
    expect_run_reply(&url, &queued, run_reply::QUEUED).await;

    // Refused triggers are not journaled: sent again once they can run, they are accepted.
    let discarded = TriggerParam {
        executor_block_strategy: "DISCARD_LATER".to_owned(),
        ..bean(900, 1_000_003, "sleeper", "1")
    };
    let unknown =
        TriggerParam { glue_type: "GLUE_SHELL".to_owned(), ..bean(901, 1_000_004, "x", "") };
    for refused in [&discarded, &unknown] {
        let reply = send_run(&url, refused).await;
        assert_eq!((reply.code, reply.content.as_deref()), (500, None), "{reply:?}");
        assert_eq!(journal_count(&data_dir, "accepted", refused.log_id), 0);
    }
    kill_job(&url, 900).await;
    for param in [&running, &queued] {
        wait_until("the killed runs are reported", || async {
            let reply = send_run(&url, param).await;
            (reply.content.as_deref() == Some(run_reply::REPORTED)).then_some(())
        })
        .await;
    }
    assert_eq!(journal_count(&data_dir, "started", running.log_id), 1);
    assert_eq!(journal_count(&data_dir, "started", queued.log_id), 0);
    assert_eq!(journal_count(&data_dir, "finished", queued.log_id), 1);
    expect_run_reply(&url, &discarded, run_reply::ACCEPTED).await;
    app.stop().await;
}

/// `/runs` judges each trigger of a batch as `/run` would, and answers each in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_triggers_is_answered_trigger_by_trigger() {
    let app = TestApp::start(Backend::Sqlite).await;
    let data_dir = app.executor_dir();
    let url = executor_url(app.executor.as_ref().unwrap());
    install_handlers(&data_dir, &["hello"]);
    let first = bean(910, 2_000_001, "hello", "a");
    let second = bean(911, 2_000_002, "hello", "b");
    let unknown =
        TriggerParam { glue_type: "GLUE_SHELL".to_owned(), ..bean(912, 2_000_003, "x", "") };
    let batch = [&first, &second, &first, &unknown];
    let reply: ReturnT<Vec<ReturnT<String>>> = reqwest::Client::new()
        .post(protocol::join_url(&url, "runs"))
        .header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply.code, 200, "{reply:?}");
    let answers: Vec<(i32, Option<String>)> = reply
        .into_payload()
        .unwrap()
        .into_iter()
        .map(|answer| (answer.code, answer.content))
        .collect();
    let accepted = Some(run_reply::ACCEPTED.to_owned());
    assert_eq!(answers[..2], [(200, accepted.clone()), (200, accepted)]);
    // The same run twice in one batch is taken once.
    assert_eq!(answers[2].0, 200);
    assert_ne!(answers[2].1.as_deref(), Some(run_reply::ACCEPTED));
    assert_eq!(answers[3], (500, None));
    assert_eq!(journal_count(&data_dir, "accepted", first.log_id), 1);
    assert_eq!(journal_count(&data_dir, "accepted", unknown.log_id), 0);

    // A body that is not a list of triggers is refused whole.
    let refused: ReturnT<String> = reqwest::Client::new()
        .post(protocol::join_url(&url, "runs"))
        .header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(&json!({"logId": 5}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused.code, 500);
    assert!(refused.msg.unwrap().contains("invalid request body"));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_executor_remembers_the_runs_it_reported() {
    let mut app = TestApp::start(Backend::Sqlite).await;
    let data_dir = app.executor_dir();
    install_handlers(&data_dir, &["hello"]);
    let url = executor_url(app.executor.as_ref().unwrap());
    let param = bean(901, 2_000_001, "hello", "before");
    expect_run_reply(&url, &param, run_reply::ACCEPTED).await;
    wait_until("the run is reported", || async {
        let reply = send_run(&url, &param).await;
        (reply.content.as_deref() == Some(run_reply::REPORTED)).then_some(())
    })
    .await;
    app.executor.take().unwrap().stop().await;

    let restarted =
        executor::start(executor_config(&app.api.base, data_dir.clone())).await.unwrap();
    let url = executor_url(&restarted);
    expect_run_reply(&url, &param, run_reply::REPORTED).await;
    assert_eq!(journal_count(&data_dir, "started", param.log_id), 1);
    // New runs are accepted as before.
    expect_run_reply(&url, &bean(901, 2_000_002, "hello", "after"), run_reply::ACCEPTED).await;
    app.executor = Some(restarted);
    app.stop().await;
}

/// A `wasmjob executor` process, killed (`SIGKILL`) when dropped, also when a test fails.
struct ExecutorProcess {
    child: Child,
}

impl ExecutorProcess {
    fn spawn(admin_url: &str, port: u16, data_dir: &Path) -> ExecutorProcess {
        ExecutorProcess::spawn_with_failpoints(admin_url, port, data_dir, "")
    }

    /// Spawns with `--failpoints` armed (`NAME=abort`).
    fn spawn_with_failpoints(
        admin_url: &str,
        port: u16,
        data_dir: &Path,
        failpoints: &str,
    ) -> ExecutorProcess {
        let address = format!("http://127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .args(["executor", "--listen", &format!("127.0.0.1:{port}"), "--address", &address])
            .args(["--admin-url", admin_url, "--app-name", "lifecycle"])
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--handlers-dir")
            .arg(data_dir.join("handlers"))
            .env("WASMJOB_ACCESS_TOKEN", ACCESS_TOKEN)
            .env("WASMJOB_FAILPOINTS", failpoints)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        ExecutorProcess { child }
    }

    /// `SIGKILL` by process id, and reap it.
    fn kill(&mut self) {
        // Already gone is fine: the point is that it is not running afterwards.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until the process ends on its own (a failpoint aborted it).
    async fn wait_for_exit(&mut self) {
        let child = Mutex::new(&mut self.child);
        wait_until("the executor process ends", || async {
            child.lock().unwrap().try_wait().unwrap().map(drop)
        })
        .await;
    }
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn wait_for_beat(url: &str) {
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(2)).unwrap();
    wait_until("the executor answers /beat", || async {
        client.call::<_, String>(url, "beat", &json!({})).await.ok().map(drop)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_short_by_sigkill_is_lost_and_never_run() {
    let app = TestApp::start(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("executor");
    install_handlers(&data_dir, &["sleeper", "hello"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");

    let mut process = ExecutorProcess::spawn(&app.api.base, port, &data_dir);
    wait_for_beat(&url).await;
    let cut = bean(902, 3_000_001, "sleeper", "3600000");
    expect_run_reply(&url, &cut, run_reply::ACCEPTED).await;
    wait_until("the sleeper sleeps", || async {
        run_log(&url, &cut).await.contains("sleeping").then_some(())
    })
    .await;
    process.kill();

    // The same address and data dir, as systemd or a stable pod name would restart it.
    let mut process = ExecutorProcess::spawn(&app.api.base, port, &data_dir);
    wait_for_beat(&url).await;
    expect_run_reply(&url, &cut, run_reply::LOST).await;
    let log = run_log(&url, &cut).await;
    assert!(log.contains("lost: run 3000001 was accepted by this executor"), "{log}");
    assert_eq!(journal_count(&data_dir, "accepted", cut.log_id), 1);
    assert_eq!(journal_count(&data_dir, "started", cut.log_id), 1);
    assert_eq!(journal_count(&data_dir, "finished", cut.log_id), 0);

    // The restarted executor runs new triggers.
    let fresh = bean(902, 3_000_002, "hello", "after");
    expect_run_reply(&url, &fresh, run_reply::ACCEPTED).await;
    wait_until("the new run is reported", || async {
        let reply = send_run(&url, &fresh).await;
        (reply.content.as_deref() == Some(run_reply::REPORTED)).then_some(())
    })
    .await;
    // Killed once more: the lost run stays lost, its log says so once, the reported run stays
    // reported.
    process.kill();
    let _process = ExecutorProcess::spawn(&app.api.base, port, &data_dir);
    wait_for_beat(&url).await;
    expect_run_reply(&url, &cut, run_reply::LOST).await;
    expect_run_reply(&url, &fresh, run_reply::REPORTED).await;
    let log = run_log(&url, &cut).await;
    assert_eq!(log.matches("lost: run 3000001").count(), 1, "{log}");
    assert_eq!(journal_count(&data_dir, "started", cut.log_id), 1);
    assert_eq!(journal_count(&data_dir, "started", fresh.log_id), 1);
    app.stop().await;
}

/// An admin that records what executors tell it and acknowledges callbacks unless told not to.
/// Its module download records the request and never answers (a run stuck fetching).
#[derive(Clone, Default)]
struct RecordingAdmin {
    beats: Arc<Mutex<Vec<(String, RegistryParam)>>>,
    delivered: Arc<Mutex<Vec<i64>>>,
    /// `(logId, handleCode, handleMsg)` of each result delivered.
    results: Arc<Mutex<Vec<(i64, i32, String)>>>,
    /// `(logId, startedAt)` of each result delivered that reported a start.
    starts: Arc<Mutex<Vec<(i64, i64)>>>,
    refuse_callbacks: Arc<AtomicBool>,
    module_requests: Arc<Mutex<Vec<String>>>,
}

impl RecordingAdmin {
    async fn serve(&self) -> String {
        async fn registry(
            State(admin): State<RecordingAdmin>,
            Json(param): Json<RegistryParam>,
        ) -> Json<ReturnT<String>> {
            admin.beats.lock().unwrap().push(("registry".to_owned(), param));
            Json(ReturnT::success())
        }
        async fn registry_remove(
            State(admin): State<RecordingAdmin>,
            Json(param): Json<RegistryParam>,
        ) -> Json<ReturnT<String>> {
            admin.beats.lock().unwrap().push(("registryRemove".to_owned(), param));
            Json(ReturnT::success())
        }
        async fn callback(
            State(admin): State<RecordingAdmin>,
            body: Bytes,
        ) -> Json<ReturnT<String>> {
            if admin.refuse_callbacks.load(Ordering::SeqCst) {
                return Json(ReturnT::fail("not now"));
            }
            let results = serde_json::from_slice::<CallbackBody>(&body).unwrap().into_list();
            admin.delivered.lock().unwrap().extend(results.iter().map(|result| result.log_id));
            admin.results.lock().unwrap().extend(results.iter().map(|result| {
                (result.log_id, result.handle_code, result.handle_msg.clone().unwrap_or_default())
            }));
            admin.starts.lock().unwrap().extend(
                results.iter().filter_map(|result| Some((result.log_id, result.started_at?))),
            );
            Json(ReturnT::success())
        }
        async fn module(State(admin): State<RecordingAdmin>, UrlPath(sha256): UrlPath<String>) {
            admin.module_requests.lock().unwrap().push(sha256);
            std::future::pending::<()>().await;
        }
        let app = Router::new()
            .route("/api/registry", post(registry))
            .route("/api/registryRemove", post(registry_remove))
            .route("/api/callback", post(callback))
            .route("/api/modules/{sha256}", axum::routing::get(module))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    /// The held runs of the first beat recorded after now that satisfies `accept`.
    async fn next_beat(&self, what: &str, accept: impl Fn(&[i64]) -> bool) -> Vec<i64> {
        let seen = self.beats.lock().unwrap().len();
        wait_until(what, || async {
            let beats = self.beats.lock().unwrap();
            beats[seen..].iter().find_map(|(path, param)| {
                let held = param.held_runs.clone()?;
                (path == "registry" && accept(&held)).then_some(held)
            })
        })
        .await
    }

    fn delivered(&self) -> Vec<i64> {
        self.delivered.lock().unwrap().clone()
    }

    /// The delivered result of run `log_id`, once there is one.
    async fn result_of(&self, log_id: i64) -> (i32, String) {
        wait_until(&format!("run {log_id} is reported"), || async {
            let results = self.results.lock().unwrap();
            results.iter().find(|result| result.0 == log_id).map(|r| (r.1, r.2.clone()))
        })
        .await
    }
}

async fn start_executor(admin_url: &str, data_dir: PathBuf) -> Executor {
    start_executor_with(admin_url, data_dir, |_| {}).await
}

async fn start_executor_with(
    admin_url: &str,
    data_dir: PathBuf,
    adjust: impl FnOnce(&mut ExecutorConfig),
) -> Executor {
    wasmjob::telemetry::init_for_test();
    let mut config = executor_config(admin_url, data_dir);
    config.heartbeat_interval = Duration::from_millis(100);
    adjust(&mut config);
    executor::start(config).await.unwrap()
}

/// `POST {executor}/runs` with `batch`: the envelope of each trigger.
async fn send_runs(executor_url: &str, batch: &[&TriggerParam]) -> Vec<ReturnT<String>> {
    let reply: ReturnT<Vec<ReturnT<String>>> = reqwest::Client::new()
        .post(protocol::join_url(executor_url, "runs"))
        .header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply.code, 200, "{reply:?}");
    reply.into_payload().unwrap()
}

/// Sends `param` and checks it is refused with a message containing `reason`.
async fn expect_refused(executor_url: &str, param: &TriggerParam, reason: &str) {
    let reply = send_run(executor_url, param).await;
    assert_eq!(reply.code, 500, "{reply:?}");
    assert!(reply.msg.as_deref().is_some_and(|msg| msg.contains(reason)), "{reply:?}");
}

async fn wait_for_log(executor_url: &str, run: &TriggerParam, text: &str) {
    wait_until(&format!("the log of run {} says `{text}`", run.log_id), || async {
        run_log(executor_url, run).await.contains(text).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_list_the_runs_held() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    install_handlers(dir.path(), &["sleeper"]);
    let executor = start_executor(&admin_url, dir.path().to_owned()).await;
    let url = executor_url(&executor);
    admin.next_beat("the first beat", |held| held.is_empty()).await;

    admin.refuse_callbacks.store(true, Ordering::SeqCst);
    let running = bean(903, 4_000_001, "sleeper", "3600000");
    let queued = bean(903, 4_000_002, "sleeper", "3600000");
    expect_run_reply(&url, &running, run_reply::ACCEPTED).await;
    expect_run_reply(&url, &queued, run_reply::ACCEPTED).await;
    let held = admin.next_beat("a beat lists both runs", |held| held.len() == 2).await;
    assert_eq!(held, [running.log_id, queued.log_id]);

    // Killed, both have results the admin has not acknowledged yet: still held.
    kill_job(&url, 903).await;
    for param in [&running, &queued] {
        wait_until("the killed runs are reported", || async {
            let reply = send_run(&url, param).await;
            (reply.content.as_deref() == Some(run_reply::REPORTED)).then_some(())
        })
        .await;
    }
    let held = admin.next_beat("a beat after the runs ended", |_| true).await;
    assert_eq!(held, [running.log_id, queued.log_id]);

    // Acknowledged: no longer held.
    admin.refuse_callbacks.store(false, Ordering::SeqCst);
    wait_until("the results are delivered", || async {
        (admin.delivered().len() == 2).then_some(())
    })
    .await;
    admin.next_beat("a beat without the runs", |held| held.is_empty()).await;

    executor.stop().await;
    let beats = admin.beats.lock().unwrap();
    let (path, last) = beats.last().unwrap();
    assert_eq!((path.as_str(), &last.held_runs), ("registryRemove", &None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_outbox_entries_are_quarantined_and_the_rest_delivered() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = dir.path().join("outbox");
    std::fs::create_dir_all(&outbox).unwrap();
    let corrupt = br#"{"logId":5000002,"handleCode":2"#;
    std::fs::write(outbox.join("5000002.json"), corrupt).unwrap();
    std::fs::write(outbox.join("5000003.json"), b"").unwrap();
    for log_id in [5_000_001, 5_000_004] {
        let result = json!({"logId": log_id, "logDateTim": trigger_time_ms(), "handleCode": 200});
        std::fs::write(outbox.join(format!("{log_id}.json")), result.to_string()).unwrap();
    }

    let executor = start_executor(&admin_url, dir.path().to_owned()).await;
    wait_until("the readable results are delivered", || async {
        (admin.delivered().len() == 2).then_some(())
    })
    .await;
    assert_eq!(admin.delivered(), [5_000_001, 5_000_004]);
    let quarantine = outbox.join("quarantine");
    assert_eq!(std::fs::read(quarantine.join("5000002.json")).unwrap(), corrupt);
    assert_eq!(std::fs::read(quarantine.join("5000003.json")).unwrap(), b"");
    // The files of an earlier version go once the admin's acknowledgement is processed;
    // results now go to segments.
    wait_until("the delivered entries are deleted", || async {
        let mut left: Vec<_> = std::fs::read_dir(&outbox)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        (left == ["quarantine", "results-1.log"]).then_some(())
    })
    .await;
    executor.stop().await;
}

/// The executor's failpoints stop it where fault tests need it, and the journal tells what the
/// next start must do: a run confirmed to nobody, or ended without its result stored, is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failpoints_abort_where_the_journal_says_the_run_is_lost() {
    let app = TestApp::start(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("executor");
    install_handlers(&data_dir, &["hello", "sleeper"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    // A durable acceptance may start its run before `/run` answers, so after `after_accept` the
    // run may or may not have started (a sleeper, so that it cannot have ended).
    let cases = [
        ("executor.after_accept", bean(904, 6_000_001, "sleeper", "3600000"), 0..=1),
        ("executor.before_report", bean(904, 6_000_002, "hello", "b"), 1..=1),
    ];
    for (failpoint, run, started) in cases {
        let mut process = ExecutorProcess::spawn_with_failpoints(
            &app.api.base,
            port,
            &data_dir,
            &format!("{failpoint}=abort"),
        );
        wait_for_beat(&url).await;
        // After `after_accept` the answer never comes; after `before_report` it does.
        let _ = reqwest::Client::new()
            .post(protocol::join_url(&url, "run"))
            .header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
            .json(&run)
            .send()
            .await;
        process.wait_for_exit().await;

        let _process = ExecutorProcess::spawn(&app.api.base, port, &data_dir);
        wait_for_beat(&url).await;
        expect_run_reply(&url, &run, run_reply::LOST).await;
        assert_eq!(journal_count(&data_dir, "accepted", run.log_id), 1, "{failpoint}");
        assert!(started.contains(&journal_count(&data_dir, "started", run.log_id)), "{failpoint}");
        assert_eq!(journal_count(&data_dir, "finished", run.log_id), 0, "{failpoint}");
    }
    app.stop().await;
}

/// A job's queue and the bytes all accepted runs hold are bounded: a trigger past either limit
/// is refused with XXL-JOB's failure code and the limit's name, on `/run` and per item of
/// `/runs`, is not journaled, and is accepted once room is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queues_are_refused_and_accept_again_once_drained() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    install_handlers(dir.path(), &["sleeper", "hello"]);
    let executor = start_executor_with(&admin_url, dir.path().to_owned(), |config| {
        config.limits.max_queue_per_job = 2;
        config.limits.max_queued_bytes = 3 * 1024 * 1024;
    })
    .await;
    let url = executor_url(&executor);

    // Job 920: one running, two waiting; the third waiting one is refused.
    let running = bean(920, 7_000_001, "sleeper", "3600000");
    expect_run_reply(&url, &running, run_reply::ACCEPTED).await;
    wait_for_log(&url, &running, "sleeping").await;
    for log_id in [7_000_002, 7_000_003] {
        expect_run_reply(&url, &bean(920, log_id, "sleeper", "1"), run_reply::ACCEPTED).await;
    }
    let over = bean(920, 7_000_004, "sleeper", "1");
    expect_refused(&url, &over, "queue full: job 920 already has 2 runs waiting").await;
    // In a batch, only the trigger of the full queue is refused.
    let other_job = bean(921, 7_000_005, "hello", "x");
    let answers = send_runs(&url, &[&over, &other_job]).await;
    assert_eq!(answers[0].code, 500, "{answers:?}");
    assert!(answers[0].msg.as_deref().unwrap().contains("--max-queue-per-job"), "{answers:?}");
    assert_eq!(answers[1].content.as_deref(), Some(run_reply::ACCEPTED), "{answers:?}");
    assert_eq!(journal_count(dir.path(), "accepted", over.log_id), 0);

    // Three jobs, each running a sleeper whose parameter carries a MiB of padding: the third
    // passes the 3 MiB the executor may hold.
    let padded = format!("3600000{}", " ".repeat(1024 * 1024));
    let heavy: Vec<TriggerParam> =
        (0..3).map(|i| bean(930 + i, 7_000_010 + i, "sleeper", &padded)).collect();
    expect_run_reply(&url, &heavy[0], run_reply::ACCEPTED).await;
    expect_run_reply(&url, &heavy[1], run_reply::ACCEPTED).await;
    expect_refused(&url, &heavy[2], "(--max-queued-mb)").await;
    assert_eq!(journal_count(dir.path(), "accepted", heavy[2].log_id), 0);
    let before_kill = executor.held_bytes();
    assert!(before_kill > 2 * 1024 * 1024 && before_kill <= 3 * 1024 * 1024, "{before_kill}");

    // Ending a heavy run and a waiting one makes room for both refused triggers.
    kill_job(&url, 930).await;
    assert_eq!(admin.result_of(heavy[0].log_id).await.0, 500);
    expect_run_reply(&url, &heavy[2], run_reply::ACCEPTED).await;
    kill_job(&url, 920).await;
    admin.result_of(7_000_003).await;
    expect_run_reply(&url, &over, run_reply::ACCEPTED).await;
    executor.stop().await;
}

/// A run beyond the instance pool waits for a slot (its log says so) and runs once one is free,
/// instead of failing as "executor busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_beyond_the_pool_wait_for_a_slot() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    install_handlers(dir.path(), &["sleeper", "hello"]);
    let executor = start_executor_with(&admin_url, dir.path().to_owned(), |config| {
        config.limits.max_concurrent_runs = 1;
    })
    .await;
    let url = executor_url(&executor);
    let holder = bean(940, 8_000_001, "sleeper", "3600000");
    let waiting = bean(941, 8_000_002, "hello", "patient");
    expect_run_reply(&url, &holder, run_reply::ACCEPTED).await;
    wait_for_log(&url, &holder, "sleeping").await;
    expect_run_reply(&url, &waiting, run_reply::ACCEPTED).await;
    wait_for_log(&url, &waiting, "waiting for a run slot: all 1 are in use").await;
    expect_run_reply(&url, &waiting, run_reply::RUNNING).await;

    kill_job(&url, 940).await;
    assert_eq!(admin.result_of(waiting.log_id).await, (200, "hello, patient".to_owned()));
    let (code, msg) = admin.result_of(holder.log_id).await;
    assert_eq!((code, msg.as_str()), (500, "killed: the run was stopped on request"));
    executor.stop().await;
}

/// A stop deregisters, then refuses new triggers while `/log` still answers, stops beating,
/// lets runs end for the grace period, and kills the rest, a run still fetching its module and
/// one still waiting in a queue included, each reported through the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_deregisters_refuses_drains_then_kills_and_reports_every_run() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    install_handlers(dir.path(), &["sleeper", "hello"]);
    let executor = start_executor_with(&admin_url, dir.path().to_owned(), |config| {
        config.limits.shutdown_grace = Duration::from_secs(2);
    })
    .await;
    let url = executor_url(&executor);
    admin.next_beat("the first beat", |_| true).await;

    let short = bean(950, 9_000_001, "sleeper", "300");
    let long = bean(951, 9_000_002, "sleeper", "3600000");
    let queued = bean(951, 9_000_003, "sleeper", "1");
    let fetching = TriggerParam {
        glue_type: protocol::GLUE_WASM.to_owned(),
        glue_source: "ab".repeat(32),
        ..bean(952, 9_000_004, "", "")
    };
    for param in [&long, &queued, &fetching] {
        expect_run_reply(&url, param, run_reply::ACCEPTED).await;
    }
    wait_for_log(&url, &long, "sleeping").await;
    wait_until("the module is being fetched", || async {
        (!admin.module_requests.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    expect_run_reply(&url, &short, run_reply::ACCEPTED).await;
    wait_for_log(&url, &short, "sleeping").await;

    let stopping = tokio::spawn(executor.stop());
    wait_until("the executor deregisters", || async {
        let beats = admin.beats.lock().unwrap();
        beats.iter().any(|(path, _)| path == "registryRemove").then_some(())
    })
    .await;
    // A DISCARD_LATER trigger for the busy job 951 is refused either way, so this probe changes
    // nothing while it waits for the refusal to change its reason.
    let probe = TriggerParam {
        executor_block_strategy: "DISCARD_LATER".to_owned(),
        ..bean(951, 9_000_005, "sleeper", "1")
    };
    wait_until("new triggers are refused", || async {
        let reply = send_run(&url, &probe).await;
        reply.msg.is_some_and(|msg| msg.contains("shutting down")).then_some(())
    })
    .await;
    let fresh = bean(953, 9_000_006, "hello", "late");
    expect_refused(&url, &fresh, "this executor is shutting down and takes no new runs").await;
    let answers = send_runs(&url, &[&fresh]).await;
    assert!(answers[0].msg.as_deref().unwrap().contains("shutting down"), "{answers:?}");
    // A run accepted before is still answered with where it is, and logs are still read.
    expect_run_reply(&url, &long, run_reply::RUNNING).await;
    assert!(run_log(&url, &long).await.contains("sleeping"));

    stopping.await.unwrap();
    let beats = admin.beats.lock().unwrap().clone();
    let removed = beats.iter().position(|(path, _)| path == "registryRemove").unwrap();
    assert_eq!(removed, beats.len() - 1, "a beat after the deregistration: {beats:?}");
    assert_eq!(admin.result_of(short.log_id).await, (200, "slept 300 ms".to_owned()));
    let killed = "killed: the run was stopped on request".to_owned();
    assert_eq!(admin.result_of(long.log_id).await, (500, killed.clone()));
    assert_eq!(admin.result_of(fetching.log_id).await, (500, killed));
    assert_eq!(admin.result_of(queued.log_id).await, (500, "killed before it started".to_owned()));
    for param in [&probe, &fresh] {
        assert_eq!(journal_count(dir.path(), "accepted", param.log_id), 0);
    }
    assert_eq!(admin.delivered().len(), 4, "{:?}", admin.delivered());
}

/// A trigger sent ahead of its instant (`notBefore`) is accepted and journaled at once and held
/// until its instant: it starts no earlier, its block strategy is judged against the job's queue
/// as it is then, and a kill before then ends it without a start. The executor's beats say it
/// holds triggers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_sent_ahead_is_held_until_its_instant() {
    let admin = RecordingAdmin::default();
    let admin_url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    install_handlers(dir.path(), &["sleeper", "hello"]);
    let executor = start_executor(&admin_url, dir.path().to_owned()).await;
    let url = executor_url(&executor);
    admin.next_beat("the first beat", |_| true).await;
    let beat = admin.beats.lock().unwrap().last().unwrap().1.clone();
    assert_eq!(beat.holds_triggers, Some(true), "{beat:?}");
    let ahead = |param: TriggerParam, ms: i64| {
        let at = trigger_time_ms() + ms;
        TriggerParam { log_date_time: at, not_before: Some(at), ..param }
    };

    // Held, then run at its instant.
    let hello = ahead(bean(960, 10_000_001, "hello", "on time"), 1_500);
    expect_run_reply(&url, &hello, run_reply::ACCEPTED).await;
    assert_eq!(journal_count(dir.path(), "accepted", hello.log_id), 1);
    expect_run_reply(&url, &hello, run_reply::QUEUED).await;
    assert!(run_log(&url, &hello).await.contains("ahead of its instant: held until then"));
    assert_eq!(admin.result_of(hello.log_id).await, (200, "hello, on time".to_owned()));
    let started = admin.starts.lock().unwrap().iter().find(|s| s.0 == hello.log_id).unwrap().1;
    assert!(started >= hello.log_date_time, "started {started}, due {}", hello.log_date_time);

    // DISCARD_LATER is judged at the instant: refused then while the job is busy, taken then
    // once it is idle, whatever the job was doing when the trigger arrived.
    let busy = bean(961, 10_000_002, "sleeper", "3600000");
    expect_run_reply(&url, &busy, run_reply::ACCEPTED).await;
    wait_for_log(&url, &busy, "sleeping").await;
    let discard = |log_id, ms| TriggerParam {
        executor_block_strategy: "DISCARD_LATER".to_owned(),
        ..ahead(bean(961, log_id, "hello", "later"), ms)
    };
    let discarded = discard(10_000_003, 500);
    expect_run_reply(&url, &discarded, run_reply::ACCEPTED).await;
    let (code, msg) = admin.result_of(discarded.log_id).await;
    assert_eq!(
        (code, msg.as_str()),
        (500, "block strategy effect: DISCARD_LATER (the job is running or queued)")
    );
    let taken = discard(10_000_004, 1_500);
    expect_run_reply(&url, &taken, run_reply::ACCEPTED).await;
    kill_run(&url, &busy).await;
    admin.result_of(busy.log_id).await;
    assert_eq!(admin.result_of(taken.log_id).await, (200, "hello, later".to_owned()));

    // The runs of one instant whose jobs are idle start at it together, their starts journaled
    // in one write; one queued behind its job's running run starts once that run has ended.
    let sleeping = bean(964, 10_000_006, "sleeper", "3600000");
    expect_run_reply(&url, &sleeping, run_reply::ACCEPTED).await;
    wait_for_log(&url, &sleeping, "sleeping").await;
    let at = trigger_time_ms() + 1_000;
    let together = |job_id, log_id| TriggerParam {
        log_date_time: at,
        not_before: Some(at),
        ..bean(job_id, log_id, "hello", "together")
    };
    let (first, second, behind) =
        (together(965, 10_000_007), together(966, 10_000_008), together(964, 10_000_009));
    for param in [&first, &second, &behind] {
        expect_run_reply(&url, param, run_reply::ACCEPTED).await;
    }
    admin.result_of(first.log_id).await;
    admin.result_of(second.log_id).await;
    let start_of = |log_id| admin.starts.lock().unwrap().iter().find(|s| s.0 == log_id).unwrap().1;
    let together_at = start_of(first.log_id);
    assert!(together_at >= at, "started {together_at}, due {at}");
    assert_eq!(start_of(second.log_id), together_at);
    assert_eq!(journal_count(dir.path(), "started", behind.log_id), 0);
    let killed_at = trigger_time_ms();
    kill_run(&url, &sleeping).await;
    assert_eq!(admin.result_of(behind.log_id).await, (200, "hello, together".to_owned()));
    assert!(start_of(behind.log_id) >= killed_at);

    // A kill before the instant: ended, never started.
    let killed = ahead(bean(962, 10_000_005, "hello", "never"), 60_000);
    expect_run_reply(&url, &killed, run_reply::ACCEPTED).await;
    kill_run(&url, &killed).await;
    let (code, msg) = admin.result_of(killed.log_id).await;
    assert_eq!((code, msg.as_str()), (500, "killed before its instant (it was held until then)"));
    assert_eq!(journal_count(dir.path(), "started", killed.log_id), 0);
    executor.stop().await;
}
