//! `/api/v1/jobs`: create, read, change, delete, start, stop and trigger jobs.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::{ApiError, ResultExt};
use super::error::{
    BadRequest, Conflict, Forbidden, Internal, NotFound, Overloaded, TooLarge, Unauthorized,
    Unprocessable, UnsupportedMediaType,
};
use super::extract::{Json, Path, Query};
use super::rfc3339;
use crate::admin::dispatch::{PlannedTrigger, TriggerError};
use crate::admin::{AppState, now_ms};
use crate::model::{Job, ScheduleType, TriggerType};
use crate::schedule::Schedule;
use crate::storage::JobUpdate;

mod checked;

use self::checked::validate;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/jobs", get(list_jobs).post(create_job))
        .route("/jobs/{id}", get(get_job).put(update_job).delete(delete_job))
        .route("/jobs/{id}/start", post(start_job))
        .route("/jobs/{id}/stop", post(stop_job))
        .route("/jobs/{id}/trigger", post(trigger_job))
        .route("/jobs/{id}/next-fire-times", get(next_fire_times))
}

/// The body of `POST /jobs` and `PUT /jobs/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct JobBody {
    group_id: i64,
    name: String,
    schedule_type: String,
    #[serde(default)]
    schedule_conf: String,
    time_zone: Option<String>,
    misfire_strategy: Option<String>,
    route_strategy: Option<String>,
    block_strategy: Option<String>,
    #[serde(default)]
    timeout_secs: i64,
    #[serde(default)]
    retry_count: i64,
    /// Seconds before the first retry; 0 (the default) retries at once.
    #[serde(default)]
    retry_interval_secs: i64,
    /// `FIXED` (the default) or `EXPONENTIAL`: interval × 2^(attempt - 1).
    retry_backoff: Option<String>,
    /// The longest wait before a retry, in seconds; 0 (the default) means one day.
    #[serde(default)]
    retry_max_interval_secs: i64,
    glue_type: Option<String>,
    handler: Option<String>,
    #[serde(default)]
    param: String,
    #[serde(default)]
    child_job_ids: Vec<i64>,
    alarm_email: Option<String>,
    alarm_silence_secs: Option<i64>,
    fuel_limit: Option<i64>,
    memory_limit_mb: Option<i64>,
    misfire_threshold_ms: Option<i64>,
    #[serde(default)]
    sharding_total_count: i64,
    #[serde(default)]
    sharding_item_parameters: String,
    sharding_strategy: Option<String>,
    /// The most runs of the job dispatching or running at once, on all executors; 0 (the
    /// default) means no cap.
    #[serde(default)]
    max_concurrent_runs: i64,
    calendar: Option<String>,
    /// What the job is for, for people (at most 2,000 characters).
    #[serde(default)]
    description: String,
    /// Who answers for the job, XXL-JOB's author (at most 200 characters).
    #[serde(default)]
    owner: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct JobResponse {
    id: i64,
    group_id: i64,
    name: String,
    schedule_type: &'static str,
    schedule_conf: String,
    time_zone: Option<String>,
    misfire_strategy: &'static str,
    route_strategy: &'static str,
    block_strategy: &'static str,
    timeout_secs: i64,
    retry_count: i64,
    retry_interval_secs: i64,
    retry_backoff: &'static str,
    retry_max_interval_secs: i64,
    glue_type: &'static str,
    handler: Option<String>,
    param: String,
    child_job_ids: Vec<i64>,
    alarm_email: Option<String>,
    alarm_silence_secs: i64,
    fuel_limit: Option<i64>,
    memory_limit_mb: Option<i64>,
    misfire_threshold_ms: i64,
    sharding_total_count: i64,
    sharding_item_parameters: String,
    sharding_strategy: &'static str,
    max_concurrent_runs: i64,
    calendar: Option<String>,
    description: String,
    owner: String,
    running: bool,
    next_fire_time: Option<String>,
    active_version: Option<i64>,
    created_at: Option<String>,
    updated_at: Option<String>,
}

