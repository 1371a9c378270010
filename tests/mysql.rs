//! What only MySQL and MariaDB need: text beyond the Basic Multilingual Plane, names that differ
//! only in case, and the server's bound on one statement, which bounds an uploaded component.
//! Skipped, saying so, without `WASMJOB_TEST_MYSQL_URL`.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestApp, sample_job};

async fn app() -> Option<TestApp> {
    #[expect(clippy::disallowed_methods, reason = "test configuration")]
    if std::env::var("WASMJOB_TEST_MYSQL_URL").is_err() {
        eprintln!("WASMJOB_TEST_MYSQL_URL is unset: skipping the MySQL tests");
        return None;
    }
    Some(TestApp::start(Backend::Mysql).await)
}

/// A job named with emoji reads back byte for byte, and two groups whose names differ only in
/// case are two groups, as on the other databases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_keep_every_character_and_their_case() {
    let Some(app) = app().await else { return };
    let name = "nightly 🚀 report — 夜间";
    let id = app.api.create_job(json!({"name": name, "description": "🧾 ledger"})).await;
    let (status, job) = app.api.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["name"], name);
    assert_eq!(job["description"], "🧾 ledger");
    for app_name in ["billing", "Billing"] {
        let body = json!({"app_name": app_name, "title": app_name, "address_type": "AUTO"});
        let (status, group) = app.api.post("/api/v1/groups", body).await;
        assert_eq!(status, StatusCode::CREATED, "{app_name:?}: {group}");
        assert_eq!(group["app_name"], app_name);
    }
    app.stop().await;
}

/// The admin lowers its component limit to what one statement can carry to the server, so a
/// component larger than the server takes is refused with 413 and the limit, and one under it
/// is stored and read back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_larger_than_the_server_takes_is_refused_with_413() {
    let Some(app) = app().await else { return };
    let admin = app.admin.as_ref().unwrap();
    let packet = admin.state.db.largest_statement_bytes().await.unwrap().unwrap();
    let limit = admin.state.config.max_module_bytes;
    assert!(limit as u64 <= packet, "the limit {limit} passes the server's {packet}");
    let id = app.api.create_job(json!({"name": "big"})).await;
    let (status, body) = app.api.upload(id, vec![0; limit + 1]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, body) = app.api.upload(id, sample_job("hello")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.stop().await;
}
