//! `/api/v1/logs`: run records, their log content (read from the executor in bounded pages) and kill.

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::ApiError;
use super::error::{BadGateway, BadRequest, Forbidden, Internal, NotFound, Unauthorized};
use super::extract::{Path, Query};
use super::rfc3339;
use crate::admin::AppState;
use crate::model::{RunRecord, RunState, code};
use crate::protocol::{LogParam, LogResult};
use crate::storage::RunFilter;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/logs", get(list_logs))
        .route("/logs/{id}", get(get_log))
        .route("/logs/{id}/content", get(log_content))
        .route("/logs/{id}/kill", post(kill_run))
}

/// One ElasticJob sharding item of a run: `{"item": 0, "parameter": "Beijing"}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ShardingItemResponse {
    item: u32,
    parameter: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct RunResponse {
    id: i64,
    job_id: i64,
    executor_address: Option<String>,
    trigger_type: &'static str,
    trigger_time: Option<String>,
    /// For a pending run, when it is due to be sent: a retry waits here out its job's retry
    /// interval. Absent once the run was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    due_at: Option<String>,
    param: String,
    trigger_code: i32,
    trigger_msg: String,
    handle_time: Option<String>,
    handle_code: i32,
    handle_msg: String,
    shard_index: i64,
    shard_total: i64,
    sharding_items: Vec<ShardingItemResponse>,
    attempt: i64,
    version: Option<i64>,
    fuel_used: Option<i64>,
    state: &'static str,
    dispatched_at: Option<String>,
    started_at: Option<String>,
    parent_run_id: Option<i64>,
    kill_requested: bool,
    /// Pending because its job or group is at its concurrency cap: it is sent when a run of
    /// that job or group ends.
    held: bool,
}

impl From<RunRecord> for RunResponse {
    fn from(run: RunRecord) -> RunResponse {
        RunResponse {
            id: run.id,
            job_id: run.job_id,
            executor_address: run.executor_address,
            trigger_type: run.trigger_type.as_str(),
            trigger_time: rfc3339(run.trigger_time_ms),
            due_at: (run.state == RunState::Pending)
                .then(|| rfc3339(run.trigger_time_ms))
                .flatten(),
            param: run.param,
            trigger_code: run.trigger_code,
            trigger_msg: run.trigger_msg,
            handle_time: rfc3339(run.handle_time_ms),
            handle_code: run.handle_code,
            handle_msg: run.handle_msg,
            shard_index: run.shard_index,
            shard_total: run.shard_total,
            sharding_items: run
                .sharding_items
                .into_iter()
                .map(|item| ShardingItemResponse { item: item.item, parameter: item.parameter })
                .collect(),
            attempt: run.attempt,
            version: run.version,
            fuel_used: run.fuel_used,
            state: run.state.as_str(),
            dispatched_at: rfc3339(run.dispatched_at_ms),
            started_at: rfc3339(run.started_at_ms),
            parent_run_id: run.parent_run_id,
            kill_requested: run.kill_requested,
            held: run.held,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    job_id: Option<i64>,
    /// A run state: `pending`, `running`, `success`, `failed`, …
    status: Option<String>,
    /// Runs triggered at or after this time (see [`parse_time_bound`]).
    from: Option<String>,
    /// Runs triggered at or before this time.
    to: Option<String>,
    /// The page's size, 1 to 1000 (default 20).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    #[param(minimum = 0)]
    offset: Option<i64>,
}

/// Which end of a time range a text bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The first instant included: a date means its midnight.
    From,
    /// The last instant included: a date means its whole day.
    To,
}

/// The instant (ms) a `from` or `to` query value names: an RFC 3339 instant
/// (`2026-01-31T08:00:00+08:00`), a UTC date and time without zone (`2026-01-31T08:00`,
/// seconds optional, as a browser's `datetime-local` field sends it, or with a space), or a
/// UTC date (`2026-01-31`). The error says which forms are understood.
pub(crate) fn parse_time_bound(text: &str, bound: Bound) -> Result<i64, String> {
    use chrono::{DateTime, NaiveDate, NaiveDateTime};
    let text = text.trim();
    if let Ok(instant) = DateTime::parse_from_rfc3339(text) {
        return Ok(instant.timestamp_millis());
    }
    for format in
        ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M"]
    {
        if let Ok(time) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(time.and_utc().timestamp_millis());
        }
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let midnight = date.and_hms_opt(0, 0, 0).map(|time| time.and_utc().timestamp_millis());
        if let Some(midnight) = midnight {
            return Ok(match bound {
                Bound::From => midnight,
                Bound::To => midnight + 86_400_000 - 1,
            });
        }
    }
    Err(format!(
        "`{text}` is not a time: use a date (2026-01-31), a UTC date and time \
         (2026-01-31T08:00:00) or an RFC 3339 instant (2026-01-31T08:00:00Z)"
    ))
}

