//! `/api/v1/calendars`: business calendars, whose excluded instants the jobs naming them do not
//! fire at, and the import of `.ics` holiday files into them.
//!
//! A calendar is addressed by its name, which jobs name too; it cannot be renamed, and one a job
//! names cannot be deleted (409, listing the jobs). A change moves the next fire of each running
//! job that names it, so an exclusion lifted takes effect at once rather than after the fire
//! the old rules allowed. Reads are for any caller; changes for admins (`access::api_need`),
//! since one calendar stops or starts jobs of every group. The helpers at the end serve
//! `jobs.rs` and `schedule.rs`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::routing::{get, post};
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
use crate::model::{CalendarRecord, CalendarSpec, JobSpec};
use crate::schedule::Schedule;
use crate::schedule::calendar::{Calendar, CalendarNext, parse_ics_dates};
use crate::storage::CalendarDelete;

/// The most entries of all lists of one calendar.
const MAX_ENTRIES: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/calendars", get(list_calendars).post(create_calendar))
        .route("/calendars/{name}", get(get_calendar).put(update_calendar).delete(delete_calendar))
        .route("/calendars/{name}/ics", post(import_ics))
}

/// The body of `POST /calendars` (with `name`) and `PUT /calendars/{name}`. Entry syntax:
/// dates `2026-10-01` or `2026-10-01/2026-10-07`, annual dates `05-01`, weekdays `SAT`, daily
/// windows `00:00-06:00`, Quartz cron expressions; `included_dates` override every exclusion.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CalendarBody {
    /// Required on create; on update, if given, the name in the path.
    name: Option<String>,
    /// IANA time zone the rules are read in (default UTC).
    time_zone: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    excluded_dates: Vec<String>,
    #[serde(default)]
    annual_dates: Vec<String>,
    #[serde(default)]
    weekdays: Vec<String>,
    #[serde(default)]
    daily_windows: Vec<String>,
    #[serde(default)]
    cron: Vec<String>,
    #[serde(default)]
    included_dates: Vec<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct CalendarResponse {
    name: String,
    time_zone: Option<String>,
    description: String,
    excluded_dates: Vec<String>,
    annual_dates: Vec<String>,
    weekdays: Vec<String>,
    daily_windows: Vec<String>,
    cron: Vec<String>,
    included_dates: Vec<String>,
    created_at: Option<String>,
    updated_at: Option<String>,
}

