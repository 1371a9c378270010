//! `GET /api/v1/audit`: the audit log, newest first, for admins.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ApiError;
use super::error::{BadRequest, Forbidden, Internal, Unauthorized};
use super::extract::Query;
use super::rfc3339;
use crate::admin::AppState;
use crate::storage::AuditRecord;

pub fn router() -> Router<AppState> {
    Router::new().route("/audit", get(list_audit))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
    /// The page's size, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    #[param(minimum = 0)]
    offset: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AuditResponse {
    id: i64,
    at: Option<String>,
    actor: String,
    user_id: Option<i64>,
    source: String,
    action: String,
    target: String,
    before: Option<Value>,
    after: Option<Value>,
}

impl From<AuditRecord> for AuditResponse {
    fn from(record: AuditRecord) -> AuditResponse {
        let json = |text: Option<String>| text.and_then(|text| serde_json::from_str(&text).ok());
        AuditResponse {
            id: record.id,
            at: rfc3339(record.at_ms),
            actor: record.entry.actor,
            user_id: record.entry.user_id,
            source: record.entry.source,
            action: record.entry.action,
            target: record.entry.target,
            before: json(record.entry.before_json),
            after: json(record.entry.after_json),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AuditList {
    total: i64,
    items: Vec<AuditResponse>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/audit", tag = "audit", params(AuditQuery), responses(
    (status = 200, body = AuditList), BadRequest, Unauthorized, Forbidden, Internal,
))]
async fn list_audit(
    State(state): State<AppState>,
    Query(query): Query<AuditQuery>,
) -> Result<axum::Json<AuditList>, ApiError> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) || query.offset.is_some_and(|offset| offset < 0) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "limit is 1 to 1000, offset at least 0",
        ));
    }
    let page = state
        .db
        .list_audit(
            query.actor.as_deref(),
            query.action.as_deref(),
            limit,
            query.offset.unwrap_or(0),
        )
        .await?;
    Ok(axum::Json(AuditList {
        total: page.total,
        items: page.items.into_iter().map(AuditResponse::from).collect(),
    }))
}
