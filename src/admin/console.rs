//! The web console at `/`: server-rendered pages for people, on the same data and rules as the
//! operator API.
//!
//! Pages are minijinja templates compiled into the binary, with one stylesheet and one small
//! script (`console/assets/`), all served from memory: the console fetches nothing from anywhere
//! else. Reading happens here, through `storage`. Every change a page offers is made by its
//! script through the operator API (`/api/v1`) with the session cookie and the session's CSRF
//! token, so the role rules, validation and audit log of the API are the console's too, and a
//! refused change shows the API's message beside the field it names.
//!
//! Every page is in English or Simplified Chinese (`i18n.rs`): the request's language is set
//! for the whole request by a middleware, and [`render`] gives it to the templates.
//!
//! This module owns the session cookie's life: login (throttled, CSRF-protected by a
//! double-submit cookie), logout, and the redirect to the login page.

mod dag;
mod i18n;
mod job_form;
mod pages;
mod workflow_pages;

use std::sync::OnceLock;

use axum::Router;
use axum::extract::{Form, FromRequestParts, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_LANGUAGE, CONTENT_TYPE, LOCATION, RETRY_AFTER, SET_COOKIE, VARY,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::Environment;
use serde::Deserialize;

use self::i18n::Lang;
use super::accounts::{self, LoginError, SESSION_TTL_MS, cookie, new_secret, secret_hash};
use super::http::auth::{SESSION_COOKIE, source};
use super::{AppState, now_ms};
use crate::access::Principal;
use crate::access::constant_time_eq;

/// The cookie that pairs the login form with the browser that loaded it.
const LOGIN_CSRF_COOKIE: &str = "wasmjob_login";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::dashboard))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/new", get(pages::new_job))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/versions", get(pages::versions))
        .route("/workflows", get(workflow_pages::workflows))
        .route("/workflows/{id}", get(workflow_pages::workflow))
        .route("/workflow-runs/{id}", get(workflow_pages::workflow_run))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/executors", get(pages::executors))
        .route("/users", get(pages::users))
        .route("/audit", get(pages::audit))
        .route("/tokens", get(pages::tokens))
        .route("/assets/console.js", get(script))
        .route("/assets/console.css", get(stylesheet))
        .layer(middleware::from_fn(language))
}

tokio::task_local! {
    /// The language of the request being answered.
    static LANG: Lang;
}

/// Answers the request in its language: [`render`] and [`PageError`] read it from [`LANG`], so
/// no handler has to pass it along (an error page is rendered far from any request).
async fn language(request: Request, next: Next) -> Response {
    let lang = Lang::of_request(request.headers());
    let mut response = LANG.scope(lang, next.run(request)).await;
    let headers = response.headers_mut();
    headers.insert(CONTENT_LANGUAGE, HeaderValue::from_static(lang.tag()));
    headers.append(VARY, HeaderValue::from_static("accept-language, cookie"));
    response
}

/// The language of the request being answered (English outside one).
fn current_lang() -> Lang {
    LANG.try_with(|lang| *lang).unwrap_or(Lang::En)
}

/// The text of catalog `key` in the request's language.
fn text(key: &str) -> String {
    i18n::text(current_lang(), key)
}

/// The signed-in person a page is for; pages without one redirect to the login page.
pub struct Signed {
    /// Who.
    pub principal: Principal,
    /// The session's CSRF token, for the page's script and forms.
    pub csrf_token: String,
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, PageError> {
        let Some(token) = cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(PageError::SignIn);
        };
        let session = state.db.get_session(&secret_hash(token), now_ms()).await?;
        let session = session.ok_or(PageError::SignIn)?;
        Ok(Signed { principal: accounts::principal(&session.user), csrf_token: session.csrf_token })
    }
}

