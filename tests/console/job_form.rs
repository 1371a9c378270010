//! The job form through the router: it has every field of the API's job, in both languages;
//! its number inputs have the API's bounds; what the script sends for it, untouched, is the
//! API's defaults on the new-job page and changes nothing on a job's page; and a refusal names
//! a field the form shows it beside.
//!
//! The form is read from the rendered page and sent as `console.js` sends it (`formBody`): an
//! input's `data-type` says whether it goes as a string, a number, `null` when empty, or a list.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{Console, between, is_cjk};

/// The fields of `GET /api/v1/jobs/{id}` that a person does not set.
const READ_ONLY: [&str; 6] =
    ["id", "running", "next_fire_time", "active_version", "created_at", "updated_at"];

/// A job with every field away from its default, made through the API.
fn unusual_job(child_id: i64) -> Value {
    json!({
        "group_id": 1, "name": "unusual", "schedule_type": "FIX_RATE", "schedule_conf": "90",
        "time_zone": "Asia/Shanghai", "misfire_strategy": "FIRE_ONCE_NOW",
        "misfire_threshold_ms": 60_000, "route_strategy": "ROUND", "block_strategy": "DISCARD_LATER",
        "timeout_secs": 120, "retry_count": 3, "glue_type": "BEAN", "handler": "demoJobHandler",
        "param": "first line\nsecond <line> & \"quoted\"", "child_job_ids": [child_id],
        "alarm_email": "ops@example.com", "alarm_silence_secs": 0, "fuel_limit": 5_000_000,
        "memory_limit_mb": 64, "sharding_total_count": 3,
        "sharding_item_parameters": "0=Beijing,1=Shanghai,2=Guangzhou",
        "sharding_strategy": "ROTATE_SERVER_BY_NAME",
    })
}

#[tokio::test]
async fn the_job_form_has_every_field_of_the_api_in_both_languages() {
    let console = Console::start().await;
    let session = console.admin_session().await;
    let job = json!({"group_id": 1, "name": "nightly", "schedule_type": "NONE"});
    let (status, job) = console.api("POST", "/api/v1/jobs", job).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let api_fields: BTreeSet<String> = job
        .as_object()
        .unwrap()
        .keys()
        .filter(|key| !READ_ONLY.contains(&key.as_str()))
        .cloned()
        .collect();
    for path in ["/jobs/new", "/jobs/1"] {
        for lang in ["en", "zh-CN"] {
            let page = console.page(path, &session, lang).await;
            assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.text);
            let form = job_form_html(&page.text);
            let names: BTreeSet<String> =
                form_inputs(&page.text).into_iter().map(|input| input.name).collect();
            assert_eq!(names, api_fields, "{path} ({lang}): the form's fields against the API's");
            for name in &names {
                let label = between(&form, &format!("<label for=\"{name}\">"), "</label>");
                let help = between(&form, &format!("id=\"help-{name}\">"), "</p>");
                assert!(!label.trim().is_empty() && !help.trim().is_empty(), "{path} {name}");
                assert!(!help.contains("help."), "{path} ({lang}) {name}: {help}");
                assert_eq!(help.chars().any(is_cjk), lang == "zh-CN", "{path} ({lang}): {help}");
                let refusal = format!("data-error-for=\"{name}\"");
                assert!(form.contains(&refusal), "{path}: no place for a refusal of {name}");
            }
        }
    }
}

