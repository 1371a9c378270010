//! `/api/v1/executors`: the registry, with each executor's last heartbeat, protocol kind and
//! version (what its last registration showed), so that a rolling upgrade can be followed, and
//! its mode: called at its address (push) or polling its admins (pull).

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::Serialize;

use super::error::ApiError;
use super::error::{Internal, Unauthorized};
use super::rfc3339;
use crate::admin::AppState;
use crate::admin::dispatch::Peer;
use crate::netpolicy::is_pull_address;
use crate::protocol::REGISTRY_GROUP_EXECUTOR;

pub fn router() -> Router<AppState> {
    Router::new().route("/executors", get(list_executors))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ExecutorResponse {
    app_name: String,
    address: String,
    last_heartbeat: Option<String>,
    /// What answers at the address: `wasmjob`, `xxl-job` (XXL-JOB 2.2 to 3.4) or
    /// `xxl-job-3.5`; null when not known (a registration older than the admin's record of it).
    protocol: Option<&'static str>,
    /// The version the executor reported at its last registration; null when it reported none
    /// (XXL-JOB executors do not report one).
    version: Option<String>,
    /// `push` (the admin calls it at its address) or `pull` (it polls its admins for its runs:
    /// `wasmjob executor --pull`, an address `pull://…`).
    mode: &'static str,
    /// For a pull executor, whether it polls the admin that answers now (a pull executor should
    /// poll every admin); null for a push executor.
    polling_this_admin: Option<bool>,
}

/// Lists registered executors with their last heartbeat, protocol kind and version.
#[utoipa::path(get, path = "/executors", tag = "executors", responses(
    (status = 200, body = Vec<ExecutorResponse>), Unauthorized, Internal,
))]
async fn list_executors(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<ExecutorResponse>>, ApiError> {
    let rows = state.db.list_registrations(REGISTRY_GROUP_EXECUTOR).await?;
    let hub = state.dispatcher.client().pull_hub();
    Ok(axum::Json(
        rows.into_iter()
            .map(|row| ExecutorResponse {
                mode: if is_pull_address(&row.address) { "pull" } else { "push" },
                polling_this_admin: is_pull_address(&row.address)
                    .then(|| hub.is_some_and(|hub| hub.is_connected(&row.address))),
                app_name: row.app_name,
                address: row.address,
                last_heartbeat: rfc3339(row.updated_at_ms),
                protocol: Peer::shown_kind(&row.peer_kind),
                version: Some(row.version).filter(|version| !version.is_empty()),
            })
            .collect(),
    ))
}
