//! The console through the router (no socket): every page in English and in Chinese, chosen by
//! `Accept-Language` or the `lang` cookie, and the runs list filtered by time, in the API and on
//! the runs page. `job_form.rs`: the job form against the API's job.

mod job_form;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wasmjob::admin::{AppState, router};
use wasmjob::storage::Db;

use crate::support::ADMIN_TOKEN;
use crate::support::runs::manual_run;

const PASSWORD: &str = "a long enough password";

struct Console {
    app: axum::Router,
    db: Db,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

impl Console {
    async fn start() -> Console {
        wasmjob::telemetry::init_for_test();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("console.db").display());
        let db = Db::connect(&url).await.unwrap();
        db.ensure_group("default", "Default", 0).await.unwrap();
        let config = crate::support::app::admin_config(url);
        let app = router(AppState::new(db.clone(), config).unwrap());
        Console { app, db, _dir: dir }
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Body) -> Reply {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self.app.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Reply { status, headers, text: String::from_utf8_lossy(&bytes).into_owned() }
    }

    /// The operator API with the operator token; the answer's status and JSON.
    async fn api(&self, method: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let mut headers = vec![("authorization", auth.as_str())];
        let body = if body.is_null() {
            Body::empty()
        } else {
            headers.push(("content-type", "application/json"));
            Body::from(body.to_string())
        };
        let reply = self.send(method, path, &headers, body).await;
        (reply.status, serde_json::from_str(&reply.text).unwrap_or(Value::Null))
    }

    /// Makes an admin and signs in with the login form; the session's cookie.
    async fn admin_session(&self) -> String {
        let user = json!({"name": "root", "password": PASSWORD, "role": "admin"});
        assert_eq!(self.api("POST", "/api/v1/users", user).await.0, StatusCode::CREATED);
        let form = self.send("GET", "/login", &[], Body::empty()).await;
        let login_cookie = format!("wasmjob_login={}", set_cookie(&form, "wasmjob_login"));
        let csrf = between(&form.text, "name=\"csrf\" value=\"", "\"");
        let body = format!("name=root&password={}&csrf={csrf}", PASSWORD.replace(' ', "+"));
        let headers = [
            ("cookie", login_cookie.as_str()),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        let reply = self.send("POST", "/login", &headers, Body::from(body)).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text);
        format!("wasmjob_session={}", set_cookie(&reply, "wasmjob_session"))
    }

    /// A page as a browser with these cookies and this `Accept-Language` gets it.
    async fn page(&self, path: &str, cookies: &str, accept_language: &str) -> Reply {
        let headers = [("cookie", cookies), ("accept-language", accept_language)];
        self.send("GET", path, &headers, Body::empty()).await
    }
}