/// Each number input's `min` and `max` are the API's: the bounds are taken, one past them is
/// refused naming the field.
#[tokio::test]
async fn every_number_on_the_job_form_has_the_apis_bounds() {
    let console = Console::start().await;
    let session = console.admin_session().await;
    let page = console.page("/jobs/new", &session, "en").await;
    let mut out = String::new();
    for input in form_inputs(&page.text) {
        if input.attrs.get("type").map(String::as_str) != Some("number") {
            continue;
        }
        let name = input.name.as_str();
        let min: i64 = input.attrs["min"].parse().unwrap();
        let max: Option<i64> = input.attrs.get("max").map(|max| max.parse().unwrap());
        let mut tries = vec![min - 1, min];
        tries.extend(max.map_or(vec![i64::MAX], |max| vec![max, max + 1]));
        let mut answers = Vec::new();
        for value in tries {
            let mut job = json!({"group_id": 1, "name": "bounds", "schedule_type": "NONE"});
            job[name] = json!(value);
            let (status, body) = console.api("POST", "/api/v1/jobs", job).await;
            let answer = match status {
                StatusCode::CREATED => {
                    assert_eq!(body[name], value, "{name}");
                    "taken".to_owned()
                }
                _ => {
                    let message = body["message"].as_str().unwrap();
                    assert!(message.starts_with(&format!("{name}: ")), "{message}");
                    format!("refused ({})", status.as_u16())
                }
            };
            answers.push(format!("{value} {answer}"));
        }
        out.push_str(&format!(
            "{name} min={min} max={}: {}\n",
            max.map_or("-".to_owned(), |max| max.to_string()),
            answers.join(", ")
        ));
    }
    expect_test::expect![[r#"
        misfire_threshold_ms min=1000 max=86400000: 999 refused (400), 1000 taken, 86400000 taken, 86400001 refused (400)
        max_concurrent_runs min=0 max=10000: -1 refused (400), 0 taken, 10000 taken, 10001 refused (400)
        timeout_secs min=0 max=604800: -1 refused (400), 0 taken, 604800 taken, 604801 refused (400)
        fuel_limit min=1 max=-: 0 refused (400), 1 taken, 9223372036854775807 taken
        memory_limit_mb min=1 max=4096: 0 refused (400), 1 taken, 4096 taken, 4097 refused (400)
        retry_count min=0 max=100: -1 refused (400), 0 taken, 100 taken, 101 refused (400)
        retry_interval_secs min=0 max=86400: -1 refused (400), 0 taken, 86400 taken, 86401 refused (400)
        retry_max_interval_secs min=0 max=86400: -1 refused (400), 0 taken, 86400 taken, 86401 refused (400)
        sharding_total_count min=0 max=1000: -1 refused (400), 0 taken, 1000 taken, 1001 refused (400)
        alarm_silence_secs min=0 max=86400: -1 refused (400), 0 taken, 86400 taken, 86401 refused (400)
    "#]]
    .assert_eq(&out);
}

/// The new-job form as it opens, with a name and a schedule typed in, makes the job the API
/// makes of those alone; a job's page saved untouched leaves every field as it was.
#[tokio::test]
async fn the_job_form_sends_the_apis_defaults_and_saves_a_job_unchanged() {
    let console = Console::start().await;
    let session = console.admin_session().await;
    let typed = json!({"group_id": 1, "name": "typed", "schedule_type": "CRON", "schedule_conf": "0 0 3 * * ?"});
    let (status, by_api) = console.api("POST", "/api/v1/jobs", typed.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{by_api}");

    let page = console.page("/jobs/new", &session, "en").await;
    let mut body = script_body(&form_inputs(&page.text));
    for (name, value) in typed.as_object().unwrap() {
        body[name] = value.clone();
    }
    let (status, by_form) = console.session_api(&session, "POST", "/api/v1/jobs", body).await;
    assert_eq!(status, StatusCode::CREATED, "{by_form}");
    for (name, value) in by_api.as_object().unwrap() {
        if !["id", "created_at", "updated_at"].contains(&name.as_str()) {
            assert_eq!(&by_form[name], value, "{name}: the form's default against the API's");
        }
    }

    let (_, unusual) = console.api("POST", "/api/v1/jobs", unusual_job(1)).await;
    let id = unusual["id"].as_i64().unwrap();
    let page = console.page(&format!("/jobs/{id}"), &session, "zh-CN").await;
    let body = script_body(&form_inputs(&page.text));
    let path = format!("/api/v1/jobs/{id}");
    let (status, saved) = console.session_api(&session, "PUT", &path, body).await;
    assert_eq!(status, StatusCode::OK, "{saved}");
    for (name, value) in unusual.as_object().unwrap() {
        if name != "updated_at" {
            assert_eq!(&saved[name], value, "{name} changed by a save of the untouched page");
        }
    }
}

/// A refusal starts with the name of a field the form has a place for (or, for a schedule,
/// the script's place for schedules), and a refused value is a 4xx, never a 500.
#[tokio::test]
async fn a_refused_job_field_is_shown_beside_it() {
    let console = Console::start().await;
    let session = console.admin_session().await;
    let page = console.page("/jobs/new", &session, "en").await;
    let form = job_form_html(&page.text);
    let mut body = script_body(&form_inputs(&page.text));
    body["name"] = json!("refused");
    body["schedule_conf"] = json!("0 0 3 * * ?");
    let (_, other_group) =
        console.api("POST", "/api/v1/groups", json!({"app_name": "billing"})).await;
    let mut out = String::new();
    let other_group = other_group["id"].as_i64().unwrap();
    for change in [
        json!({"sharding_total_count": -1}),
        json!({"sharding_total_count": 1001}),
        json!({"sharding_total_count": 2, "route_strategy": "SHARDING_BROADCAST"}),
        json!({"sharding_item_parameters": "0=Beijing"}),
        json!({"sharding_total_count": 2, "sharding_item_parameters": "0=Beijing,5=Wuhan"}),
        json!({"sharding_total_count": 2, "sharding_item_parameters": "Beijing"}),
        json!({"sharding_strategy": "EVERYWHERE"}),
        json!({"misfire_threshold_ms": 10}),
        json!({"alarm_silence_secs": 86_401}),
        json!({"fuel_limit": 0}),
        json!({"memory_limit_mb": 8192}),
        json!({"timeout_secs": -5}),
        json!({"retry_count": 101}),
        json!({"child_job_ids": [99]}),
        json!({"handler": "../etc/passwd"}),
        json!({"glue_type": "BEAN", "handler": null}),
        json!({"time_zone": "Mars/Olympus_Mons"}),
        json!({"group_id": other_group + 1}),
        json!({"schedule_conf": "0 0 25 * * ?"}),
    ] {
        let mut body = body.clone();
        for (name, value) in change.as_object().unwrap() {
            body[name] = value.clone();
        }
        let (status, answer) = console.session_api(&session, "POST", "/api/v1/jobs", body).await;
        assert!(status.is_client_error(), "{change}: {status} {answer}");
        let message = answer["message"].as_str().unwrap();
        // Where the script puts it (`showError`).
        let field = message.split(':').next().unwrap().trim();
        let place = if form.contains(&format!("data-error-for=\"{field}\"")) {
            field
        } else if answer["code"] == "invalid_schedule" {
            "schedule_conf"
        } else {
            "(the form's top)"
        };
        out.push_str(&format!("{change} → {} beside {place}: {message}\n", status.as_u16()));
    }
    expect_test::expect![[r#"
        {"sharding_total_count":-1} → 400 beside sharding_total_count: sharding_total_count: 0 (not sharded) to 1000
        {"sharding_total_count":1001} → 400 beside sharding_total_count: sharding_total_count: 0 (not sharded) to 1000
        {"route_strategy":"SHARDING_BROADCAST","sharding_total_count":2} → 400 beside sharding_total_count: sharding_total_count: a job shards by items or by SHARDING_BROADCAST, not both
        {"sharding_item_parameters":"0=Beijing"} → 400 beside sharding_item_parameters: sharding_item_parameters: set sharding_total_count to shard the job
        {"sharding_item_parameters":"0=Beijing,5=Wuhan","sharding_total_count":2} → 400 beside sharding_item_parameters: sharding_item_parameters: item 5 is out of range: items run from 0 to 1
        {"sharding_item_parameters":"Beijing","sharding_total_count":2} → 400 beside sharding_item_parameters: sharding_item_parameters: `Beijing` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        {"sharding_strategy":"EVERYWHERE"} → 400 beside sharding_strategy: sharding_strategy: unknown ShardingStrategy `EVERYWHERE`, expected one of: AVERAGE_ALLOCATION, ODEVITY_SORT_BY_NAME, ROTATE_SERVER_BY_NAME, CONSISTENT_HASH
        {"misfire_threshold_ms":10} → 400 beside misfire_threshold_ms: misfire_threshold_ms: 1000 to 86400000 (one day)
        {"alarm_silence_secs":86401} → 400 beside alarm_silence_secs: alarm_silence_secs: 0 (alarm on every failure) to 86400 (one day)
        {"fuel_limit":0} → 400 beside fuel_limit: fuel_limit: must be positive
        {"memory_limit_mb":8192} → 400 beside memory_limit_mb: memory_limit_mb: 1 to 4096
        {"timeout_secs":-5} → 400 beside timeout_secs: timeout_secs: 0 (none) to 604800
        {"retry_count":101} → 400 beside retry_count: retry_count: 0 to 100
        {"child_job_ids":[99]} → 400 beside child_job_ids: child_job_ids: job 99 does not exist
        {"handler":"../etc/passwd"} → 400 beside handler: handler: a name of at most 255 letters, digits and `-_.:$@#`, not a path
        {"glue_type":"BEAN","handler":null} → 400 beside handler: handler: a BEAN job needs the handler's name
        {"time_zone":"Mars/Olympus_Mons"} → 400 beside schedule_conf: unknown time zone `Mars/Olympus_Mons`
        {"group_id":3} → 400 beside group_id: group_id: group 3 does not exist
        {"schedule_conf":"0 0 25 * * ?"} → 400 beside schedule_conf: invalid cron expression `0 0 25 * * ?`: hour field, at character 4: hour values must be from 0 to 23
    "#]]
    .assert_eq(&out);
}

impl Console {
    /// The operator API as the console's script calls it: the session's cookie and its CSRF
    /// token, which the page carries.
    async fn session_api(
        &self,
        session: &str,
        method: &str,
        path: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let page = self.page("/", session, "en").await;
        let csrf = between(&page.text, "name=\"csrf-token\" content=\"", "\"");
        let headers = [
            ("cookie", session),
            ("x-csrf-token", csrf.as_str()),
            ("content-type", "application/json"),
        ];
        let reply = self.send(method, path, &headers, Body::from(body.to_string())).await;
        (reply.status, serde_json::from_str(&reply.text).unwrap_or(Value::Null))
    }
}

/// An input, select or text area of the job form, as rendered.
struct FormInput {
    name: String,
    attrs: BTreeMap<String, String>,
    /// What the browser would hold: the value, the selected option or the text.
    value: String,
}

fn job_form_html(page: &str) -> String {
    between(page, "<form id=\"job-form\"", "</form>")
}

/// Every named input of the job form on `page`, in order.
fn form_inputs(page: &str) -> Vec<FormInput> {
    let form = job_form_html(page);
    let mut inputs = Vec::new();
    let mut rest = form.as_str();
    while let Some(at) = rest.find('<') {
        rest = &rest[at + 1..];
        let tag: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        if !["input", "select", "textarea"].contains(&tag.as_str()) {
            continue;
        }
        let (attrs, after) = attributes(&rest[tag.len()..]);
        let value = match tag.as_str() {
            "select" => {
                let options = after.split("</select>").next().unwrap();
                let options: Vec<(BTreeMap<String, String>, &str)> =
                    options.split("<option").skip(1).map(attributes).collect();
                let selected = options.iter().find(|(attrs, _)| attrs.contains_key("selected"));
                selected.or(options.first()).map(|(attrs, _)| attrs["value"].clone()).unwrap()
            }
            "textarea" => unescape(after.split("</textarea>").next().unwrap()),
            _ => attrs.get("value").cloned().unwrap_or_default(),
        };
        if let Some(name) = attrs.get("name") {
            inputs.push(FormInput { name: name.clone(), attrs: attrs.clone(), value });
        }
    }
    inputs
}

/// The attributes of a tag whose name was just read, and the text after its `>`.
fn attributes(text: &str) -> (BTreeMap<String, String>, &str) {
    let mut attrs = BTreeMap::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('>') {
            return (attrs, after);
        }
        let end = rest.find(|c: char| c == '=' || c == '>' || c.is_whitespace()).unwrap();
        let key = rest[..end].to_owned();
        rest = &rest[end..];
        if let Some(quoted) = rest.strip_prefix("=\"") {
            let close = quoted.find('"').unwrap();
            attrs.insert(key, unescape(&quoted[..close]));
            rest = &quoted[close + 1..];
        } else {
            attrs.insert(key, String::new());
        }
    }
}

/// The text of HTML-escaped `text`, for the escapes the templates produce.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#x2f;", "/")
        .replace("&amp;", "&")
}

/// The body `console.js` sends for `inputs` (its `formBody`).
fn script_body(inputs: &[FormInput]) -> Value {
    let mut body = json!({});
    for input in inputs {
        let value = input.value.as_str();
        let number = |text: &str| json!(text.trim().parse::<i64>().unwrap());
        body[&input.name] = match input.attrs.get("data-type").map(String::as_str) {
            Some("int") => number(if value.is_empty() { "0" } else { value }),
            Some("opt-int") if value.trim().is_empty() => Value::Null,
            Some("opt-int") => number(value),
            Some("opt") if value.trim().is_empty() => Value::Null,
            Some("ids") => {
                value.split(',').map(str::trim).filter(|id| !id.is_empty()).map(number).collect()
            }
            _ => json!(value),
        };
    }
    body
}
