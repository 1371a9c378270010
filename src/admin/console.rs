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
//! This module owns the session cookie's life: login (throttled, CSRF-protected by a
//! double-submit cookie), logout, and the redirect to the login page.

mod pages;

use std::sync::OnceLock;

use axum::Router;
use axum::extract::{Form, FromRequestParts, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::Environment;
use serde::Deserialize;

use super::accounts::{self, LoginError, SESSION_TTL_MS, cookie, new_secret, secret_hash};
use super::http::auth::{SESSION_COOKIE, source};
use super::{AppState, now_ms};
use crate::access::Principal;
use crate::protocol::constant_time_eq;

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
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/executors", get(pages::executors))
        .route("/users", get(pages::users))
        .route("/audit", get(pages::audit))
        .route("/tokens", get(pages::tokens))
        .route("/assets/console.js", get(script))
        .route("/assets/console.css", get(stylesheet))
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
    /// The thing asked for does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The role does not allow the page.
    #[error("{0}")]
    Forbidden(String),
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
            PageError::NotFound(_) => StatusCode::NOT_FOUND,
            PageError::Forbidden(_) => StatusCode::FORBIDDEN,
            PageError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "console page failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let message = match &self {
            PageError::Internal(_) => {
                "Something went wrong on our side; it has been logged.".to_owned()
            }
            other => other.to_string(),
        };
        let page = render("error.html", minijinja::context! { message, status => status.as_u16() });
        (status, page.unwrap_or_else(|_| Html(String::new()))).into_response()
    }
}

/// Renders template `name` with `context`.
pub fn render(name: &str, context: minijinja::Value) -> Result<Html<String>, PageError> {
    let template = templates().get_template(name).map_err(|error| anyhow::anyhow!("{error:#}"))?;
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
/// over TLS (to a proxy in front of us, which says so in `X-Forwarded-Proto`).
fn set_cookie(
    headers: &HeaderMap,
    name: &str,
    value: &str,
    path: &str,
    max_age_secs: i64,
) -> HeaderValue {
    let tls = headers
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
    login_page(&state, &parts.headers, StatusCode::OK, "", "").await
}

async fn login_page(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    name: &str,
    error: &str,
) -> Result<Response, PageError> {
    let csrf = new_secret("");
    let no_users = state.db.count_users().await? == 0;
    let page = render("login.html", minijinja::context! { csrf, name, error, no_users })?;
    let cookie = set_cookie(headers, LOGIN_CSRF_COOKIE, &csrf, "/login", 3600);
    Ok((status, [(SET_COOKIE, cookie)], page).into_response())
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
        let error = "The login form expired: please sign in again.";
        return login_page(&state, headers, StatusCode::FORBIDDEN, &form.name, error).await;
    }
    let name = form.name.trim();
    match accounts::login(&state.db, name, &form.password, &source(&parts)).await {
        Ok(token) => {
            let cookie = set_cookie(headers, SESSION_COOKIE, &token, "/", SESSION_TTL_MS / 1000);
            let clear = set_cookie(headers, LOGIN_CSRF_COOKIE, "", "/login", 0);
            let mut response = (StatusCode::SEE_OTHER, [(LOCATION, HeaderValue::from_static("/"))])
                .into_response();
            response.headers_mut().append(SET_COOKIE, cookie);
            response.headers_mut().append(SET_COOKIE, clear);
            Ok(response)
        }
        Err(LoginError::Internal(error)) => Err(PageError::Internal(error)),
        Err(error @ LoginError::Locked { .. }) => {
            login_page(&state, headers, StatusCode::TOO_MANY_REQUESTS, name, &error.to_string())
                .await
        }
        Err(error @ LoginError::Refused) => {
            login_page(&state, headers, StatusCode::UNAUTHORIZED, name, &error.to_string()).await
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
        return Err(PageError::Forbidden(
            "The page was out of date: sign out again from a fresh page.".to_owned(),
        ));
    }
    if let Some(token) = cookie(&parts.headers, SESSION_COOKIE) {
        state.db.delete_session(&secret_hash(token)).await?;
    }
    let target = format!("user {}", signed.principal.name);
    accounts::audit(&state.db, &signed.principal, &source(&parts), "logout", target, None, None)
        .await;
    let clear = set_cookie(&parts.headers, SESSION_COOKIE, "", "/", 0);
    Ok((
        StatusCode::SEE_OTHER,
        [(LOCATION, HeaderValue::from_static("/login")), (SET_COOKIE, clear)],
    )
        .into_response())
}
