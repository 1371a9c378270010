//! The bad-input battery: malformed and oversized bodies, wrong types, huge and negative numbers,
//! unicode, NUL bytes, traversal-like ids, SQL metacharacters and every token mistake, against
//! the admin's operator API (`/api/v1`), its executor-facing API (`/api`, `/xxl-job-admin/api`)
//! and the executor's API (`/run`, `/runs`, `/kill`, `/log`, `/beat`, `/idleBeat`).
//!
//! Each table line is a request and what it must get: `401`, `4xx`, `refused` (a 4xx, or
//! XXL-JOB's failure envelope: HTTP 200 with `code 500` and a reason) or `any` (a read). Every
//! request must also get no 5xx and no panic, and all of them together must change nothing:
//! the admin's jobs, versions, runs, registrations, users and audit log, and every file of the
//! executor's data dir, are compared before and after.
//!
//! Token mistakes are sent with requests that would change something if the token were taken
//! (create a job, register, finish a run, queue a run), so a check that let one through shows.
//! The admin is driven through its router with `oneshot`, on SQLite and on PostgreSQL when
//! `WASMJOB_TEST_POSTGRES_URL` is set; the executor, whose router is private
//! to it, through a real socket on 127.0.0.1:0.

use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wasmjob::admin::{AppState, now_ms, router};
use wasmjob::protocol::{ACCESS_TOKEN_HEADER, REGISTRY_GROUP_EXECUTOR};
use wasmjob::storage::testing::{drop_postgres_database, postgres_database};
use wasmjob::storage::{Db, RunFilter};

use crate::support::app::executor_config;
use crate::support::runs::{manual_run, running_run};
use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, Backend, backends, sample_job};

/// One request of the battery.
struct Probe {
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    want: &'static str,
}

fn probe(method: &'static str, path: &str, want: &'static str) -> Probe {
    Probe { method, path: path.to_owned(), headers: Vec::new(), body: Vec::new(), want }
}

impl Probe {
    fn header(mut self, name: &'static str, value: &str) -> Probe {
        self.headers.push((name, value.to_owned()));
        self
    }
    fn admin(self) -> Probe {
        self.header("authorization", &format!("Bearer {ADMIN_TOKEN}"))
    }
    fn access(self) -> Probe {
        self.header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
    }
    fn json(mut self, body: &str) -> Probe {
        self.body = body.as_bytes().to_vec();
        self.header("content-type", "application/json")
    }
    fn bytes(mut self, body: Vec<u8>) -> Probe {
        self.body = body;
        self.header("content-type", "application/json")
    }
    fn describe(&self) -> String {
        let body = String::from_utf8_lossy(&self.body);
        let body: String = body.chars().take(400).collect();
        let headers: Vec<String> = self
            .headers
            .iter()
            .filter(|(name, _)| *name != "content-type")
            .map(|(name, value)| format!("{name}: {}", value.chars().take(40).collect::<String>()))
            .collect();
        format!("{} {} [{}] {body:?}", self.method, self.path, headers.join("; "))
    }
}

/// Why `status` and `body` do not meet `want`, if they do not.
fn verdict(want: &str, path: &str, status: StatusCode, body: &Value) -> Option<String> {
    if status.is_server_error() {
        return Some(format!("server error {status}: {body}"));
    }
    let envelope_refused = status == StatusCode::OK
        && body["code"] == 500
        && body["msg"].as_str().is_some_and(|msg| !msg.is_empty());
    // `/runs` answers a well-formed batch with one envelope per trigger.
    let items_refused = path.ends_with("/runs")
        && body["content"]
            .as_array()
            .is_some_and(|items| !items.is_empty() && items.iter().all(|item| item["code"] == 500));
    let met = match want {
        "401" => status == StatusCode::UNAUTHORIZED,
        "4xx" => status.is_client_error(),
        "refused" => status.is_client_error() || envelope_refused || items_refused,
        "any" => true,
        other => panic!("unknown expectation {other}"),
    };
    (!met).then(|| format!("wanted {want}, got {status}: {body}"))
}

/// Sends each probe through `router` and returns the failures, one line each.
async fn run_admin_probes(app: &axum::Router, probes: Vec<Probe>) -> Vec<String> {
    let mut failures = Vec::new();
    for probe in probes {
        let mut request = Request::builder().method(probe.method).uri(&probe.path);
        for (name, value) in &probe.headers {
            request = request.header(*name, value);
        }
        let request = request.body(Body::from(probe.body.clone())).unwrap();
        let app = app.clone();
        // A panicking handler fails its own task only, so the battery reports it by name.
        let answered = tokio::spawn(async move {
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
        })
        .await;
        let failure = match answered {
            Ok((status, body)) => verdict(probe.want, &probe.path, status, &body),
            Err(error) => Some(format!("panicked: {error}")),
        };
        if let Some(failure) = failure {
            failures.push(format!("{}: {failure}", probe.describe()));
        }
    }
    failures
}