/// Why a page is not shown.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// No session: go to the login page.
    #[error("sign in first")]
    SignIn,
    /// The thing asked for does not exist: the catalog key of the message, and the id.
    #[error("{0} {1} not found")]
    NotFound(&'static str, i64),
    /// The role does not allow the page: the catalog key of the message.
    #[error("{0}")]
    Forbidden(&'static str),
    /// Our fault: logged, never shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<crate::storage::StorageError> for PageError {
    fn from(error: crate::storage::StorageError) -> PageError {
        PageError::Internal(error.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = match &self {
            PageError::SignIn => return Redirect::to("/login").into_response(),
            PageError::NotFound(..) => StatusCode::NOT_FOUND,
            PageError::Forbidden(_) => StatusCode::FORBIDDEN,
            PageError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "console page failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let message = match &self {
            PageError::SignIn => String::new(),
            PageError::NotFound(key, id) => text(key).replace("{id}", &id.to_string()),
            PageError::Forbidden(key) => text(key),
            PageError::Internal(_) => text("error.internal"),
        };
        let page = render("error.html", minijinja::context! { message, status => status.as_u16() });
        (status, page.unwrap_or_else(|_| Html(String::new()))).into_response()
    }
}

/// Renders template `name` with `context`, in the request's language.
pub fn render(name: &str, context: minijinja::Value) -> Result<Html<String>, PageError> {
    render_in(current_lang(), name, context)
}

/// Renders template `name` with `context` in `lang`: the templates' `t()` reads `lang`, and
/// the page carries the script's texts.
fn render_in(lang: Lang, name: &str, context: minijinja::Value) -> Result<Html<String>, PageError> {
    let template = templates().get_template(name).map_err(|error| anyhow::anyhow!("{error:#}"))?;
    let context = minijinja::context! {
        lang => lang.code(), lang_tag => lang.tag(),
        script_texts => minijinja::Value::from_safe_string(i18n::script_texts(lang)),
        ..context
    };
    let html =
        template.render(context).map_err(|error| anyhow::anyhow!("template {name}: {error:#}"))?;
    Ok(Html(html))
}

/// The templates, parsed once. They are compiled into the binary and a test renders each
/// page, so a template that does not parse never ships.
fn templates() -> &'static Environment<'static> {
    static TEMPLATES: OnceLock<Environment<'static>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let mut env = Environment::new();
        env.add_function("t", i18n::template_text);
        for (name, source) in pages::TEMPLATES {
            if let Err(error) = env.add_template(name, source) {
                tracing::error!(%error, "console template {name} does not parse");
            }
        }
        env
    })
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("console/assets/console.js"))
}

async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", include_str!("console/assets/console.css"))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

