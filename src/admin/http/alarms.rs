//! `/api/v1/alarms`: the webhooks alarms are posted to, and the deliveries made, for admins.
//!
//! A webhook has a name, an `http(s)` URL, a signing secret (write-only: never returned, kept
//! when an update leaves it out) and an optional group filter. E-mail needs no resource: it goes
//! to each job's `alarm_email` when the admin runs with `--smtp-url`.

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
use super::extract::{Json, Path, Query};
use super::rfc3339;
use crate::admin::{AppState, now_ms};
use crate::storage::{AlarmDelivery, AlarmWebhook, NewAlarmWebhook};

/// The shortest secret accepted.
const MIN_SECRET_LEN: usize = 16;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/alarms", get(list_alarms).post(create_alarm))
        .route("/alarms/deliveries", get(list_deliveries))
        .route("/alarms/{id}", get(get_alarm).put(update_alarm).delete(delete_alarm))
}

/// The body of `POST /alarms` and `PUT /alarms/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AlarmBody {
    name: String,
    url: String,
    /// Required on create; left out on update to keep the stored one.
    secret: Option<String>,
    group_id: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AlarmResponse {
    id: i64,
    name: String,
    url: String,
    group_id: Option<i64>,
    created_at: Option<String>,
    updated_at: Option<String>,
}

impl From<AlarmWebhook> for AlarmResponse {
    fn from(webhook: AlarmWebhook) -> AlarmResponse {
        AlarmResponse {
            id: webhook.id,
            name: webhook.name,
            url: webhook.url,
            group_id: webhook.group_id,
            created_at: rfc3339(webhook.created_at_ms),
            updated_at: rfc3339(webhook.updated_at_ms),
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct DeliveryQuery {
    /// How many, newest first: 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DeliveryResponse {
    id: i64,
    channel: String,
    target: String,
    state: String,
    attempts: i64,
    next_attempt_at: Option<String>,
    last_error: String,
    delivered_at: Option<String>,
    event_id: i64,
    kind: String,
    job_id: Option<i64>,
    run_id: Option<i64>,
    executor_address: String,
    silenced_before: i64,
    created_at: Option<String>,
}

impl From<AlarmDelivery> for DeliveryResponse {
    fn from(delivery: AlarmDelivery) -> DeliveryResponse {
        let pending = delivery.state == "pending";
        DeliveryResponse {
            id: delivery.id,
            channel: delivery.channel,
            target: delivery.target,
            state: delivery.state,
            attempts: delivery.attempts,
            next_attempt_at: pending.then(|| rfc3339(delivery.next_attempt_at_ms)).flatten(),
            last_error: delivery.last_error,
            delivered_at: rfc3339(delivery.delivered_at_ms),
            event_id: delivery.event.id,
            kind: delivery.event.kind,
            job_id: delivery.event.job_id,
            run_id: delivery.event.run_id,
            executor_address: delivery.event.executor_address,
            silenced_before: delivery.event.silenced_before,
            created_at: rfc3339(delivery.event.created_at_ms),
        }
    }
}

/// Lists the alarm webhooks (their secrets never).
#[utoipa::path(get, path = "/alarms", tag = "alarms", responses(
    (status = 200, body = Vec<AlarmResponse>), Unauthorized, Forbidden, Internal,
))]
async fn list_alarms(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<AlarmResponse>>, ApiError> {
    let webhooks = state.db.list_alarm_webhooks().await?;
    Ok(axum::Json(webhooks.into_iter().map(AlarmResponse::from).collect()))
}

/// One alarm webhook.
#[utoipa::path(get, path = "/alarms/{id}", tag = "alarms", params(("id" = i64, Path)), responses(
    (status = 200, body = AlarmResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn get_alarm(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<AlarmResponse>, ApiError> {
    Ok(axum::Json(load(&state, id).await?.into()))
}

/// Adds an alarm webhook.
#[utoipa::path(post, path = "/alarms", tag = "alarms", request_body = AlarmBody, responses(
    (status = 201, body = AlarmResponse), BadRequest, Unauthorized, Forbidden, Conflict, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_alarm(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<AlarmBody>,
) -> Result<(StatusCode, axum::Json<AlarmResponse>), ApiError> {
    if body.secret.is_none() {
        return Err(invalid(format!("secret: required, at least {MIN_SECRET_LEN} characters")));
    }
    let webhook = validate(&state, body).await?;
    let created = state
        .db
        .create_alarm_webhook(&webhook, now_ms())
        .await
        .on_constraint(|| format!("an alarm named `{}` exists already", webhook.name))?;
    let created = AlarmResponse::from(created);
    actor
        .audit(&state, "alarm.create", format!("alarm {}", created.id), None, Some(&created))
        .await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// Changes an alarm webhook; without `secret` it keeps the stored one.
#[utoipa::path(put, path = "/alarms/{id}", tag = "alarms", params(("id" = i64, Path)), request_body = AlarmBody, responses(
    (status = 200, body = AlarmResponse), BadRequest, Unauthorized, Forbidden, NotFound, Conflict,
    TooLarge, UnsupportedMediaType, Unprocessable, Internal,
))]
async fn update_alarm(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<AlarmBody>,
) -> Result<axum::Json<AlarmResponse>, ApiError> {
    let before = AlarmResponse::from(load(&state, id).await?);
    let webhook = validate(&state, body).await?;
    let updated = state
        .db
        .update_alarm_webhook(id, &webhook, now_ms())
        .await
        .on_constraint(|| format!("an alarm named `{}` exists already", webhook.name))?
        .ok_or_else(|| alarm_not_found(id))?;
    let updated = AlarmResponse::from(updated);
    actor.audit(&state, "alarm.update", format!("alarm {id}"), Some(&before), Some(&updated)).await;
    Ok(axum::Json(updated))
}

/// Removes an alarm webhook.
#[utoipa::path(delete, path = "/alarms/{id}", tag = "alarms", params(("id" = i64, Path)), responses(
    (status = 204, description = "Deleted."), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn delete_alarm(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    let before = AlarmResponse::from(load(&state, id).await?);
    if !state.db.delete_alarm_webhook(id).await? {
        return Err(alarm_not_found(id));
    }
    actor.audit(&state, "alarm.delete", format!("alarm {id}"), Some(&before), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// The latest alarm deliveries and their state.
#[utoipa::path(get, path = "/alarms/deliveries", tag = "alarms", params(DeliveryQuery), responses(
    (status = 200, body = Vec<DeliveryResponse>), BadRequest, Unauthorized, Forbidden, Internal,
))]
async fn list_deliveries(
    State(state): State<AppState>,
    Query(query): Query<DeliveryQuery>,
) -> Result<axum::Json<Vec<DeliveryResponse>>, ApiError> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("invalid_query", "limit is 1 to 1000"));
    }
    let deliveries = state.db.list_alarm_deliveries(limit).await?;
    Ok(axum::Json(deliveries.into_iter().map(DeliveryResponse::from).collect()))
}