/// The most runs a list counts for its `total`: a page of a table of millions costs its rows and
/// at most this many index entries, never a count of the whole table.
pub const LIST_COUNT_CAP: i64 = 10_000;

/// A page of runs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct RunList {
    /// How many runs match the filter, counted up to 10,000: exact when `total_capped` is
    /// false, else a lower bound (more match).
    total: i64,
    /// Whether more runs match than `total` says (the count stopped at 10,000).
    total_capped: bool,
    /// Whether runs past this page match the filter (the next page, at `offset + limit`, is not
    /// empty): page by this, not by `total`.
    has_more: bool,
    /// This page, newest first.
    items: Vec<RunResponse>,
}

/// Lists runs, newest first, a page at a time.
#[utoipa::path(get, path = "/logs", tag = "runs", params(ListQuery), responses(
    (status = 200, body = RunList), BadRequest, Unauthorized, Internal,
))]
async fn list_logs(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<RunList>, ApiError> {
    let state_filter =
        match query.status.as_deref() {
            None | Some("") => None,
            // The spellings of the first API version.
            Some("failure") => Some(RunState::Failed),
            Some("timeout") => Some(RunState::TimedOut),
            Some(other) => Some(other.parse::<RunState>().map_err(|error| {
                ApiError::bad_request("invalid_query", format!("status: {error}"))
            })?),
        };
    let limit = query.limit.unwrap_or(20);
    if !(1..=1000).contains(&limit) || query.offset.is_some_and(|offset| offset < 0) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "limit is 1 to 1000, offset at least 0",
        ));
    }
    let bound = |text: Option<&str>, bound: Bound, name: &str| {
        text.filter(|text| !text.trim().is_empty())
            .map(|text| parse_time_bound(text, bound))
            .transpose()
            .map_err(|error| ApiError::bad_request("invalid_query", format!("{name}: {error}")))
    };
    let from_ms = bound(query.from.as_deref(), Bound::From, "from")?;
    let to_ms = bound(query.to.as_deref(), Bound::To, "to")?;
    if let (Some(from_ms), Some(to_ms)) = (from_ms, to_ms)
        && from_ms > to_ms
    {
        return Err(ApiError::bad_request("invalid_query", "from: after to"));
    }
    let filter = RunFilter {
        job_id: query.job_id,
        state: state_filter,
        from_ms,
        to_ms,
        limit,
        offset: query.offset.unwrap_or(0),
        count_up_to: Some(LIST_COUNT_CAP),
    };
    let page = state.db.list_runs(&filter).await?;
    Ok(axum::Json(RunList {
        total: page.total,
        total_capped: page.total_capped,
        has_more: page.has_more,
        items: page.items.into_iter().map(RunResponse::from).collect(),
    }))
}