impl From<CalendarRecord> for CalendarResponse {
    fn from(record: CalendarRecord) -> CalendarResponse {
        let spec = record.spec;
        CalendarResponse {
            name: record.name,
            time_zone: spec.time_zone,
            description: spec.description,
            excluded_dates: spec.excluded_dates,
            annual_dates: spec.annual_dates,
            weekdays: spec.weekdays,
            daily_windows: spec.daily_windows,
            cron: spec.cron,
            included_dates: spec.included_dates,
            created_at: rfc3339(record.created_at_ms),
            updated_at: rfc3339(record.updated_at_ms),
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct IcsQuery {
    /// Add each event's dates to `included_dates` instead of `excluded_dates`.
    #[serde(default)]
    included: bool,
}

/// Lists the calendars.
#[utoipa::path(get, path = "/calendars", tag = "calendars", responses(
    (status = 200, body = Vec<CalendarResponse>), Unauthorized, Internal,
))]
async fn list_calendars(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<CalendarResponse>>, ApiError> {
    let calendars = state.db.list_calendars().await?;
    Ok(axum::Json(calendars.into_iter().map(CalendarResponse::from).collect()))
}

/// Creates a calendar.
#[utoipa::path(post, path = "/calendars", tag = "calendars", request_body = CalendarBody, responses(
    (status = 201, body = CalendarResponse), BadRequest, Unauthorized, Forbidden, Conflict, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_calendar(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<CalendarBody>,
) -> Result<(StatusCode, axum::Json<CalendarResponse>), ApiError> {
    let name = body.name.clone().unwrap_or_default();
    check_name(&name)?;
    let (spec, _) = validate(body)?;
    let created = state
        .db
        .create_calendar(&name, &spec, now_ms())
        .await
        .on_constraint(|| format!("a calendar named `{name}` exists already"))?;
    let created = CalendarResponse::from(created);
    actor.audit(&state, "calendar.create", format!("calendar {name}"), None, Some(&created)).await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// One calendar.
#[utoipa::path(get, path = "/calendars/{name}", tag = "calendars", params(("name" = String, Path)), responses(
    (status = 200, body = CalendarResponse), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_calendar(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<axum::Json<CalendarResponse>, ApiError> {
    Ok(axum::Json(load(&state, &name).await?.into()))
}

/// Replaces a calendar's rules, and moves the next fires of the running jobs that name it.
#[utoipa::path(put, path = "/calendars/{name}", tag = "calendars", params(("name" = String, Path)), request_body = CalendarBody, responses(
    (status = 200, body = CalendarResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn update_calendar(
    State(state): State<AppState>,
    actor: Actor,
    Path(name): Path<String>,
    Json(body): Json<CalendarBody>,
) -> Result<axum::Json<CalendarResponse>, ApiError> {
    if body.name.as_ref().is_some_and(|given| *given != name) {
        return Err(invalid("name: a calendar cannot be renamed".to_owned()));
    }
    let before = CalendarResponse::from(load(&state, &name).await?);
    let (spec, calendar) = validate(body)?;
    let updated = save(&state, &name, &spec, &calendar).await?;
    actor
        .audit(&state, "calendar.update", format!("calendar {name}"), Some(&before), Some(&updated))
        .await;
    Ok(axum::Json(updated))
}

/// Deletes a calendar no job names.
#[utoipa::path(delete, path = "/calendars/{name}", tag = "calendars", params(("name" = String, Path)), responses(
    (status = 204, description = "Deleted."), BadRequest, Unauthorized, Forbidden, NotFound, Conflict,
    Internal,
))]
async fn delete_calendar(
    State(state): State<AppState>,
    actor: Actor,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let before = CalendarResponse::from(load(&state, &name).await?);
    let in_use = |jobs: &[(i64, String)]| {
        let jobs: Vec<String> = jobs.iter().map(|(id, job)| format!("{id} `{job}`")).collect();
        ApiError::Conflict(format!("calendar `{name}` is named by jobs {}", jobs.join(", ")))
    };
    let deleted = state
        .db
        .delete_calendar(&name)
        .await
        .on_constraint(|| format!("calendar `{name}` is named by a job"))?;
    match deleted {
        CalendarDelete::Deleted => {}
        CalendarDelete::NotFound => return Err(calendar_not_found(&name)),
        CalendarDelete::InUse(jobs) => return Err(in_use(&jobs)),
    }
    actor.audit(&state, "calendar.delete", format!("calendar {name}"), Some(&before), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Adds the dates of an iCalendar file's events to a calendar: excluded, or with
/// `included=true` included (make-up workdays). Recurring events are refused.
#[utoipa::path(post, path = "/calendars/{name}/ics", tag = "calendars", params(("name" = String, Path), IcsQuery),
    request_body(content((String = "text/calendar"))), responses(
    (status = 200, body = CalendarResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    Unprocessable, Internal,
))]
async fn import_ics(
    State(state): State<AppState>,
    actor: Actor,
    Path(name): Path<String>,
    Query(query): Query<IcsQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<CalendarResponse>, ApiError> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(rejection.body_text()),
        _ => ApiError::bad_request("invalid_body", rejection.body_text()),
    })?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("invalid_ics", "the file is not UTF-8 text"))?;
    let record = load(&state, &name).await?;
    let before = CalendarResponse::from(record.clone());
    let zone = load_calendar_spec(&record.spec)?.zone();
    let dates = parse_ics_dates(text, zone).map_err(|error| ApiError::Unprocessable {
        code: "invalid_ics",
        message: error.to_string(),
    })?;
    let mut spec = record.spec;
    let list = if query.included { &mut spec.included_dates } else { &mut spec.excluded_dates };
    for date in dates {
        if !list.contains(&date) {
            list.push(date);
        }
    }
    let calendar = check_spec(&spec)?;
    let updated = save(&state, &name, &spec, &calendar).await?;
    actor
        .audit(
            &state,
            "calendar.import_ics",
            format!("calendar {name}"),
            Some(&before),
            Some(&updated),
        )
        .await;
    Ok(axum::Json(updated))
}

