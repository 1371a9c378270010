//! The executor API (XXL-JOB's executor protocol): `/beat`, `/idleBeat`, `/run`, `/trigger`,
//! `/kill`, `/log`, each a `POST` answered with the envelope.
//!
//! A call without the right `XXL-JOB-ACCESS-TOKEN` is answered with a `code 500` envelope and
//! does nothing. A malformed body is a `code 500` envelope naming the problem: the protocol has
//! no other error channel, and XXL-JOB admins read only the envelope.
//!
//! `/run` answers success only once the acceptance is durable in the run journal, with `content`
//! [`run_reply::ACCEPTED`]; a `logId` accepted before is answered with code 200, a message
//! saying so and `content` naming where that run is ([`run_reply`]), and is not run again.
//!
//! A trigger is refused (`code 500` and the reason) when its job's queue or the executor's bytes
//! of held triggers are full, and once the executor is stopping; ids that are not positive are
//! refused on every route.
//!
//! `/runs` is wasmjob's batch extension: a JSON array of triggers, each judged as `/run` would
//! judge it, answered with the array of their envelopes, in order, inside one envelope. The
//! acceptances of a batch share one journal sync. A panic while one trigger is judged (a bug)
//! refuses that trigger alone; the others of its batch are answered for what happened to them.
//!
//! `GET /log/stream?logId=&logDateTim=&fromLineNum=` is wasmjob's push extension of `/log`: the
//! same pages as JSON lines, each sent as soon as the run writes (an empty one every
//! `logs::follow::FOLLOW_IDLE` while it is quiet), the last with `isEnd`.
//!
//! `GET /metrics` is the executor's Prometheus metrics (`crate::metrics`), for the access token
//! in either header or as `Authorization: Bearer`.
//!
//! `GET /healthz` (the process answers) and `GET /readyz` (200 when its last registration with
//! an admin succeeded within three heartbeat intervals, else 503 saying why: `crate::readiness`)
//! are for probes and take no token.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::logs::{LogStore, follow_json_lines};
use super::worker::{Pushed, Workers};
use crate::access::constant_time_eq;
use crate::protocol::{
    ACCESS_TOKEN_HEADER, JobIdParam, LogParam, LogResult, ProtocolJson, ReturnT, TriggerParam,
    run_reply,
};
use crate::readiness::{Pulse, Readiness};

/// The largest `/runs` body: the admin splits its batches well below this.
const MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct ExecutorState {
    /// The job workers.
    pub workers: Workers,
    /// The run logs.
    pub logs: LogStore,
    /// The admin⇄executor token.
    pub access_token: Arc<str>,
    /// When a registration with an admin last succeeded (`/readyz`).
    pub registered: Arc<Pulse>,
    /// How old that registration may be: the admins' online window, three heartbeat intervals.
    pub registered_max_age_ms: i64,
}

/// The executor API's router.
pub fn router(state: ExecutorState) -> Router {
    Router::new()
        .route("/beat", post(beat))
        .route("/idleBeat", post(idle_beat))
        .route("/run", post(run))
        .route("/trigger", post(run))
        .route("/runs", post(runs).layer(DefaultBodyLimit::max(MAX_BATCH_BYTES)))
        .route("/kill", post(kill))
        .route("/log", post(log))
        .route("/log/stream", get(log_stream))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn require_token(
    State(state): State<ExecutorState>,
    request: Request,
    next: Next,
) -> Response {
    if !token_matches(request.headers(), &state.access_token) {
        return Json(ReturnT::fail("The access token is wrong.")).into_response();
    }
    next.run(request).await
}

/// Whether `headers` carry `expected` as the access token.
pub fn token_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(ACCESS_TOKEN_HEADER)
        .is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()))
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the last registration with an admin succeeded, within the admins' online window.
async fn readyz(State(state): State<ExecutorState>) -> Readiness {
    let mut readiness = Readiness::default();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let registered =
        state.registered.check("registered with an admin", state.registered_max_age_ms, now_ms);
    readiness.check("registered", registered);
    readiness
}

