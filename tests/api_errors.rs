use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wasmjob::admin::{AppState, router};
use wasmjob::storage::Db;

use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, sample_job};

struct Case {
    method: &'static str,
    path: String,
    token: Option<&'static str>,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

fn case(method: &'static str, path: &str) -> Case {
    Case {
        method,
        path: path.to_owned(),
        token: Some(ADMIN_TOKEN),
        content_type: None,
        body: Vec::new(),
    }
}

impl Case {
    fn json(mut self, body: &str) -> Case {
        self.content_type = Some("application/json");
        self.body = body.as_bytes().to_vec();
        self
    }
    fn wasm(mut self, body: Vec<u8>) -> Case {
        self.content_type = Some("application/wasm");
        self.body = body;
        self
    }
    fn text(mut self, content_type: &'static str, body: &str) -> Case {
        self.content_type = Some(content_type);
        self.body = body.as_bytes().to_vec();
        self
    }
    fn token(mut self, token: Option<&'static str>) -> Case {
        self.token = token;
        self
    }
}

async fn send(app: &axum::Router, case: Case) -> (StatusCode, Value) {
    let mut request = Request::builder().method(case.method).uri(&case.path);
    if let Some(token) = case.token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(content_type) = case.content_type {
        request = request.header("content-type", content_type);
    }
    let response = app.clone().oneshot(request.body(Body::from(case.body)).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn app() -> (axum::Router, Db, tempfile::TempDir) {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("api.db").display())).await.unwrap();
    db.ensure_group("default", "Default", 0).await.unwrap();
    let config = crate::support::app::admin_config(String::new());
    let state = AppState::new(db.clone(), config).unwrap();
    (router(state), db, dir)
}

#[tokio::test]
async fn bad_input_gets_a_reason_and_changes_nothing() {
    let (app, db, _dir) = app().await;
    let (status, job) = send(
        &app,
        case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"ok","schedule_type":"NONE"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");

    let big = vec![0u8; 5 * 1024 * 1024];
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let cases: Vec<(Case, &str)> = vec![
        (case("GET", "/api/v1/jobs").token(None), "401 unauthorized"),
        (case("GET", "/api/v1/jobs").token(Some("wrong-token-wrong-token")), "401 unauthorized"),
        (case("GET", "/api/v1/jobs/999"), "404 job_not_found"),
        (case("GET", "/api/v1/jobs/abc"), "400 invalid_path"),
        (case("GET", "/api/v1/groups/999"), "404 group_not_found"),
        (case("GET", "/api/v1/logs/999"), "404 log_not_found"),
        (case("GET", "/api/v1/logs?status=weird"), "400 invalid_query"),
        (case("GET", "/api/v1/nothing-here"), "404 route_not_found"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"CRON","schedule_conf":"61 * * * * ?"}"#), "400 invalid_schedule"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"CRON","schedule_conf":"* * *"}"#), "400 invalid_schedule"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"FIX_RATE","schedule_conf":"-5"}"#), "400 invalid_schedule"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"CRON","schedule_conf":"* * * * * ?","time_zone":"Mars/Olympus"}"#), "400 invalid_schedule"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"SOMETIMES"}"#), "400 invalid_job"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"NONE","route_strategy":"NEAREST"}"#), "400 invalid_job"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":42,"name":"x","schedule_type":"NONE"}"#), "400 invalid_job"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"NONE","glue_type":"BEAN"}"#), "400 invalid_job"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x""#), "400 malformed_json"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":"one","name":"x","schedule_type":"NONE"}"#), "422 invalid_field"),
        (case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"x","schedule_type":"NONE","colour":"red"}"#), "422 invalid_field"),
        (case("POST", "/api/v1/jobs"), "415 unsupported_media_type"),
        (case("POST", "/api/v1/jobs/1/trigger").json("{not json"), "400 malformed_json"),
        (case("POST", "/api/v1/jobs/1/trigger").json(r#"{"param":"no version yet"}"#), "409 conflict"),
        (case("POST", "/api/v1/jobs/1/start"), "400 not_schedulable"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(Vec::new()), "422 empty_module"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(b"#!/bin/sh\nrm -rf /\n".to_vec()), "422 invalid_module"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(b"\0asm\x0d\0\x01\0junk".to_vec()), "422 invalid_module"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(core_module), "422 wrong_kind"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(big), "413 too_large"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(wat::parse_str(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#).unwrap()), "422 disallowed_import"),
        (case("POST", "/api/v1/jobs/1/versions").text("text/x-python", "print(1)"), "400 wrong_glue_type"),
        (case("POST", "/api/v1/jobs/1/versions").text("text/javascript; charset=utf-8", "1"), "400 wrong_glue_type"),
        (case("POST", "/api/v1/jobs/1/versions").text("text/plain", "print(1)"), "415 unsupported_media_type"),
        (case("POST", "/api/v1/jobs/1/versions").wasm(wat::parse_str("(component)").unwrap()), "422 missing_export"),
        (
            case("POST", "/api/v1/jobs/1/versions")
                .wasm(wat::parse_str(r#"(component (import "evil:net/socket@1.0.0" (instance)))"#).unwrap()),
            "422 disallowed_import",
        ),
        (case("POST", "/api/v1/jobs/1/versions").json("{}"), "415 unsupported_media_type"),
        (case("POST", "/api/v1/jobs/999/versions").wasm(sample_job("hello")), "404 job_not_found"),
        (case("POST", "/api/v1/jobs/1/versions/7/activate"), "404 version_not_found"),
    ];
    let mut failures = Vec::new();
    for (case, expected) in cases {
        let label = format!("{} {}", case.method, case.path);
        let (status, body) = send(&app, case).await;
        let got = format!("{} {}", status.as_u16(), body["code"].as_str().unwrap_or("-"));
        if got != expected {
            failures.push(format!("{label}: expected {expected}, got {got} {body}"));
        }
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{label}: no message in {body}"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing above created anything.
    assert_eq!(db.list_jobs(None).await.unwrap().len(), 1);
    assert!(db.list_job_versions(1).await.unwrap().is_empty());
    assert_eq!(db.count_modules().await.unwrap(), 0);
    assert_eq!(
        db.list_runs(&wasmjob::storage::RunFilter { limit: 10, ..Default::default() })
            .await
            .unwrap()
            .total,
        0
    );
}

/// The schedule and sharding fields of a job: each bad value gets a 400 naming the field, and
/// the good ones come back as stored.
#[tokio::test]
async fn schedule_and_sharding_fields_are_checked() {
    let (app, _db, _dir) = app().await;
    let bodies = [
        r#""schedule_type":"FIX_DELAY","schedule_conf":"0""#,
        r#""schedule_type":"FIX_DELAY","schedule_conf":"soon""#,
        r#""schedule_type":"ONCE","schedule_conf":"2026-05-01""#,
        r#""schedule_type":"NONE","misfire_threshold_ms":999"#,
        r#""schedule_type":"NONE","misfire_threshold_ms":86400001"#,
        r#""schedule_type":"NONE","sharding_total_count":-1"#,
        r#""schedule_type":"NONE","sharding_total_count":1001"#,
        r#""schedule_type":"NONE","sharding_item_parameters":"0=Beijing""#,
        r#""schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"0=Beijing,3=Lhasa""#,
        r#""schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"0:Beijing""#,
        r#""schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"1=a,1=b""#,
        r#""schedule_type":"NONE","sharding_total_count":3,"sharding_strategy":"BY_MOOD""#,
        r#""schedule_type":"NONE","sharding_total_count":3,"route_strategy":"SHARDING_BROADCAST""#,
        r#""schedule_type":"FIX_DELAY","schedule_conf":" 30 ","misfire_threshold_ms":60000,"sharding_total_count":3,"sharding_item_parameters":"0=Beijing, 2=Guangzhou","sharding_strategy":"ODEVITY_SORT_BY_NAME""#,
        r#""schedule_type":"ONCE","schedule_conf":"2020-01-01T00:00:00Z""#,
    ];
    let mut out = String::new();
    for fields in bodies {
        let body = format!(r#"{{"group_id":1,"name":"x",{fields}}}"#);
        let (status, job) = send(&app, case("POST", "/api/v1/jobs").json(&body)).await;
        let shown = if status == StatusCode::CREATED {
            let keys = [
                "schedule_type",
                "schedule_conf",
                "misfire_threshold_ms",
                "sharding_total_count",
                "sharding_item_parameters",
                "sharding_strategy",
            ];
            let values: Vec<String> = keys.iter().map(|key| job[key].to_string()).collect();
            let path = format!("/api/v1/jobs/{}/start", job["id"]);
            let (started, reply) = send(&app, case("POST", &path)).await;
            let start = match reply["next_fire_time"].as_str() {
                Some(_) => "starts with a next fire".to_owned(),
                None => format!("start {} {}", started.as_u16(), reply["message"]),
            };
            format!("{}; {start}", values.join(" "))
        } else {
            format!("{} {}", status.as_u16(), job["message"])
        };
        out.push_str(&format!("{fields}\n  {shown}\n"));
    }
    expect_test::expect![[r#"
        "schedule_type":"FIX_DELAY","schedule_conf":"0"
          400 "invalid fix delay `0`: expected a whole number of seconds from 1 to 31536000"
        "schedule_type":"FIX_DELAY","schedule_conf":"soon"
          400 "invalid fix delay `soon`: expected a whole number of seconds from 1 to 31536000"
        "schedule_type":"ONCE","schedule_conf":"2026-05-01"
          400 "invalid instant `2026-05-01`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00"
        "schedule_type":"NONE","misfire_threshold_ms":999
          400 "misfire_threshold_ms: 1000 to 86400000 (one day)"
        "schedule_type":"NONE","misfire_threshold_ms":86400001
          400 "misfire_threshold_ms: 1000 to 86400000 (one day)"
        "schedule_type":"NONE","sharding_total_count":-1
          400 "sharding_total_count: 0 (not sharded) to 1000"
        "schedule_type":"NONE","sharding_total_count":1001
          400 "sharding_total_count: 0 (not sharded) to 1000"
        "schedule_type":"NONE","sharding_item_parameters":"0=Beijing"
          400 "sharding_item_parameters: set sharding_total_count to shard the job"
        "schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"0=Beijing,3=Lhasa"
          400 "sharding_item_parameters: item 3 is out of range: items run from 0 to 2"
        "schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"0:Beijing"
          400 "sharding_item_parameters: `0:Beijing` is not `item=parameter`, as in 0=Beijing,1=Shanghai"
        "schedule_type":"NONE","sharding_total_count":3,"sharding_item_parameters":"1=a,1=b"
          400 "sharding_item_parameters: item 1 has two parameters"
        "schedule_type":"NONE","sharding_total_count":3,"sharding_strategy":"BY_MOOD"
          400 "sharding_strategy: unknown ShardingStrategy `BY_MOOD`, expected one of: AVERAGE_ALLOCATION, ODEVITY_SORT_BY_NAME, ROTATE_SERVER_BY_NAME, CONSISTENT_HASH"
        "schedule_type":"NONE","sharding_total_count":3,"route_strategy":"SHARDING_BROADCAST"
          400 "sharding_total_count: a job shards by items or by SHARDING_BROADCAST, not both"
        "schedule_type":"FIX_DELAY","schedule_conf":" 30 ","misfire_threshold_ms":60000,"sharding_total_count":3,"sharding_item_parameters":"0=Beijing, 2=Guangzhou","sharding_strategy":"ODEVITY_SORT_BY_NAME"
          "FIX_DELAY" "30" 60000 3 "0=Beijing, 2=Guangzhou" "ODEVITY_SORT_BY_NAME"; starts with a next fire
        "schedule_type":"ONCE","schedule_conf":"2020-01-01T00:00:00Z"
          "ONCE" "2020-01-01T00:00:00Z" 5000 0 "" "AVERAGE_ALLOCATION"; start 400 "the schedule has no fire time in the future"
    "#]].assert_eq(&out);
}

/// The retry and concurrency fields of a job: each bad value gets a 400 naming the field, and
/// the good ones come back as stored, defaults included.
#[tokio::test]
async fn retry_and_cap_fields_are_checked() {
    let (app, _db, _dir) = app().await;
    let bodies = [
        r#""retry_interval_secs":-1"#,
        r#""retry_interval_secs":86401"#,
        r#""retry_max_interval_secs":86401"#,
        r#""retry_interval_secs":60,"retry_max_interval_secs":30"#,
        r#""retry_backoff":"LINEAR""#,
        r#""retry_backoff":"fixed""#,
        r#""retry_interval_secs":"soon""#,
        r#""retry_count":3"#,
        r#""retry_count":3,"retry_interval_secs":10,"retry_backoff":"EXPONENTIAL","retry_max_interval_secs":300"#,
        r#""retry_interval_secs":86400,"retry_backoff":"FIXED""#,
        r#""max_concurrent_runs":-1"#,
        r#""max_concurrent_runs":10001"#,
        r#""max_concurrent_runs":1,"block_strategy":"DISCARD_LATER""#,
    ];
    let mut out = String::new();
    for fields in bodies {
        let body = format!(r#"{{"group_id":1,"name":"x","schedule_type":"NONE",{fields}}}"#);
        let (status, job) = send(&app, case("POST", "/api/v1/jobs").json(&body)).await;
        let shown = if status == StatusCode::CREATED {
            let keys = [
                "retry_count",
                "retry_interval_secs",
                "retry_backoff",
                "retry_max_interval_secs",
                "max_concurrent_runs",
                "block_strategy",
            ];
            let values: Vec<String> = keys.iter().map(|key| job[key].to_string()).collect();
            values.join(" ")
        } else {
            format!("{} {}", status.as_u16(), job["message"])
        };
        out.push_str(&format!("{fields}\n  {shown}\n"));
    }
    expect_test::expect![[r#"
        "retry_interval_secs":-1
          400 "retry_interval_secs: 0 to 86400 (one day)"
        "retry_interval_secs":86401
          400 "retry_interval_secs: 0 to 86400 (one day)"
        "retry_max_interval_secs":86401
          400 "retry_max_interval_secs: 0 to 86400 (one day)"
        "retry_interval_secs":60,"retry_max_interval_secs":30
          400 "retry_max_interval_secs: at least retry_interval_secs, or 0 for no cap but a day"
        "retry_backoff":"LINEAR"
          400 "retry_backoff: unknown RetryBackoff `LINEAR`, expected one of: FIXED, EXPONENTIAL"
        "retry_backoff":"fixed"
          400 "retry_backoff: unknown RetryBackoff `fixed`, expected one of: FIXED, EXPONENTIAL"
        "retry_interval_secs":"soon"
          422 "Failed to deserialize the JSON body into the target type: retry_interval_secs: invalid type: string \"soon\", expected i64"
        "retry_count":3
          3 0 "FIXED" 0 0 "SERIAL_EXECUTION"
        "retry_count":3,"retry_interval_secs":10,"retry_backoff":"EXPONENTIAL","retry_max_interval_secs":300
          3 10 "EXPONENTIAL" 300 0 "SERIAL_EXECUTION"
        "retry_interval_secs":86400,"retry_backoff":"FIXED"
          0 86400 "FIXED" 0 0 "SERIAL_EXECUTION"
        "max_concurrent_runs":-1
          400 "max_concurrent_runs: 0 (no cap) to 10000"
        "max_concurrent_runs":10001
          400 "max_concurrent_runs: 0 (no cap) to 10000"
        "max_concurrent_runs":1,"block_strategy":"DISCARD_LATER"
          0 0 "FIXED" 0 1 "DISCARD_LATER"
    "#]].assert_eq(&out);
}

#[tokio::test]
async fn messages_name_the_problem() {
    let (app, _db, _dir) = app().await;
    send(
        &app,
        case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"ok","schedule_type":"NONE"}"#),
    )
    .await;
    let http_import =
        wat::parse_str(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#)
            .unwrap();
    let (_, body) = send(&app, case("POST", "/api/v1/jobs/1/versions").wasm(http_import)).await;
    assert!(body["message"].as_str().unwrap().contains("wasi:http/"), "{body}");
    let (_, body) = send(
        &app,
        case("POST", "/api/v1/jobs").json(
            r#"{"group_id":1,"name":"x","schedule_type":"CRON","schedule_conf":"61 * * * * ?"}"#,
        ),
    )
    .await;
    assert!(body["message"].as_str().unwrap().contains("61 * * * * ?"), "{body}");
    let (_, body) = send(
        &app,
        case("POST", "/api/v1/jobs")
            .json(r#"{"group_id":"one","name":"x","schedule_type":"NONE"}"#),
    )
    .await;
    assert!(body["message"].as_str().unwrap().contains("group_id"), "{body}");
}

#[tokio::test]
async fn executor_api_requires_the_access_token() {
    let (app, db, _dir) = app().await;
    let registry = json!({"registryGroup": "EXECUTOR", "registryKey": "default", "registryValue": "http://127.0.0.1:1"}).to_string();
    for (prefix, token) in [("/api", None), ("/xxl-job-admin/api", Some("not-the-token-at-all"))] {
        let mut request = Request::builder()
            .method("POST")
            .uri(format!("{prefix}/registry"))
            .header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("XXL-JOB-ACCESS-TOKEN", token);
        }
        let response =
            app.clone().oneshot(request.body(Body::from(registry.clone())).unwrap()).await.unwrap();
        let body: Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                .unwrap();
        assert_eq!(body["code"], 500, "{body}");
    }
    assert!(db.list_registrations("EXECUTOR").await.unwrap().is_empty());

    let request = Request::builder()
        .uri(format!("/api/modules/{}", "a".repeat(64)))
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), StatusCode::UNAUTHORIZED);

    for prefix in ["/api", "/xxl-job-admin/api"] {
        let request = Request::builder()
            .method("POST")
            .uri(format!("{prefix}/registry"))
            .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
            .body(Body::from(registry.clone()))
            .unwrap();
        let body: Value = serde_json::from_slice(
            &app.clone()
                .oneshot(request)
                .await
                .unwrap()
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes(),
        )
        .unwrap();
        assert_eq!(body["code"], 200, "{body}");
    }
    assert_eq!(db.list_registrations("EXECUTOR").await.unwrap().len(), 1);
}

#[tokio::test]
async fn manual_triggers_reach_only_the_groups_executors() {
    let (app, db, _dir) = app().await;
    send(
        &app,
        case("POST", "/api/v1/jobs").json(r#"{"group_id":1,"name":"ok","schedule_type":"NONE"}"#),
    )
    .await;
    let (status, _) =
        send(&app, case("POST", "/api/v1/jobs/1/versions").wasm(sample_job("hello"))).await;
    assert_eq!(status, StatusCode::CREATED);
    let body = r#"{"addresses":["http://169.254.169.254/latest/meta-data"]}"#;
    let (status, body) = send(&app, case("POST", "/api/v1/jobs/1/trigger").json(body)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_trigger")),
        "{body}"
    );
    assert_eq!(
        db.list_runs(&wasmjob::storage::RunFilter { limit: 10, ..Default::default() })
            .await
            .unwrap()
            .total,
        0
    );
}
