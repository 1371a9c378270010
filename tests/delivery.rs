//! What crosses between admin and executor gets there: the largest requests an executor sends
//! fit the admin's body limit, a stopping executor delivers its outbox, a run whose send was
//! never confirmed is killed where it went, a panic while accepting triggers strands none, and a
//! panic while applying one result of a callback fails that result alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wasmjob::admin::ANSWER_WITHIN;
use wasmjob::model::RunState;
use wasmjob::protocol::{
    CALLBACK_BUSY, HandleCallbackParam, MAX_CALLBACK_BATCH, MAX_HELD_RUNS_PER_BEAT,
    MAX_RESULT_MESSAGE_BYTES, RegistryParam,
};

use wasmjob::storage::RunFilter;

use crate::support::app::{Api, admin_config, executor_config};
use crate::support::cluster::Cluster;
use crate::support::{ACCESS_TOKEN, Backend, TestApp, sample_job, wait_until};

/// Posts `body` to the admin's executor API at `path` with the access token: the status and the
/// envelope.
async fn post_as_executor(app: &TestApp, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    post_to_admin(&app.api, path, body).await
}

/// [`post_as_executor`] to the admin that `api` speaks to.
async fn post_to_admin(api: &Api, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let reply = reqwest::Client::new()
        .post(api.url(path))
        .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = reply.status();
    let text = reply.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The largest callback batch and the largest beat a wasmjob executor sends, and a callback batch
/// as large as an XXL-JOB executor sends after an outage, are read and acknowledged (axum's
/// default limit, 2 MB, answered each with 413, and the results of an XXL-JOB executor were
/// refused for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_requests_an_executor_sends_are_accepted() {
    let app = TestApp::start(Backend::Sqlite).await;
    // A full batch whose every message is as long as an executor reports and made of control
    // characters, each written as a six-byte escape, twice per result. The runs do not exist
    // here: the admin acknowledges results it has nothing to apply to.
    let message = "\u{1}".repeat(MAX_RESULT_MESSAGE_BYTES);
    let results: Vec<HandleCallbackParam> = (0..MAX_CALLBACK_BATCH as i64)
        .map(|index| HandleCallbackParam {
            log_id: 900_000_000_000 + index,
            log_date_tim: 1_700_000_000_000,
            handle_code: 500,
            handle_msg: Some(message.clone()),
            fuel_used: Some(i64::MAX),
            started_at: Some(1_700_000_000_000),
            execute_result: None,
            reply_to: None,
        })
        .collect();
    let batch = serde_json::to_vec(&results).unwrap();
    assert!(batch.len() > 20 * 1024 * 1024, "{} bytes", batch.len());
    let (status, reply) = post_as_executor(&app, "/api/callback", batch).await;
    assert_eq!((status, &reply["code"]), (StatusCode::OK, &json!(200)), "{reply}");

    // A beat listing as many runs as a beat lists, each id as long as an id gets.
    let beat = RegistryParam {
        registry_group: "EXECUTOR".to_owned(),
        registry_key: "crowded".to_owned(),
        registry_value: "http://127.0.0.1:1/".to_owned(),
        held_runs: Some(vec![i64::MAX; MAX_HELD_RUNS_PER_BEAT]),
        holds_triggers: Some(true),
        version: Some(env!("CARGO_PKG_VERSION").to_owned()),
    };
    let beat = serde_json::to_vec(&beat).unwrap();
    assert!(beat.len() > 35 * 1024 * 1024, "{} bytes", beat.len());
    let (status, reply) = post_as_executor(&app, "/api/registry", beat).await;
    assert_eq!((status, &reply["code"]), (StatusCode::OK, &json!(200)), "{reply}");

    // An XXL-JOB 2.x executor's queue of 80,000 results after an outage, about 7 MB.
    let entries: Vec<String> = (0..80_000)
        .map(|index| {
            format!(
                r#"{{"logId":{},"logDateTim":1700000000000,"handleCode":200,"handleMsg":"{}"}}"#,
                800_000_000_000_i64 + index,
                "ok ".repeat(15)
            )
        })
        .collect();
    let batch = format!("[{}]", entries.join(",")).into_bytes();
    assert!(batch.len() > 7_000_000, "{} bytes", batch.len());
    // Applied a chunk at a time within the answer's time: on a slow machine the answer may ask
    // for the batch again, as many times as it takes.
    for _ in 0..100 {
        let (status, reply) =
            post_as_executor(&app, "/xxl-job-admin/api/callback", batch.clone()).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        if reply["code"] == 200 {
            app.stop().await;
            return;
        }
        assert!(reply["msg"].as_str().unwrap_or_default().starts_with(CALLBACK_BUSY), "{reply}");
    }
    panic!("the 80,000 results were never acknowledged");
}