async fn beat() -> Json<ReturnT<String>> {
    Json(ReturnT::success())
}

async fn idle_beat(
    State(state): State<ExecutorState>,
    ProtocolJson(param): ProtocolJson<JobIdParam>,
) -> Json<ReturnT<String>> {
    if param.job_id <= 0 {
        return Json(ReturnT::fail("jobId must be a positive job id"));
    }
    if state.workers.is_idle(param.job_id) {
        Json(ReturnT::success())
    } else {
        Json(ReturnT::fail("job thread is running or has trigger queue."))
    }
}

async fn run(
    State(state): State<ExecutorState>,
    ProtocolJson(param): ProtocolJson<TriggerParam>,
) -> Json<ReturnT<String>> {
    let mut replies = accept(&state, vec![param]).await;
    Json(replies.pop().unwrap_or_else(|| ReturnT::fail("internal error: no reply")))
}

async fn runs(
    State(state): State<ExecutorState>,
    ProtocolJson(params): ProtocolJson<Vec<TriggerParam>>,
) -> Json<ReturnT<Vec<ReturnT<String>>>> {
    let replies = accept(&state, params).await;
    Json(ReturnT { code: 200, msg: None, content: Some(replies), data: None })
}

/// Judges each trigger as `/run` does and answers each, in order, once every acceptance among
/// them is durable (one journal sync for all of them).
///
/// A panic while one trigger is judged (a bug) refuses that trigger alone: the triggers accepted
/// before it in the batch are still confirmed and answered as accepted (refusing them would have
/// the admin send elsewhere runs that run here), the ones after it are judged as usual, and the
/// workers' locks it held do not refuse later triggers (`worker.rs`).
async fn accept(state: &ExecutorState, params: Vec<TriggerParam>) -> Vec<ReturnT<String>> {
    let ids: Vec<(i64, i64)> = params.iter().map(|param| (param.job_id, param.log_id)).collect();
    let workers = state.workers.clone();
    let pushed = tokio::task::spawn_blocking(move || {
        let mut pushed: Vec<Result<Pushed, String>> = params
            .into_iter()
            .map(|param| {
                let (job_id, log_id, log_date_time) =
                    (param.job_id, param.log_id, param.log_date_time);
                let judged =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| workers.push(param)));
                judged.unwrap_or_else(|panic| {
                    let what = panic_message(panic.as_ref());
                    let reason = format!("internal error while accepting run {log_id}: {what}");
                    workers.settle_panic(job_id, log_id, log_date_time, &reason);
                    Err(reason)
                })
            })
            .collect();
        let last = pushed.iter().rev().find_map(|pushed| match pushed {
            Ok(Pushed::Accepted(ticket)) => Some(*ticket),
            _ => None,
        });
        if let Some(Err(error)) = last.map(|ticket| workers.confirm(ticket)) {
            for pushed in &mut pushed {
                if matches!(pushed, Ok(Pushed::Accepted(_))) {
                    *pushed = Err(error.clone());
                }
            }
        }
        pushed
    })
    .await
    .unwrap_or_else(|error| ids.iter().map(|_| Err(format!("internal error: {error}"))).collect());
    ids.iter()
        .zip(pushed)
        .map(|(&(job_id, log_id), pushed)| reply(job_id, log_id, pushed))
        .collect()
}

/// The message a panic was raised with.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => (*message).to_owned(),
        (None, Some(message)) => message.clone(),
        (None, None) => "a panic".to_owned(),
    }
}