fn set_cookie(reply: &Reply, name: &str) -> String {
    reply
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(|value| value.strip_prefix(&format!("{name}=")))
        .map(|rest| rest.split(';').next().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no {name} cookie set"))
}

fn between(text: &str, start: &str, end: &str) -> String {
    let from = text.find(start).unwrap_or_else(|| panic!("no `{start}` in {text}")) + start.len();
    text[from..].split(end).next().unwrap().to_owned()
}

/// The text a person reads on `html`: every text node but the script's catalog.
fn visible_text(html: &str) -> String {
    html.split('<')
        .filter(|segment| !segment.starts_with("script"))
        .filter_map(|segment| segment.split_once('>').map(|(_, text)| text))
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

#[tokio::test]
async fn every_page_speaks_english_or_chinese_as_the_browser_asks() {
    let console = Console::start().await;
    let session = console.admin_session().await;
    let job = json!({"group_id": 1, "name": "nightly", "schedule_type": "CRON", "schedule_conf": "0 0 3 * * ?"});
    assert_eq!(console.api("POST", "/api/v1/jobs", job).await.0, StatusCode::CREATED);
    let run = console.db.create_run(&manual_run(1, 1_700_000_000_000), 1).await.unwrap().unwrap();
    let workflow = json!({"group_id": 1, "name": "etl", "nodes": [{"name": "a", "job_id": 1}, {"name": "b", "job_id": 1}],
        "edges": [{"from": "a", "to": "b", "condition": "always"}]});
    assert_eq!(console.api("POST", "/api/v1/workflows", workflow).await.0, StatusCode::CREATED);
    assert_eq!(
        console.api("POST", "/api/v1/workflows/1/trigger", json!({})).await.0,
        StatusCode::CREATED
    );
    let pages = [
        "/".to_owned(),
        "/jobs".to_owned(),
        "/jobs/new".to_owned(),
        "/jobs/1".to_owned(),
        "/jobs/1/versions".to_owned(),
        "/runs".to_owned(),
        format!("/runs/{run}"),
        "/executors".to_owned(),
        "/users".to_owned(),
        "/audit".to_owned(),
        "/tokens".to_owned(),
        "/workflows".to_owned(),
        "/workflows/1".to_owned(),
        "/workflow-runs/1".to_owned(),
        "/jobs/99".to_owned(),
    ];
    // (cookies besides the session, Accept-Language) → the language expected.
    let browsers = [
        ("", "", "en"),
        ("", "en-US,en;q=0.9", "en"),
        ("", "zh-CN,zh;q=0.9,en;q=0.8", "zh-CN"),
        ("", "zh-Hans", "zh-CN"),
        ("; lang=zh", "en-US", "zh-CN"),
        ("; lang=en", "zh-CN", "en"),
    ];
    for path in pages.iter().map(String::as_str).chain(["/login"]) {
        for (extra_cookies, accept_language, lang) in browsers {
            let cookies = if path == "/login" {
                extra_cookies.trim_start_matches("; ").to_owned()
            } else {
                format!("{session}{extra_cookies}")
            };
            let page = console.page(path, &cookies, accept_language).await;
            let label = format!("{path} ({accept_language:?}, cookies {extra_cookies:?})");
            let expected = if path == "/jobs/99" { StatusCode::NOT_FOUND } else { StatusCode::OK };
            assert_eq!(page.status, expected, "{label}: {}", page.text);
            assert!(page.text.contains(&format!("<html lang=\"{lang}\">")), "{label}");
            assert_eq!(page.headers[header::CONTENT_LANGUAGE], lang, "{label}");
            let text = visible_text(&page.text);
            // Every placeholder was filled, and no key was left untranslated.
            for leftover in [
                "{id}",
                "{total}",
                "{name}",
                "{status}",
                "{time}",
                "nav.",
                "field.",
                "help.",
                "col.",
                "job_section.",
            ] {
                assert!(!text.contains(leftover), "{label} shows `{leftover}`:\n{text}");
            }
            if lang == "en" {
                // The language switch names Chinese in Chinese.
                let text = text.replace("中文", "");
                assert!(!text.chars().any(is_cjk), "{label} is not all English:\n{text}");
            } else {
                let wanted = match path {
                    "/login" => "登录",
                    "/jobs/99" => "任务 99 不存在",
                    _ => "任务管理",
                };
                assert!(text.contains(wanted), "{label} lacks `{wanted}`:\n{text}");
            }
        }
    }
}

#[tokio::test]
async fn runs_are_listed_between_two_times() {
    let console = Console::start().await;
    let job = json!({"group_id": 1, "name": "nightly", "schedule_type": "NONE"});
    assert_eq!(console.api("POST", "/api/v1/jobs", job).await.0, StatusCode::CREATED);
    // 2026-01-30T23:00Z, 2026-01-31T08:00Z, 2026-01-31T20:00Z, 2026-02-01T00:00Z.
    let day = 1_769_817_600_000; // 2026-01-31T00:00:00Z
    let hour = 3_600_000;
    for at in [day - hour, day + 8 * hour, day + 20 * hour, day + 24 * hour] {
        console.db.create_run(&manual_run(1, at), 1).await.unwrap().unwrap();
    }
    let console = &console;
    let listed = |query: &str| {
        let path = format!("/api/v1/logs?limit=100&{query}");
        async move {
            let (status, body) = console.api("GET", &path, Value::Null).await;
            if status != StatusCode::OK {
                return format!("{} {}: {}", status.as_u16(), body["code"], body["message"]);
            }
            let times: Vec<&str> = body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|run| run["trigger_time"].as_str().unwrap())
                .collect();
            format!("{} {}", body["total"], times.join(" "))
        }
    };
    let mut out = String::new();
    for query in [
        "",
        "from=2026-01-31",
        "to=2026-01-31",
        "from=2026-01-31&to=2026-01-31",
        "from=2026-01-31T08:00&to=2026-01-31T20:00:00",
        "from=2026-01-31T08:00:00.001Z",
        "from=2026-01-31T16:00:00%2B08:00",
        "from=&to=",
        "from=yesterday",
        "to=2026-02-30",
        "from=2026-02-01&to=2026-01-31",
    ] {
        out.push_str(&format!("{query:?}: {}\n", listed(query).await));
    }
    expect_test::expect![[r#"
        "": 4 2026-02-01T00:00:00.000Z 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z 2026-01-30T23:00:00.000Z
        "from=2026-01-31": 3 2026-02-01T00:00:00.000Z 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z
        "to=2026-01-31": 3 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z 2026-01-30T23:00:00.000Z
        "from=2026-01-31&to=2026-01-31": 2 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z
        "from=2026-01-31T08:00&to=2026-01-31T20:00:00": 2 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z
        "from=2026-01-31T08:00:00.001Z": 2 2026-02-01T00:00:00.000Z 2026-01-31T20:00:00.000Z
        "from=2026-01-31T16:00:00%2B08:00": 3 2026-02-01T00:00:00.000Z 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z
        "from=&to=": 4 2026-02-01T00:00:00.000Z 2026-01-31T20:00:00.000Z 2026-01-31T08:00:00.000Z 2026-01-30T23:00:00.000Z
        "from=yesterday": 400 "invalid_query": "from: `yesterday` is not a time: use a date (2026-01-31), a UTC date and time (2026-01-31T08:00:00) or an RFC 3339 instant (2026-01-31T08:00:00Z)"
        "to=2026-02-30": 400 "invalid_query": "to: `2026-02-30` is not a time: use a date (2026-01-31), a UTC date and time (2026-01-31T08:00:00) or an RFC 3339 instant (2026-01-31T08:00:00Z)"
        "from=2026-02-01&to=2026-01-31": 400 "invalid_query": "from: after to"
    "#]]
    .assert_eq(&out);

    // The runs page narrows the same way, and says so beside a field it cannot read.
    let session = console.admin_session().await;
    let page = console.page("/runs?from=2026-01-31&to=2026-01-31", &session, "en").await;
    assert!(visible_text(&page.text).contains("Runs: 2."), "{}", page.text);
    let page = console.page("/runs?from=yesterday", &session, "en").await;
    assert_eq!(page.status, StatusCode::OK);
    let error = between(&page.text, "id=\"f-from-error\" data-error-for=\"from\">", "<");
    assert!(error.starts_with("Not a time"), "{}", page.text);
    assert!(visible_text(&page.text).contains("Runs: 4."), "an unreadable bound narrows nothing");
}

/// A page of `/api/v1/logs` says whether another follows (`has_more`) and whether its `total`
/// stopped at the count's cap (`total_capped`), so a client pages without a count of the table.
#[tokio::test]
async fn run_pages_say_whether_another_follows() {
    let console = Console::start().await;
    let job = json!({"group_id": 1, "name": "paged", "schedule_type": "NONE"});
    assert_eq!(console.api("POST", "/api/v1/jobs", job).await.0, StatusCode::CREATED);
    for at in 1..=5 {
        console.db.create_run(&manual_run(1, at * 1_000), 1).await.unwrap().unwrap();
    }
    let mut out = String::new();
    for query in ["limit=2", "limit=2&offset=2", "limit=2&offset=4", "limit=5", "limit=9&offset=9"]
    {
        let (status, body) =
            console.api("GET", &format!("/api/v1/logs?{query}"), Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let ids: Vec<String> =
            body["items"].as_array().unwrap().iter().map(|run| run["id"].to_string()).collect();
        out.push_str(&format!(
            "{query}: total {} capped {} has_more {} ids [{}]\n",
            body["total"],
            body["total_capped"],
            body["has_more"],
            ids.join(" ")
        ));
    }
    expect_test::expect![[r#"
        limit=2: total 5 capped false has_more true ids [5 4]
        limit=2&offset=2: total 5 capped false has_more true ids [3 2]
        limit=2&offset=4: total 5 capped false has_more false ids [1]
        limit=5: total 5 capped false has_more false ids [5 4 3 2 1]
        limit=9&offset=9: total 5 capped false has_more false ids []
    "#]]
    .assert_eq(&out);
}
