//! Backfills: `POST /jobs/{id}/backfill` creates one, `GET /jobs/{id}/backfills` lists a job's,
//! `GET /backfills/{id}` shows one with its progress, and `POST /backfills/{id}/pause`,
//! `/resume` and `/cancel` change it. The runs are released by `admin::backfill`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::ApiError;
use super::error::{
    BadRequest, Conflict, Forbidden, Internal, NotFound, TooLarge, Unauthorized, Unprocessable,
    UnsupportedMediaType,
};
use super::extract::{Json, Path};
use super::rfc3339;
use crate::admin::{AppState, now_ms};
use crate::backfill::{
    Backfill, BackfillError, BackfillState, Instants, MAX_CONCURRENT, WindowSchedule,
};
use crate::model::{Job, ScheduleType};
use crate::storage::NewBackfill;

/// How many runs of a backfill are unfinished at once when the request does not say.
const DEFAULT_MAX_CONCURRENT: i64 = 10;
/// The most backfills a job's list shows.
const LIST_LIMIT: i64 = 100;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/jobs/{id}/backfill", post(create_backfill))
        .route("/jobs/{id}/backfills", get(list_backfills))
        .route("/backfills/{id}", get(get_backfill))
        .route("/backfills/{id}/pause", post(pause_backfill))
        .route("/backfills/{id}/resume", post(resume_backfill))
        .route("/backfills/{id}/cancel", post(cancel_backfill))
}

/// The body of `POST /jobs/{id}/backfill`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    /// The window's first instant, RFC 3339, inclusive.
    #[schema(example = "2026-01-01T00:00:00Z")]
    from: String,
    /// The window's last instant, RFC 3339, inclusive; not in the future.
    #[schema(example = "2026-01-31T23:59:59Z")]
    to: String,
    /// The most runs of the backfill unfinished at once, 1 to 1000 (default 10).
    max_concurrent: Option<i64>,
    /// Whether instants that already have a run get another (default false).
    #[serde(default)]
    rerun: bool,
}

/// A backfill with its progress, counted in instants.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct BackfillResponse {
    id: i64,
    job_id: i64,
    from: Option<String>,
    to: Option<String>,
    max_concurrent: i64,
    rerun: bool,
    /// `running`, `paused`, `cancelled` or `done`.
    state: String,
    /// Why the admin paused or cancelled it (its job is gone or has no version), or empty.
    reason: String,
    /// The schedule it walks, as the job had it at its creation.
    schedule_type: String,
    schedule_conf: String,
    /// Instants in the window.
    total: i64,
    /// Instants released so far (their runs created, or found to exist).
    released: i64,
    /// Instants whose runs all succeeded.
    done: i64,
    /// Instants with a run that failed, timed out, was killed or lost.
    failed: i64,
    /// Instants that already had a run (without `rerun`, none is made for them).
    skipped: i64,
    /// Instants with a run not ended.
    running: i64,
    /// Instants not finished: running, or not released yet.
    remaining: i64,
    created_by: String,
    created_at: Option<String>,
    updated_at: Option<String>,
    finished_at: Option<String>,
}

/// A job's backfills, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct BackfillList {
    items: Vec<BackfillResponse>,
}