/// The lines of every outbox segment in the executor data dir `dir`.
fn outbox_text(dir: &std::path::Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir.join("outbox")) else { return String::new() };
    let mut text = String::new();
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with("results-") {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

/// Whether the result of run `log_id` waits in the outbox in `dir`, stored and not acknowledged.
fn waits_in_outbox(dir: &std::path::Path, log_id: i64) -> bool {
    let text = outbox_text(dir);
    text.contains(&format!("\"logId\":{log_id},")) && !text.contains(&format!("ack {log_id}\n"))
}

/// A TCP listener on `address` that takes each connection and closes it at once, as an admin
/// going down does: a call made to it gets no answer. Counts the connections.
async fn closing_listener(
    address: std::net::SocketAddr,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (task, connections)
}

/// A stopping executor delivers every result before it leaves. Its admin is down when the last
/// run ends; the executor keeps trying, and the admin, back within the grace period, gets the
/// result (a stop used to try once and leave it on disk until the next start). An admin that
/// never comes back holds a stop only until the deadline, and the result then waits on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_executor_delivers_its_whole_outbox() {
    let mut app = TestApp::start(Backend::Sqlite).await;
    let job_id = app.api.create_job(json!({"name": "last run"})).await;
    let (status, version) = app.api.upload(job_id, sample_job("sleeper")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let (status, triggered) =
        app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "1500"})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    app.api
        .wait_until("the run runs", || async {
            let (_, run) = app.api.get(&format!("/api/v1/logs/{log_id}")).await;
            (run["state"] == "running").then_some(())
        })
        .await;

    // The admin goes down; its port takes connections and drops them.
    let admin = app.admin.take().unwrap();
    let (address, database_url) = (admin.local_addr, admin.state.config.database_url.clone());
    admin.stop().await;
    let (down, connections) = closing_listener(address).await;
    let executor_dir = app.executor_dir();
    let stopping = tokio::spawn(app.executor.take().unwrap().stop());
    wait_until("the run's result is stored", || async {
        waits_in_outbox(&executor_dir, log_id).then_some(())
    })
    .await;
    // A delivery after that is refused; the executor tries again (or, as it used to, leaves).
    let seen = connections.load(Ordering::SeqCst);
    wait_until("a delivery after the run's end is tried, or the stop ends", || async {
        (connections.load(Ordering::SeqCst) > seen || stopping.is_finished()).then_some(())
    })
    .await;
    down.abort();
    let _ = down.await;
    let config = wasmjob::config::AdminConfig { listen: address, ..admin_config(database_url) };
    let admin = wasmjob::admin::start(config).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), stopping).await.unwrap().unwrap();
    let (_, run) = app.api.get(&format!("/api/v1/logs/{log_id}")).await;
    assert_eq!(
        (run["state"].as_str(), run["handle_msg"].as_str()),
        (Some("success"), Some("slept 1500 ms")),
        "the result was delivered before the executor left: {run}"
    );
    assert!(!waits_in_outbox(&executor_dir, log_id));

    // No admin at all: a stop waits for one only until the deadline.
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("http://127.0.0.1:{}", crate::support::cluster::free_port());
    let mut config = executor_config(&nowhere, dir.path().join("executor"));
    config.limits.shutdown_grace = Duration::from_secs(1);
    std::fs::write(dir.path().join("executor/handlers/hello.wasm"), sample_job("hello")).unwrap();
    let lonely = wasmjob::executor::start(config).await.unwrap();
    let trigger = json!({
        "jobId": 1, "logId": 7, "logDateTime": 1_700_000_000_000_i64, "glueType": "BEAN",
        "executorHandler": "hello", "executorParams": "nobody", "executorBlockStrategy": "SERIAL_EXECUTION",
        "executorTimeout": 0, "broadcastIndex": 0, "broadcastTotal": 1,
    });
    let reply: Value = reqwest::Client::new()
        .post(format!("http://{}/run", lonely.local_addr))
        .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
        .json(&trigger)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["code"], 200, "{reply}");
    let lonely_dir = dir.path().join("executor");
    wait_until("the lonely run's result is stored", || async {
        waits_in_outbox(&lonely_dir, 7).then_some(())
    })
    .await;
    tokio::time::timeout(Duration::from_secs(30), lonely.stop()).await.unwrap();
    assert!(waits_in_outbox(&lonely_dir, 7), "an undelivered result stays for the next start");
    admin.stop().await;
    app.stop().await;
}