/// Checks that calendar `name` exists, for a job that names it (`None` or blank: no calendar).
pub(super) async fn job_calendar(
    state: &AppState,
    name: Option<String>,
) -> Result<Option<String>, ApiError> {
    let Some(name) = name.map(|name| name.trim().to_owned()).filter(|name| !name.is_empty()) else {
        return Ok(None);
    };
    if check_name(&name).is_err() || state.db.get_calendar(&name).await?.is_none() {
        return Err(ApiError::bad_request(
            "invalid_job",
            format!("calendar: calendar `{name}` does not exist"),
        ));
    }
    Ok(Some(name))
}

/// The calendar a job names, parsed; `None` when it names none.
pub(super) async fn calendar_of(
    state: &AppState,
    job: &JobSpec,
) -> Result<Option<Calendar>, ApiError> {
    let Some(name) = &job.calendar else { return Ok(None) };
    let record = load(state, name).await?;
    Ok(Some(load_calendar_spec(&record.spec)?))
}

/// Calendar `name`, parsed, for a preview.
pub(super) async fn named_calendar(state: &AppState, name: &str) -> Result<Calendar, ApiError> {
    let found = match check_name(name) {
        Ok(()) => state.db.get_calendar(name).await?,
        Err(_) => None,
    };
    let record = found.ok_or_else(|| {
        ApiError::bad_request(
            "invalid_query",
            format!("calendar: calendar `{name}` does not exist"),
        )
    })?;
    load_calendar_spec(&record.spec)
}

/// The first fire of `schedule` after `now` that `job`'s calendar allows (a search that gave
/// up gives the excluded instant to look again from), or `None`.
pub(super) async fn next_fire(
    state: &AppState,
    job: &JobSpec,
    schedule: &Schedule,
    now: i64,
) -> Result<Option<i64>, ApiError> {
    Ok(match calendar_of(state, job).await? {
        None => schedule.next_after(now),
        Some(calendar) => match calendar.next_fire(schedule, now) {
            CalendarNext::At(at) | CalendarNext::GaveUp(at) => Some(at),
            CalendarNext::Never => None,
        },
    })
}

/// Up to `count` fires of `job`'s schedule after `now` that its calendar allows.
pub(super) async fn fire_times(
    state: &AppState,
    job: &JobSpec,
    now: i64,
    count: usize,
) -> Result<Vec<i64>, ApiError> {
    let schedule =
        &Schedule::parse(job.schedule_type, &job.schedule_conf, job.time_zone.as_deref())
            .map_err(|error| ApiError::bad_request("invalid_schedule", error.to_string()))?;
    Ok(match calendar_of(state, job).await? {
        None => schedule.next_n(now, count),
        Some(calendar) => calendar
            .walk(schedule, now, count)
            .into_iter()
            .filter_map(|step| match step {
                crate::schedule::calendar::Step::Fire(at) => Some(at),
                _ => None,
            })
            .collect(),
    })
}

async fn load(state: &AppState, name: &str) -> Result<CalendarRecord, ApiError> {
    // A name no calendar can have is not looked up: PostgreSQL refuses NUL in text.
    check_name(name).map_err(|_| calendar_not_found(name))?;
    state.db.get_calendar(name).await?.ok_or_else(|| calendar_not_found(name))
}

