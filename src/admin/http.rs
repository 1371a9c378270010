//! The admin's HTTP surface: the operator REST API under `/api/v1` (bearer token) and the
//! executor-facing XXL-JOB API under `/api` and `/xxl-job-admin/api` (access token).
//!
//! Handlers stay thin: extract, call storage or the dispatcher, map to a response DTO.
//! The DTOs here and in `protocol` are the only serde wire types of the admin.

mod error;
mod executor_api;
mod executors;
mod extract;
mod groups;
mod jobs;
mod logs;
mod schedule;
mod versions;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use self::error::ApiError;
use super::AppState;
use crate::protocol::constant_time_eq;

/// The admin's router: operator API, executor API, health.
pub fn router(state: AppState) -> Router {
    let operator = Router::new()
        .merge(groups::router())
        .merge(jobs::router())
        .merge(versions::router(&state))
        .merge(logs::router())
        .merge(executors::router())
        .merge(schedule::router())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_bearer));
    Router::new()
        .nest("/api/v1", operator)
        .merge(executor_api::router(&state))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { ApiError::not_found("route_not_found", "route") })
        .with_state(state)
}

async fn require_bearer(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match given {
        Some(token)
            if constant_time_eq(token.trim().as_bytes(), state.config.admin_token.as_bytes()) =>
        {
            next.run(request).await
        }
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC), or `None` for 0.
fn rfc3339(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|time| time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}