/// A `BEAN` trigger of the sample `hello` for run `log_id` of job `job_id`.
fn hello_trigger(job_id: i64, log_id: i64, name: &str) -> Value {
    json!({
        "jobId": job_id, "logId": log_id, "logDateTime": 1_700_000_000_000_i64,
        "glueType": "BEAN", "executorHandler": "hello", "executorParams": name,
        "executorBlockStrategy": "SERIAL_EXECUTION", "executorTimeout": 0,
        "broadcastIndex": 0, "broadcastTotal": 1,
    })
}

/// Posts `triggers` to the executor at `url` as one `/runs` batch: each answer's code and content.
async fn post_runs(url: &str, triggers: &[Value]) -> Vec<(i64, String)> {
    let reply: Value = reqwest::Client::new()
        .post(format!("{url}/runs"))
        .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
        .json(triggers)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["code"], 200, "{reply}");
    let answers = reply["content"].as_array().unwrap();
    answers
        .iter()
        .map(|answer| {
            let content = answer["content"].as_str().map_or_else(
                || answer["msg"].as_str().unwrap_or_default().to_owned(),
                str::to_owned,
            );
            (answer["code"].as_i64().unwrap(), content)
        })
        .collect()
}

/// The log of run `log_id` (triggered at `log_date_tim`) on the executor at `url` once it ended.
async fn ended_log(url: &str, log_id: i64, log_date_tim: i64) -> String {
    wait_until(&format!("run {log_id} ends on the executor"), || async {
        let page: Value = reqwest::Client::new()
            .post(format!("{url}/log"))
            .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
            .json(&json!({"logDateTim": log_date_tim, "logId": log_id, "fromLineNum": 1}))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let content = &page["content"];
        (content["isEnd"] == true).then(|| content["logContent"].as_str().unwrap().to_owned())
    })
    .await
}

/// A panic while a batch of triggers is judged (a failpoint in the real executor, under the
/// workers' table and the job's queue locks) refuses the one trigger being judged. The triggers
/// accepted before it in the batch used to be answered as refused while they ran anyway, and the
/// poisoned locks refused every later trigger; now they are answered as accepted, and later
/// triggers, and the refused one sent again, are accepted and run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_accepting_strands_no_trigger() {
    let mut cluster = Cluster::start(None, 1, 1).await;
    cluster.executors[0].restart("executor.accept=panic@2").await;
    let url = cluster.executors[0].url();
    let first =
        [hello_trigger(1, 101, "a"), hello_trigger(1, 102, "b"), hello_trigger(2, 103, "c")];
    let answers = post_runs(&url, &first).await;
    assert_eq!((answers[0].0, answers[0].1.as_str()), (200, "accepted"), "{answers:?}");
    assert_eq!(answers[1].0, 500, "{answers:?}");
    assert!(answers[1].1.contains("internal error while accepting run 102"), "{answers:?}");
    assert_eq!((answers[2].0, answers[2].1.as_str()), (200, "accepted"), "{answers:?}");

    let later = [hello_trigger(1, 104, "d"), hello_trigger(1, 102, "b")];
    let answers = post_runs(&url, &later).await;
    let accepted = [(200, "accepted".to_owned()), (200, "accepted".to_owned())];
    assert_eq!(answers, accepted, "after the panic");
    for (log_id, name) in [(101, "a"), (102, "b"), (103, "c"), (104, "d")] {
        let log = ended_log(&url, log_id, 1_700_000_000_000).await;
        assert!(log.contains(&format!("hello, {name}")), "run {log_id}: {log}");
    }
    // Accepted once: sent again, each is a duplicate that has reported.
    let again: Vec<Value> = [(1, 101, "a"), (1, 102, "b"), (2, 103, "c"), (1, 104, "d")]
        .iter()
        .map(|(job_id, log_id, name)| hello_trigger(*job_id, *log_id, name))
        .collect();
    let answers = post_runs(&url, &again).await;
    assert!(answers.iter().all(|answer| *answer == (200, "reported".to_owned())), "{answers:?}");
    assert!(cluster.executors[0].is_alive(), "{}", cluster.executors[0].log_tail());
    cluster.finish().await;
}