/// Parses a stored calendar; one that no longer parses (a time zone gone from the database)
/// is reported, not a 500.
fn load_calendar_spec(spec: &CalendarSpec) -> Result<Calendar, ApiError> {
    Calendar::parse(spec).map_err(|error| ApiError::Unprocessable {
        code: "invalid_calendar",
        message: format!("the stored calendar is invalid: {error}"),
    })
}

/// Writes `spec` to calendar `name`, then moves the next fire of each running job naming it.
async fn save(
    state: &AppState,
    name: &str,
    spec: &CalendarSpec,
    calendar: &Calendar,
) -> Result<CalendarResponse, ApiError> {
    let now = now_ms();
    let updated =
        state.db.update_calendar(name, spec, now).await?.ok_or_else(|| calendar_not_found(name))?;
    state.cache.forget_calendar(name);
    for job in state.db.running_jobs_with_calendar(name).await? {
        // A `FIX_DELAY` job waiting for its runs has no next fire to move.
        if job.next_fire_ms == 0 {
            continue;
        }
        let spec = &job.spec;
        let Ok(schedule) =
            Schedule::parse(spec.schedule_type, &spec.schedule_conf, spec.time_zone.as_deref())
        else {
            continue;
        };
        let next = match calendar.next_fire(&schedule, now) {
            CalendarNext::At(at) | CalendarNext::GaveUp(at) => at,
            // The scheduler stops the job when it finds no fire.
            CalendarNext::Never => continue,
        };
        if state.db.reschedule_job(job.id, job.next_fire_ms, next, now).await? {
            state.cache.forget_job(job.id);
        }
    }
    state.scheduler_wake.notify_one();
    Ok(updated.into())
}

/// Checks a body's rules: NUL-free, at most [`MAX_ENTRIES`] entries, and a valid calendar.
fn validate(body: CalendarBody) -> Result<(CalendarSpec, Calendar), ApiError> {
    let spec = CalendarSpec {
        time_zone: body
            .time_zone
            .map(|zone| zone.trim().to_owned())
            .filter(|zone| !zone.is_empty()),
        description: body.description,
        excluded_dates: body.excluded_dates,
        annual_dates: body.annual_dates,
        weekdays: body.weekdays,
        daily_windows: body.daily_windows,
        cron: body.cron,
        included_dates: body.included_dates,
    };
    if spec.description.len() > 1000 || spec.description.contains('\0') {
        return Err(invalid("description: at most 1000 characters, no NUL".to_owned()));
    }
    let calendar = check_spec(&spec)?;
    Ok((spec, calendar))
}

fn check_spec(spec: &CalendarSpec) -> Result<Calendar, ApiError> {
    let lists = [
        &spec.excluded_dates,
        &spec.annual_dates,
        &spec.weekdays,
        &spec.daily_windows,
        &spec.cron,
        &spec.included_dates,
    ];
    if lists.iter().map(|list| list.len()).sum::<usize>() > MAX_ENTRIES {
        return Err(invalid(format!("at most {MAX_ENTRIES} entries in all")));
    }
    if lists
        .iter()
        .flat_map(|list| list.iter())
        .any(|entry| entry.len() > 200 || entry.contains('\0'))
    {
        return Err(invalid("an entry is longer than 200 characters or holds a NUL".to_owned()));
    }
    Calendar::parse(spec).map_err(|error| invalid(error.to_string()))
}

/// A name that can stand in a path: 1 to 100 letters, digits and `-_.`.
fn check_name(name: &str) -> Result<(), ApiError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if name.is_empty() || name.len() > 100 || !name.chars().all(allowed) {
        return Err(invalid("name: 1 to 100 letters, digits and `-_.`".to_owned()));
    }
    Ok(())
}

fn invalid(message: String) -> ApiError {
    ApiError::bad_request("invalid_calendar", message)
}

fn calendar_not_found(name: &str) -> ApiError {
    ApiError::not_found("calendar_not_found", format!("calendar `{name}`"))
}
