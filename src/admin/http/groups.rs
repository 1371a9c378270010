//! `/api/v1/groups`: executor groups and their online addresses.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::{ApiError, ResultExt};
use super::error::{
    BadRequest, Conflict, Forbidden, Internal, NotFound, TooLarge, Unauthorized, Unprocessable,
    UnsupportedMediaType,
};
use super::extract::{Json, Path};
use crate::admin::{AppState, now_ms};
use crate::model::{AddressType, Group, MAX_CONCURRENT_RUNS_CAP};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/groups", get(list_groups).post(create_group))
        .route("/groups/{id}", get(get_group).put(update_group))
}

/// The body of `POST /groups` and `PUT /groups/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct GroupBody {
    app_name: String,
    title: Option<String>,
    address_type: Option<String>,
    #[serde(default)]
    addresses: Vec<String>,
    /// The most runs of all the group's jobs dispatching or running at once; 0 (the default)
    /// means no cap.
    #[serde(default)]
    max_concurrent_runs: i64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct GroupResponse {
    id: i64,
    app_name: String,
    title: String,
    address_type: &'static str,
    addresses: Vec<String>,
    online_addresses: Vec<String>,
    max_concurrent_runs: i64,
}

/// A group's fields as checked: its app name, title, address type, addresses and cap.
struct GroupFields {
    app_name: String,
    title: String,
    address_type: AddressType,
    addresses: Vec<String>,
    max_concurrent_runs: i64,
}

fn checked(body: GroupBody) -> Result<GroupFields, ApiError> {
    let invalid = |message: String| ApiError::bad_request("invalid_group", message);
    let app_name = body.app_name.trim().to_owned();
    if app_name.is_empty()
        || app_name.len() > 64
        || !app_name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid("app_name: use 1 to 64 letters, digits, '-', '_' or '.'".to_owned()));
    }
    let address_type = match body.address_type.as_deref() {
        None => AddressType::Auto,
        Some(text) => text.parse().map_err(|e| invalid(format!("address_type: {e}")))?,
    };
    for address in &body.addresses {
        if !(address.starts_with("http://") || address.starts_with("https://")) {
            return Err(invalid(format!("address `{address}` is not an http(s) URL")));
        }
    }
    if address_type == AddressType::Manual && body.addresses.is_empty() {
        return Err(invalid("a MANUAL group needs at least one address".to_owned()));
    }
    if !(0..=MAX_CONCURRENT_RUNS_CAP).contains(&body.max_concurrent_runs) {
        return Err(invalid(format!(
            "max_concurrent_runs: 0 (no cap) to {MAX_CONCURRENT_RUNS_CAP}"
        )));
    }
    let addresses = body.addresses.iter().map(|a| a.trim_end_matches('/').to_owned()).collect();
    let title = body.title.unwrap_or_else(|| app_name.clone());
    if title.contains('\0') || title.len() > 200 {
        return Err(invalid("title: at most 200 characters, no NUL".to_owned()));
    }
    Ok(GroupFields {
        app_name,
        title,
        address_type,
        addresses,
        max_concurrent_runs: body.max_concurrent_runs,
    })
}

/// Creates an executor group.
#[utoipa::path(post, path = "/groups", tag = "groups", request_body = GroupBody, responses(
    (status = 201, body = GroupResponse), BadRequest, Unauthorized, Forbidden, Conflict, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_group(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<GroupBody>,
) -> Result<(StatusCode, axum::Json<GroupResponse>), ApiError> {
    let fields = checked(body)?;
    let app_name = fields.app_name.as_str();
    let group = state
        .db
        .create_group(
            app_name,
            &fields.title,
            fields.address_type,
            &fields.addresses,
            fields.max_concurrent_runs,
            now_ms(),
        )
        .await
        .on_constraint(|| format!("a group with app_name `{app_name}` exists already"))?;
    let group = respond(&state, group).await?;
    actor.audit(&state, "group.create", format!("group {}", group.id), None, Some(&group)).await;
    Ok((StatusCode::CREATED, axum::Json(group)))
}

/// Changes a group's title, addresses and concurrency cap; its `app_name`, which its executors
/// register under, stays.
#[utoipa::path(put, path = "/groups/{id}", tag = "groups", params(("id" = i64, Path)),
    request_body = GroupBody, responses(
    (status = 200, body = GroupResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn update_group(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<GroupBody>,
) -> Result<axum::Json<GroupResponse>, ApiError> {
    let fields = checked(body)?;
    let not_found = || ApiError::not_found("group_not_found", format!("group {id}"));
    let before = state.db.get_group(id).await?.ok_or_else(not_found)?;
    if before.app_name != fields.app_name {
        return Err(ApiError::bad_request(
            "invalid_group",
            format!(
                "app_name: a group's app_name stays `{}`: its executors register under it",
                before.app_name
            ),
        ));
    }
    let group = state
        .db
        .update_group(
            id,
            &fields.title,
            fields.address_type,
            &fields.addresses,
            fields.max_concurrent_runs,
            now_ms(),
        )
        .await?
        .ok_or_else(not_found)?;
    state.cache.forget_group(id);
    // A raised cap makes room for held runs now.
    state.dispatcher.release_held(id).await?;
    let before = respond(&state, before).await?;
    let group = respond(&state, group).await?;
    actor.audit(&state, "group.update", format!("group {id}"), Some(&before), Some(&group)).await;
    Ok(axum::Json(group))
}

/// Lists executor groups with their online addresses.
#[utoipa::path(get, path = "/groups", tag = "groups", responses(
    (status = 200, body = Vec<GroupResponse>), Unauthorized, Internal,
))]
async fn list_groups(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<GroupResponse>>, ApiError> {
    let mut out = Vec::new();
    for group in state.db.list_groups().await? {
        out.push(respond(&state, group).await?);
    }
    Ok(axum::Json(out))
}

/// Shows one group.
#[utoipa::path(get, path = "/groups/{id}", tag = "groups", params(("id" = i64, Path)), responses(
    (status = 200, body = GroupResponse), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_group(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<GroupResponse>, ApiError> {
    let group = state
        .db
        .get_group(id)
        .await?
        .ok_or_else(|| ApiError::not_found("group_not_found", format!("group {id}")))?;
    Ok(axum::Json(respond(&state, group).await?))
}

async fn respond(state: &AppState, group: Group) -> Result<GroupResponse, ApiError> {
    let online_addresses = state.cache.online_addresses(&group, now_ms()).await?;
    Ok(GroupResponse {
        id: group.id,
        app_name: group.app_name,
        title: group.title,
        address_type: group.address_type.as_str(),
        addresses: group.addresses,
        online_addresses,
        max_concurrent_runs: group.max_concurrent_runs,
    })
}