/// What the admin holds: any change here is a change made by bad input.
async fn admin_snapshot(db: &Db) -> String {
    let jobs = db.list_jobs(None).await.unwrap();
    let mut versions = Vec::new();
    for job in &jobs {
        versions.push(db.list_job_versions(job.id).await.unwrap());
    }
    let all = RunFilter { limit: 100_000, ..RunFilter::default() };
    format!(
        "groups {:?}\njobs {jobs:?}\nversions {versions:?}\nruns {:?}\nregistry {:?}\nusers {:?}\n\
         audit {:?}\nmodules {}",
        db.list_groups().await.unwrap(),
        db.list_runs(&all).await.unwrap(),
        db.list_registrations(REGISTRY_GROUP_EXECUTOR).await.unwrap(),
        db.list_users().await.unwrap(),
        db.list_audit(None, None, 100_000, 0).await.unwrap(),
        db.count_modules().await.unwrap(),
    )
}

/// Deeply nested arrays: past serde_json's recursion limit.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A JSON body of `size` bytes: one long string field.
fn oversized(field: &str, size: usize) -> Vec<u8> {
    format!(r#"{{"{field}":"{}"}}"#, "x".repeat(size)).into_bytes()
}

/// Malformed, oversized and wrongly typed bodies, for any JSON endpoint.
fn malformed_bodies() -> Vec<Vec<u8>> {
    let mut bodies: Vec<Vec<u8>> = [
        "",
        "{",
        "}",
        "null",
        "true",
        "42",
        "\"a string\"",
        "{\"a\":}",
        "{'single':'quotes'}",
        "{\"a\":1,}",
        "\u{feff}{}",
        "{\"a\":\"\\ud800\"}",
    ]
    .iter()
    .map(|text| text.as_bytes().to_vec())
    .collect();
    bodies.push(nested(10_000).into_bytes());
    bodies.push(b"\xff\xfe\x00\x01not utf-8".to_vec());
    bodies.push(b"{\"a\":\"\x00\"}".to_vec());
    bodies
}

/// The admin under test and what the battery needs to know of it.
struct AdminUnderTest {
    app: axum::Router,
    db: Db,
    job_id: i64,
    run_id: i64,
    _dir: tempfile::TempDir,
    postgres_url: Option<String>,
}

/// The admin with a group, a job with a version, one registered executor and one running run.
async fn admin_app(backend: Backend) -> AdminUnderTest {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let postgres_url = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => postgres_database("badinput").await.unwrap(),
    };
    let url = postgres_url
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", dir.path().join("bad.db").display()));
    let db = Db::connect(&url).await.unwrap();
    db.ensure_group("default", "Default", 0).await.unwrap();
    let config = crate::support::app::admin_config(String::new());
    let app = router(AppState::new(db.clone(), config).unwrap());
    let job = r#"{"group_id":1,"name":"battery","schedule_type":"NONE"}"#;
    let (created, _) = one(&app, probe("POST", "/api/v1/jobs", "any").admin().json(job)).await;
    assert_eq!(created, StatusCode::CREATED);
    let mut upload = probe("POST", "/api/v1/jobs/1/versions", "any").admin();
    upload.body = sample_job("hello");
    let (uploaded, body) = one(&app, upload.header("content-type", "application/wasm")).await;
    assert_eq!(uploaded, StatusCode::CREATED, "{body}");
    let now = now_ms();
    db.upsert_registration(
        REGISTRY_GROUP_EXECUTOR,
        "default",
        "http://127.0.0.1:9",
        &wasmjob::storage::Peer { kind: "wasmjob", version: "" },
        now,
    )
    .await
    .unwrap();
    let run_id = running_run(&db, &manual_run(1, now), "http://127.0.0.1:9", now, 3600).await;
    AdminUnderTest { app, db, job_id: 1, run_id, _dir: dir, postgres_url }
}