/// Between the admin and an executor: passes every call on and records its path and body, but
/// loses the answer to the first trigger batch once the executor has taken it (the connection
/// breaks while the admin reads the answer), as a network failing at that moment would.
struct LossyLink {
    url: String,
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    target: Arc<std::sync::OnceLock<String>>,
}

impl LossyLink {
    /// A link on a port of its own, which passes calls on once [`LossyLink::forward_to`] says
    /// where.
    async fn start() -> LossyLink {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let target = Arc::new(std::sync::OnceLock::<String>::new());
        let lost_one = Arc::new(AtomicBool::new(false));
        let (seen, http) = (calls.clone(), reqwest::Client::new());
        let to = target.clone();
        let pass_on = move |request: axum::extract::Request| {
            let (seen, lost_one, http, to) =
                (seen.clone(), lost_one.clone(), http.clone(), to.clone());
            async move {
                let target = to.get().expect("the link has somewhere to forward to");
                let path = request.uri().path().to_owned();
                let method = request.method().clone();
                let token = request.headers().get("XXL-JOB-ACCESS-TOKEN").cloned();
                let body = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap();
                let parsed = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock().unwrap().push((path.clone(), parsed));
                let mut forward = http.request(method, format!("{target}{path}")).body(body);
                if let Some(token) = token {
                    forward = forward.header("XXL-JOB-ACCESS-TOKEN", token);
                }
                let answer = forward.header("content-type", "application/json").send().await;
                let answer = answer.unwrap().bytes().await.unwrap();
                let trigger = path == "/runs" || path == "/run";
                if trigger && !lost_one.swap(true, Ordering::SeqCst) {
                    let broken = futures_util::stream::once(async {
                        Err::<bytes::Bytes, _>(std::io::Error::other("the link went down"))
                    });
                    return axum::response::Response::new(axum::body::Body::from_stream(broken));
                }
                axum::response::Response::new(axum::body::Body::from(answer))
            }
        };
        let router = axum::Router::new().fallback(pass_on);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        LossyLink { url, calls, target }
    }

    /// Where the link passes calls on (`http://host:port`).
    fn forward_to(&self, target: String) {
        self.target.set(target).expect("set once");
    }

    /// The bodies of the calls made to `path` so far.
    fn calls_to(&self, path: &str) -> Vec<Value> {
        let calls = self.calls.lock().unwrap();
        calls.iter().filter(|(called, _)| called == path).map(|(_, body)| body.clone()).collect()
    }
}