/// Shows one run.
#[utoipa::path(get, path = "/logs/{id}", tag = "runs", params(("id" = i64, Path)), responses(
    (status = 200, body = RunResponse), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_log(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<RunResponse>, ApiError> {
    Ok(axum::Json(load(&state, id).await?.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ContentQuery {
    from_line: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct LogContent {
    from_line: i64,
    to_line: i64,
    content: String,
    is_end: bool,
}

/// A page of a run's log, read from its executor.
#[utoipa::path(get, path = "/logs/{id}/content", tag = "runs", params(("id" = i64, Path), ContentQuery), responses(
    (status = 200, body = LogContent), BadRequest, Unauthorized, NotFound, Internal, BadGateway,
))]
async fn log_content(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(query): Query<ContentQuery>,
) -> Result<axum::Json<LogContent>, ApiError> {
    let run = load(&state, id).await?;
    let from_line = query.from_line.unwrap_or(1).max(1);
    let (Some(address), code::SUCCESS) = (&run.executor_address, run.trigger_code) else {
        // Not sent (yet, or ever): there is no log on any executor.
        let is_end = run.state.is_terminal();
        return Ok(axum::Json(LogContent {
            from_line,
            to_line: from_line - 1,
            content: String::new(),
            is_end,
        }));
    };
    let param =
        LogParam { log_date_tim: run.trigger_time_ms, log_id: run.id, from_line_num: from_line };
    let peer = state.dispatcher.peer(address).await;
    let app_name = peer.as_ref().and_then(|peer| peer.app_name_header());
    let page: LogResult = state
        .dispatcher
        .client()
        .call_as(address, "log", &param, app_name)
        .await
        .map_err(|error| ApiError::BadGateway(format!("reading the log from {address}: {error}")))?
        .ok_or_else(|| ApiError::BadGateway(format!("{address} returned no log page")))?;
    Ok(axum::Json(log_page(from_line, page, run.state.is_terminal())))
}

/// Our answer from an executor's page of the log starting at `from_line`.
///
/// The admin decides the end, as XXL-JOB's admin does: the run has a result and the page is past
/// the log's last line. Executors' own `isEnd` is not enough: an XXL-JOB executor always answers
/// `false` for a file that exists (and `true` for one that does not exist, even while the run is
/// still queued). A page past the end is empty and may say `toLineNum: 0` (XXL-JOB 3.x) or the
/// last line (2.x); either way it is answered `to_line = from_line - 1`, so a reader that goes on
/// at `to_line + 1` never starts over at line 1.
fn log_page(from_line: i64, page: LogResult, run_ended: bool) -> LogContent {
    let past_the_end = page.to_line_num < from_line;
    let to_line = if past_the_end { from_line - 1 } else { page.to_line_num };
    let content = if past_the_end && !page.is_end { String::new() } else { page.log_content };
    LogContent { from_line, to_line, content, is_end: run_ended && (past_the_end || page.is_end) }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct KillResponse {
    message: String,
    /// What the kill stops: `run`, `job_queue` (an XXL-JOB executor, whose kill takes only the
    /// job), or `run_or_job_queue` (an executor whose kind the admin does not know yet).
    scope: &'static str,
}

/// Kills a run on its executor.
#[utoipa::path(post, path = "/logs/{id}/kill", tag = "runs", params(("id" = i64, Path)), responses(
    (status = 200, body = KillResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
    BadGateway,
))]
async fn kill_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<KillResponse>, ApiError> {
    let run = load(&state, id).await?;
    // A run whose job was deleted belongs to no group any more: only an admin may kill it.
    let group_id = state.db.get_job(run.job_id).await?.map_or(-1, |job| job.spec.group_id);
    actor.require_group(group_id)?;
    let killed = state
        .dispatcher
        .kill(&run)
        .await
        .map_err(|error| ApiError::BadGateway(format!("{error:#}")))?;
    let what =
        serde_json::json!({"job_id": run.job_id, "message": killed.message, "scope": killed.scope});
    actor.audit(&state, "run.kill", format!("run {id}"), None, Some(&what)).await;
    Ok(axum::Json(KillResponse { message: killed.message, scope: killed.scope }))
}

async fn load(state: &AppState, id: i64) -> Result<RunRecord, ApiError> {
    state
        .db
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found("log_not_found", format!("log {id}")))
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    /// The page asked for, what the executor answered, whether the run has ended.
    type Row<'a> = (i64, (i64, i64, &'a str, bool), bool);

    fn check(rows: &[Row<'_>], expected: Expect) {
        let mut out = String::new();
        for &(from_line, (from_line_num, to_line_num, content, is_end), run_ended) in rows {
            let page =
                LogResult { from_line_num, to_line_num, log_content: content.to_owned(), is_end };
            let ours = log_page(from_line, page, run_ended);
            out.push_str(&format!(
                "from {from_line} ({from_line_num},{to_line_num},{content:?},{is_end}) ended={run_ended} -> to {} {:?} end={}\n",
                ours.to_line, ours.content, ours.is_end
            ));
        }
        expected.assert_eq(&out);
    }

    #[test]
    fn time_bounds_take_dates_local_times_and_instants() {
        let mut out = String::new();
        for text in [
            "2026-01-31",
            "2026-01-31T08:00",
            "2026-01-31T08:00:30",
            "2026-01-31 08:00:30.250",
            "2026-01-31T08:00:00Z",
            "2026-01-31T08:00:00+08:00",
            " 2026-01-31 ",
            "2026-02-30",
            "31/01/2026",
            "yesterday",
            "",
        ] {
            let shown = |bound| match parse_time_bound(text, bound) {
                Ok(ms) => super::super::rfc3339(ms).unwrap_or_default(),
                Err(error) => error.split(':').next().unwrap_or_default().to_owned(),
            };
            out.push_str(&format!(
                "{text:?} from {} to {}\n",
                shown(Bound::From),
                shown(Bound::To)
            ));
        }
        expect![[r#"
            "2026-01-31" from 2026-01-31T00:00:00.000Z to 2026-01-31T23:59:59.999Z
            "2026-01-31T08:00" from 2026-01-31T08:00:00.000Z to 2026-01-31T08:00:00.000Z
            "2026-01-31T08:00:30" from 2026-01-31T08:00:30.000Z to 2026-01-31T08:00:30.000Z
            "2026-01-31 08:00:30.250" from 2026-01-31T08:00:30.250Z to 2026-01-31T08:00:30.250Z
            "2026-01-31T08:00:00Z" from 2026-01-31T08:00:00.000Z to 2026-01-31T08:00:00.000Z
            "2026-01-31T08:00:00+08:00" from 2026-01-31T00:00:00.000Z to 2026-01-31T00:00:00.000Z
            " 2026-01-31 " from 2026-01-31T00:00:00.000Z to 2026-01-31T23:59:59.999Z
            "2026-02-30" from `2026-02-30` is not a time to `2026-02-30` is not a time
            "31/01/2026" from `31/01/2026` is not a time to `31/01/2026` is not a time
            "yesterday" from `yesterday` is not a time to `yesterday` is not a time
            "" from `` is not a time to `` is not a time
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn the_admin_decides_the_end_of_a_log() {
        check(
            &[
                // A Java 2.4 executor: `isEnd` always false, `toLineNum` the file's last line.
                (1, (1, 2, "a\nb\n", false), true),
                (3, (3, 2, "", false), false),
                (3, (3, 2, "", false), true),
                // A Java 3.4 executor: `toLineNum` 0 past the end.
                (3, (3, 0, "", false), false),
                (3, (3, 0, "", false), true),
                // No log file (yet): Java says `isEnd` with a message, whatever the run's state.
                (1, (1, 0, "readLog fail, logFile not exists", true), false),
                (1, (1, 0, "readLog fail, logFile not exists", true), true),
                // A wasmjob executor: its own end, taken once the admin has the result too.
                (1, (1, 2, "a\nb\n", true), false),
                (1, (1, 2, "a\nb\n", true), true),
            ],
            expect![[r#"
                from 1 (1,2,"a\nb\n",false) ended=true -> to 2 "a\nb\n" end=false
                from 3 (3,2,"",false) ended=false -> to 2 "" end=false
                from 3 (3,2,"",false) ended=true -> to 2 "" end=true
                from 3 (3,0,"",false) ended=false -> to 2 "" end=false
                from 3 (3,0,"",false) ended=true -> to 2 "" end=true
                from 1 (1,0,"readLog fail, logFile not exists",true) ended=false -> to 0 "readLog fail, logFile not exists" end=false
                from 1 (1,0,"readLog fail, logFile not exists",true) ended=true -> to 0 "readLog fail, logFile not exists" end=true
                from 1 (1,2,"a\nb\n",true) ended=false -> to 2 "a\nb\n" end=false
                from 1 (1,2,"a\nb\n",true) ended=true -> to 2 "a\nb\n" end=true
            "#]],
        );
    }
}
