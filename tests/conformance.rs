//! XXL-JOB wire conformance, generation by generation, in both directions, over 127.0.0.1.
//!
//! `tests/conformance/<generation>/` holds, for 2.2, 2.4 (2.3 to 2.4), 3.4 (3.0 to 3.4) and 3.5,
//! bodies written from that generation's Java sources (`generation.json` says which were read):
//! what its executor sends (`executor_sends/`) and answers (`executor_answers/`), what its admin
//! sends (`admin_sends/`) and answers (`admin_answers/`), and what its Java side parses
//! (`parses/`: field name → Java type, `name?` for a field it reads only when present, an array
//! for a list).
//!
//! Direction (a): a peer that speaks like that generation's Java executor registers with our
//! admin, takes the trigger at its route, calls back, has its log tailed and a run killed; our
//! admin's bodies and answers are checked against what that executor parses.
//! Direction (b): our executor reports to a peer that speaks like that generation's Java admin
//! and is driven with that admin's bodies; what our executor sends and answers is checked against
//! what that admin parses. The peers are small HTTP servers that follow the Java code's rules
//! (routes, token and application checks, the log reader's line numbers); nothing of ours is
//! replaced.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use serde_json::{Value, json};
use wasmjob::admin;
use wasmjob::executor;
use wasmjob::protocol::Generation;

use crate::support::app::{admin_config, executor_config};
use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, Api, sample_job, wait_until};

const GENERATIONS: &[&str] = &["2.2", "2.4", "3.4", "3.5"];
const APP_NAME: &str = "xxl-job-executor-sample";
const ACCESS_HEADER: &str = "XXL-JOB-ACCESS-TOKEN";
const APP_HEADER: &str = "XXL-JOB-APPNAME";

fn fixture(generation: &str, name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance")
        .join(generation)
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What `value` lacks, or holds with the wrong type, of what `schema` says the Java side parses.
fn mismatches(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_schema(schema, value, "$", &mut out);
    out
}

fn check_schema(schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    match schema {
        Value::String(java_type) => {
            let fits = match java_type.as_str() {
                "int" => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                "long" => value.as_i64().is_some(),
                "String" => value.is_string() || value.is_null(),
                "boolean" => value.is_boolean(),
                other => panic!("unknown Java type {other} in a schema"),
            };
            if !fits {
                out.push(format!("{at}: {java_type} expected, found {value}"));
            }
        }
        Value::Object(fields) => {
            let Some(object) = value.as_object() else {
                out.push(format!("{at}: an object expected, found {value}"));
                return;
            };
            for (name, field_schema) in fields {
                let (name, optional) = match name.strip_suffix('?') {
                    Some(name) => (name, true),
                    None => (name.as_str(), false),
                };
                match object.get(name) {
                    Some(field) => check_schema(field_schema, field, &format!("{at}.{name}"), out),
                    None if optional => {}
                    None => out.push(format!("{at}.{name}: missing")),
                }
            }
        }
        Value::Array(element) => {
            let Some(items) = value.as_array().filter(|items| !items.is_empty()) else {
                out.push(format!("{at}: a non-empty array expected, found {value}"));
                return;
            };
            for (index, item) in items.iter().enumerate() {
                check_schema(&element[0], item, &format!("{at}[{index}]"), out);
            }
        }
        other => panic!("bad schema {other}"),
    }
}

fn assert_parses(generation: &str, schema_name: &str, value: &Value) {
    let schema = fixture(generation, &format!("parses/{schema_name}"));
    let wrong = mismatches(&schema, value);
    assert!(wrong.is_empty(), "{generation} cannot parse {schema_name} from {value}: {wrong:?}");
}

/// One request a fake Java peer received.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    app_name: Option<String>,
    body: Value,
}

/// How a fake peer answers a request: its path and JSON body to the reply.
type Answer = fn(&Peer, &str, Value) -> Value;

