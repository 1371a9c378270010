//! Every job field through the console's form in headless Chromium, read back through the REST
//! API field by field: set away from its default on the new-job page, then changed again on the
//! job's page, where the form shows what the API holds. A value the API refuses is shown beside
//! its field; a number out of the API's bounds is refused by the browser before it is sent.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{ADMIN_PASSWORD, Visit, create_first_admin};
use crate::support::browser::Browser;
use crate::support::standalone::{Standalone, spawn_standalone};

/// The fields of a job the API answers with that a person does not set.
const READ_ONLY: [&str; 6] =
    ["id", "running", "next_fire_time", "active_version", "created_at", "updated_at"];

/// A field, the text typed or chosen in the form, and the value the API then holds.
type Entry = (&'static str, String, Value);

/// Every field away from its default: a job of the second group with two child jobs.
fn created(children: [i64; 2]) -> Vec<Entry> {
    let [a, b] = children;
    let mut entries = entries(&[
        ("group_id", "2", json!(2)),
        ("name", "every field", json!("every field")),
        ("description", "settles the day\nsecond line", json!("settles the day\nsecond line")),
        ("owner", "Li Wei", json!("Li Wei")),
        ("schedule_type", "FIX_RATE", json!("FIX_RATE")),
        ("time_zone", "Asia/Shanghai", json!("Asia/Shanghai")),
        ("calendar", "weekends", json!("weekends")),
        ("schedule_conf", "90", json!("90")),
        ("misfire_strategy", "FIRE_ONCE_NOW", json!("FIRE_ONCE_NOW")),
        ("misfire_threshold_ms", "60000", json!(60_000)),
        ("route_strategy", "ROUND", json!("ROUND")),
        ("block_strategy", "DISCARD_LATER", json!("DISCARD_LATER")),
        ("timeout_secs", "120", json!(120)),
        ("glue_type", "BEAN", json!("BEAN")),
        ("handler", "demoJobHandler", json!("demoJobHandler")),
        ("fuel_limit", "5000000", json!(5_000_000)),
        ("memory_limit_mb", "64", json!(64)),
        ("param", "first line\nsecond line", json!("first line\nsecond line")),
        ("retry_count", "3", json!(3)),
        ("retry_interval_secs", "30", json!(30)),
        ("retry_backoff", "EXPONENTIAL", json!("EXPONENTIAL")),
        ("retry_max_interval_secs", "600", json!(600)),
        ("max_concurrent_runs", "2", json!(2)),
        ("sharding_total_count", "3", json!(3)),
        (
            "sharding_item_parameters",
            "0=Beijing,1=Shanghai,2=Guangzhou",
            json!("0=Beijing,1=Shanghai,2=Guangzhou"),
        ),
        ("sharding_strategy", "ROTATE_SERVER_BY_NAME", json!("ROTATE_SERVER_BY_NAME")),
        (
            "alarm_email",
            "ops@example.com,dev@example.com",
            json!("ops@example.com,dev@example.com"),
        ),
        ("alarm_silence_secs", "600", json!(600)),
    ]);
    entries.push(("child_job_ids", format!("{a}, {b}"), json!([a, b])));
    entries
}

/// Every field changed again; the optional ones emptied, which the API takes as none.
fn edited(children: [i64; 2]) -> Vec<Entry> {
    let mut entries = entries(&[
        ("group_id", "1", json!(1)),
        ("name", "every field, edited", json!("every field, edited")),
        ("description", "", json!("")),
        ("owner", "王芳", json!("王芳")),
        ("schedule_type", "CRON", json!("CRON")),
        ("time_zone", "Europe/Berlin", json!("Europe/Berlin")),
        ("calendar", "", Value::Null),
        ("schedule_conf", "0 30 2 * * ?", json!("0 30 2 * * ?")),
        ("misfire_strategy", "DO_NOTHING", json!("DO_NOTHING")),
        ("misfire_threshold_ms", "2000", json!(2_000)),
        ("route_strategy", "CONSISTENT_HASH", json!("CONSISTENT_HASH")),
        ("block_strategy", "COVER_EARLY", json!("COVER_EARLY")),
        ("timeout_secs", "30", json!(30)),
        ("glue_type", "GLUE_PYTHON", json!("GLUE_PYTHON")),
        ("handler", "", Value::Null),
        ("fuel_limit", "", Value::Null),
        ("memory_limit_mb", "128", json!(128)),
        ("param", "edited", json!("edited")),
        ("retry_count", "5", json!(5)),
        ("retry_interval_secs", "0", json!(0)),
        ("retry_backoff", "FIXED", json!("FIXED")),
        ("retry_max_interval_secs", "0", json!(0)),
        ("max_concurrent_runs", "0", json!(0)),
        ("sharding_total_count", "2", json!(2)),
        ("sharding_item_parameters", "0=north,1=south", json!("0=north,1=south")),
        ("sharding_strategy", "CONSISTENT_HASH", json!("CONSISTENT_HASH")),
        ("alarm_email", "", Value::Null),
        ("alarm_silence_secs", "0", json!(0)),
    ]);
    entries.push(("child_job_ids", children[1].to_string(), json!([children[1]])));
    entries
}

fn entries(rows: &[(&'static str, &str, Value)]) -> Vec<Entry> {
    rows.iter().map(|(name, text, value)| (*name, (*text).to_owned(), value.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_field_set_on_the_new_job_page_reads_back_through_the_api() {
    let Some(browser) = Browser::start().await else { return };
    let console = Console::start().await;
    let visit = Visit { browser: &browser, base: console.base.clone() };
    let entries = created(console.children);
    let defaults =
        console.post("/jobs", json!({"group_id": 1, "name": "d", "schedule_type": "NONE"})).await;
    for (name, _, value) in &entries {
        assert_ne!(&defaults[name], value, "{name} is set to its default");
    }

    visit.login("admin", ADMIN_PASSWORD).await;
    visit.page("/jobs/new", "job-new-every-field-empty", "#job-form").await;
    fill(&browser, &entries).await;
    settle_preview(&browser, "+08:00").await;
    visit.shoot("job-new-every-field").await;
    browser.click("#job-form button[type=submit]").await;
    let heading = browser.wait_for_text("h1", "every field").await;
    let id: i64 = heading.trim_start_matches("Job ").split(':').next().unwrap().parse().unwrap();

    console.compare(id, &entries).await;
    compare_form(&browser, &entries).await;
    visit.shoot("job-every-field").await;
    browser.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_field_edited_on_the_job_page_reads_back_through_the_api() {
    let Some(browser) = Browser::start().await else { return };
    let console = Console::start().await;
    let visit = Visit { browser: &browser, base: console.base.clone() };
    let before = created(console.children);
    let mut body = json!({});
    for (name, _, value) in &before {
        body[name] = value.clone();
    }
    let id = console.post("/jobs", body).await["id"].as_i64().unwrap();

    // The page shows what the API holds, then every field is changed.
    visit.login("admin", ADMIN_PASSWORD).await;
    visit.page(&format!("/jobs/{id}"), "job-edit-every-field", "#job-form").await;
    compare_form(&browser, &before).await;
    let after = edited(console.children);
    fill(&browser, &after).await;
    settle_preview(&browser, "T02:30:00+0").await;
    browser.click("#job-form button[type=submit]").await;
    browser.wait_for_text("h1", "every field, edited").await;
    console.compare(id, &after).await;
    compare_form(&browser, &after).await;
    visit.shoot("job-edited-every-field").await;

    // A value the API refuses: its reason beside the field, and nothing saved.
    fill(&browser, &entries(&[("sharding_item_parameters", "0=north,7=west", Value::Null)])).await;
    browser.click("#job-form button[type=submit]").await;
    let reason =
        browser.wait_for_text("[data-error-for=sharding_item_parameters]", "out of range").await;
    assert!(reason.starts_with("sharding_item_parameters: item 7"), "{reason}");
    // A number past the API's bounds: the browser refuses it and sends nothing.
    fill(&browser, &entries(&[("sharding_total_count", "-1", Value::Null)])).await;
    let refused = browser
        .run(
            "const field = document.querySelector('#sharding_total_count');
             return [field.validity.rangeUnderflow, document.querySelector('#job-form').checkValidity()];",
        )
        .await;
    assert_eq!(refused, json!([true, false]));
    visit.shoot("job-every-field-refused").await;
    console.compare(id, &after).await;
    browser.quit().await;
}

/// `wasmjob standalone` with its first admin, a second group, and one job in each group to be
/// the child jobs.
struct Console {
    base: String,
    http: reqwest::Client,
    token: String,
    children: [i64; 2],
    _standalone: Standalone,
    _dir: tempfile::TempDir,
}

impl Console {
    async fn start() -> Console {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let (standalone, base) = spawn_standalone(&data_dir);
        create_first_admin(&data_dir);
        let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
        let mut console = Console {
            base,
            http: reqwest::Client::new(),
            token: token.trim().to_owned(),
            children: [0, 0],
            _standalone: standalone,
            _dir: dir,
        };
        console.post("/groups", json!({"app_name": "billing"})).await;
        for name in ["weekends", "holidays"] {
            let calendar =
                json!({"name": name, "time_zone": "Asia/Shanghai", "weekdays": ["SAT", "SUN"]});
            console.post("/calendars", calendar).await;
        }
        for (group_id, name) in [(1, "child a"), (2, "child b")] {
            let job = json!({"group_id": group_id, "name": name, "schedule_type": "NONE"});
            console.children[group_id as usize - 1] =
                console.post("/jobs", job).await["id"].as_i64().unwrap();
        }
        console
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let url = format!("{}/api/v1{path}", self.base);
        let reply = self.http.post(url).bearer_auth(&self.token).json(&body).send().await.unwrap();
        assert!(reply.status().is_success(), "POST {path}: {}", reply.status());
        reply.json().await.unwrap()
    }

    /// Reads job `id` through the REST API and compares it with `entries`, which must name
    /// every field a person sets.
    async fn compare(&self, id: i64, entries: &[Entry]) {
        let url = format!("{}/api/v1/jobs/{id}", self.base);
        let reply = self.http.get(url).bearer_auth(&self.token).send().await.unwrap();
        let job: Value = reply.json().await.unwrap();
        let mut unset: BTreeSet<&str> =
            job.as_object().unwrap().keys().map(String::as_str).collect();
        for (name, _, value) in entries {
            assert_eq!(&job[name], value, "{name} through the API");
            unset.remove(name);
        }
        unset.retain(|name| !READ_ONLY.contains(name));
        assert!(unset.is_empty(), "the test sets no value for {unset:?}");
    }
}

/// Types or chooses each entry's text into its field of the job form.
async fn fill(browser: &Browser, entries: &[Entry]) {
    for (name, text, _) in entries {
        let css = format!("#job-form [name='{name}']");
        let tag = browser.run(&format!("return document.querySelector(\"{css}\").tagName;")).await;
        if tag == "SELECT" {
            assert!(browser.select(&css, text).await, "{name} offers no {text}");
        } else {
            browser.fill(&css, text).await;
        }
    }
}

/// The job form shows each entry's text.
async fn compare_form(browser: &Browser, entries: &[Entry]) {
    let shown = browser
        .run(
            "return Object.fromEntries([...document.querySelectorAll('#job-form [name]')]
               .map((field) => [field.name, field.value]));",
        )
        .await;
    for (name, text, _) in entries {
        let text = if *name == "child_job_ids" { text.replace(' ', "") } else { text.clone() };
        assert_eq!(shown[name], json!(text), "{name} on the job page");
    }
}

/// Waits for the schedule preview of what was typed (showing `wanted`), and forgets the console
/// errors of the previews of half-typed schedules, which the API refuses (400) on the way.
async fn settle_preview(browser: &Browser, wanted: &str) {
    browser.wait_for_text("#preview", wanted).await;
    let errors = browser.console_errors().await;
    assert!(
        errors.iter().all(|error| error.contains("/api/v1/schedule/preview")),
        "console errors: {errors:?}"
    );
}