impl From<Job> for JobResponse {
    fn from(job: Job) -> JobResponse {
        JobResponse {
            id: job.id,
            group_id: job.spec.group_id,
            name: job.spec.name,
            schedule_type: job.spec.schedule_type.as_str(),
            schedule_conf: job.spec.schedule_conf,
            time_zone: job.spec.time_zone,
            misfire_strategy: job.spec.misfire_strategy.as_str(),
            route_strategy: job.spec.route_strategy.as_str(),
            block_strategy: job.spec.block_strategy.as_str(),
            timeout_secs: job.spec.timeout_secs,
            retry_count: job.spec.retry_count,
            retry_interval_secs: job.spec.retry_interval_secs,
            retry_backoff: job.spec.retry_backoff.as_str(),
            retry_max_interval_secs: job.spec.retry_max_interval_secs,
            glue_type: job.spec.glue_type.as_str(),
            handler: job.spec.handler,
            param: job.spec.param,
            child_job_ids: job.spec.child_job_ids,
            alarm_email: job.spec.alarm_email,
            alarm_silence_secs: job.spec.alarm_silence_secs,
            fuel_limit: job.spec.fuel_limit,
            memory_limit_mb: job.spec.memory_limit_mb,
            misfire_threshold_ms: job.spec.misfire_threshold_ms,
            sharding_total_count: job.spec.sharding_total_count,
            sharding_item_parameters: job.spec.sharding_item_parameters,
            sharding_strategy: job.spec.sharding_strategy.as_str(),
            max_concurrent_runs: job.spec.max_concurrent_runs,
            calendar: job.spec.calendar,
            description: job.spec.description,
            owner: job.spec.owner,
            running: job.running,
            next_fire_time: rfc3339(job.next_fire_ms),
            active_version: job.active_version,
            created_at: rfc3339(job.created_at_ms),
            updated_at: rfc3339(job.updated_at_ms),
        }
    }
}

