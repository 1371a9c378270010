//! `GET /metrics`: the admin's Prometheus metrics (`crate::metrics`), for any caller of the
//! operator API (the operator token, a personal API token, a session); `access::api_need`
//! rules on it like on `/api/v1` routes. Prometheus sends the token with
//! `authorization: {credentials: …}` in its scrape config.
//!
//! The levels (online executors per group, unfinished runs per state) are read from the
//! database at each scrape; the counters are the process's.

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::error::ApiError;
use super::error::{Internal, Unauthorized};
use crate::admin::{AppState, now_ms};
use crate::metrics::{self, AdminLevels};

pub fn router() -> Router<AppState> {
    Router::new().route("/metrics", get(scrape))
}

/// The admin's metrics in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "meta", responses(
    (status = 200, description = "The metrics (OpenMetrics text).", content_type = "application/openmetrics-text", body = String),
    Unauthorized, Internal,
))]
async fn scrape(State(state): State<AppState>) -> Result<Response, ApiError> {
    let now = now_ms();
    let mut levels = AdminLevels::default();
    for group in state.db.list_groups().await? {
        let online = state.cache.online_addresses(&group, now).await?;
        levels.online_executors.push((group.app_name.clone(), online.len() as i64));
    }
    for (run_state, total) in state.db.count_runs_by_unfinished_state().await? {
        levels.unfinished_runs.push((run_state.as_str(), total));
    }
    // Every state, at 0 when no workflow run is in it, so the family is always there.
    let counts = state.db.workflow_run_counts().await?;
    for run_state in crate::workflow::RunState::ALL {
        let count = counts.iter().find(|(stored, _)| stored == run_state.as_str());
        levels.workflow_runs.push((run_state.to_string(), count.map_or(0, |(_, n)| *n)));
    }
    let text = metrics::admin().encode(&levels);
    Ok(([(CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}