/// `Set-Cookie` for `name=value`, HttpOnly and SameSite=Strict, Secure when the request came
/// over TLS: to this admin, which serves TLS itself (`--tls-cert`), or to a proxy in front of
/// it, which says so in `X-Forwarded-Proto`.
fn set_cookie(
    state: &AppState,
    headers: &HeaderMap,
    name: &str,
    value: &str,
    path: &str,
    max_age_secs: i64,
) -> HeaderValue {
    let tls = state.config.network.serve_tls.is_some()
        || headers
            .get("x-forwarded-proto")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    let secure = if tls { "; Secure" } else { "" };
    let text = format!(
        "{name}={value}; Path={path}; Max-Age={max_age_secs}; HttpOnly; SameSite=Strict{secure}"
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

async fn login_form(
    State(state): State<AppState>,
    mut parts: Parts,
) -> Result<Response, PageError> {
    if Signed::from_request_parts(&mut parts, &state).await.is_ok() {
        return Ok(Redirect::to("/").into_response());
    }
    login_page(&state, &parts.headers, StatusCode::OK, "", None).await
}

/// Why a login was refused: the catalog key of the message, and for a lock its seconds.
type LoginRefusal = Option<(&'static str, i64)>;

async fn login_page(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    name: &str,
    refusal: LoginRefusal,
) -> Result<Response, PageError> {
    let csrf = new_secret("");
    let no_users = state.db.count_users().await? == 0;
    let (error, locked_secs) = refusal.unwrap_or(("", 0));
    // A refusal that asks the client to come back says when, to people and to programs alike.
    let retry_after_secs = (status == StatusCode::TOO_MANY_REQUESTS)
        .then(|| u64::try_from(locked_secs).unwrap_or(1).max(1));
    let page =
        render("login.html", minijinja::context! { csrf, name, error, locked_secs, no_users })?;
    let cookie = set_cookie(state, headers, LOGIN_CSRF_COOKIE, &csrf, "/login", 3600);
    let mut response = (status, [(SET_COOKIE, cookie)], page).into_response();
    if let Some(secs) = retry_after_secs {
        response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    name: String,
    password: String,
    csrf: String,
}

async fn login(
    State(state): State<AppState>,
    parts: Parts,
    Form(form): Form<LoginForm>,
) -> Result<Response, PageError> {
    let headers = &parts.headers;
    let expected = cookie(headers, LOGIN_CSRF_COOKIE).unwrap_or("");
    if expected.is_empty() || !constant_time_eq(form.csrf.as_bytes(), expected.as_bytes()) {
        let refusal = Some(("login.expired", 0));
        return login_page(&state, headers, StatusCode::FORBIDDEN, &form.name, refusal).await;
    }
    let name = form.name.trim();
    let checks = &state.password_checks;
    match accounts::login(&state.db, checks, name, &form.password, &source(&parts)).await {
        Ok(token) => {
            let max_age = SESSION_TTL_MS / 1000;
            let cookie = set_cookie(&state, headers, SESSION_COOKIE, &token, "/", max_age);
            let clear = set_cookie(&state, headers, LOGIN_CSRF_COOKIE, "", "/login", 0);
            let mut response = (StatusCode::SEE_OTHER, [(LOCATION, HeaderValue::from_static("/"))])
                .into_response();
            response.headers_mut().append(SET_COOKIE, cookie);
            response.headers_mut().append(SET_COOKIE, clear);
            Ok(response)
        }
        Err(LoginError::Internal(error)) => Err(PageError::Internal(error)),
        Err(LoginError::Locked { retry_after_ms }) => {
            let refusal = Some(("login.locked", (retry_after_ms + 999) / 1000));
            login_page(&state, headers, StatusCode::TOO_MANY_REQUESTS, name, refusal).await
        }
        Err(LoginError::Busy) => {
            let secs = i64::try_from(accounts::BUSY_RETRY_AFTER_SECS).unwrap_or(1);
            let refusal = Some(("login.busy", secs));
            login_page(&state, headers, StatusCode::TOO_MANY_REQUESTS, name, refusal).await
        }
        Err(LoginError::Refused) => {
            let refusal = Some(("login.refused", 0));
            login_page(&state, headers, StatusCode::UNAUTHORIZED, name, refusal).await
        }
    }
}

#[derive(Debug, Deserialize)]
struct LogoutForm {
    csrf: String,
}

async fn logout(
    State(state): State<AppState>,
    mut parts: Parts,
    Form(form): Form<LogoutForm>,
) -> Result<Response, PageError> {
    let signed = Signed::from_request_parts(&mut parts, &state).await?;
    if !constant_time_eq(form.csrf.as_bytes(), signed.csrf_token.as_bytes()) {
        return Err(PageError::Forbidden("error.logout_stale"));
    }
    if let Some(token) = cookie(&parts.headers, SESSION_COOKIE) {
        state.db.delete_session(&secret_hash(token)).await?;
    }
    let target = format!("user {}", signed.principal.name);
    accounts::audit(&state.db, &signed.principal, &source(&parts), "logout", target, None, None)
        .await;
    let clear = set_cookie(&state, &parts.headers, SESSION_COOKIE, "", "/", 0);
    Ok((
        StatusCode::SEE_OTHER,
        [(LOCATION, HeaderValue::from_static("/login")), (SET_COOKIE, clear)],
    )
        .into_response())
}
