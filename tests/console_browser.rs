//! The console in a real headless Chromium against `wasmjob standalone`: the first admin signs
//! in and makes an operator of one group; the operator creates a job (watching the schedule
//! preview), uploads `hello`, runs it once with a parameter and sees its log line, and cannot
//! touch another group's job; the admin finds both in the audit log. Every page is
//! screenshotted at laptop and phone sizes into `target/`, and no page logs a console error.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::standalone::spawn_standalone;
use crate::support::browser::Browser;
use crate::support::sample_job;

const ADMIN_PASSWORD: &str = "first admin password";
const OPERATOR_PASSWORD: &str = "operator password";

/// Where the screenshots go: `target/tmp/console-screenshots`.
fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `wasmjob user create --admin`, the password on standard input, as the README says.
fn create_first_admin(data_dir: &std::path::Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
        .args(["user", "create", "--admin", "--name", "admin", "--database-url"])
        .arg(format!("sqlite:{}", data_dir.join("wasmjob.db").display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{ADMIN_PASSWORD}").unwrap();
    assert!(child.wait().unwrap().success(), "wasmjob user create failed");
}

struct Visit<'a> {
    browser: &'a Browser,
    base: String,
}

impl Visit<'_> {
    /// Opens `path`, screenshots it at both sizes as `name`, and checks the console is clean.
    async fn page(&self, path: &str, name: &str, ready: &str) {
        self.browser.goto(&format!("{}{path}", self.base)).await;
        self.browser.wait_for(ready).await;
        self.shoot(name).await;
    }

    async fn shoot(&self, name: &str) {
        for (width, height) in [(1280, 800), (390, 844)] {
            self.browser.resize(width, height).await;
            self.browser
                .screenshot(&screenshot_dir().join(format!("{name}-{width}x{height}.png")))
                .await;
        }
        self.browser.resize(1280, 800).await;
        // Chromium logs every 4xx answer as an error: a page refused on purpose is named so.
        let errors = self.browser.console_errors().await;
        if !name.contains("refused") {
            assert!(errors.is_empty(), "{name} logged console errors: {errors:?}");
        }
    }

    async fn login(&self, name: &str, password: &str) {
        self.page("/login", &format!("login-{name}"), "#password").await;
        self.browser.fill("#name", name).await;
        self.browser.fill("#password", password).await;
        self.browser.click("button[type=submit]").await;
        self.browser.wait_for_text("header .whoami span", name).await;
    }

    async fn logout(&self) {
        self.browser.click("header .whoami button").await;
        self.browser.wait_for("#password").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_in_the_console_and_the_admin_audits_it() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (standalone, base) = spawn_standalone(&data_dir);
    create_first_admin(&data_dir);
    let component = dir.path().join("hello.wasm");
    std::fs::write(&component, sample_job("hello")).unwrap();

    // Another group with a job, made with the operator token.
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{base}/api/v1{path}")).bearer_auth(token.trim()).json(&body).send()
    };
    assert!(post("/groups", json!({"app_name": "billing"})).await.unwrap().status().is_success());
    let other: Value =
        post("/jobs", json!({"group_id": 2, "name": "invoices", "schedule_type": "NONE"}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let other_id = other["id"].as_i64().unwrap();

    let visit = Visit { browser: &browser, base: base.clone() };
    visit.login("admin", ADMIN_PASSWORD).await;
    visit.shoot("dashboard").await;

    // The admin makes an operator of the group `default` only.
    visit.page("/users", "users", "#user-form").await;
    browser.fill("#user-name", "ops").await;
    browser.fill("#user-password", OPERATOR_PASSWORD).await;
    browser.run("document.querySelector('#user-role').value = 'operator';").await;
    browser
        .run("document.querySelector('#user-groups option[value=\"1\"]').selected = true;")
        .await;
    browser.click("#user-form button[type=submit]").await;
    browser.wait_for_text("#users", "ops").await;
    visit.logout().await;

    // The operator creates a job, seeing the next fire times under the cron field.
    visit.login("ops", OPERATOR_PASSWORD).await;
    visit.page("/jobs/new", "job-new", "#job-form").await;
    browser.fill("#name", "hello from the console").await;
    browser.fill("#schedule_conf", "0 0 12 * * ?").await;
    browser.wait_for_text("#preview", "12:00:00").await;
    visit.shoot("job-new-preview").await;
    browser.click("#job-form button[type=submit]").await;
    let job_heading = browser.wait_for_text("h1", "hello from the console").await;
    let job_id: i64 =
        job_heading.trim_start_matches("Job ").split(':').next().unwrap().parse().unwrap();

    // A refused field shows the API's reason beside it.
    browser.fill("#schedule_conf", "0 0 25 * * ?").await;
    browser.click("#job-form button[type=submit]").await;
    let reason = browser.wait_for_text("[data-error-for=schedule_conf]", "hour").await;
    assert!(!reason.contains('{'), "a person's message, not JSON: {reason}");
    visit.shoot("job-refused-field").await;

    // Upload `hello`, then run it once with a parameter and watch the log line arrive.
    browser.fill("#component", component.to_str().unwrap()).await;
    browser.fill("#remark", "from the browser").await;
    browser.click("#upload-form button[type=submit]").await;
    browser.wait_for_text("#versions", "from the browser").await;
    visit.shoot("job").await;
    browser.fill("#trigger-param", "console").await;
    browser.click("#trigger-form button[type=submit]").await;
    browser.wait_for_text("#log", "hello, console").await;
    browser.wait_for_text("#log-status", "End of log").await;
    visit.shoot("run").await;

    visit.page("/jobs", "jobs", "#jobs").await;
    browser.wait_for_text("#jobs", "hello from the console").await;
    visit.page("/runs", "runs", ".runs").await;
    visit.page("/executors", "executors", "#executors").await;
    visit.page("/", "dashboard-operator", "#jobs-total").await;

    // The other group's job offers no change, and the API refuses one made anyway.
    visit.page(&format!("/jobs/{other_id}"), "job-other-group", "#versions").await;
    assert!(browser.find("[data-action$='/start']").await.is_none());
    let status = browser
        .run_async(
            "const [url, done] = arguments;
             const csrf = document.querySelector('meta[name=\"csrf-token\"]').content;
             fetch(url, {method: 'POST', headers: {'X-CSRF-Token': csrf}}).then(r => done(r.status));",
            json!([format!("/api/v1/jobs/{other_id}/start")]),
        )
        .await;
    assert_eq!(status, 403);
    visit.shoot("job-other-group-refused").await;

    // A personal token, made in the console, works on the REST API with the operator's role.
    visit.page("/tokens", "tokens", "#token-form").await;
    browser.fill("#token-name", "ci").await;
    browser.click("#token-form button[type=submit]").await;
    let secret = browser.wait_for_text("#new-token-value", "wjt_").await;
    let with_token =
        |path: &str| http.post(format!("{base}/api/v1{path}")).bearer_auth(secret.trim()).send();
    assert_eq!(with_token(&format!("/jobs/{job_id}/stop")).await.unwrap().status(), 200);
    assert_eq!(with_token(&format!("/jobs/{other_id}/stop")).await.unwrap().status(), 403);
    visit.logout().await;

    // The admin sees both in the audit log.
    visit.login("admin", ADMIN_PASSWORD).await;
    visit.page("/audit", "audit", "#audit").await;
    let audit = browser.text("#audit").await;
    for wanted in [
        format!("ops 127.0.0.1 job.create job {job_id}"),
        format!("ops 127.0.0.1 version.upload job {job_id}"),
        format!("ops 127.0.0.1 job.trigger job {job_id}"),
        format!("ops 127.0.0.1 job.stop job {job_id}"),
        "admin 127.0.0.1 user.create user ops".to_owned(),
    ] {
        assert!(audit.contains(&wanted), "the audit log lacks `{wanted}`:\n{audit}");
    }
    browser.quit().await;
    drop(standalone);
}