fn reply(job_id: i64, log_id: i64, pushed: Result<Pushed, String>) -> ReturnT<String> {
    let (message, content) = match pushed {
        Ok(Pushed::Accepted(_)) => {
            crate::failpoint::hit("executor.after_accept");
            tracing::debug!(job.id = job_id, run.id = log_id, "run {log_id} accepted");
            (run_reply::ACCEPTED.to_owned(), run_reply::ACCEPTED)
        }
        Ok(Pushed::Duplicate(run_state)) => {
            let content = run_state.reply();
            tracing::info!(
                job.id = job_id,
                run.id = log_id,
                "trigger for run {log_id} again: it is {content}"
            );
            (format!("duplicate logId {log_id}: {content}"), content)
        }
        Err(reason) => {
            tracing::info!(
                job.id = job_id,
                run.id = log_id,
                "trigger for run {log_id} refused: {reason}"
            );
            return ReturnT::fail(reason);
        }
    };
    let content = Some(content.to_owned());
    ReturnT { code: 200, msg: Some(message), content: content.clone(), data: content }
}

async fn kill(
    State(state): State<ExecutorState>,
    ProtocolJson(param): ProtocolJson<JobIdParam>,
) -> Json<ReturnT<String>> {
    if param.job_id <= 0 || param.log_id.is_some_and(|log_id| log_id <= 0) {
        return Json(ReturnT::fail("jobId (and logId, when given) must be positive ids"));
    }
    let workers = state.workers.clone();
    // Killing a queued run reports it, which syncs the outbox: off the async runtime.
    let found = tokio::task::spawn_blocking(move || workers.kill(param.job_id, param.log_id)).await;
    if found.unwrap_or(false) {
        Json(ReturnT::success())
    } else {
        Json(ReturnT {
            code: 200,
            msg: Some("job thread already killed.".to_owned()),
            content: None,
            data: None,
        })
    }
}

async fn log(
    State(state): State<ExecutorState>,
    ProtocolJson(param): ProtocolJson<LogParam>,
) -> Json<ReturnT<LogResult>> {
    if param.log_id <= 0 {
        return Json(ReturnT {
            code: 500,
            msg: Some("logId must be a positive run id".to_owned()),
            content: None,
            data: None,
        });
    }
    let logs = state.logs.clone();
    let page = tokio::task::spawn_blocking(move || {
        logs.read(param.log_id, param.log_date_tim, param.from_line_num)
    })
    .await;
    match page {
        Ok(Ok(page)) => Json(ReturnT::ok(page)),
        Ok(Err(error)) => Json(ReturnT {
            code: 500,
            msg: Some(format!("reading log: {error}")),
            content: None,
            data: None,
        }),
        Err(error) => Json(ReturnT {
            code: 500,
            msg: Some(format!("reading log: {error}")),
            content: None,
            data: None,
        }),
    }
}

/// The query of `/log/stream`, spelled as `/log`'s body.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogStreamQuery {
    log_id: i64,
    log_date_tim: i64,
    from_line_num: Option<i64>,
}

async fn log_stream(
    State(state): State<ExecutorState>,
    query: Result<axum::extract::Query<LogStreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(query)) = query else {
        return Json(ReturnT::<String>::fail("invalid query: logId and logDateTim are numbers"))
            .into_response();
    };
    crate::metrics::executor().log_streams.inc();
    let follower =
        state.logs.follow(query.log_id, query.log_date_tim, query.from_line_num.unwrap_or(1));
    let body = axum::body::Body::from_stream(follow_json_lines(follower));
    ([(axum::http::header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// Prometheus metrics, for the access token as `XXL-JOB-ACCESS-TOKEN` or as a bearer token
/// (what Prometheus's `authorization` setting sends).
async fn metrics(State(state): State<ExecutorState>, headers: HeaderMap) -> Response {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let bearer_matches = bearer.is_some_and(|token| {
        constant_time_eq(token.trim().as_bytes(), state.access_token.as_bytes())
    });
    if !bearer_matches && !token_matches(&headers, &state.access_token) {
        return (axum::http::StatusCode::UNAUTHORIZED, "the access token is wrong\n")
            .into_response();
    }
    let text = crate::metrics::executor().encode(&state.workers.levels());
    ([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}
