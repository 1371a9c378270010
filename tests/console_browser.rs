//! The console in a real headless Chromium against `wasmjob standalone`: the first admin signs
//! in and makes an operator of one group; the operator creates a job (watching the schedule
//! preview), uploads `hello` twice and activates the first version again, runs it once with a
//! parameter and sees its log line arrive over the live tail, kills a `ticker` run from its
//! page, and cannot touch another group's job; the admin finds all of it in the audit log, then
//! switches the console to Chinese. Every page, in both languages, is screenshotted at laptop
//! and phone sizes into `target/`, and no page logs a console error.
//!
//! A second test edits a `GLUE_PYTHON` job's source in the same console, built by the real
//! builders (skipped, saying so, when they cannot be installed). `job_fields.rs`: every job
//! field set through the form and read back through the REST API.

mod job_fields;
mod workflows;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::browser::Browser;
use crate::support::builders::{builders_dir, sample_source};
use crate::support::sample_job;
use crate::support::standalone::spawn_standalone;

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
    // The preview, asked 250 ms after typing, is refused too: wait for it, so that its 400 is
    // logged before this page's console is read rather than on the next page's.
    browser.wait_for_text("#preview.error", "hour").await;
    visit.shoot("job-refused-field").await;

    // The versions page: upload `hello` twice, then make the first version active again.
    browser.click("#versions-link").await;
    browser.wait_for("#upload-form").await;
    visit.shoot("versions-empty").await;
    for remark in ["from the browser", "uploaded again"] {
        browser.fill("#component", component.to_str().unwrap()).await;
        browser.fill("#remark", remark).await;
        browser.click("#upload-form button[type=submit]").await;
        browser.wait_for_text("#versions", remark).await;
    }
    browser.click("#versions tr[data-version='1'] button[data-action$='/activate']").await;
    let question = browser.accept_dialog().await;
    assert!(question.contains("version 1"), "{question}");
    browser.wait_for_text("#versions tr[data-version='1']", "active").await;
    visit.shoot("versions").await;

    // Run it once with a parameter and watch the log line arrive over the live tail.
    visit.page(&format!("/jobs/{job_id}"), "job", "#trigger-form").await;
    browser.fill("#trigger-param", "console").await;
    browser.click("#trigger-form button[type=submit]").await;
    browser.wait_for_text("#log", "hello, console").await;
    browser.wait_for_text("#log-status", "End of log").await;
    browser.wait_for_text("#run-state", "success").await;
    assert!(browser.find("#log[data-tail='stream']").await.is_some(), "the log was polled");
    visit.shoot("run").await;

    visit.page("/jobs", "jobs", "#jobs").await;
    browser.wait_for_text("#jobs", "hello from the console").await;
    visit.page("/runs", "runs", ".runs").await;
    visit.page("/runs?from=yesterday", "runs-bad-time", "#runs-filter").await;
    let refusal = browser.text("#f-from-error").await;
    assert!(refusal.starts_with("Not a time"), "{refusal}");
    visit.page("/executors", "executors", "#executors").await;
    visit.page("/", "dashboard-operator", "#jobs-total").await;

    // The other group's job offers no change, and the API refuses one made anyway.
    visit.page(&format!("/jobs/{other_id}"), "job-other-group", "#job-summary").await;
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

    // A long `ticker` run, killed from its page while its lines arrive.
    let ticker: Value =
        post("/jobs", json!({"group_id": 1, "name": "ticker", "schedule_type": "NONE"}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let ticker_id = ticker["id"].as_i64().unwrap();
    let upload = http
        .post(format!("{base}/api/v1/jobs/{ticker_id}/versions"))
        .bearer_auth(token.trim())
        .header("content-type", "application/wasm")
        .body(sample_job("ticker"))
        .send()
        .await
        .unwrap();
    assert!(upload.status().is_success());
    visit.page(&format!("/jobs/{ticker_id}"), "job-ticker", "#trigger-form").await;
    browser.fill("#trigger-param", "600,100").await;
    browser.click("#trigger-form button[type=submit]").await;
    browser.wait_for_text("#log", "tick 2 of 600").await;
    let killed_run: i64 = browser.text("h1").await.trim_start_matches("Run ").parse().unwrap();
    browser.click("#kill button").await;
    browser.accept_dialog().await;
    browser.wait_for_text("#run-state", "killed").await;
    browser.wait_for_text("#log-status", "End of log").await;
    assert!(browser.find("#kill").await.is_none(), "an ended run offers no kill");
    visit.shoot("run-killed").await;
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
        format!("ops 127.0.0.1 version.activate job {job_id}"),
        format!("ops 127.0.0.1 run.kill run {killed_run}"),
        "admin 127.0.0.1 user.create user ops".to_owned(),
    ] {
        assert!(audit.contains(&wanted), "the audit log lacks `{wanted}`:\n{audit}");
    }

    // The switch turns the console Chinese, and every page reads in Chinese.
    browser.click("button[data-lang='zh']").await;
    browser.wait_for_text("nav", "任务管理").await;
    assert_eq!(browser.run("return document.documentElement.lang;").await, "zh-CN");
    let (job_page, versions_page) = (format!("/jobs/{job_id}"), format!("/jobs/{job_id}/versions"));
    let run_page = format!("/runs/{killed_run}");
    let chinese = [
        ("/", "zh-dashboard", "#jobs-total", "运行报表"),
        ("/jobs", "zh-jobs", "#jobs", "新增任务"),
        ("/jobs/new", "zh-job-new", "#job-form", "调度类型"),
        (job_page.as_str(), "zh-job", "#trigger-form", "执行一次"),
        (versions_page.as_str(), "zh-versions", "#upload-form", "版本历史"),
        ("/runs", "zh-runs", ".runs", "调度日志"),
        ("/executors", "zh-executors", "#executors", "注册节点"),
        ("/users", "zh-users", "#user-form", "新增用户"),
        ("/audit", "zh-audit", "#audit", "操作审计"),
        ("/tokens", "zh-tokens", "#token-form", "创建令牌"),
        (run_page.as_str(), "zh-run", "#log", "已终止"),
    ];
    for (path, name, ready, wanted) in chinese {
        visit.page(path, name, ready).await;
        browser.wait_for_text("main", wanted).await;
    }
    browser.wait_for_text("#log-status", "日志结束").await;
    visit.logout().await;
    visit.page("/login", "zh-login", "#password").await;
    browser.wait_for_text("main", "账号").await;
    browser.click("button[data-lang='en']").await;
    browser.wait_for_text("main", "User name").await;
    browser.quit().await;
    drop(standalone);
}