/// Creates a backfill: one run for every instant the job's schedule would have fired in
/// `[from, to]`, with trigger type `BACKFILL` and that instant as trigger time.
#[utoipa::path(post, path = "/jobs/{id}/backfill", tag = "jobs", params(("id" = i64, Path)),
    request_body = BackfillBody, responses(
    (status = 201, body = BackfillResponse), BadRequest, Unauthorized, Forbidden, NotFound,
    Conflict, TooLarge, UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_backfill(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<BackfillBody>,
) -> Result<(StatusCode, axum::Json<BackfillResponse>), ApiError> {
    let job = state.db.get_job(id).await?.ok_or_else(|| job_not_found(id))?;
    actor.require_group(job.spec.group_id)?;
    let from_ms = parse_instant("from", &body.from)?;
    let to_ms = parse_instant("to", &body.to)?;
    if to_ms > now_ms() {
        return Err(invalid("`to` is in the future: a backfill covers past instants only"));
    }
    let max_concurrent = body.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT);
    if !(1..=MAX_CONCURRENT).contains(&max_concurrent) {
        return Err(invalid(format!("max_concurrent: from 1 to {MAX_CONCURRENT}")));
    }
    let window = window_of(&job, from_ms);
    // Instants the job's calendar excludes are not run, as they were not fired.
    let calendar = match job.spec.calendar.as_deref() {
        Some(name) => state.cache.calendar(name).await?,
        None => None,
    };
    let total =
        Instants::new(&window).and_then(|instants| instants.except(calendar).count(from_ms, to_ms));
    let total = total.map_err(|error| match error {
        BackfillError::Reversed => invalid(error.to_string()),
        BackfillError::NotBackfillable(_) => unprocessable("schedule_not_backfillable", error),
        BackfillError::TooManyInstants => unprocessable("backfill_too_large", error),
        BackfillError::Schedule(_) => unprocessable("invalid_schedule", error),
    })?;
    if job.spec.glue_type.runs_a_version() && job.active_version.is_none() {
        return Err(ApiError::Conflict(format!(
            "job {id} has no module version: upload one first"
        )));
    }
    let new = NewBackfill {
        job_id: id,
        from_ms,
        to_ms,
        max_concurrent,
        rerun: body.rerun,
        window,
        total,
        created_by: actor.principal.name.clone(),
    };
    let created = state.db.create_backfill(&new, now_ms()).await?;
    state.backfill_wake.notify_one();
    tracing::info!(
        job.id = id,
        backfill.id = created.id,
        "created backfill {} of job {id}: {total} instants",
        created.id
    );
    let created = response(&state, created).await?;
    actor.audit(&state, "backfill.create", format!("job {id}"), None, Some(&created)).await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// Lists a job's backfills, newest first (at most 100), with their progress.
#[utoipa::path(get, path = "/jobs/{id}/backfills", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, body = BackfillList), BadRequest, Unauthorized, NotFound, Internal))]
async fn list_backfills(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<BackfillList>, ApiError> {
    state.db.get_job(id).await?.ok_or_else(|| job_not_found(id))?;
    let mut items = Vec::new();
    for backfill in state.db.list_backfills(id, LIST_LIMIT).await? {
        items.push(response(&state, backfill).await?);
    }
    Ok(axum::Json(BackfillList { items }))
}

/// Shows one backfill with its progress.
#[utoipa::path(get, path = "/backfills/{id}", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, body = BackfillResponse), BadRequest, Unauthorized, NotFound, Internal))]
async fn get_backfill(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<BackfillResponse>, ApiError> {
    let backfill = state.db.get_backfill(id).await?.ok_or_else(|| backfill_not_found(id))?;
    Ok(axum::Json(response(&state, backfill).await?))
}

/// Pauses a running backfill: it releases nothing more until resumed; its released runs finish.
#[utoipa::path(post, path = "/backfills/{id}/pause", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, body = BackfillResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Conflict, Internal))]
async fn pause_backfill(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<BackfillResponse>, ApiError> {
    change(&state, &actor, id, &[BackfillState::Running], BackfillState::Paused).await
}

/// Resumes a paused backfill.
#[utoipa::path(post, path = "/backfills/{id}/resume", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, body = BackfillResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Conflict, Internal))]
async fn resume_backfill(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<BackfillResponse>, ApiError> {
    change(&state, &actor, id, &[BackfillState::Paused], BackfillState::Running).await
}

/// Cancels a running or paused backfill for good; its released runs finish.
#[utoipa::path(post, path = "/backfills/{id}/cancel", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, body = BackfillResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Conflict, Internal))]
async fn cancel_backfill(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<BackfillResponse>, ApiError> {
    let from = [BackfillState::Running, BackfillState::Paused];
    change(&state, &actor, id, &from, BackfillState::Cancelled).await
}

/// Moves backfill `id` from one of `from` to `to`, for a caller who may change its job.
async fn change(
    state: &AppState,
    actor: &Actor,
    id: i64,
    from: &[BackfillState],
    to: BackfillState,
) -> Result<axum::Json<BackfillResponse>, ApiError> {
    let before = state.db.get_backfill(id).await?.ok_or_else(|| backfill_not_found(id))?;
    let job = state.db.get_job(before.job_id).await?;
    if let Some(job) = &job {
        actor.require_group(job.spec.group_id)?;
    }
    let Some(after) = state.db.set_backfill_state(id, from, to, "", now_ms()).await? else {
        let message = format!("backfill {id} is {}: it cannot be {}", before.state, past(to));
        return Err(ApiError::Conflict(message));
    };
    tracing::info!(backfill.id = id, job.id = after.job_id, "backfill {id} is {to}");
    if to == BackfillState::Running {
        state.backfill_wake.notify_one();
    }
    let action = format!("backfill.{}", verb(to));
    let before = response(state, before).await?;
    let after = response(state, after).await?;
    actor.audit(state, &action, format!("backfill {id}"), Some(&before), Some(&after)).await;
    Ok(axum::Json(after))
}

/// What a change to `state` did, in a sentence.
fn past(state: BackfillState) -> &'static str {
    match state {
        BackfillState::Running => "resumed",
        BackfillState::Paused => "paused",
        BackfillState::Cancelled | BackfillState::Done => "cancelled",
    }
}

/// The verb of a change to `state`, as the audit log names it.
fn verb(state: BackfillState) -> &'static str {
    match state {
        BackfillState::Running => "resume",
        BackfillState::Paused => "pause",
        BackfillState::Cancelled | BackfillState::Done => "cancel",
    }
}

/// The schedule a backfill of `job` from `from_ms` walks: the job's, a fixed rate anchored at
/// its next fire when it has one so that the instants are the job's own fires.
fn window_of(job: &Job, from_ms: i64) -> WindowSchedule {
    let anchor_ms = match job.spec.schedule_type {
        ScheduleType::FixRate if job.next_fire_ms > 0 => job.next_fire_ms,
        _ => from_ms,
    };
    WindowSchedule {
        schedule_type: job.spec.schedule_type,
        schedule_conf: job.spec.schedule_conf.clone(),
        time_zone: job.spec.time_zone.clone(),
        anchor_ms,
    }
}

async fn response(state: &AppState, backfill: Backfill) -> Result<BackfillResponse, ApiError> {
    let progress = state.db.backfill_progress(&backfill).await?;
    Ok(BackfillResponse {
        id: backfill.id,
        job_id: backfill.job_id,
        from: rfc3339(backfill.from_ms),
        to: rfc3339(backfill.to_ms),
        max_concurrent: backfill.max_concurrent,
        rerun: backfill.rerun,
        state: backfill.state.as_str().to_owned(),
        reason: backfill.reason,
        schedule_type: backfill.window.schedule_type.as_str().to_owned(),
        schedule_conf: backfill.window.schedule_conf,
        total: backfill.total,
        released: backfill.released,
        done: progress.done,
        failed: progress.failed,
        skipped: progress.skipped,
        running: progress.running,
        remaining: progress.remaining(),
        created_by: backfill.created_by,
        created_at: rfc3339(backfill.created_at_ms),
        updated_at: rfc3339(backfill.updated_at_ms),
        finished_at: rfc3339(backfill.finished_at_ms),
    })
}

fn parse_instant(field: &str, text: &str) -> Result<i64, ApiError> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|instant| instant.timestamp_millis())
        .map_err(|_| invalid(format!("{field}: expected an RFC 3339 instant, got `{text}`")))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_backfill", message)
}

fn unprocessable(code: &'static str, error: BackfillError) -> ApiError {
    ApiError::Unprocessable { code, message: error.to_string() }
}

fn job_not_found(id: i64) -> ApiError {
    ApiError::not_found("job_not_found", format!("job {id}"))
}

fn backfill_not_found(id: i64) -> ApiError {
    ApiError::not_found("backfill_not_found", format!("backfill {id}"))
}
