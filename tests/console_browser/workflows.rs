//! Workflows in the console, in headless Chromium against `wasmjob standalone`: the admin
//! writes a workflow's document in the form, sees its graph, runs it once, and watches the run's
//! page colour both nodes succeeded as it reloads; a document that is not JSON, or names a
//! cycle, is refused beside the form.

use serde_json::{Value, json};

use super::{ADMIN_PASSWORD, Visit, create_first_admin};
use crate::support::browser::Browser;
use crate::support::sample_job;
use crate::support::standalone::spawn_standalone;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_draws_runs_and_watches_a_workflow() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (standalone, base) = spawn_standalone(&data_dir);
    create_first_admin(&data_dir);

    // Two jobs running `hello`, made with the operator token.
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    let http = reqwest::Client::new();
    let mut jobs = Vec::new();
    for name in ["extract", "load"] {
        let job: Value = http
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(token.trim())
            .json(&json!({"group_id": 1, "name": name, "schedule_type": "NONE"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = job["id"].as_i64().unwrap();
        let upload = http
            .post(format!("{base}/api/v1/jobs/{id}/versions"))
            .bearer_auth(token.trim())
            .header("content-type", "application/wasm")
            .body(sample_job("hello"))
            .send()
            .await
            .unwrap();
        assert!(upload.status().is_success());
        jobs.push(id);
    }

    let visit = Visit { browser: &browser, base: base.clone() };
    visit.login("admin", ADMIN_PASSWORD).await;
    visit.page("/workflows", "workflows", "#workflow-form").await;
    // Not JSON, then a cycle: each refused beside the form, nothing created.
    set_document(&browser, "{ not json".to_owned()).await;
    browser.click("#workflow-form button[type=submit]").await;
    browser.wait_for_text("#workflow-form .error", "JSON").await;
    let cycle = json!({"name": "loop", "group_id": 1,
        "nodes": [{"name": "a", "job_id": jobs[0]}, {"name": "b", "job_id": jobs[1]}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}]});
    set_document(&browser, cycle.to_string()).await;
    browser.click("#workflow-form button[type=submit]").await;
    browser.wait_for_text("#workflow-form .error", "a → b → a").await;
    visit.shoot("workflow-refused").await;

    let document = json!({"name": "etl", "group_id": 1,
        "nodes": [{"name": "extract", "job_id": jobs[0]}, {"name": "load", "job_id": jobs[1]}],
        "edges": [{"from": "extract", "to": "load"}]});
    set_document(&browser, serde_json::to_string_pretty(&document).unwrap()).await;
    browser.click("#workflow-form button[type=submit]").await;
    browser.wait_for(".dag-figure svg .node").await;
    visit.shoot("workflow").await;
    let boxes = browser.run("return document.querySelectorAll('.dag .node').length;").await;
    assert_eq!(boxes, json!(2));

    browser.click("#workflow-trigger").await;
    browser.wait_for("#workflow-runs a[href^='/workflow-runs/']").await;
    browser.click("#workflow-runs a[href^='/workflow-runs/']").await;
    browser.wait_for_text("#workflow-run-state", "success").await;
    let succeeded =
        browser.run("return document.querySelectorAll('.dag .node-succeeded').length;").await;
    assert_eq!(succeeded, json!(2), "both nodes coloured as succeeded");
    visit.shoot("workflow-run").await;
    // Each node links to its run.
    let links = browser
        .run("return document.querySelectorAll('#workflow-nodes a[href^=\"/runs/\"]').length;")
        .await;
    assert_eq!(links, json!(2));

    drop(standalone);
    browser.quit().await;
}

/// Puts `document` in the form's text area.
async fn set_document(browser: &Browser, document: String) {
    let script = format!(
        "document.querySelector('#workflow-document').value = {};",
        serde_json::to_string(&document).unwrap()
    );
    browser.run(&script).await;
}