async fn one(app: &axum::Router, probe: Probe) -> (StatusCode, Value) {
    let mut request = Request::builder().method(probe.method).uri(&probe.path);
    for (name, value) in &probe.headers {
        request = request.header(*name, value);
    }
    let response =
        app.clone().oneshot(request.body(Body::from(probe.body)).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Ways to present the operator token wrongly (header name and value), each a request that
/// would otherwise be allowed.
fn operator_token_mistakes() -> Vec<Vec<(&'static str, String)>> {
    let bearer = |token: &str| vec![("authorization", format!("Bearer {token}"))];
    vec![
        vec![],
        vec![("authorization", String::new())],
        bearer(""),
        bearer("wrong-token-wrong-token-0123"),
        bearer("default_token"),
        bearer(ACCESS_TOKEN),
        bearer(&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]),
        bearer(&format!("{ADMIN_TOKEN}x")),
        bearer(&format!("{ADMIN_TOKEN} {ADMIN_TOKEN}")),
        vec![("authorization", ADMIN_TOKEN.to_owned())],
        vec![("authorization", format!("Token {ADMIN_TOKEN}"))],
        vec![("authorization", format!("Basic {}", base64_admin()))],
        vec![("x-admin-token", ADMIN_TOKEN.to_owned())],
        vec![("x-api-key", ADMIN_TOKEN.to_owned())],
        vec![(ACCESS_TOKEN_HEADER, ADMIN_TOKEN.to_owned())],
        vec![(ACCESS_TOKEN_HEADER, ACCESS_TOKEN.to_owned())],
        vec![("cookie", format!("wasmjob_session={ADMIN_TOKEN}"))],
        vec![
            ("cookie", format!("wasmjob_session={ADMIN_TOKEN}")),
            ("x-csrf-token", ADMIN_TOKEN.to_owned()),
        ],
    ]
}

/// `admin:<token>` in base64, as a client that tries HTTP basic auth would send it.
fn base64_admin() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("admin:{ADMIN_TOKEN}").into_bytes();
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let bytes = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(bytes[0]) << 16) | (u32::from(bytes[1]) << 8) | u32::from(bytes[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Ways to present the access token wrongly.
fn access_token_mistakes() -> Vec<Vec<(&'static str, String)>> {
    let header = |token: &str| vec![(ACCESS_TOKEN_HEADER, token.to_owned())];
    vec![
        vec![],
        header(""),
        header("wrong-token-wrong-token-0123"),
        header("default_token"),
        header(ADMIN_TOKEN),
        header(&ACCESS_TOKEN[..ACCESS_TOKEN.len() - 1]),
        header(&format!("{ACCESS_TOKEN}x")),
        header(&format!(" {ACCESS_TOKEN}x ")),
        vec![("authorization", format!("Bearer {ACCESS_TOKEN}"))],
        vec![("xxl-job-token", ACCESS_TOKEN.to_owned())],
        vec![("access-token", ACCESS_TOKEN.to_owned())],
        vec![("xxl-job-appname", "default".to_owned())],
        vec![("cookie", format!("XXL-JOB-ACCESS-TOKEN={ACCESS_TOKEN}"))],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_apis_refuse_bad_input_without_5xx_panics_or_changes() {
    for backend in backends() {
        let admin = admin_app(backend).await;
        admin_battery(&admin).await;
        if let Some(url) = &admin.postgres_url {
            drop_postgres_database(url).await.unwrap();
        }
    }
}

async fn admin_battery(admin: &AdminUnderTest) {
    let AdminUnderTest { app, db, job_id, run_id, .. } = admin;
    let (app, db, job_id, run_id) = (app, db, *job_id, *run_id);
    let before = admin_snapshot(db).await;
    let mut probes = Vec::new();

    // Every token mistake, on requests that would change something.
    let valid_job = r#"{"group_id":1,"name":"sneaky","schedule_type":"NONE"}"#;
    for headers in operator_token_mistakes() {
        let changes = [
            probe("POST", "/api/v1/jobs", "401").json(valid_job),
            probe("POST", "/api/v1/jobs?token=T&access_token=T&api_key=T", "401").json(valid_job),
            probe("DELETE", &format!("/api/v1/jobs/{job_id}"), "401"),
            probe("POST", &format!("/api/v1/jobs/{job_id}/trigger"), "401").json("{}"),
            probe("POST", &format!("/api/v1/logs/{run_id}/kill"), "401"),
            probe("POST", "/api/v1/groups", "401")
                .json(r#"{"app_name":"sneaky","title":"x","address_type":"AUTO"}"#),
            probe("POST", "/api/v1/users", "401")
                .json(r#"{"name":"sneaky","password":"a long password here","role":"admin"}"#),
        ];
        for mut probe in changes {
            probe.path = probe.path.replace("=T", &format!("={ADMIN_TOKEN}"));
            for (name, value) in &headers {
                probe = probe.header(name, value);
            }
            probes.push(probe);
        }
    }
    let registry = r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"http://127.0.0.1:7"}"#;
    let remove = r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"http://127.0.0.1:9"}"#;
    let forged =
        format!(r#"[{{"logId":{run_id},"logDateTim":0,"handleCode":200,"handleMsg":"forged"}}]"#);
    for headers in access_token_mistakes() {
        for base in ["/api", "/xxl-job-admin/api"] {
            let mut changes = vec![
                probe("POST", &format!("{base}/registry"), "refused").json(registry),
                probe("POST", &format!("{base}/registryRemove"), "refused").json(remove),
                probe("POST", &format!("{base}/callback"), "refused").json(&forged),
                probe("POST", &format!("{base}/callback?accessToken={ACCESS_TOKEN}"), "refused")
                    .json(&forged),
                probe("POST", &format!("{base}/registry"), "refused").json(&format!(
                    r#"{{"accessToken":"{ACCESS_TOKEN}","registryGroup":"EXECUTOR","registryKey":"default","registryValue":"http://127.0.0.1:7"}}"#
                )),
            ];
            let sha256 = db.list_job_versions(job_id).await.unwrap()[0].sha256.clone();
            changes.push(probe("GET", &format!("{base}/modules/{sha256}"), "401"));
            for mut probe in changes {
                for (name, value) in &headers {
                    probe = probe.header(name, value);
                }
                probes.push(probe);
            }
        }
    }

    // Malformed, oversized and wrongly typed bodies on every JSON endpoint.
    let json_endpoints = [
        ("POST", "/api/v1/jobs".to_owned(), true),
        ("PUT", format!("/api/v1/jobs/{job_id}"), true),
        ("POST", format!("/api/v1/jobs/{job_id}/trigger"), true),
        ("POST", "/api/v1/groups".to_owned(), true),
        ("PUT", "/api/v1/groups/1".to_owned(), true),
        ("POST", "/api/v1/users".to_owned(), true),
        ("POST", "/api/v1/tokens".to_owned(), true),
        ("POST", "/api/v1/alarms".to_owned(), true),
        ("PUT", "/api/v1/alarms/1".to_owned(), true),
        ("POST", "/api/registry".to_owned(), false),
        ("POST", "/api/registryRemove".to_owned(), false),
        ("POST", "/api/callback".to_owned(), false),
        ("POST", "/xxl-job-admin/api/callback".to_owned(), false),
    ];
    for (method, path, operator) in &json_endpoints {
        let mut bodies = malformed_bodies();
        if path.ends_with("/trigger") {
            // No body is a trigger with the job's own parameter: not bad input.
            bodies.retain(|body| !body.is_empty());
        }
        bodies.push(oversized("name", 3 * 1024 * 1024));
        for body in bodies {
            let probe = probe(method, path, if *operator { "4xx" } else { "refused" }).bytes(body);
            probes.push(if *operator { probe.admin() } else { probe.access() });
        }
    }

    // Fields of the wrong type, numbers out of range, unicode look-alikes, NUL bytes, SQL and
    // path metacharacters where a value is checked.
    let job_fields = [
        r#""group_id":"1""#,
        r#""group_id":1.5"#,
        r#""group_id":-1"#,
        r#""group_id":0"#,
        r#""group_id":9223372036854775807"#,
        r#""group_id":9223372036854775808"#,
        r#""group_id":1e400"#,
        r#""group_id":"1 OR 1=1""#,
        r#""name":5"#,
        r#""name":["a"]"#,
        r#""name":"""#,
        r#""name":null"#,
        r#""schedule_type":"ＮＯＮＥ""#,
        r#""schedule_type":"NONE\u0000""#,
        r#""schedule_type":"NONE' OR '1'='1""#,
        r#""schedule_type":"CRON","schedule_conf":"* * * * * ?\u0000""#,
        r#""schedule_type":"CRON","schedule_conf":"'; DROP TABLE jobs; --""#,
        r#""schedule_type":"FIX_RATE","schedule_conf":"-1""#,
        r#""schedule_type":"FIX_RATE","schedule_conf":"99999999999999999999999""#,
        r#""schedule_type":"CRON","schedule_conf":"* * * * * ?","time_zone":"../../etc/localtime""#,
        r#""schedule_type":"CRON","schedule_conf":"* * * * * ?","time_zone":"Europe/Paris\u0000""#,
        r#""route_strategy":"FIRST\u200b""#,
        r#""route_strategy":"first""#,
        r#""block_strategy":"SERIAL_EXECUTION; DROP TABLE jobs""#,
        r#""misfire_strategy":7"#,
        r#""glue_type":"GLUE_SHELL""#,
        r#""glue_type":"BEAN","handler":"../../etc/passwd""#,
        r#""glue_type":"BEAN","handler":"hello\u0000""#,
        r#""glue_type":"BEAN","handler":"%2e%2e%2fhello""#,
        r#""timeout_secs":"10""#,
        r#""timeout_secs":1e400"#,
        r#""timeout_secs":9223372036854775808"#,
        r#""retry_count":true"#,
        r#""retry_count":-9223372036854775809"#,
        r#""retry_interval_secs":9223372036854775807"#,
        r#""retry_backoff":"EXPONENTIAL\u0000""#,
        r#""retry_max_interval_secs":-1"#,
        r#""child_job_ids":"1,2""#,
        r#""child_job_ids":[-1]"#,
        r#""child_job_ids":[9223372036854775807]"#,
        r#""child_job_ids":["../1"]"#,
        r#""fuel_limit":"lots""#,
        r#""memory_limit_mb":18446744073709551616"#,
        r#""unknown_field":1"#,
    ];
    for field in job_fields {
        let body = format!(r#"{{"group_id":1,"name":"bad","schedule_type":"NONE",{field}}}"#);
        // Later keys win in our parser only if duplicates are allowed: send the field alone too.
        let alone = format!(r#"{{{field}}}"#);
        for body in [body, alone] {
            probes.push(probe("POST", "/api/v1/jobs", "4xx").admin().json(&body));
            probes.push(probe("PUT", &format!("/api/v1/jobs/{job_id}"), "4xx").admin().json(&body));
        }
    }
    let trigger_bodies = [
        r#"{"param":5}"#,
        r#"{"addresses":"http://127.0.0.1:9"}"#,
        r#"{"addresses":["http://169.254.169.254/latest/meta-data"]}"#,
        r#"{"addresses":["http://127.0.0.1:9/../admin"]}"#,
        r#"{"addresses":["file:///etc/passwd"]}"#,
        r#"{"addresses":["http://127.0.0.1:9\u0000"]}"#,
        r#"{"addresses":[5]}"#,
    ];
    for body in trigger_bodies {
        probes.push(
            probe("POST", &format!("/api/v1/jobs/{job_id}/trigger"), "4xx").admin().json(body),
        );
    }
    let group_bodies = [
        r#"{"app_name":"","title":"x","address_type":"AUTO"}"#,
        r#"{"app_name":"../etc","title":"x","address_type":"AUTO"}"#,
        r#"{"app_name":"a'; DROP TABLE groups; --","title":"x","address_type":"AUTO"}"#,
        r#"{"app_name":"a\u0000b","title":"x","address_type":"AUTO"}"#,
        r#"{"app_name":"ｄｅｆａｕｌｔ","title":"x","address_type":"AUTO"}"#,
        r#"{"app_name":"ok-name","title":"x","address_type":"SOMETIMES"}"#,
        r#"{"app_name":"ok-name","title":"x","address_type":"MANUAL","addresses":"http://x"}"#,
        r#"{"app_name":"ok-name","title":"x","address_type":"MANUAL","addresses":["javascript:alert(1)"]}"#,
        r#"{"app_name":"default","title":"x","address_type":"AUTO"}"#,
    ];
    for body in group_bodies {
        probes.push(probe("POST", "/api/v1/groups", "4xx").admin().json(body));
    }

    // Ids in paths and queries: negative, zero, huge, not numbers, traversal, SQL, unicode.
    let ids = [
        "-1",
        "0",
        "9223372036854775807",
        "9223372036854775808",
        "99999999999999999999999",
        "1e3",
        "0x1",
        "1.0",
        "%2e%2e",
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "1%00",
        "1%3B%20DROP%20TABLE%20jobs",
        "1%27%20OR%20%271%27%3D%271",
        "%E2%91%A0",
        "%EF%BC%91",
        "%20",
    ];
    for id in ids {
        let want = "4xx";
        probes.push(probe("GET", &format!("/api/v1/jobs/{id}"), want).admin());
        probes.push(probe("PUT", &format!("/api/v1/jobs/{id}"), want).admin().json(valid_job));
        probes.push(probe("DELETE", &format!("/api/v1/jobs/{id}"), want).admin());
        probes.push(probe("POST", &format!("/api/v1/jobs/{id}/start"), want).admin());
        probes.push(probe("POST", &format!("/api/v1/jobs/{id}/stop"), want).admin());
        probes.push(probe("POST", &format!("/api/v1/jobs/{id}/trigger"), want).admin().json("{}"));
        probes.push(
            probe("POST", &format!("/api/v1/jobs/{job_id}/versions/{id}/activate"), want).admin(),
        );
        probes.push(
            probe("GET", &format!("/api/v1/jobs/{job_id}/versions/{id}/source"), want).admin(),
        );
        probes.push(
            probe("GET", &format!("/api/v1/jobs/{job_id}/versions/1/diff/{id}"), want).admin(),
        );
        probes.push(probe("GET", &format!("/api/v1/jobs/{id}/versions/1/source"), want).admin());
        probes.push(probe("GET", &format!("/api/v1/groups/{id}"), want).admin());
        probes.push(probe("DELETE", &format!("/api/v1/groups/{id}"), want).admin());
        probes.push(probe("GET", &format!("/api/v1/logs/{id}"), want).admin());
        probes.push(probe("GET", &format!("/api/v1/logs/{id}/content"), want).admin());
        probes.push(probe("POST", &format!("/api/v1/logs/{id}/kill"), want).admin());
        probes.push(probe("GET", &format!("/api/v1/users/{id}"), want).admin());
        probes.push(probe("DELETE", &format!("/api/v1/tokens/{id}"), want).admin());
        probes.push(probe("GET", &format!("/api/v1/alarms/{id}"), want).admin());
        probes.push(probe("DELETE", &format!("/api/v1/alarms/{id}"), want).admin());
        probes.push(probe("GET", &format!("/api/modules/{id}"), "4xx").access());
    }
    let queries = [
        "/api/v1/logs?limit=-1",
        "/api/v1/logs?limit=99999999999999999999",
        "/api/v1/logs?offset=-5",
        "/api/v1/logs?job_id=1%20OR%201%3D1",
        "/api/v1/logs?job_id=%27%3B%20DROP%20TABLE%20runs%3B%20--",
        "/api/v1/logs?status=running%27--",
        "/api/v1/logs?status=%00",
        "/api/v1/jobs?group_id=abc",
        "/api/v1/jobs/1/next-fire-times?count=-1",
        "/api/v1/jobs/1/next-fire-times?count=abc",
        "/api/v1/jobs/1/next-fire-times?count=99999999999999999999",
        "/api/v1/logs/424242/content?from_line=abc",
        "/api/v1/logs/424242/content?from_line=99999999999999999999",
        "/api/v1/audit?limit=-1",
        "/api/v1/audit?limit=abc",
        "/api/v1/alarms/deliveries?limit=-1",
        "/api/v1/alarms/deliveries?limit=99999999999999999999",
        "/api/v1/report?from=%00&to=2026-01-01",
        "/api/v1/report?from=2026-01-01&to=-1",
        "/api/v1/report?from=99999-01-01&to=99999-12-31",
        "/api/v1/report?from=-262143-01-01&to=262142-12-31",
        "/api/v1/report?from=2026-01-01%27--&to=2026-01-02",
        "/api/v1/schedule/preview?schedule_type=CRON&schedule_conf=%00",
        "/api/v1/schedule/preview?schedule_type=FIX_RATE&schedule_conf=-1",
    ];
    for query in queries {
        probes.push(probe("GET", query, "any").admin());
    }
    // (A run's log comes from its executor; this run's is offline, which is a 502, not bad
    // input, so the line numbers are tried on a run that does not exist.)
    for line in ["-1", "0", "9223372036854775807"] {
        probes.push(
            probe("GET", &format!("/api/v1/logs/424242/content?from_line={line}"), "4xx").admin(),
        );
    }

    // The executor-facing API: protocol fields out of range or of the wrong type.
    let executor_bodies = [
        (
            "registry",
            r#"{"registryGroup":"ADMIN","registryKey":"default","registryValue":"http://127.0.0.1:7"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR\u0000","registryKey":"default","registryValue":"http://127.0.0.1:7"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"","registryValue":"http://127.0.0.1:7"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":5,"registryValue":"http://127.0.0.1:7"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"file:///etc/passwd"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"javascript:alert(1)"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"../../etc"}"#,
        ),
        ("registry", r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":""}"#),
        ("registry", r#"{"registryGroup":"EXECUTOR","registryKey":"default"}"#),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"http://127.0.0.1:7","heldRuns":"all"}"#,
        ),
        (
            "registry",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":"http://127.0.0.1:7","heldRuns":[-1,"x"]}"#,
        ),
        (
            "registryRemove",
            r#"{"registryGroup":"EXECUTOR","registryKey":"default","registryValue":5}"#,
        ),
        (
            "registryRemove",
            r#"{"registryGroup":"ADMIN","registryKey":"default","registryValue":"http://127.0.0.1:9"}"#,
        ),
        ("callback", r#"{"callbackList":5}"#),
        ("callback", r#"{"callbackList":[{"logId":"1"}]}"#),
        ("callback", r#"[{"logId":"1","handleCode":200}]"#),
        ("callback", r#"[{"logId":9223372036854775808,"handleCode":200}]"#),
        ("callback", r#"[{"logId":1e400,"handleCode":200}]"#),
        ("callback", r#"[{"logId":"../1","handleCode":200}]"#),
    ];
    for (path, body) in executor_bodies {
        for base in ["/api", "/xxl-job-admin/api"] {
            probes.push(probe("POST", &format!("{base}/{path}"), "refused").access().json(body));
        }
    }
    // Results for runs that do not exist, or with a handle code of the wrong type, change nothing.
    let callbacks = [
        r#"[{"logId":-1,"logDateTim":0,"handleCode":200}]"#.to_owned(),
        r#"[{"logId":0,"logDateTim":0,"handleCode":200}]"#.to_owned(),
        r#"[{"logId":9223372036854775807,"logDateTim":0,"handleCode":200}]"#.to_owned(),
        r#"[{"logId":424242,"logDateTim":-1,"handleCode":500,"handleMsg":"a\u0000b ✓ '; DROP TABLE runs; --"}]"#.to_owned(),
        format!(r#"[{{"logId":{run_id},"logDateTim":0,"handleCode":"200"}}]"#),
        format!(r#"[{{"logId":{run_id},"logDateTim":0,"handleCode":9999999999}}]"#),
        format!(r#"[{{"logId":{run_id},"logDateTim":"yesterday","handleCode":200}}]"#),
    ];
    for body in &callbacks {
        probes.push(probe("POST", "/api/callback", "any").access().json(body));
    }
    for sha in ["..%2F..%2Fetc%2Fpasswd", "%2e%2e", &"A".repeat(64), &"a".repeat(63), "%00"] {
        probes.push(probe("GET", &format!("/api/modules/{sha}"), "4xx").access());
    }

    let count = probes.len();
    let failures = run_admin_probes(app, probes).await;
    assert!(
        failures.is_empty(),
        "{} of {count} probes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let after = admin_snapshot(db).await;
    assert_eq!(before, after, "bad input changed the admin's state");
}

/// Every file under `dir` with its contents, sorted by path.
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(next) = stack.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                files.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_api_refuses_bad_input_without_5xx_panics_or_changes() {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("executor");
    let mut config = executor_config("http://127.0.0.1:9", data_dir.clone());
    config.limits.max_queued_bytes = 1024 * 1024;
    std::fs::write(data_dir.join("handlers").join("hello.wasm"), sample_job("hello")).unwrap();
    let executor = wasmjob::executor::start(config).await.unwrap();
    let url = format!("http://{}", executor.local_addr);
    let before = files_under(&data_dir);

    let valid = json!({
        "jobId": 1, "executorHandler": "hello", "executorParams": "x",
        "executorBlockStrategy": "SERIAL_EXECUTION", "executorTimeout": 0, "logId": 77,
        "logDateTime": now_ms(), "glueType": "BEAN", "glueSource": "", "glueUpdatetime": 0,
        "broadcastIndex": 0, "broadcastTotal": 1
    });
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        body.to_string()
    };
    let mut probes = Vec::new();
    // Every token mistake, with a trigger that would be queued if the token were taken.
    for headers in access_token_mistakes() {
        let batch = format!("[{valid}]");
        let mut changes = vec![
            probe("POST", "/run", "refused").json(&valid.to_string()),
            probe("POST", "/trigger", "refused").json(&valid.to_string()),
            probe("POST", "/runs", "refused").json(&batch),
            probe("POST", &format!("/run?accessToken={ACCESS_TOKEN}"), "refused")
                .json(&valid.to_string()),
            probe("POST", "/run", "refused").json(&with("accessToken", json!(ACCESS_TOKEN))),
            probe("POST", "/kill", "refused").json(r#"{"jobId":1}"#),
            probe("POST", "/log", "refused").json(r#"{"logId":77,"logDateTim":0,"fromLineNum":1}"#),
            probe("POST", "/beat", "refused").json("{}"),
            probe("POST", "/idleBeat", "refused").json(r#"{"jobId":1}"#),
        ];
        for mut probe in changes.drain(..) {
            for (name, value) in &headers {
                probe = probe.header(name, value);
            }
            probes.push(probe);
        }
    }
    // Malformed and oversized bodies on every route.
    for path in ["/run", "/trigger", "/runs", "/kill", "/log", "/idleBeat"] {
        let mut bodies = malformed_bodies();
        bodies.push(oversized("executorParams", 3 * 1024 * 1024));
        for body in bodies {
            probes.push(probe("POST", path, "refused").access().bytes(body));
        }
    }
    // Triggers with one field wrong: type, range, unicode, NUL, traversal, SQL.
    let bad_fields = [
        ("jobId", json!("1")),
        ("jobId", json!(-1)),
        ("jobId", json!(0)),
        ("jobId", json!(1.5)),
        ("jobId", json!(null)),
        ("logId", json!(-1)),
        ("logId", json!(0)),
        ("logId", json!("77")),
        ("logId", json!("../77")),
        ("logId", json!(u64::MAX)),
        ("logId", json!(1e300)),
        ("logDateTime", json!("today")),
        ("executorTimeout", json!("10")),
        ("broadcastIndex", json!([])),
        ("glueType", json!("GLUE_SHELL")),
        ("glueType", json!("BEAN\u{0}")),
        ("glueType", json!("ＢＥＡＮ")),
        ("glueType", json!(5)),
        ("executorHandler", json!("../hello")),
        ("executorHandler", json!("..%2Fhello")),
        ("executorHandler", json!("hello\u{0}")),
        ("executorHandler", json!("hello.wasm")),
        ("executorHandler", json!("/etc/passwd")),
        ("executorHandler", json!("héllo")),
        ("executorHandler", json!("hello'; DROP TABLE runs; --")),
        ("executorHandler", json!("")),
        ("executorHandler", json!("h".repeat(200))),
        ("executorParams", json!(5)),
        ("executorParams", json!("x".repeat(1024 * 1024 + 1))),
        ("shardingItems", json!("0=a")),
        ("shardingItems", json!([{"item": "a"}])),
    ];
    for (field, value) in bad_fields {
        let body = with(field, value);
        probes.push(probe("POST", "/run", "refused").access().json(&body));
        probes.push(probe("POST", "/runs", "refused").access().json(&format!("[{body}]")));
    }
    let wasm_sources = [
        "../../etc/passwd".to_owned(),
        "%2e%2e%2f%2e%2e%2fetc%2fpasswd".to_owned(),
        "A".repeat(64),
        "a".repeat(63),
        format!("{}\u{0}", "a".repeat(63)),
        "' OR 1=1 --".to_owned(),
    ];
    for source in wasm_sources {
        let mut body = valid.clone();
        body["glueType"] = json!("GLUE_WASM");
        body["glueSource"] = json!(source);
        probes.push(probe("POST", "/run", "refused").access().json(&body.to_string()));
    }
    for body in [r#"{}"#, r#"[1,2]"#, r#"[{"jobId":1}]"#, r#"{"callbackList":[]}"#] {
        probes.push(probe("POST", "/runs", "refused").access().json(body));
    }
    let kill_and_idle = [
        r#"{"jobId":"1"}"#,
        r#"{"jobId":9223372036854775808}"#,
        r#"{"jobId":"../1"}"#,
        r#"{"jobId":1,"logId":"x"}"#,
        r#"{}"#,
    ];
    for body in kill_and_idle {
        probes.push(probe("POST", "/kill", "refused").access().json(body));
        probes.push(probe("POST", "/idleBeat", "refused").access().json(body));
    }
    for body in [r#"{"jobId":-1}"#, r#"{"jobId":0}"#, r#"{"jobId":1,"logId":-1}"#] {
        probes.push(probe("POST", "/kill", "any").access().json(body));
        probes.push(probe("POST", "/idleBeat", "any").access().json(body));
    }
    let log_reads = [
        (r#"{"logId":"../../etc/passwd","logDateTim":0,"fromLineNum":1}"#, "refused"),
        (r#"{"logId":"77","logDateTim":0,"fromLineNum":1}"#, "refused"),
        (r#"{"logId":77,"logDateTim":0,"fromLineNum":"1"}"#, "refused"),
        (r#"{"logId":-1,"logDateTim":0,"fromLineNum":1}"#, "any"),
        (r#"{"logId":0,"logDateTim":0,"fromLineNum":1}"#, "any"),
        (r#"{"logId":77,"logDateTim":0,"fromLineNum":-1}"#, "any"),
        (r#"{"logId":77,"logDateTim":0,"fromLineNum":9223372036854775807}"#, "any"),
        (r#"{"logId":77,"logDateTim":9223372036854775807,"fromLineNum":1}"#, "any"),
        (r#"{"logId":77,"logDateTim":-9223372036854775808,"fromLineNum":1}"#, "any"),
        (r#"{"logId":9223372036854775807,"logDateTime":-1,"fromLineNum":1}"#, "any"),
    ];
    for (body, want) in log_reads {
        probes.push(probe("POST", "/log", want).access().json(body));
    }
    probes.push(probe("POST", "/beat", "any").access().bytes(b"\xff\x00".to_vec()));
    probes.push(probe("GET", "/run", "4xx").access());
    probes.push(probe("POST", "/run/..%2Frun", "4xx").access().json(&valid.to_string()));

    let count = probes.len();
    // A new connection per request: a 413 answered before the body was read closes the
    // connection, and a pooled client would send the next probe into it.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let mut failures = Vec::new();
    for probe in probes {
        let method = reqwest::Method::from_bytes(probe.method.as_bytes()).unwrap();
        let mut request = client.request(method, format!("{url}{}", probe.path));
        for (name, value) in &probe.headers {
            request = request.header(*name, value);
        }
        let reply = request.body(probe.body.clone()).send().await;
        let failure = match reply {
            Ok(reply) => {
                let status = reply.status();
                let body = reply.bytes().await.unwrap_or_default();
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                verdict(probe.want, &probe.path, status, &body)
            }
            Err(error) => Some(format!("no answer: {error}")),
        };
        if let Some(failure) = failure {
            failures.push(format!("{}: {failure}", probe.describe()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} probes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Still serving, nothing queued or held, nothing written.
    let beat = client.post(format!("{url}/beat")).header(ACCESS_TOKEN_HEADER, ACCESS_TOKEN);
    let beat: Value = beat.json(&json!({})).send().await.unwrap().json().await.unwrap();
    assert_eq!(beat["code"], 200);
    assert_eq!(executor.held_bytes(), 0);
    assert_eq!(files_under(&data_dir), before, "bad input changed the executor's files");
    executor.stop().await;
}
