//! Users, sessions and roles through the router (no socket): every operator API route with every
//! kind of caller, login and its throttle, logout, and which console pages each role gets.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use expect_test::expect;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wasmjob::admin::{AppState, PasswordChecks, now_ms, router};
use wasmjob::config::AdminConfig;
use wasmjob::storage::Db;

use crate::support::ADMIN_TOKEN;
use crate::support::app::{admin_config, backends};

const PASSWORD: &str = "a long enough password";

/// How a request authenticates.
#[derive(Clone, Default)]
struct Caller {
    bearer: Option<String>,
    cookie: Option<String>,
    csrf: Option<String>,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

struct Console {
    app: axum::Router,
    state: AppState,
    _dir: tempfile::TempDir,
}

impl Console {
    /// An admin on SQLite in a temp dir, with the groups `default` (1) and `other` (2).
    async fn start() -> Console {
        Console::start_with(|_| {}).await
    }

    /// As [`Console::start`], with the admin's configuration changed by `configure`.
    async fn start_with(configure: impl FnOnce(&mut AdminConfig)) -> Console {
        wasmjob::telemetry::init_for_test();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("access.db").display());
        let db = Db::connect(&url).await.unwrap();
        db.ensure_group("default", "Default", 0).await.unwrap();
        db.ensure_group("other", "Other", 0).await.unwrap();
        let mut config = crate::support::app::admin_config(url);
        configure(&mut config);
        let state = AppState::new(db, config).unwrap();
        let app = router(state.clone());
        Console { app, state, _dir: dir }
    }

    /// The same admin with a bound of `limit` password checks at once.
    fn with_password_checks(mut self, limit: usize) -> Console {
        self.state.password_checks = std::sync::Arc::new(PasswordChecks::new(limit));
        self.app = router(self.state.clone());
        self
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        caller: &Caller,
        body: Option<(&str, String)>,
    ) -> Reply {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = &caller.bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some(cookie) = &caller.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        if let Some(csrf) = &caller.csrf {
            request = request.header("x-csrf-token", csrf);
        }
        let body = match body {
            Some((content_type, body)) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                Body::from(body)
            }
            None => Body::empty(),
        };
        let response = self.app.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Reply { status, headers, text: String::from_utf8_lossy(&bytes).into_owned() }
    }

    /// Sends `body` as JSON, or a JSON string as the bytes of a component.
    async fn api(&self, method: &str, path: &str, caller: &Caller, body: Value) -> Reply {
        let body = match body {
            Value::Null => None,
            Value::String(bytes) => Some(("application/wasm", bytes)),
            body => Some(("application/json", body.to_string())),
        };
        self.send(method, path, caller, body).await
    }

    /// Creates a user with the operator token.
    async fn create_user(&self, name: &str, role: &str, group_ids: &[i64]) {
        let body =
            json!({"name": name, "password": PASSWORD, "role": role, "group_ids": group_ids});
        let reply = self.api("POST", "/api/v1/users", &operator_token(), body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }

    /// Posts the login form the way a browser does (its CSRF cookie and field); the reply.
    async fn try_login(&self, name: &str, password: &str) -> Reply {
        let form = self.send("GET", "/login", &Caller::default(), None).await;
        let login_cookie = set_cookie(&form, "wasmjob_login").expect("the form sets its cookie");
        let csrf = between(&form.text, "name=\"csrf\" value=\"", "\"");
        let body = format!("name={name}&password={}&csrf={csrf}", password.replace(' ', "+"));
        let caller =
            Caller { cookie: Some(format!("wasmjob_login={login_cookie}")), ..Caller::default() };
        self.send("POST", "/login", &caller, Some(("application/x-www-form-urlencoded", body)))
            .await
    }

    /// Signs in; the session cookie and the CSRF token its pages carry.
    async fn login(&self, name: &str) -> Caller {
        let reply = self.try_login(name, PASSWORD).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text);
        let cookie = format!("wasmjob_session={}", set_cookie(&reply, "wasmjob_session").unwrap());
        let session = Caller { cookie: Some(cookie), ..Caller::default() };
        let page = self.send("GET", "/", &session, None).await;
        let csrf = between(&page.text, "name=\"csrf-token\" content=\"", "\"");
        Caller { csrf: Some(csrf), ..session }
    }

    /// A personal API token of the signed-in `caller`.
    async fn api_token(&self, caller: &Caller) -> Caller {
        let reply = self.api("POST", "/api/v1/tokens", caller, json!({"name": "test"})).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        Caller {
            bearer: Some(reply.json()["token"].as_str().unwrap().to_owned()),
            ..Caller::default()
        }
    }
}

