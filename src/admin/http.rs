//! The admin's HTTP surface: the operator REST API under `/api/v1` (bearer token or console
//! session, with role rules: `auth.rs`), the executor-facing XXL-JOB API under `/api` and
//! `/xxl-job-admin/api` (access token), the web console at `/` (`admin::console`),
//! Prometheus metrics at `/metrics` (the operator API's callers), and the probes `/healthz` and
//! `/readyz` (anyone: `health.rs`).
//!
//! Handlers stay thin: extract, call storage or the dispatcher, map to a response DTO.
//! The DTOs here and in `protocol` are the only serde wire types of the admin.

mod admins;
mod alarms;
mod audit;
pub(super) mod auth;
mod backfills;
mod calendars;
pub(super) mod error;
mod executor_api;
mod executors;
pub(super) mod extract;
mod groups;
pub(super) mod health;
mod jobs;
pub(super) mod logs;
mod metrics;
pub mod openapi;
mod report;
mod schedule;
pub(crate) mod stream;
mod users;
mod versions;
pub(super) mod workflows;

use axum::Router;
use axum::middleware;

use self::error::ApiError;
use super::AppState;
use super::admission::AdmitError;

/// The admin's HTTP API: the operator API, the executor API, metrics and health, with the
/// API's answer to an unknown route (`admin::router` adds the console).
pub fn routes(state: &AppState) -> Router<AppState> {
    let operator = Router::new()
        .merge(groups::router())
        .merge(jobs::router())
        .merge(backfills::router())
        .merge(versions::router(state))
        .merge(logs::router())
        .merge(stream::router())
        .merge(executors::router())
        .merge(admins::router())
        .merge(schedule::router())
        .merge(users::router())
        .merge(audit::router())
        .merge(alarms::router())
        .merge(calendars::router())
        .merge(workflows::router())
        .merge(report::router())
        .merge(openapi::router())
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::authenticate));
    let metrics = metrics::router()
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::authenticate));
    Router::new()
        .nest("/api/v1", operator)
        .merge(metrics)
        .merge(executor_api::router(state))
        .merge(health::router())
        .fallback(|| async { ApiError::not_found("route_not_found", "route") })
}

/// Admits one triggered run under the bound on unfinished runs (`admission`): past it, the
/// trigger is refused with 503 `overloaded` rather than queued.
pub(super) async fn admit_trigger(state: &AppState) -> Result<(), ApiError> {
    match state.admission.admit(1).await {
        Ok(()) => Ok(()),
        Err(AdmitError::Overloaded(overloaded)) => {
            crate::metrics::admin().admission_refused("trigger");
            Err(ApiError::Overloaded(overloaded.to_string()))
        }
        Err(AdmitError::Internal(error)) => Err(error.into()),
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC), or `None` for 0.
pub(super) fn rfc3339(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|time| time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}