/// A build of Python source takes tens of seconds on a loaded machine: a bound, not an estimate.
const BUILD_PATIENCE: Duration = Duration::from_secs(600);

/// An admin types `sample-jobs/python/hello.py` into a `GLUE_PYTHON` job's source editor and
/// saves it, changes one line and saves again, compares versions 1 and 2 in the coloured diff,
/// and sees the builder's own message beside the editor when the source does not compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_edits_python_source_and_compares_its_versions() {
    let Some(builders) = builders_dir() else { return };
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    // Without `--builders-dir`, `standalone` builds with `<data dir>/builders`.
    std::os::unix::fs::symlink(&builders, data_dir.join("builders")).unwrap();
    let (standalone, base) = spawn_standalone(&data_dir);
    create_first_admin(&data_dir);

    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    let job: Value = reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(token.trim())
        .json(&json!({
            "group_id": 1, "name": "hello in python", "schedule_type": "NONE",
            "glue_type": "GLUE_PYTHON",
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = job["id"].as_i64().unwrap_or_else(|| panic!("no job: {job}"));

    let visit = Visit { browser: &browser, base: base.clone() };
    visit.login("admin", ADMIN_PASSWORD).await;
    let versions_page = format!("/jobs/{job_id}/versions");
    visit.page(&versions_page, "source-empty", "#source-form").await;
    assert!(browser.find("#upload-form").await.is_none(), "a source job offers no upload");

    // Version 1: the sample, typed into the editor as it is.
    let hello = sample_source("python/hello.py");
    browser.fill("#source", &hello).await;
    let typed = browser.run("return document.querySelector('#source').value;").await;
    assert_eq!(typed.as_str(), Some(hello.as_str()), "the editor holds what was typed");
    browser.fill("#source-remark", "typed in the browser").await;
    browser.click("#source-form button[type=submit]").await;
    browser.wait_for_text_within("#versions tr[data-version='1']", "python", BUILD_PATIENCE).await;
    let row = browser.text("#versions tr[data-version='1']").await;
    assert!(row.contains("typed in the browser") && row.contains("active"), "{row}");

    // Version 2: the editor opens with version 1's text; one line changes.
    let (old_line, new_line) = ("f\"hello, {", "f\"hi, {");
    assert!(hello.contains(old_line));
    let edited = hello.replace(old_line, new_line);
    crate::support::wait_until("the editor holds version 1", || async {
        let value = browser.run("return document.querySelector('#source').value;").await;
        (value.as_str() == Some(hello.as_str())).then_some(())
    })
    .await;
    browser.fill("#source", &edited).await;
    browser.fill("#source-remark", "one line changed").await;
    browser.click("#source-form button[type=submit]").await;
    browser.wait_for_text_within("#versions tr[data-version='2']", "python", BUILD_PATIENCE).await;
    let row = browser.text("#versions tr[data-version='2']").await;
    assert!(row.contains("one line changed") && row.contains("active"), "{row}");

    // The diff of versions 1 and 2: one line removed, one added, each coloured.
    browser.wait_for("#diff-from option[value='1']").await;
    browser
        .run(
            "document.querySelector('#diff-from').value = '1';
             document.querySelector('#diff-to').value = '2';",
        )
        .await;
    browser.click("#diff-form button[type=submit]").await;
    browser.wait_for_text("#diff", "hi, {").await;
    let diff = browser
        .run(
            "const lines = (kind) => [...document.querySelectorAll(`#diff .${kind}`)].map((line) =>
               ({text: line.textContent, background: getComputedStyle(line).backgroundColor}));
             return {added: lines('added'), removed: lines('removed'),
                     plain: getComputedStyle(document.querySelector('#diff')).backgroundColor};",
        )
        .await;
    let (added, removed) = (diff["added"].as_array().unwrap(), diff["removed"].as_array().unwrap());
    assert_eq!((added.len(), removed.len()), (1, 1), "one line each way: {diff}");
    assert!(removed[0]["text"].as_str().unwrap().starts_with('-'), "{diff}");
    assert!(removed[0]["text"].as_str().unwrap().contains(old_line), "{diff}");
    assert!(added[0]["text"].as_str().unwrap().starts_with('+'), "{diff}");
    assert!(added[0]["text"].as_str().unwrap().contains(new_line), "{diff}");
    let colours = [&added[0]["background"], &removed[0]["background"], &diff["plain"]];
    assert!(
        colours[0] != colours[1] && colours[0] != colours[2] && colours[1] != colours[2],
        "added, removed and unchanged lines look different: {diff}"
    );
    visit.shoot("source-diff").await;

    // A syntax error: no version, and the builder's message beside the editor.
    let broken =
        edited.replace("def run(self, t: Trigger) -> str:", "def run(self, t: Trigger) -> str");
    assert_ne!(broken, edited);
    browser.fill("#source", &broken).await;
    browser.fill("#source-remark", "broken").await;
    browser.click("#source-form button[type=submit]").await;
    let message =
        browser.wait_for_text_within("#source-error", "SyntaxError", BUILD_PATIENCE).await;
    assert!(!message.trim_start().starts_with('{'), "the builder's message, not JSON: {message}");
    assert!(browser.find("#versions tr[data-version='3']").await.is_none(), "nothing was saved");
    // Chromium logs the refused save (422) as an error; nothing else may be logged.
    let errors = browser.console_errors().await;
    assert!(errors.iter().all(|error| error.contains("422")), "console errors: {errors:?}");
    visit.shoot("source-build-error").await;

    browser.quit().await;
    drop(standalone);
}