fn operator_token() -> Caller {
    Caller { bearer: Some(ADMIN_TOKEN.to_owned()), ..Caller::default() }
}

fn set_cookie(reply: &Reply, name: &str) -> Option<String> {
    reply
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(|value| {
            value
                .strip_prefix(&format!("{name}="))
                .map(|rest| rest.split(';').next().unwrap().to_owned())
        })
}

fn between(text: &str, start: &str, end: &str) -> String {
    let from = text.find(start).unwrap_or_else(|| panic!("no `{start}` in {text}")) + start.len();
    text[from..].split(end).next().unwrap().to_owned()
}

#[tokio::test]
async fn every_route_with_every_caller() {
    let console = Console::start().await;
    console.create_user("root", "admin", &[]).await;
    console.create_user("ops", "operator", &[1]).await;
    console.create_user("watcher", "viewer", &[]).await;
    let admin_session = console.login("root").await;
    let viewer_session = console.login("watcher").await;
    let job = |group: i64, name: &str| json!({"group_id": group, "name": name, "schedule_type": "CRON", "schedule_conf": "0 0 * * * ?"});
    let workflow = |group: i64, job: i64| json!({"name": "flow", "group_id": group, "nodes": [{"name": "only", "job_id": job}]});
    let alarm = |name: &str| json!({"name": name, "url": "https://hooks.example.com/wasmjob", "secret": "0123456789abcdef"});
    for (group, name) in [(1, "mine"), (2, "theirs")] {
        let reply = console.api("POST", "/api/v1/jobs", &operator_token(), job(group, name)).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    // Jobs 3 to 103 of group 1, to be children.
    for n in 3..=103 {
        let reply =
            console.api("POST", "/api/v1/jobs", &operator_token(), job(1, &format!("{n}"))).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let with_children = |mut body: Value, children: Vec<i64>| {
        body["child_job_ids"] = json!(children);
        body
    };
    // The callers, weakest first, so that what the stronger ones delete was there for the others.
    let callers = [
        ("nobody", Caller::default()),
        ("no-csrf", Caller { csrf: None, ..admin_session.clone() }),
        ("foreign-csrf", Caller { csrf: viewer_session.csrf.clone(), ..admin_session.clone() }),
        ("viewer", console.api_token(&viewer_session).await),
        ("operator", console.login("ops").await),
        ("admin", console.api_token(&admin_session).await),
        ("op-token", operator_token()),
    ];
    let routes: Vec<(&str, &str, Value)> = vec![
        ("GET", "/api/v1/jobs", Value::Null),
        ("POST", "/api/v1/jobs", job(1, "new")),
        ("POST", "/api/v1/jobs", job(2, "new")),
        ("GET", "/api/v1/jobs/1", Value::Null),
        ("PUT", "/api/v1/jobs/1", job(1, "mine")),
        ("PUT", "/api/v1/jobs/2", job(2, "theirs")),
        // A child runs when its parent succeeds: the caller must be allowed to trigger it.
        ("POST", "/api/v1/jobs", with_children(job(1, "new"), vec![2])),
        ("PUT", "/api/v1/jobs/1", with_children(job(1, "mine"), vec![2])),
        // Each child once, at most 100.
        ("PUT", "/api/v1/jobs/1", with_children(job(1, "mine"), vec![3, 3])),
        ("PUT", "/api/v1/jobs/1", with_children(job(1, "mine"), (3..=103).collect())),
        ("PUT", "/api/v1/jobs/1", with_children(job(1, "mine"), (3..=102).collect())),
        ("POST", "/api/v1/jobs/1/start", Value::Null),
        ("POST", "/api/v1/jobs/1/stop", Value::Null),
        ("POST", "/api/v1/jobs/2/stop", Value::Null),
        ("POST", "/api/v1/jobs/1/trigger", Value::Null),
        ("POST", "/api/v1/jobs/2/trigger", Value::Null),
        ("GET", "/api/v1/jobs/1/next-fire-times", Value::Null),
        ("GET", "/api/v1/jobs/1/versions", Value::Null),
        ("POST", "/api/v1/jobs/1/versions/1/activate", Value::Null),
        ("POST", "/api/v1/jobs/2/versions/1/activate", Value::Null),
        ("GET", "/api/v1/jobs/1/versions/1/source", Value::Null),
        ("GET", "/api/v1/jobs/1/versions/1/diff/2", Value::Null),
        ("GET", "/api/v1/logs", Value::Null),
        ("GET", "/api/v1/logs/1", Value::Null),
        ("GET", "/api/v1/logs/1/stream", Value::Null),
        ("POST", "/api/v1/logs/1/kill", Value::Null),
        ("POST", "/api/v1/jobs/1/versions", json!("not a component")),
        ("POST", "/api/v1/jobs/2/versions", json!("not a component")),
        // Moving job 1 to the other group: an operator of one group may not, the admin does.
        ("PUT", "/api/v1/jobs/1", job(2, "moved")),
        ("GET", "/api/v1/executors", Value::Null),
        ("GET", "/api/v1/admins", Value::Null),
        ("GET", "/metrics", Value::Null),
        ("GET", "/api/v1/groups", Value::Null),
        ("POST", "/api/v1/groups", json!({"app_name": "more"})),
        (
            "GET",
            "/api/v1/schedule/preview?schedule_type=CRON&schedule_conf=0+0+*+*+*+%3F",
            Value::Null,
        ),
        ("GET", "/api/v1/users", Value::Null),
        ("POST", "/api/v1/users", json!({"name": "new", "password": PASSWORD, "role": "viewer"})),
        ("DELETE", "/api/v1/users/99", Value::Null),
        ("GET", "/api/v1/audit", Value::Null),
        ("GET", "/api/v1/alarms", Value::Null),
        ("POST", "/api/v1/alarms", alarm("pager")),
        ("GET", "/api/v1/alarms/1", Value::Null),
        ("PUT", "/api/v1/alarms/1", alarm("pager")),
        ("GET", "/api/v1/alarms/deliveries", Value::Null),
        ("DELETE", "/api/v1/alarms/99", Value::Null),
        ("GET", "/api/v1/calendars", Value::Null),
        ("POST", "/api/v1/calendars", json!({"name": "holidays", "weekdays": ["SUN"]})),
        ("GET", "/api/v1/calendars/holidays", Value::Null),
        ("PUT", "/api/v1/calendars/holidays", json!({"weekdays": ["SAT"]})),
        ("POST", "/api/v1/calendars/holidays/ics", json!("not a calendar")),
        ("DELETE", "/api/v1/calendars/99", Value::Null),
        ("GET", "/api/v1/report?from=2026-11-01&to=2026-11-07", Value::Null),
        ("GET", "/api/v1/dashboard", Value::Null),
        ("GET", "/api/v1/workflows", Value::Null),
        // Workflows 1 to 3 of group 1 (with job 3), then 4 and 5 of group 2.
        ("POST", "/api/v1/workflows", workflow(1, 3)),
        ("POST", "/api/v1/workflows", workflow(2, 2)),
        ("GET", "/api/v1/workflows/1", Value::Null),
        ("PUT", "/api/v1/workflows/1", workflow(1, 3)),
        ("PUT", "/api/v1/workflows/1", workflow(1, 2)),
        ("POST", "/api/v1/workflows/1/trigger", Value::Null),
        ("POST", "/api/v1/workflows/4/trigger", Value::Null),
        ("POST", "/api/v1/workflows/1/start", Value::Null),
        ("POST", "/api/v1/workflows/4/stop", Value::Null),
        ("GET", "/api/v1/workflows/1/runs", Value::Null),
        ("GET", "/api/v1/workflow-runs/1", Value::Null),
        ("POST", "/api/v1/workflow-runs/1/nodes/only/retry", Value::Null),
        ("POST", "/api/v1/workflow-runs/1/kill", Value::Null),
        ("DELETE", "/api/v1/workflows/99", Value::Null),
        ("GET", "/api/v1/openapi.json", Value::Null),
        ("GET", "/api/v1/tokens", Value::Null),
        ("DELETE", "/api/v1/tokens/99", Value::Null),
        ("DELETE", "/api/v1/jobs/2", Value::Null),
        ("DELETE", "/api/v1/jobs/1", Value::Null),
    ];
    let mut table = format!(
        "{:<48}{}\n",
        "",
        callers.iter().map(|(name, _)| format!("{name:>13}")).collect::<String>()
    );
    for (method, path, body) in &routes {
        let mut line = format!("{:<48}", format!("{method} {}", path.split('?').next().unwrap()));
        for (_, caller) in &callers {
            let reply = console.api(method, path, caller, body.clone()).await;
            let code = reply.json()["code"].as_str().map(str::to_owned).unwrap_or_default();
            let cell = match reply.status.as_u16() {
                status @ (401 | 403) => format!("{status} {}", &code[..code.len().min(8)]),
                status => status.to_string(),
            };
            line.push_str(&format!("{cell:>13}"));
        }
        table.push_str(line.trim_end());
        table.push('\n');
    }
    expect![[r#"
                                                               nobody      no-csrf foreign-csrf       viewer     operator        admin     op-token
        GET /api/v1/jobs                                 401 unauthor          200          200          200          200          200          200
        POST /api/v1/jobs                                401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          201          201          201
        POST /api/v1/jobs                                401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          201
        GET /api/v1/jobs/1                               401 unauthor          200          200          200          200          200          200
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        PUT /api/v1/jobs/2                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        POST /api/v1/jobs                                401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          201
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          400          400          400
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          400          400          400
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        POST /api/v1/jobs/1/start                        401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        POST /api/v1/jobs/1/stop                         401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        POST /api/v1/jobs/2/stop                         401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        POST /api/v1/jobs/1/trigger                      401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          409          409          409
        POST /api/v1/jobs/2/trigger                      401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          409          409
        GET /api/v1/jobs/1/next-fire-times               401 unauthor          200          200          200          200          200          200
        GET /api/v1/jobs/1/versions                      401 unauthor          200          200          200          200          200          200
        POST /api/v1/jobs/1/versions/1/activate          401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          404          404          404
        POST /api/v1/jobs/2/versions/1/activate          401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          404          404
        GET /api/v1/jobs/1/versions/1/source             401 unauthor          404          404          404          404          404          404
        GET /api/v1/jobs/1/versions/1/diff/2             401 unauthor          404          404          404          404          404          404
        GET /api/v1/logs                                 401 unauthor          200          200          200          200          200          200
        GET /api/v1/logs/1                               401 unauthor          404          404          404          404          404          404
        GET /api/v1/logs/1/stream                        401 unauthor          404          404          404          404          404          404
        POST /api/v1/logs/1/kill                         401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          404          404          404
        POST /api/v1/jobs/1/versions                     401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          422          422          422
        POST /api/v1/jobs/2/versions                     401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          422          422
        PUT /api/v1/jobs/1                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        GET /api/v1/executors                            401 unauthor          200          200          200          200          200          200
        GET /api/v1/admins                               401 unauthor          200          200          200          200          200          200
        GET /metrics                                     401 unauthor          200          200          200          200          200          200
        GET /api/v1/groups                               401 unauthor          200          200          200          200          200          200
        POST /api/v1/groups                              401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          409
        GET /api/v1/schedule/preview                     401 unauthor          200          200          200          200          200          200
        GET /api/v1/users                                401 unauthor          200          200 403 forbidde 403 forbidde          200          200
        POST /api/v1/users                               401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          409
        DELETE /api/v1/users/99                          401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          404          404
        GET /api/v1/audit                                401 unauthor          200          200 403 forbidde 403 forbidde          200          200
        GET /api/v1/alarms                               401 unauthor          200          200 403 forbidde 403 forbidde          200          200
        POST /api/v1/alarms                              401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          409
        GET /api/v1/alarms/1                             401 unauthor          200          200 403 forbidde 403 forbidde          200          200
        PUT /api/v1/alarms/1                             401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        GET /api/v1/alarms/deliveries                    401 unauthor          200          200 403 forbidde 403 forbidde          200          200
        DELETE /api/v1/alarms/99                         401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          404          404
        GET /api/v1/calendars                            401 unauthor          200          200          200          200          200          200
        POST /api/v1/calendars                           401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          409
        GET /api/v1/calendars/holidays                   401 unauthor          200          200          200          200          200          200
        PUT /api/v1/calendars/holidays                   401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        POST /api/v1/calendars/holidays/ics              401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          422          422
        DELETE /api/v1/calendars/99                      401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          404          404
        GET /api/v1/report                               401 unauthor          200          200          200          200          200          200
        GET /api/v1/dashboard                            401 unauthor          200          200          200          200          200          200
        GET /api/v1/workflows                            401 unauthor          200          200          200          200          200          200
        POST /api/v1/workflows                           401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          201          201          201
        POST /api/v1/workflows                           401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          201
        GET /api/v1/workflows/1                          401 unauthor          200          200          200          200          200          200
        PUT /api/v1/workflows/1                          401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        PUT /api/v1/workflows/1                          401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          400          400          400
        POST /api/v1/workflows/1/trigger                 401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          201          201          201
        POST /api/v1/workflows/4/trigger                 401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          201          201
        POST /api/v1/workflows/1/start                   401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          409          409          409
        POST /api/v1/workflows/4/stop                    401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          200          200
        GET /api/v1/workflows/1/runs                     401 unauthor          200          200          200          200          200          200
        GET /api/v1/workflow-runs/1                      401 unauthor          200          200          200          200          200          200
        POST /api/v1/workflow-runs/1/nodes/only/retry    401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          200          200          200
        POST /api/v1/workflow-runs/1/kill                401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          409          409          409
        DELETE /api/v1/workflows/99                      401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde          404          404          404
        GET /api/v1/openapi.json                         401 unauthor          200          200          200          200          200          200
        GET /api/v1/tokens                               401 unauthor          200          200          200          200          200          400
        DELETE /api/v1/tokens/99                         401 unauthor 403 csrf_fai 403 csrf_fai          404          404          404          400
        DELETE /api/v1/jobs/2                            401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          204          404
        DELETE /api/v1/jobs/1                            401 unauthor 403 csrf_fai 403 csrf_fai 403 forbidde 403 forbidde          204          404
    "#]].assert_eq(&table);
}

#[tokio::test]
async fn logins_are_throttled_recorded_and_end_with_logout() {
    let console = Console::start().await;
    console.create_user("root", "admin", &[]).await;

    // An unknown name and a wrong password get the same answer.
    let unknown = console.try_login("nobody", PASSWORD).await;
    let wrong = console.try_login("root", "not the password").await;
    assert_eq!(
        (unknown.status, wrong.status),
        (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED)
    );
    assert!(unknown.text.contains("wrong user name or password"));
    assert!(wrong.text.contains("wrong user name or password"));

    // A form without its cookie is refused before the password is looked at.
    let caller = Caller::default();
    let body = format!("name=root&password={}&csrf=forged", PASSWORD.replace(' ', "+"));
    let forged = console
        .send("POST", "/login", &caller, Some(("application/x-www-form-urlencoded", body)))
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    // Five failures in a row lock the account: even the right password waits.
    for _ in 0..4 {
        assert_eq!(
            console.try_login("root", "still wrong!").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    let locked = console.try_login("root", PASSWORD).await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS, "{}", locked.text);
    assert!(locked.text.contains("too many failed logins"));

    let audit =
        console.api("GET", "/api/v1/audit?action=login", &operator_token(), Value::Null).await;
    let actions: Vec<String> = audit.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            format!("{} {}", item["action"].as_str().unwrap(), item["actor"].as_str().unwrap())
        })
        .collect();
    assert_eq!(actions.first().map(String::as_str), Some("login.locked root"));
    assert_eq!(actions.iter().filter(|a| *a == "login.failed root").count(), 5);
    assert!(actions.contains(&"login.failed nobody".to_owned()));
}

#[tokio::test]
async fn logout_ends_the_session_and_changes_are_audited() {
    let console = Console::start().await;
    console.create_user("root", "admin", &[]).await;
    let session = console.login("root").await;
    let created = console
        .api(
            "POST",
            "/api/v1/jobs",
            &session,
            json!({"group_id": 1, "name": "a", "schedule_type": "NONE"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let update = json!({"group_id": 1, "name": "b", "schedule_type": "NONE"});
    assert_eq!(console.api("PUT", "/api/v1/jobs/1", &session, update).await.status, StatusCode::OK);

    let cron = json!({"group_id": 1, "name": "b", "schedule_type": "CRON", "schedule_conf": "0 0 3 * * ?"});
    assert_eq!(console.api("PUT", "/api/v1/jobs/1", &session, cron).await.status, StatusCode::OK);
    let started = console.api("POST", "/api/v1/jobs/1/start", &session, Value::Null).await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.text);
    let audit = console.api("GET", "/api/v1/audit?action=job.", &session, Value::Null).await.json();
    let start = &audit["items"][0];
    assert_eq!(start["action"], "job.start");
    assert_eq!(
        (&start["before"]["running"], &start["after"]["running"]),
        (&json!(false), &json!(true))
    );
    let change = &audit["items"][2];
    assert_eq!(
        (change["action"].as_str(), change["actor"].as_str()),
        (Some("job.update"), Some("root"))
    );
    assert_eq!(
        (change["before"]["name"].as_str(), change["after"]["name"].as_str()),
        (Some("a"), Some("b"))
    );
    assert_eq!(audit["items"][3]["action"], "job.create");

    // Logging out needs the page's token, and then the cookie opens nothing.
    let form = |csrf: &str| Some(("application/x-www-form-urlencoded", format!("csrf={csrf}")));
    let refused = console.send("POST", "/logout", &session, form("forged")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let out =
        console.send("POST", "/logout", &session, form(session.csrf.as_deref().unwrap())).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(set_cookie(&out, "wasmjob_session").as_deref(), Some(""));
    let after = console.api("GET", "/api/v1/jobs", &session, Value::Null).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    let page = console.send("GET", "/jobs", &session, None).await;
    assert_eq!(
        (page.status, page.headers.get("location").unwrap().to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/login")
    );
}

#[tokio::test]
async fn console_pages_by_role() {
    let console = Console::start().await;
    // Before any user exists, the login page says how to make the first one.
    let login = console.send("GET", "/login", &Caller::default(), None).await;
    assert!(login.text.contains("wasmjob user create --admin"), "{}", login.text);
    let cookie = set_cookie(&login, "wasmjob_login").unwrap();
    assert!(
        login
            .headers
            .get(header::SET_COOKIE)
            .unwrap()
            .to_str()
            .unwrap()
            .contains("HttpOnly; SameSite=Strict")
    );
    assert!(!cookie.is_empty());

    console.create_user("root", "admin", &[]).await;
    console.create_user("watcher", "viewer", &[]).await;
    let job = json!({"group_id": 1, "name": "nightly <b>", "schedule_type": "CRON", "schedule_conf": "0 0 3 * * ?"});
    assert_eq!(
        console.api("POST", "/api/v1/jobs", &operator_token(), job).await.status,
        StatusCode::CREATED
    );
    let pages = [
        "/",
        "/jobs",
        "/jobs?name=night&state=stopped&group_id=1",
        "/jobs/new",
        "/jobs/1",
        "/runs",
        "/runs?state=failed&job_id=1",
        "/executors",
        "/users",
        "/audit",
        "/tokens",
        "/jobs/99",
        "/runs/99",
    ];
    let mut table = String::new();
    for name in ["nobody", "root", "watcher"] {
        let caller = if name == "nobody" { Caller::default() } else { console.login(name).await };
        let statuses: Vec<String> = {
            let mut out = Vec::new();
            for page in pages {
                out.push(
                    console.send("GET", page, &caller, None).await.status.as_u16().to_string(),
                );
            }
            out
        };
        table.push_str(&format!("{name}: {}\n", statuses.join(" ")));
    }
    expect![[r#"
        nobody: 303 303 303 303 303 303 303 303 303 303 303 303 303
        root: 200 200 200 200 200 200 200 200 200 200 200 404 404
        watcher: 200 200 200 403 200 200 200 200 403 403 200 404 404
    "#]]
    .assert_eq(&table);

    // Text from the database is escaped.
    let root = console.login("root").await;
    let jobs = console.send("GET", "/jobs", &root, None).await;
    assert!(jobs.text.contains("nightly &lt;b&gt;") && !jobs.text.contains("nightly <b>"));
    let script = console.send("GET", "/assets/console.js", &Caller::default(), None).await;
    assert_eq!(script.headers.get(header::CONTENT_TYPE).unwrap(), "text/javascript; charset=utf-8");
}

/// Runs `wasmjob user create ARGS` on `database_url` with `password` on stdin: success, and
/// what it printed on stderr.
fn user_create(database_url: &str, args: &[&str], password: &str) -> (bool, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
        .args(["user", "create"])
        .args(args)
        .args(["--database-url", database_url])
        .env_remove("WASMJOB_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let output = child.wait_with_output().unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test]
async fn users_are_made_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("cli.db").display());
    let db = Db::connect(&url).await.unwrap();
    db.ensure_group("default", "Default", 0).await.unwrap();

    let refusals = [
        (vec!["--admin", "--name", "alice"], "short", "password: 10 to 1024 characters"),
        (vec!["--admin", "--viewer", "--name", "alice"], PASSWORD, "cannot be used with"),
        (vec!["--name", "alice"], PASSWORD, "required"),
        (vec!["--operator", "nosuch", "--name", "bob"], PASSWORD, "there is no group `nosuch`"),
        (vec!["--viewer", "--name", "no spaces"], PASSWORD, "--name `no spaces`"),
    ];
    for (args, password, reason) in refusals {
        let (ok, stderr) = user_create(&url, &args, password);
        assert!(!ok && stderr.contains(reason), "{args:?}: {stderr}");
    }
    assert_eq!(db.count_users().await.unwrap(), 0, "a refusal makes no user");

    assert!(user_create(&url, &["--admin", "--name", "alice"], PASSWORD).0);
    assert!(user_create(&url, &["--operator", "default", "--name", "bob"], PASSWORD).0);
    let (ok, stderr) = user_create(&url, &["--viewer", "--name", "alice"], PASSWORD);
    assert!(!ok && stderr.contains("exists already"), "{stderr}");
    let alice = db.get_user_by_name("alice").await.unwrap().unwrap();
    let bob = db.get_user_by_name("bob").await.unwrap().unwrap();
    assert_eq!(
        (alice.role.as_str(), bob.role.as_str(), bob.group_ids),
        ("admin", "operator", vec![1])
    );
    assert!(alice.password_hash.starts_with("$argon2id$"), "{}", alice.password_hash);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_wrong_logins_lock_briefly_and_check_within_the_bound() {
    // A bound above this machine's cores, so that more guesses than the lock's threshold are
    // checked at once.
    let console = Console::start().await.with_password_checks(8);
    console.create_user("root", "admin", &[]).await;
    let checks = &console.state.password_checks;

    // 25 wrong guesses at once: each is checked, refused as a locked account, or refused at
    // once for too many checks running; none waits in a queue.
    let guesses = (0..25).map(|_| console.try_login("root", "not the password"));
    let replies = futures_util::future::join_all(guesses).await;
    for reply in &replies {
        match reply.status {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                let retry_after = reply.headers.get(header::RETRY_AFTER).expect("Retry-After");
                assert!(retry_after.to_str().unwrap().parse::<u64>().unwrap() >= 1);
            }
            other => panic!("{other}: {}", reply.text),
        }
    }
    assert!(replies.iter().any(|reply| reply.status == StatusCode::UNAUTHORIZED));
    assert!(
        (1..=checks.limit()).contains(&checks.high_water()),
        "{} password checks ran at once, over the bound of {}",
        checks.high_water(),
        checks.limit()
    );

    // Counted before each check, in the statement that decides the lock: the fifth failure
    // locks for 30 s and the guesses after it are not counted, so the lock stays short.
    let user = console.state.db.get_user_by_name("root").await.unwrap().unwrap();
    let locked_for_ms = user.locked_until_ms - now_ms();
    let refused = |status| replies.iter().filter(|reply| reply.status == status).count();
    eprintln!(
        "25 wrong logins: {} checked and refused, {} refused unchecked (locked or busy), \
         at most {} checks at once (bound {}), {} failures counted, locked for {locked_for_ms} ms",
        refused(StatusCode::UNAUTHORIZED),
        refused(StatusCode::TOO_MANY_REQUESTS),
        checks.high_water(),
        checks.limit(),
        user.failed_logins,
    );
    assert!(locked_for_ms <= 60_000, "locked for {locked_for_ms} ms by 25 guesses");

    // While locked, even the right password waits; once the lock ends, it opens a session.
    if locked_for_ms > 0 {
        let locked = console.try_login("root", PASSWORD).await;
        assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS, "{}", locked.text);
        assert!(locked.headers.contains_key(header::RETRY_AFTER));
        let wait = u64::try_from(locked_for_ms).unwrap() + 100;
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    }
    let reply = console.try_login("root", PASSWORD).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text);
    let user = console.state.db.get_user_by_name("root").await.unwrap().unwrap();
    assert_eq!((user.failed_logins, user.locked_until_ms), (0, 0));
}

#[tokio::test]
async fn session_cookies_are_secure_when_the_admin_serves_tls() {
    let mut table = String::new();
    for tls in [false, true] {
        let console = Console::start_with(|config| {
            if tls {
                config.network.serve_tls = Some(("cert.pem".into(), "key.pem".into()));
            }
        })
        .await;
        console.create_user("root", "admin", &[]).await;
        let reply = console.try_login("root", PASSWORD).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text);
        let form = console.send("GET", "/login", &Caller::default(), None).await;
        for (name, reply) in [("wasmjob_session", &reply), ("wasmjob_login", &form)] {
            let cookie = reply
                .headers
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|value| value.to_str().unwrap())
                .find(|value| value.starts_with(&format!("{name}=")))
                .unwrap();
            let secure = cookie.split("; ").any(|attribute| attribute == "Secure");
            table.push_str(&format!("tls {tls}: {name} secure {secure}\n"));
        }
    }
    expect![[r#"
        tls false: wasmjob_session secure false
        tls false: wasmjob_login secure false
        tls true: wasmjob_session secure true
        tls true: wasmjob_login secure true
    "#]]
    .assert_eq(&table);
}

/// `PUT /jobs/A` with child B and `PUT /jobs/B` with child A, at once, many times: each alone
/// is fine, together they would make two jobs trigger each other without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_updates_cannot_close_a_child_cycle() {
    for backend in backends() {
        wasmjob::telemetry::init_for_test();
        let dir = tempfile::tempdir().unwrap();
        let server = crate::support::server_database(backend, "cycle").await;
        let url = server
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", dir.path().join("cycle.db").display()));
        let db = Db::connect(&url).await.unwrap();
        db.ensure_group("default", "Default", 0).await.unwrap();
        let app = router(AppState::new(db.clone(), admin_config(url)).unwrap());
        let send = |method: &str, path: String, body: Value| {
            let request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header(header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            // Each on a task of its own, so that two run on two threads at once.
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(request).await.unwrap().status() })
        };
        let put = |id: i64, children: Vec<i64>| {
            let body = json!({"group_id": 1, "name": format!("job {id}"), "schedule_type": "NONE", "child_job_ids": children});
            send("PUT", format!("/api/v1/jobs/{id}"), body)
        };
        for name in ["a", "b"] {
            let spec = json!({"group_id": 1, "name": name, "schedule_type": "NONE"});
            let created = send("POST", "/api/v1/jobs".to_owned(), spec).await.unwrap();
            assert_eq!(created, StatusCode::CREATED);
        }
        for round in 0..50 {
            assert_eq!(put(1, vec![]).await.unwrap(), StatusCode::OK);
            assert_eq!(put(2, vec![]).await.unwrap(), StatusCode::OK);
            let (one, two) = (put(1, vec![2]), put(2, vec![1]));
            let statuses = [one.await.unwrap(), two.await.unwrap()];
            let children = |id| {
                let db = db.clone();
                async move { db.get_job(id).await.unwrap().unwrap().spec.child_job_ids }
            };
            let graph = (children(1).await, children(2).await);
            assert!(
                graph.0.is_empty() || graph.1.is_empty(),
                "{backend:?} round {round}: {statuses:?} left the cycle {graph:?}"
            );
            assert!(statuses.contains(&StatusCode::OK), "{backend:?} round {round}: {statuses:?}");
        }
        db.close().await;
        if let Some(url) = server {
            crate::support::drop_database(&url).await;
        }
    }
}