#[derive(Clone)]
struct Peer {
    generation: &'static str,
    /// The log file of every run, as lines.
    lines: Vec<String>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Peer {
    fn new(generation: &'static str) -> Peer {
        let lines = vec!["line 1".to_owned(), "line 2".to_owned(), "line 3".to_owned()];
        Peer { generation, lines, received: Arc::default() }
    }

    fn meta(&self, key: &str) -> Value {
        fixture(self.generation, "generation")[key].clone()
    }

    /// Serves `handler` on 127.0.0.1:0; returns its base URL.
    async fn serve(&self, handler: Answer) -> String {
        async fn any(
            State((peer, handler)): State<(Peer, Answer)>,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> axum::Json<Value> {
            let header = |name: &str| {
                headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
            };
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let path = uri.path().to_owned();
            let app_name = header(APP_HEADER);
            peer.received.lock().unwrap().push(Received {
                path: path.clone(),
                app_name: app_name.clone(),
                body: body.clone(),
            });
            // The Java peers check the token first (3.5 the application name too), then route.
            if header(ACCESS_HEADER).as_deref() != Some(ACCESS_TOKEN) {
                return axum::Json(json!({"code": 500, "msg": "The access token is wrong."}));
            }
            if peer.meta("requires_app_name") == json!(true)
                && app_name.as_deref() != Some(APP_NAME)
            {
                let msg = "invalid request, accessToken or appname invalid.";
                return axum::Json(json!({"code": 500, "msg": msg}));
            }
            axum::Json(handler(&peer, &path, body))
        }
        let app = Router::new().fallback(any).with_state((self.clone(), handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    /// Waits for a request to `path` and returns the last one.
    async fn wait_for(&self, path: &str) -> Received {
        let what = format!("the {} peer receives {path}", self.generation);
        wait_until(&what, || async {
            let received = self.received.lock().unwrap();
            received.iter().rev().find(|r| r.path.ends_with(path)).cloned()
        })
        .await
    }

    fn count(&self, path: &str) -> usize {
        self.received.lock().unwrap().iter().filter(|r| r.path.ends_with(path)).count()
    }
}

/// A Java executor of the peer's generation: its routes, its answers, its log reader.
fn java_executor(peer: &Peer, path: &str, body: Value) -> Value {
    let trigger_path = peer.meta("trigger_path");
    let g = peer.generation;
    match path {
        "/beat" | "/idleBeat" | "/kill" => fixture(g, "executor_answers/kill"),
        _ if trigger_path == json!(path) => fixture(g, "executor_answers/run"),
        "/log" => {
            // XxlJobFileAppender.readLog: lines from `fromLineNum` on; `toLineNum` is the last
            // line read (2.x: of the whole file; 3.x: of those returned, 0 when none); `isEnd`
            // false, since the file exists.
            let from = body["fromLineNum"].as_i64().unwrap_or(0);
            let total = peer.lines.len() as i64;
            let mut content = String::new();
            for (index, line) in peer.lines.iter().enumerate() {
                if index as i64 + 1 >= from {
                    content.push_str(line);
                    content.push('\n');
                }
            }
            let to = match peer.meta("log_past_the_end").as_str() {
                Some("zero") if from > total => 0,
                _ => total,
            };
            let mut answer = fixture(g, "executor_answers/log");
            let field = peer.meta("reply_payload_field");
            let page = &mut answer[field.as_str().unwrap()];
            page["fromLineNum"] = json!(from);
            page["toLineNum"] = json!(to);
            page["logContent"] = json!(content);
            answer
        }
        other => {
            json!({"code": 500, "msg": format!("invalid request, uri-mapping({other}) not found.")})
        }
    }
}

/// A Java admin of the peer's generation: it acknowledges what it can parse.
fn java_admin(peer: &Peer, path: &str, body: Value) -> Value {
    let schema = match path.rsplit('/').next() {
        Some("registry" | "registryRemove") => "RegistryParam",
        Some("callback") => "callback",
        _ => return json!({"code": 500, "msg": "invalid request, uri-mapping not found."}),
    };
    let wrong = mismatches(&fixture(peer.generation, &format!("parses/{schema}")), &body);
    if wrong.is_empty() {
        fixture(peer.generation, "admin_answers/success")
    } else {
        json!({"code": 500, "msg": format!("{wrong:?}")})
    }
}

async fn post(url: &str, body: &Value, app_name: Option<&str>) -> Value {
    let mut request =
        reqwest::Client::new().post(url).header(ACCESS_HEADER, ACCESS_TOKEN).json(body);
    if let Some(app_name) = app_name {
        request = request.header(APP_HEADER, app_name);
    }
    let reply = request.send().await.unwrap();
    assert_eq!(reply.status(), 200, "{url}");
    reply.json().await.unwrap()
}

/// (a) A Java executor of each generation against our admin.
#[tokio::test]
async fn java_executors_of_every_generation_work_with_our_admin() {
    wasmjob::telemetry::init_for_test();
    for &generation in GENERATIONS {
        java_executor_against_our_admin(generation).await;
    }
}

async fn java_executor_against_our_admin(g: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let admin = admin::start(admin_config(format!("sqlite:{}", dir.path().join("a.db").display())))
        .await
        .unwrap();
    let group = admin.state.db.ensure_group(APP_NAME, "Sample", admin::now_ms()).await.unwrap();
    let api = Api { http: reqwest::Client::new(), base: admin.url(), token: ADMIN_TOKEN.into() };
    let peer = Peer::new(g);
    let executor_url = peer.serve(java_executor).await;
    let sends_app_name = peer.meta("sends_app_name") == json!(true);
    let app_header = sends_app_name.then_some(APP_NAME);

    // Registration, with the address as Java registers it (a trailing slash). An executor left
    // with XXL-JOB's shipped token, or none, is refused and not registered.
    let mut registry = fixture(g, "executor_sends/registry");
    registry["registryValue"] = json!(format!("{executor_url}/"));
    for token in ["default_token", ""] {
        let reply = reqwest::Client::new()
            .post(api.url("/api/registry"))
            .header(ACCESS_HEADER, token)
            .json(&registry)
            .send()
            .await
            .unwrap();
        let reply: Value = reply.json().await.unwrap();
        assert_parses(g, "reply", &reply);
        assert_eq!(reply["code"], 500, "{g}: token {token:?}: {reply}");
    }
    let (_, online) = api.get(&format!("/api/v1/groups/{}", group.id)).await;
    assert_eq!(online["online_addresses"], json!([]), "{g}: {online}");
    let reply = post(&api.url("/api/registry"), &registry, app_header).await;
    assert_parses(g, "reply", &reply);
    assert_eq!(reply["code"], 200, "{g}: {reply}");
    // It sent no version (only wasmjob executors do): the registry shows none, and the protocol
    // its registration showed.
    let (_, executors) = api.get("/api/v1/executors").await;
    let protocol = if sends_app_name { "xxl-job-3.5" } else { "xxl-job" };
    let row = json!({"address": executor_url, "version": null, "protocol": protocol});
    let shown = executors.as_array().unwrap().iter().map(
        |e| json!({"address": e["address"], "version": e["version"], "protocol": e["protocol"]}),
    );
    assert_eq!(shown.collect::<Vec<_>>(), [row], "{g}: {executors}");

    // A trigger reaches the executor at its generation's route, in a body it parses.
    let job_id = api
        .create_job(json!({"group_id": group.id, "glue_type": "BEAN", "handler": "demoJobHandler"}))
        .await;
    let log_id = trigger(&api, job_id).await;
    let trigger_path = peer.meta("trigger_path");
    let sent = peer.wait_for(trigger_path.as_str().unwrap()).await;
    assert_parses(g, "TriggerParam", &sent.body);
    assert_eq!(sent.body["logId"], log_id, "{g}");
    // The admin names itself, for executors that know its URL to send the result back to it
    // (an XXL-JOB executor ignores the field).
    assert_eq!(sent.body["replyTo"], json!(admin.url()), "{g}");
    assert_eq!(sent.app_name.as_deref(), Some(APP_NAME), "{g}: the application is named");
    assert_eq!(peer.count("/runs"), 0, "{g}: no batch route is tried on an XXL-JOB executor");
    api.wait_until("the run is running", || async {
        let (_, run) = api.get(&format!("/api/v1/logs/{log_id}")).await;
        (run["state"] == "running").then_some(())
    })
    .await;

    // Its callback is applied, and our answer is one it parses.
    let mut callback = fixture(g, "executor_sends/callback");
    let entry = match callback.get_mut("callbackList") {
        Some(list) => &mut list[0],
        None => &mut callback[0],
    };
    // A Java executor echoes the trigger's `logDateTime` as the result's `logDateTim`.
    entry["logId"] = json!(log_id);
    entry["logDateTim"] = sent.body["logDateTime"].clone();
    let reply = post(&api.url("/xxl-job-admin/api/callback"), &callback, app_header).await;
    assert_parses(g, "reply", &reply);
    assert_eq!(reply["code"], 200, "{g}: {reply}");
    let run = api.finished_run(log_id).await;
    assert_eq!((run["state"].as_str(), run["handle_code"].as_i64()), (Some("success"), Some(200)));

    // The log is tailed to its end, each line once, although the executor never says `isEnd`.
    let (content, requests) = tail(&api, log_id).await;
    assert_eq!(content, "line 1\nline 2\nline 3\n", "{g}");
    assert_eq!(requests, 2, "{g}: one page with the lines, one past the end");
    assert_parses(g, "LogParam", &peer.wait_for("/log").await.body);

    // A kill: the job's whole queue on an XXL-JOB executor, and the answer says so.
    let second = trigger(&api, job_id).await;
    api.wait_until("the second run is running", || async {
        let (_, run) = api.get(&format!("/api/v1/logs/{second}")).await;
        (run["state"] == "running").then_some(())
    })
    .await;
    let (status, killed) = api.post(&format!("/api/v1/logs/{second}/kill"), json!({})).await;
    assert_eq!(status, 200, "{g}: {killed}");
    assert_eq!(killed["scope"], "job_queue", "{g}: {killed}");
    assert!(killed["message"].as_str().unwrap().contains("whole queue"), "{killed}");
    let kill = peer.wait_for("/kill").await;
    assert_parses(g, "KillParam", &kill.body);
    assert_eq!(kill.body["jobId"], job_id);
    assert_eq!(kill.app_name.as_deref(), Some(APP_NAME), "{g}");

    let mut remove = fixture(g, "executor_sends/registry_remove");
    remove["registryValue"] = json!(format!("{executor_url}/"));
    let reply = post(&api.url("/api/registryRemove"), &remove, app_header).await;
    assert_parses(g, "reply", &reply);
    assert_eq!(reply["code"], 200, "{g}: {reply}");
    admin.stop().await;
}

/// What a 3.5 executor's registration showed is kept with it: an admin that starts again on the
/// same database sends the first trigger at `/trigger`, naming the application, although the
/// executor has not registered again.
#[tokio::test]
async fn a_restarted_admin_speaks_3_5_to_an_executor_registered_before() {
    wasmjob::telemetry::init_for_test();
    let g = "3.5";
    let dir = tempfile::tempdir().unwrap();
    let database_url = format!("sqlite:{}", dir.path().join("a.db").display());
    let admin = admin::start(admin_config(database_url.clone())).await.unwrap();
    let group = admin.state.db.ensure_group(APP_NAME, "Sample", admin::now_ms()).await.unwrap();
    let api = Api { http: reqwest::Client::new(), base: admin.url(), token: ADMIN_TOKEN.into() };
    let job_id = api
        .create_job(json!({"group_id": group.id, "glue_type": "BEAN", "handler": "demoJobHandler"}))
        .await;
    let peer = Peer::new(g);
    let executor_url = peer.serve(java_executor).await;
    let mut registry = fixture(g, "executor_sends/registry");
    registry["registryValue"] = json!(format!("{executor_url}/"));
    let reply = post(&api.url("/api/registry"), &registry, Some(APP_NAME)).await;
    assert_eq!(reply["code"], 200, "{reply}");
    admin.stop().await;

    let admin = admin::start(admin_config(database_url)).await.unwrap();
    let api = Api { http: reqwest::Client::new(), base: admin.url(), token: ADMIN_TOKEN.into() };
    let log_id = trigger(&api, job_id).await;
    let run = sent_run(&api, log_id).await;
    assert_eq!(peer_calls(&peer), [("/trigger".to_owned(), Some(APP_NAME.to_owned()))]);
    assert_eq!((run["state"].as_str(), run["trigger_code"].as_i64()), (Some("running"), Some(200)));
    admin.stop().await;
}

/// With two admins on one PostgreSQL database, a 3.5 executor that registered with one of them
/// (after both started) gets the other's triggers at `/trigger`, naming the application.
#[tokio::test]
async fn another_admin_of_the_database_speaks_3_5_to_an_executor_registered_with_one() {
    wasmjob::telemetry::init_for_test();
    let Some(url) = wasmjob::storage::testing::postgres_database("peers").await.unwrap() else {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping the two-admin case");
        return;
    };
    let g = "3.5";
    let first = admin::start(admin_config(url.clone())).await.unwrap();
    let second = admin::start(admin_config(url.clone())).await.unwrap();
    let group = first.state.db.ensure_group(APP_NAME, "Sample", admin::now_ms()).await.unwrap();
    let api = Api { http: reqwest::Client::new(), base: second.url(), token: ADMIN_TOKEN.into() };
    let job_id = api
        .create_job(json!({"group_id": group.id, "glue_type": "BEAN", "handler": "demoJobHandler"}))
        .await;
    let peer = Peer::new(g);
    let executor_url = peer.serve(java_executor).await;
    let mut registry = fixture(g, "executor_sends/registry");
    registry["registryValue"] = json!(format!("{executor_url}/"));
    let reply = post(&format!("{}/api/registry", first.url()), &registry, Some(APP_NAME)).await;
    assert_eq!(reply["code"], 200, "{reply}");

    let log_id = trigger(&api, job_id).await;
    let run = sent_run(&api, log_id).await;
    assert_eq!(peer_calls(&peer), [("/trigger".to_owned(), Some(APP_NAME.to_owned()))]);
    assert_eq!((run["state"].as_str(), run["trigger_code"].as_i64()), (Some("running"), Some(200)));
    second.stop().await;
    first.stop().await;
    wasmjob::storage::testing::drop_postgres_database(&url).await.unwrap();
}

/// The run `log_id` once its send has an outcome.
async fn sent_run(api: &Api, log_id: i64) -> Value {
    api.wait_until("the run is sent", || async {
        let (_, run) = api.get(&format!("/api/v1/logs/{log_id}")).await;
        (run["state"] != "pending" && run["state"] != "dispatching").then_some(run)
    })
    .await
}

/// Every call `peer` received: its path and the application it named.
fn peer_calls(peer: &Peer) -> Vec<(String, Option<String>)> {
    let received = peer.received.lock().unwrap();
    received.iter().map(|received| (received.path.clone(), received.app_name.clone())).collect()
}

async fn trigger(api: &Api, job_id: i64) -> i64 {
    let (status, reply) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
    assert_eq!(status, 200, "{reply}");
    reply["log_ids"][0].as_i64().unwrap()
}

/// Reads the log of `log_id` page by page as a console would, going on at `to_line + 1` until
/// `is_end`; returns the text and how many pages it took (at most 10).
async fn tail(api: &Api, log_id: i64) -> (String, usize) {
    let mut from_line = 1;
    let mut content = String::new();
    for requests in 1..=10 {
        let (status, page) =
            api.get(&format!("/api/v1/logs/{log_id}/content?from_line={from_line}")).await;
        assert_eq!(status, 200, "{page}");
        content.push_str(page["content"].as_str().unwrap());
        if page["is_end"] == json!(true) {
            return (content, requests);
        }
        from_line = page["to_line"].as_i64().unwrap() + 1;
    }
    panic!("the tail of run {log_id} never ended: {content:?}");
}

/// (b) Our executor against a Java admin of each generation.
#[tokio::test]
async fn our_executor_works_with_java_admins_of_every_generation() {
    wasmjob::telemetry::init_for_test();
    for &generation in GENERATIONS {
        our_executor_against_java_admin(generation).await;
    }
}

async fn our_executor_against_java_admin(g: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let peer = Peer::new(g);
    let admin_url = format!("{}/xxl-job-admin", peer.serve(java_admin).await);
    let data_dir: PathBuf = dir.path().join("executor");
    let mut config = executor_config(&admin_url, data_dir.clone());
    config.app_name = APP_NAME.to_owned();
    config.admin_protocol = if g == "3.5" { Generation::V3_5 } else { Generation::Classic };
    std::fs::write(data_dir.join("handlers/hello.wasm"), sample_job("hello")).unwrap();
    let executor = executor::start(config).await.unwrap();
    let app_header = (peer.meta("requires_app_name") == json!(true)).then_some(APP_NAME);

    // The registration is one the admin parses (it answers 500 otherwise, and we would retry).
    let registry = peer.wait_for("/api/registry").await;
    assert_parses(g, "RegistryParam", &registry.body);
    // Registered as Java executors register, so a Java admin's CONSISTENT_HASH places it alike.
    assert_eq!(registry.body["registryValue"], format!("{}/", executor.address), "{g}");
    assert_eq!(registry.app_name.as_deref(), Some(APP_NAME), "{g}");
    // Our version rides along as a field the Java side does not read (Gson skips it).
    assert_eq!(registry.body["version"], env!("CARGO_PKG_VERSION"), "{g}");

    // The admin's trigger, at its route; our answer is one it parses.
    let log_id = 4242;
    // Logs are kept by the day of the trigger time: today's, so that retention keeps it.
    let now = admin::now_ms();
    let mut trigger = fixture(g, "admin_sends/trigger");
    trigger["logId"] = json!(log_id);
    trigger["logDateTime"] = json!(now);
    let trigger_path = peer.meta("trigger_path");
    let url = format!("{}{}", executor.address, trigger_path.as_str().unwrap());
    let reply = post(&url, &trigger, app_header).await;
    assert_parses(g, "reply", &reply);
    assert_eq!(reply["code"], 200, "{g}: {reply}");

    // The result comes back in the form this admin parses (2.2: `executeResult`; 3.5: wrapped,
    // with `logDateTime`); the fake admin refuses anything else, so the outbox would retry.
    let callback = peer.wait_for("/api/callback").await;
    assert_parses(g, "callback", &callback.body);
    let entry = match callback.body.get("callbackList") {
        Some(list) => list[0].clone(),
        None => callback.body[0].clone(),
    };
    let code = entry.get("handleCode").unwrap_or(&entry["executeResult"]["code"]);
    assert_eq!((entry["logId"].as_i64(), code.as_i64()), (Some(log_id), Some(200)), "{g}");
    assert_eq!(callback.app_name.as_deref(), Some(APP_NAME), "{g}");

    // The log, the kill and the idle beat as this admin sends them.
    let mut log = fixture(g, "admin_sends/log");
    log["logId"] = json!(log_id);
    let time_field = if log.get("logDateTime").is_some() { "logDateTime" } else { "logDateTim" };
    log[time_field] = json!(now);
    let page = post(&format!("{}/log", executor.address), &log, app_header).await;
    assert_parses(g, "LogResult", &page);
    let payload = &page[peer.meta("reply_payload_field").as_str().unwrap()];
    assert!(payload["logContent"].as_str().unwrap().contains("hello"), "{g}: {page}");
    for (path, body) in [("/idleBeat", "admin_sends/idle_beat"), ("/kill", "admin_sends/kill")] {
        let url = format!("{}{path}", executor.address);
        let reply = post(&url, &fixture(g, body), app_header).await;
        assert_parses(g, "reply", &reply);
        assert_eq!(reply["code"], 200, "{g} {path}: {reply}");
    }
    executor.stop().await;
}