/// A run whose executor took it but whose acceptance never reached the admin ends lost, and the
/// admin asks that executor to kill it before its retry runs: the old run stops there instead of
/// running beside its retry (no kill used to be sent; both ran to their end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_run_is_killed_where_it_went() {
    let app = TestApp::start(Backend::Sqlite).await;
    let (status, group) =
        app.api.post("/api/v1/groups", json!({"app_name": "linked", "address_type": "AUTO"})).await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let group_id = group["id"].as_i64().unwrap();
    // An executor of its own group, registered at the lossy link's address.
    let dir = tempfile::tempdir().unwrap();
    let mut config = executor_config(&app.api.base, dir.path().join("executor"));
    config.app_name = "linked".to_owned();
    let link = LossyLink::start().await;
    config.address = Some(link.url.clone());
    let executor = wasmjob::executor::start(config).await.unwrap();
    let port = executor.local_addr.port();
    link.forward_to(format!("http://127.0.0.1:{port}"));
    app.api
        .wait_until("the linked executor registers", || async {
            let (_, group) = app.api.get(&format!("/api/v1/groups/{group_id}")).await;
            (group["online_addresses"].as_array().map_or(0, Vec::len) == 1).then_some(())
        })
        .await;

    let job_id = app
        .api
        .create_job(json!({"name": "unconfirmed", "group_id": group_id, "retry_count": 1}))
        .await;
    let (status, version) = app.api.upload(job_id, sample_job("sleeper")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let (status, triggered) =
        app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "4000"})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    let first = triggered["log_ids"][0].as_i64().unwrap();

    let lost = app.api.finished_run(first).await;
    assert_eq!(lost["state"], "lost", "{lost}");
    let kills = app
        .api
        .wait_until("the executor is asked to kill the lost run", || async {
            let kills = link.calls_to("/kill");
            kills.iter().any(|kill| kill["logId"] == first).then_some(kills)
        })
        .await;
    assert_eq!(kills.len(), 1, "{kills:?}");
    let retry = app
        .api
        .wait_until("the retry succeeds", || async {
            let (_, page) =
                app.api.get(&format!("/api/v1/logs?job_id={job_id}&status=success")).await;
            page["items"].as_array().and_then(|items| {
                items.iter().find(|run| run["parent_run_id"].as_i64() == Some(first)).cloned()
            })
        })
        .await;
    assert_eq!(retry["attempt"], 1, "{retry}");
    // The old run was stopped where it ran: its log there says so.
    let db = &app.admin.as_ref().unwrap().state.db;
    let trigger_time_ms = db.get_run(first).await.unwrap().unwrap().trigger_time_ms;
    let log = ended_log(&format!("http://127.0.0.1:{port}"), first, trigger_time_ms).await;
    assert!(log.contains("killed: the run was stopped on request"), "{log}");
    executor.stop().await;
    app.stop().await;
}