async fn load(state: &AppState, id: i64) -> Result<AlarmWebhook, ApiError> {
    state.db.get_alarm_webhook(id).await?.ok_or_else(|| alarm_not_found(id))
}

/// Checks a webhook body: a name, an `http(s)` URL without credentials, a strong secret, an
/// existing group.
async fn validate(state: &AppState, body: AlarmBody) -> Result<NewAlarmWebhook, ApiError> {
    let name = body.name.trim().to_owned();
    if name.is_empty() || name.len() > 100 || name.contains('\0') {
        return Err(invalid("name: 1 to 100 characters, no NUL".to_owned()));
    }
    let url = body.url.trim().to_owned();
    let parsed =
        url::Url::parse(&url).map_err(|error| invalid(format!("url: not a URL: {error}")))?;
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.host_str().is_none_or(str::is_empty)
        || url.len() > 2048
    {
        return Err(invalid("url: an http:// or https:// URL with a host".to_owned()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid("url: put no credentials in the URL; the secret signs".to_owned()));
    }
    if let Some(secret) = &body.secret
        && (secret.chars().count() < MIN_SECRET_LEN || secret.len() > 256 || secret.contains('\0'))
    {
        return Err(invalid(format!("secret: {MIN_SECRET_LEN} to 256 characters")));
    }
    if let Some(group_id) = body.group_id
        && state.db.get_group(group_id).await?.is_none()
    {
        return Err(invalid(format!("group_id: group {group_id} does not exist")));
    }
    Ok(NewAlarmWebhook { name, url, secret: body.secret, group_id: body.group_id })
}

fn invalid(message: String) -> ApiError {
    ApiError::bad_request("invalid_alarm", message)
}

fn alarm_not_found(id: i64) -> ApiError {
    ApiError::not_found("alarm_not_found", format!("alarm {id}"))
}
