//! `GET /api/v1/report` (runs per UTC day by state, XXL-JOB's log report) and
//! `GET /api/v1/dashboard` (the summary the console's dashboard shows), for any caller.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::error::{BadRequest, Internal, Unauthorized};
use super::extract::Query;
use crate::admin::{AppState, now_ms};
use crate::storage::{DAY_MS, DayCounts};

/// The most days one report covers.
const MAX_DAYS: i64 = 366;
/// How many failing jobs the dashboard lists, and over how many days.
const TOP_FAILING: i64 = 5;
const TOP_FAILING_DAYS: i64 = 7;

pub fn router() -> Router<AppState> {
    Router::new().route("/report", get(get_report)).route("/dashboard", get(get_dashboard))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ReportQuery {
    /// The first UTC day, `YYYY-MM-DD` (required).
    from: Option<String>,
    /// The last UTC day, `YYYY-MM-DD` (required; at most 366 days after `from`).
    to: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DayResponse {
    day: String,
    success: i64,
    failed: i64,
    timed_out: i64,
    killed: i64,
    lost: i64,
    skipped: i64,
    running: i64,
    total: i64,
}

impl From<DayCounts> for DayResponse {
    fn from(counts: DayCounts) -> DayResponse {
        let day = chrono::DateTime::from_timestamp_millis(counts.day_ms)
            .map(|time| time.format("%Y-%m-%d").to_string())
            .unwrap_or_default();
        DayResponse {
            day,
            success: counts.success,
            failed: counts.failed,
            timed_out: counts.timed_out,
            killed: counts.killed,
            lost: counts.lost,
            skipped: counts.skipped,
            running: counts.running,
            total: counts.total,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ReportResponse {
    days: Vec<DayResponse>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct FailingJob {
    job_id: i64,
    name: String,
    failures: i64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DashboardResponse {
    jobs: usize,
    jobs_started: usize,
    executors_online: usize,
    runs_today: DayResponse,
    top_failing: Vec<FailingJob>,
}

/// Runs per UTC day by state, oldest day first, every day of the range included.
#[utoipa::path(get, path = "/report", tag = "report", params(ReportQuery), responses(
    (status = 200, body = ReportResponse), BadRequest, Unauthorized, Internal,
))]
async fn get_report(
    State(state): State<AppState>,
    Query(query): Query<ReportQuery>,
) -> Result<axum::Json<ReportResponse>, ApiError> {
    let from = parse_day("from", query.from.as_deref())?;
    let to = parse_day("to", query.to.as_deref())?;
    let days = (to - from) / DAY_MS + 1;
    if days < 1 {
        return Err(ApiError::bad_request("invalid_range", "to must not be before from"));
    }
    if days > MAX_DAYS {
        return Err(ApiError::bad_request(
            "invalid_range",
            format!("a report covers at most {MAX_DAYS} days; this asks for {days}"),
        ));
    }
    let counts = state.db.report_days(from, to).await?;
    Ok(axum::Json(ReportResponse { days: counts.into_iter().map(DayResponse::from).collect() }))
}

/// Jobs, executors online, today's runs by state and the jobs failing most in 7 days.
#[utoipa::path(get, path = "/dashboard", tag = "report", responses(
    (status = 200, body = DashboardResponse), Unauthorized, Internal,
))]
async fn get_dashboard(
    State(state): State<AppState>,
) -> Result<axum::Json<DashboardResponse>, ApiError> {
    let now = now_ms();
    let jobs = state.db.list_jobs(None).await?;
    let mut executors_online = 0;
    for group in state.db.list_groups().await? {
        executors_online += state.cache.online_addresses(&group, now).await?.len();
    }
    let today = state.db.report_days(now, now).await?.pop().unwrap_or_default();
    let mut top_failing = Vec::new();
    let since = now - TOP_FAILING_DAYS * DAY_MS;
    for (job_id, failures) in state.db.top_failing_jobs(since, TOP_FAILING).await? {
        let name = jobs.iter().find(|job| job.id == job_id).map(|job| job.spec.name.clone());
        top_failing.push(FailingJob { job_id, name: name.unwrap_or_default(), failures });
    }
    Ok(axum::Json(DashboardResponse {
        jobs: jobs.len(),
        jobs_started: jobs.iter().filter(|job| job.running).count(),
        executors_online,
        runs_today: today.into(),
        top_failing,
    }))
}

/// The first millisecond of the UTC day `text` (`YYYY-MM-DD`) names.
fn parse_day(name: &str, text: Option<&str>) -> Result<i64, ApiError> {
    let invalid = |why: &str| {
        ApiError::bad_request("invalid_range", format!("{name}: {why} (a UTC day, YYYY-MM-DD)"))
    };
    let text = text.ok_or_else(|| invalid("required"))?;
    let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| invalid("not a day"))?;
    let ms = day.and_hms_opt(0, 0, 0).map(|time| time.and_utc().timestamp_millis());
    ms.filter(|ms| *ms >= 0).ok_or_else(|| invalid("before 1970"))
}