/// An XXL-JOB executor that takes every trigger and never calls back: the test sends the
/// results itself. Returns its URL.
async fn silent_xxl_executor() -> String {
    async fn answer() -> axum::Json<Value> {
        axum::Json(json!({"code": 200}))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(answer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// An XXL-JOB group with a silent executor registered, through `api`, and a job of it: the job's
/// id.
async fn xxl_job(api: &Api) -> i64 {
    let (status, group) = api
        .post("/api/v1/groups", json!({"app_name": "xxl", "title": "XXL", "address_type": "AUTO"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let executor = silent_xxl_executor().await;
    let registry = json!({"registryGroup": "EXECUTOR", "registryKey": "xxl",
        "registryValue": format!("{executor}/")});
    let (_, reply) = post_to_admin(api, "/api/registry", registry.to_string().into()).await;
    assert_eq!(reply["code"], 200, "{reply}");
    api.create_job(json!({"group_id": group["id"], "glue_type": "BEAN", "handler": "demo"})).await
}

/// An XXL-JOB group with a silent executor, and a job of it with `count` runs sent to it and
/// running: the job's id, and a callback batch of their results (`done <id>`).
async fn xxl_runs_running(app: &TestApp, count: usize) -> (i64, Vec<u8>) {
    let job_id = xxl_job(&app.api).await;
    for _ in 0..count {
        let (status, run) =
            app.api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert!(status.is_success(), "{run}");
    }
    let running = app
        .api
        .wait_until("every run to be sent", || async {
            let running = runs_in(app, job_id, RunState::Running).await;
            (running.len() == count).then_some(running)
        })
        .await;
    let results: Vec<Value> = running
        .iter()
        .map(|run| {
            json!({"logId": run.id, "logDateTim": run.trigger_time_ms, "handleCode": 200,
                "handleMsg": format!("done {}", run.id)})
        })
        .collect();
    (job_id, serde_json::to_vec(&results).unwrap())
}

/// The runs of job `job_id` in `state`.
async fn runs_in(app: &TestApp, job_id: i64, state: RunState) -> Vec<wasmjob::model::RunRecord> {
    let filter = RunFilter {
        job_id: Some(job_id),
        state: Some(state),
        limit: 10_000,
        ..RunFilter::default()
    };
    app.admin.as_ref().unwrap().state.db.list_runs(&filter).await.unwrap().items
}

/// A callback the admin can neither apply nor record in its time is answered anyway, with what
/// it recorded and "send it again"; sent again, the rest is recorded and what was recorded is
/// not applied a second time. The answer's time is the admin's to choose: here it has none,
/// then its default, and its inbox has no room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_answered_in_time_and_what_it_could_not_take_comes_again() {
    let app = TestApp::start(Backend::Sqlite).await;
    let admin = app.admin.as_ref().unwrap();
    // More runs than one chunk of results.
    let count = 700;
    let (job_id, batch) = xxl_runs_running(&app, count).await;
    admin.state.dispatcher.set_inbox_limit(0);

    // No time at all: nothing is recorded, and the answer asks for the batch again.
    admin.state.dispatcher.set_answer_within(Duration::ZERO);
    let (_, reply) = post_as_executor(&app, "/api/callback", batch.clone()).await;
    assert_eq!(reply["code"], 500, "{reply}");
    let message = reply["msg"].as_str().unwrap();
    assert!(message.starts_with(CALLBACK_BUSY), "{message}");
    assert!(message.contains(&format!("0 of {count} results recorded")), "{message}");
    assert_eq!(runs_in(&app, job_id, RunState::Running).await.len(), count);

    // Its usual time: sent again until acknowledged, as an executor does, it is all recorded.
    admin.state.dispatcher.set_answer_within(ANSWER_WITHIN);
    let mut answers = Vec::new();
    for _ in 0..100 {
        let (_, reply) = post_as_executor(&app, "/api/callback", batch.clone()).await;
        answers.push(reply.clone());
        if reply["code"] == 200 {
            break;
        }
        let message = reply["msg"].as_str().unwrap_or_default();
        assert!(message.starts_with(CALLBACK_BUSY), "{reply}");
    }
    assert_eq!(answers.last().unwrap()["code"], 200, "{answers:?}");
    let succeeded = runs_in(&app, job_id, RunState::Success).await;
    assert_eq!(succeeded.len(), count);
    assert!(succeeded.iter().all(|run| run.handle_msg == format!("done {}", run.id)));

    // Once more, as an executor whose acknowledgement was lost: nothing changes.
    let (_, reply) = post_as_executor(&app, "/api/callback", batch).await;
    assert_eq!(reply["code"], 200, "{reply}");
    assert_eq!(runs_in(&app, job_id, RunState::Success).await, succeeded);
    app.stop().await;
}

/// A callback whose results cannot all be applied in the admin's apply time is acknowledged
/// once the rest is recorded in the inbox, and the rest is applied right after: here the apply
/// time is none, so the whole batch goes to the inbox, and the answer comes before the results
/// are applied. The inbox is empty again once they are, and a batch sent again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_acknowledged_once_recorded_and_applied_after() {
    let app = TestApp::start(Backend::Sqlite).await;
    let admin = app.admin.as_ref().unwrap();
    let count = 1_500;
    let (job_id, batch) = xxl_runs_running(&app, count).await;
    admin.state.dispatcher.set_apply_within(Duration::ZERO);
    let (_, reply) = post_as_executor(&app, "/api/callback", batch.clone()).await;
    assert_eq!(reply["code"], 200, "{reply}");

    let succeeded = app
        .api
        .wait_until("every recorded result to be applied", || async {
            let succeeded = runs_in(&app, job_id, RunState::Success).await;
            (succeeded.len() == count).then_some(succeeded)
        })
        .await;
    assert!(succeeded.iter().all(|run| run.handle_msg == format!("done {}", run.id)));
    app.api
        .wait_until("the inbox to be empty", || async {
            let held = admin.state.db.count_recorded_callbacks().await.unwrap();
            (held == (0, 0)).then_some(())
        })
        .await;

    let (_, reply) = post_as_executor(&app, "/api/callback", batch).await;
    assert_eq!(reply["code"], 200, "{reply}");
    app.api
        .wait_until("the inbox to be empty again", || async {
            let held = admin.state.db.count_recorded_callbacks().await.unwrap();
            (held == (0, 0)).then_some(())
        })
        .await;
    assert_eq!(runs_in(&app, job_id, RunState::Success).await, succeeded);
    app.stop().await;
}

/// A callback recorded by an admin that is gone (its time to apply it ran out) is taken and
/// applied by another admin's sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_recorded_by_a_gone_admin_is_applied_by_the_sweep() {
    let app = TestApp::start(Backend::Sqlite).await;
    let admin = app.admin.as_ref().unwrap();
    let count = 20;
    let (job_id, batch) = xxl_runs_running(&app, count).await;
    let body = String::from_utf8(batch).unwrap();
    let now = wasmjob::admin::now_ms();
    let db = &admin.state.db;
    db.record_callback(7, body, count as i64, "gone-admin", now - 70_000, now - 10_000)
        .await
        .unwrap();
    let succeeded = app
        .api
        .wait_until("the recorded results to be applied", || async {
            let succeeded = runs_in(&app, job_id, RunState::Success).await;
            (succeeded.len() == count).then_some(succeeded)
        })
        .await;
    assert!(succeeded.iter().all(|run| run.handle_msg == format!("done {}", run.id)));
    app.api
        .wait_until("the inbox to be empty", || async {
            (db.count_recorded_callbacks().await.unwrap() == (0, 0)).then_some(())
        })
        .await;
    app.stop().await;
}

/// A panic while one result of a callback is applied (a failpoint in the real admin, on the
/// second result it applies) fails that result alone: the others of its batch are recorded, the
/// answer asks for the batch again, and, sent again, the batch records the one that failed and
/// changes nothing else. The admin lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_applying_one_result_fails_that_result_alone() {
    let mut cluster = Cluster::start(None, 1, 0).await;
    cluster.admins[0].restart("callback.apply_result=panic@2").await;
    let api = cluster.api();
    let job_id = xxl_job(&api).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert!(status.is_success(), "{triggered}");
        ids.push(triggered["log_ids"][0].as_i64().unwrap());
    }
    api.wait_until("every run to be sent", || async {
        states_of(&api, &ids).await.iter().all(|(state, _)| state == "running").then_some(())
    })
    .await;
    let results: Vec<Value> = ids
        .iter()
        .map(|id| json!({"logId": id, "logDateTim": 0, "handleCode": 200, "handleMsg": format!("done {id}")}))
        .collect();
    let batch = serde_json::to_vec(&results).unwrap();

    let (_, reply) = post_to_admin(&api, "/api/callback", batch.clone()).await;
    assert_eq!(reply["code"], 500, "{reply}");
    let after_panic: Vec<String> =
        states_of(&api, &ids).await.into_iter().map(|(state, _)| state).collect();
    let succeeded = after_panic.iter().filter(|state| *state == "success").count();
    let running = after_panic.iter().filter(|state| *state == "running").count();
    assert_eq!((succeeded, running), (2, 1), "{after_panic:?}");
    let log = cluster.admins[0].log();
    assert!(log.contains("applying its result panicked"), "{}", cluster.admins[0].log_tail());

    let (_, reply) = post_to_admin(&api, "/api/callback", batch).await;
    assert_eq!(reply["code"], 200, "{reply}");
    for (id, (state, run)) in ids.iter().zip(states_of(&api, &ids).await) {
        assert_eq!((state.as_str(), &run["handle_msg"]), ("success", &json!(format!("done {id}"))));
    }
    assert!(cluster.admins[0].is_alive(), "{}", cluster.admins[0].log_tail());
    cluster.finish().await;
}

/// The state of each of runs `ids`, with the run.
async fn states_of(api: &Api, ids: &[i64]) -> Vec<(String, Value)> {
    let mut runs = Vec::new();
    for id in ids {
        let (_, run) = api.get(&format!("/api/v1/logs/{id}")).await;
        runs.push((run["state"].as_str().unwrap_or_default().to_owned(), run));
    }
    runs
}
