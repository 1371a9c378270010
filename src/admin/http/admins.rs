//! `/api/v1/admins`: the live admins that share the database, each with the partitions of the
//! schedule it holds, so that an operator sees who fires what and follows a handover.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::Serialize;

use super::error::ApiError;
use super::error::{Internal, Unauthorized};
use super::rfc3339;
use crate::admin::AppState;
use crate::admin::now_ms;
use crate::admin::partitions::LEASE_MS;

pub fn router() -> Router<AppState> {
    Router::new().route("/admins", get(list_admins))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AdminResponse {
    /// The admin's id, new at each start.
    id: String,
    /// The address it serves its API at, as it reported it.
    address: String,
    started_at: Option<String>,
    last_beat: Option<String>,
    /// Whether this is the admin that answers.
    this: bool,
    /// How many of the 256 partitions of the schedule it holds.
    partition_count: usize,
    /// The partitions it holds: it fires the jobs and workflows whose id × 167 modulo 256 is
    /// one of them.
    partitions: Vec<u16>,
}

/// Lists the live admins (seen within the lease) with the partitions of the schedule each
/// holds.
#[utoipa::path(get, path = "/admins", tag = "executors", responses(
    (status = 200, body = Vec<AdminResponse>), Unauthorized, Internal,
))]
async fn list_admins(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<AdminResponse>>, ApiError> {
    let admins = state.db.live_admins(now_ms() - LEASE_MS).await?;
    let me = state.dispatcher.owner();
    Ok(axum::Json(
        admins
            .into_iter()
            .map(|admin| AdminResponse {
                this: admin.owner == me,
                started_at: rfc3339(admin.started_at),
                last_beat: rfc3339(admin.seen_at),
                partition_count: admin.partitions.len(),
                partitions: admin.partitions,
                address: admin.address,
                id: admin.owner,
            })
            .collect(),
    ))
}
