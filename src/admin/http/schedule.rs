//! `/api/v1/schedule/preview`: the next fire times of a schedule that is not a job's yet.
//!
//! An operator checks a cron expression (or a fixed rate) and a time zone before saving a job:
//! the answer is what the scheduler would fire, shown with the zone's offset, and a refused
//! expression gets the reason with the field and the position. It reads and stores nothing.
//!
//! A `FIX_DELAY` schedule previews its first fire only (`from` plus the delay, as if the job
//! were started at `from`): each later fire depends on when the previous fire's runs end. A
//! `ONCE` schedule previews its instant if it is after `from`, else nothing.
//!
//! With `calendar`, the fires are those the named business calendar allows, and `excluded`
//! lists the fires it excluded on the way, each with the rule and until when; a calendar that
//! allows nothing within a year of a fire ends the list with `gave_up_at`.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use chrono::{DateTime, SecondsFormat};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::error::{BadRequest, Unauthorized};
use super::extract::Query;
use crate::admin::{AppState, now_ms};
use crate::model::ScheduleType;
use crate::schedule::Schedule;
use crate::schedule::calendar::Step;

/// How many fire times a preview answers unless asked, and at most.
const DEFAULT_COUNT: usize = 5;
const MAX_COUNT: usize = 100;

pub fn router() -> Router<AppState> {
    Router::new().route("/schedule/preview", get(preview_schedule))
}

/// The query of `GET /schedule/preview`. Numbers and instants arrive as text, so that a bad
/// value gets our own reason rather than the deserializer's.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PreviewQuery {
    schedule_type: Option<String>,
    #[serde(default)]
    schedule_conf: String,
    time_zone: Option<String>,
    /// The instant to preview from (default now).
    #[param(value_type = Option<String>, format = DateTime)]
    from: Option<String>,
    /// How many fire times, 1 to 100 (default 5).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 100)]
    count: Option<String>,
    /// A business calendar, by name, whose excluded fires are skipped and listed.
    calendar: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Preview {
    fire_times: Vec<String>,
    /// With `calendar`: the fires it excluded, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    excluded: Option<Vec<ExcludedFire>>,
    /// With `calendar`: the excluded fire where the search for an allowed one gave up.
    #[serde(skip_serializing_if = "Option::is_none")]
    gave_up_at: Option<String>,
}

/// A fire a calendar excluded.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ExcludedFire {
    time: String,
    /// The rule that excludes it, as written: `weekdays SAT`.
    rule: String,
    /// When the rule stops excluding.
    until: String,
}

/// The next fire times of a schedule, in its time zone.
#[utoipa::path(get, path = "/schedule/preview", tag = "schedule", params(PreviewQuery), responses(
    (status = 200, body = Preview), BadRequest, Unauthorized,
))]
async fn preview_schedule(
    State(state): State<AppState>,
    Query(query): Query<PreviewQuery>,
) -> Result<axum::Json<Preview>, ApiError> {
    let invalid = |message: String| ApiError::bad_request("invalid_query", message);
    let kind: ScheduleType = match query.schedule_type.as_deref().map(str::trim) {
        None | Some("") => {
            return Err(invalid(
                "schedule_type is required: CRON, FIX_RATE, FIX_DELAY, ONCE or NONE".to_owned(),
            ));
        }
        Some(text) => text.parse().map_err(|error| invalid(format!("schedule_type: {error}")))?,
    };
    let time_zone = query.time_zone.as_deref().map(str::trim).filter(|zone| !zone.is_empty());
    let from_ms = match query.from.as_deref().map(str::trim) {
        None | Some("") => now_ms(),
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map_err(|_| {
                invalid(format!(
                    "from: `{text}` is not an RFC 3339 instant such as 2026-03-29T00:00:00Z"
                ))
            })?
            .timestamp_millis(),
    };
    let count = match query.count.as_deref().map(str::trim) {
        None | Some("") => DEFAULT_COUNT,
        Some(text) => {
            text.parse().ok().filter(|count| (1..=MAX_COUNT).contains(count)).ok_or_else(|| {
                invalid(format!("count: `{text}` is not a number from 1 to {MAX_COUNT}"))
            })?
        }
    };
    let schedule = Schedule::parse(kind, &query.schedule_conf, time_zone)
        .map_err(|error| ApiError::bad_request("invalid_schedule", error.to_string()))?;
    // `Schedule::parse` has accepted the zone, so this parse cannot fail; UTC keeps it total.
    let zone: Tz = time_zone.and_then(|name| name.parse().ok()).unwrap_or(Tz::UTC);
    let show = |ms: i64| {
        DateTime::from_timestamp_millis(ms)
            .map(|fire| fire.with_timezone(&zone).to_rfc3339_opts(SecondsFormat::AutoSi, false))
    };
    let Some(name) = query.calendar.as_deref().map(str::trim).filter(|name| !name.is_empty())
    else {
        let fire_times = schedule.next_n(from_ms, count).into_iter().filter_map(show).collect();
        return Ok(axum::Json(Preview { fire_times, excluded: None, gave_up_at: None }));
    };
    let calendar = super::calendars::named_calendar(&state, name).await?;
    let mut preview =
        Preview { fire_times: Vec::new(), excluded: Some(Vec::new()), gave_up_at: None };
    for step in calendar.walk(&schedule, from_ms, count) {
        match step {
            Step::Fire(at_ms) => preview.fire_times.extend(show(at_ms)),
            Step::Excluded { at_ms, exclusion } => {
                let (time, until) = (show(at_ms), show(exclusion.until_ms));
                if let (Some(time), Some(until), Some(excluded)) =
                    (time, until, &mut preview.excluded)
                {
                    excluded.push(ExcludedFire { time, rule: exclusion.rule, until });
                }
            }
            Step::GaveUp(at_ms) => preview.gave_up_at = show(at_ms),
        }
    }
    Ok(axum::Json(preview))
}