/// Creates a job (stopped).
#[utoipa::path(post, path = "/jobs", tag = "jobs", request_body = JobBody, responses(
    (status = 201, body = JobResponse), BadRequest, Unauthorized, Forbidden, Conflict, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_job(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<JobBody>,
) -> Result<(StatusCode, axum::Json<JobResponse>), ApiError> {
    actor.require_group(body.group_id)?;
    let (job, _) = validate(&state, &actor, body).await?;
    let created = state
        .db
        .create_job(&job, now_ms())
        .await
        .on_constraint(|| "the job conflicts with existing data".to_owned())?;
    tracing::info!(job.id = created.id, "created job {} `{}`", created.id, created.spec.name);
    let created = JobResponse::from(created);
    actor.audit(&state, "job.create", format!("job {}", created.id), None, Some(&created)).await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// Replaces a job's fields.
#[utoipa::path(put, path = "/jobs/{id}", tag = "jobs", params(("id" = i64, Path)), request_body = JobBody, responses(
    (status = 200, body = JobResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn update_job(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<JobBody>,
) -> Result<axum::Json<JobResponse>, ApiError> {
    let before = JobResponse::from(load(&state, id).await?);
    actor.require_group(before.group_id)?;
    actor.require_group(body.group_id)?;
    let (job, schedule) = validate(&state, &actor, body).await?;
    let now = now_ms();
    let next = super::calendars::next_fire(&state, &job, &schedule, now).await?.unwrap_or(0);
    let updated = match state.db.update_job_checked(id, &job, next, now).await? {
        JobUpdate::Updated(updated) => *updated,
        JobUpdate::NotFound => return Err(job_not_found(id)),
        JobUpdate::Cycle(cycle) => {
            let path: Vec<String> = cycle.iter().map(i64::to_string).collect();
            return Err(ApiError::bad_request(
                "child_job_cycle",
                format!("child_job_ids: job {id} would trigger itself: {}", path.join(" → ")),
            ));
        }
    };
    state.cache.forget_job(id);
    state.scheduler_wake.notify_one();
    // A raised or removed cap makes room for held runs now.
    state.dispatcher.release_held(updated.spec.group_id).await?;
    let updated = JobResponse::from(updated);
    actor.audit(&state, "job.update", format!("job {id}"), Some(&before), Some(&updated)).await;
    Ok(axum::Json(updated))
}

/// Shows one job.
#[utoipa::path(get, path = "/jobs/{id}", tag = "jobs", params(("id" = i64, Path)), responses(
    (status = 200, body = JobResponse), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<JobResponse>, ApiError> {
    Ok(axum::Json(load(&state, id).await?.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    group_id: Option<i64>,
}

/// Lists jobs, of one group or all.
#[utoipa::path(get, path = "/jobs", tag = "jobs", params(ListQuery), responses(
    (status = 200, body = Vec<JobResponse>), BadRequest, Unauthorized, Internal,
))]
async fn list_jobs(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<Vec<JobResponse>>, ApiError> {
    let jobs = state.db.list_jobs(query.group_id).await?;
    Ok(axum::Json(jobs.into_iter().map(JobResponse::from).collect()))
}

/// Deletes a job.
#[utoipa::path(delete, path = "/jobs/{id}", tag = "jobs", params(("id" = i64, Path)), responses(
    (status = 204, description = "Deleted."), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn delete_job(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    let before = JobResponse::from(load(&state, id).await?);
    actor.require_group(before.group_id)?;
    if !state.db.delete_job(id).await? {
        return Err(job_not_found(id));
    }
    state.cache.forget_job(id);
    actor.audit(&state, "job.delete", format!("job {id}"), Some(&before), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Starts a job's schedule.
#[utoipa::path(post, path = "/jobs/{id}/start", tag = "jobs", params(("id" = i64, Path)), responses(
    (status = 200, body = JobResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn start_job(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<JobResponse>, ApiError> {
    let job = load(&state, id).await?;
    actor.require_group(job.spec.group_id)?;
    let schedule = parse_schedule(
        job.spec.schedule_type,
        &job.spec.schedule_conf,
        job.spec.time_zone.as_deref(),
    )?;
    if job.spec.schedule_type == ScheduleType::None {
        return Err(ApiError::bad_request(
            "not_schedulable",
            "a job with schedule_type NONE runs only when triggered",
        ));
    }
    let now = now_ms();
    let next = super::calendars::next_fire(&state, &job.spec, &schedule, now).await?;
    let next = next.ok_or_else(|| {
        ApiError::bad_request("no_fire_time", "the schedule has no fire time in the future")
    })?;
    state.db.set_job_running(id, Some(next), now).await?;
    state.cache.forget_job(id);
    state.scheduler_wake.notify_one();
    let started = JobResponse::from(load(&state, id).await?);
    let before = JobResponse::from(job);
    actor.audit(&state, "job.start", format!("job {id}"), Some(&before), Some(&started)).await;
    Ok(axum::Json(started))
}

/// Stops a job's schedule.
#[utoipa::path(post, path = "/jobs/{id}/stop", tag = "jobs", params(("id" = i64, Path)), responses(
    (status = 200, body = JobResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn stop_job(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<JobResponse>, ApiError> {
    let before = JobResponse::from(load(&state, id).await?);
    actor.require_group(before.group_id)?;
    if !state.db.set_job_running(id, None, now_ms()).await? {
        return Err(job_not_found(id));
    }
    state.cache.forget_job(id);
    let stopped = JobResponse::from(load(&state, id).await?);
    actor.audit(&state, "job.stop", format!("job {id}"), Some(&before), Some(&stopped)).await;
    Ok(axum::Json(stopped))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    param: Option<String>,
    addresses: Option<Vec<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TriggerResponse {
    log_ids: Vec<i64>,
}

/// Runs a job once now (on each executor for a broadcast); the new runs' ids. The body is
/// optional.
#[utoipa::path(post, path = "/jobs/{id}/trigger", tag = "jobs", params(("id" = i64, Path)),
    request_body(content = Option<TriggerBody>, content_type = "application/json"), responses(
    (status = 200, body = TriggerResponse), BadRequest, Unauthorized, Forbidden, NotFound, Conflict,
    Internal, Overloaded,
))]
async fn trigger_job(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    body: Bytes,
) -> Result<axum::Json<TriggerResponse>, ApiError> {
    // The body is optional: `curl -X POST …/trigger` with nothing runs the job's own param.
    let body: TriggerBody = if body.iter().all(u8::is_ascii_whitespace) {
        TriggerBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|error| {
            ApiError::bad_request("malformed_json", format!("invalid trigger body: {error}"))
        })?
    };
    if body.param.as_ref().is_some_and(|param| param.contains('\0') || param.len() > 64 * 1024) {
        return Err(ApiError::bad_request(
            "invalid_trigger",
            "param: at most 64 KiB, without NUL characters",
        ));
    }
    // A trigger is hot (an API client may send thousands a second): the job comes from the
    // dispatcher's cache, which this admin's own changes invalidate at once.
    let job = state.cache.job(id).await.map_err(ApiError::Internal)?;
    let job = job.ok_or_else(|| job_not_found(id))?;
    actor.require_group(job.spec.group_id)?;
    let param = body.param.unwrap_or_else(|| job.spec.param.clone());
    // Past the bound on unfinished runs, a trigger is refused rather than queued (`admission`).
    super::admit_trigger(&state).await?;
    let trigger = PlannedTrigger::now(TriggerType::Manual, param.clone());
    let addresses = body
        .addresses
        .map(|list| list.iter().map(|a| a.trim_end_matches('/').to_owned()).collect::<Vec<_>>());
    // The audit record commits with the runs, which add their ids to it as `log_ids`.
    let what = serde_json::json!({"param": param});
    let audit = actor.audit_entry("job.trigger", format!("job {id}"), Some(&what));
    match state.dispatcher.trigger(&job, trigger, addresses.as_deref(), Some(&audit)).await {
        Ok(log_ids) => Ok(axum::Json(TriggerResponse { log_ids })),
        Err(TriggerError::Internal(error)) => Err(ApiError::Internal(error)),
        Err(error @ TriggerError::NoVersion(_)) => Err(ApiError::Conflict(error.to_string())),
        Err(error) => Err(ApiError::bad_request("invalid_trigger", error.to_string())),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct CountQuery {
    /// How many, 1 to 100 (default 5).
    #[param(minimum = 1, maximum = 100)]
    count: Option<usize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct FireTimes {
    times: Vec<String>,
}

/// The job's next fire times.
#[utoipa::path(get, path = "/jobs/{id}/next-fire-times", tag = "jobs", params(("id" = i64, Path), CountQuery), responses(
    (status = 200, body = FireTimes), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn next_fire_times(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(query): Query<CountQuery>,
) -> Result<axum::Json<FireTimes>, ApiError> {
    let job = load(&state, id).await?;
    let count = query.count.unwrap_or(5);
    if !(1..=100).contains(&count) {
        return Err(ApiError::bad_request("invalid_query", "count must be between 1 and 100"));
    }
    let times = super::calendars::fire_times(&state, &job.spec, now_ms(), count).await?;
    Ok(axum::Json(FireTimes { times: times.into_iter().filter_map(rfc3339).collect() }))
}

async fn load(state: &AppState, id: i64) -> Result<Job, ApiError> {
    state.db.get_job(id).await?.ok_or_else(|| job_not_found(id))
}

fn job_not_found(id: i64) -> ApiError {
    ApiError::not_found("job_not_found", format!("job {id}"))
}

fn parse_schedule(
    kind: ScheduleType,
    conf: &str,
    time_zone: Option<&str>,
) -> Result<Schedule, ApiError> {
    Schedule::parse(kind, conf, time_zone)
        .map_err(|error| ApiError::bad_request("invalid_schedule", error.to_string()))
}
