//! `GET /api/v1/logs/{id}/stream`: a run's log as Server-Sent Events, line by line as the
//! executor writes it, then one `end` event with the run's result.
//!
//! Each line is an event whose id is its line number, so a client that reconnects with
//! `Last-Event-ID: n` gets line n + 1 onwards: no gap, no repeat. (`?from_line=` starts
//! elsewhere on a first connection.) Idle connections get a comment every [`HEARTBEAT`].
//!
//! A stream has a task that follows the log and a queue of [`SUBSCRIBER_EVENTS`] events to the
//! client: memory per subscriber is bounded, and a client that leaves the queue full for
//! [`SLOW_READER_GRACE`] is dropped (its stream ends; it may resume with `Last-Event-ID`).
//!
//! The lines come from the run's executor. A wasmjob executor pushes them (its
//! `GET /log/stream`, JSON lines of `/log` pages); any other executor (XXL-JOB's) answers that
//! with something else, and its `/log` is polled instead, backing off while the log is quiet.
//! Before the run reaches an executor, and after its log ends until its result is recorded,
//! the run record is polled the same way. This file does not read logs itself and keeps no
//! state between streams.

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::error::ApiError;
use super::extract::{Path, Query};
use crate::admin::AppState;
use crate::model::{RunRecord, code};
use crate::protocol::{ACCESS_TOKEN_HEADER, LogParam, LogResult, join_url};

/// How often an idle stream gets a comment, so proxies and clients see it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// The events queued for one client at most.
pub const SUBSCRIBER_EVENTS: usize = 256;
/// How long a client may leave its queue full before it is dropped.
pub const SLOW_READER_GRACE: Duration = Duration::from_secs(10);

/// The longest pause between two polls of a quiet log or run record.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The longest pause between two looks at a run not sent yet: it is usually sent within
/// milliseconds, and its first lines should not wait long.
const MAX_DISPATCH_BACKOFF: Duration = Duration::from_millis(200);
/// The first pause, after a poll that found something.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// How long the push stream may be silent: the executor sends a page every 5 s at least.
const PUSH_SILENCE: Duration = Duration::from_secs(20);
/// The longest JSON line accepted from an executor's push stream.
const MAX_PUSH_LINE: usize = 4 * 1024 * 1024;

pub fn router() -> Router<AppState> {
    Router::new().route("/logs/{id}/stream", get(stream_log))
}

#[derive(Debug, Deserialize)]
struct StreamQuery {
    from_line: Option<i64>,
}

/// The data of the `end` event.
#[derive(Debug, Serialize)]
struct EndEvent {
    state: &'static str,
    handle_code: i32,
    handle_msg: String,
    /// The number of the log's last line (0 when it has none).
    last_line: i64,
}

async fn stream_log(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(query): Query<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let run = state
        .db
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found("log_not_found", format!("log {id}")))?;
    let from_line = match headers.get("last-event-id") {
        Some(value) => {
            let last = value.to_str().ok().and_then(|text| text.trim().parse::<i64>().ok());
            match last {
                Some(last) if last >= 0 => last + 1,
                _ => {
                    return Err(ApiError::bad_request(
                        "invalid_last_event_id",
                        "Last-Event-ID is the number of the last line received",
                    ));
                }
            }
        }
        None => query.from_line.unwrap_or(1).max(1),
    };
    let (sender, receiver) = mpsc::channel(SUBSCRIBER_EVENTS);
    let subscriber = Subscriber { sender, grace: SLOW_READER_GRACE };
    tokio::spawn(
        follow(state, run, from_line, subscriber)
            .instrument(tracing::debug_span!("log_stream", run.id = id)),
    );
    Ok(sse(receiver, HEARTBEAT))
}

/// The SSE response over the events `receiver` gets, with a comment every `heartbeat`.
fn sse(
    receiver: mpsc::Receiver<Event>,
    heartbeat: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok(event), receiver))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat"))
}

/// The client's end of a stream, as seen by the task that follows the log.
struct Subscriber {
    sender: mpsc::Sender<Event>,
    grace: Duration,
}

/// The client left, or was dropped for reading too slowly: stop following.
#[derive(Debug, PartialEq, Eq)]
struct Gone;

impl Subscriber {
    async fn send(&self, event: Event) -> Result<(), Gone> {
        match self.sender.send_timeout(event, self.grace).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                tracing::info!("dropping a log stream subscriber that reads too slowly");
                Err(Gone)
            }
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Gone),
        }
    }

    /// Sleeps `pause`, or less if the client leaves.
    async fn pause(&self, pause: Duration) -> Result<(), Gone> {
        tokio::select! {
            () = tokio::time::sleep(pause) => Ok(()),
            () = self.sender.closed() => Err(Gone),
        }
    }

    /// Sends the lines of `page` (numbered from its `from_line_num`); the next line's number.
    async fn send_page(&self, page: &LogResult, next_line: i64) -> Result<i64, Gone> {
        let mut next_line = next_line;
        for (line_no, line) in (page.from_line_num..).zip(page.log_content.split_terminator('\n')) {
            // A page never starts before the line asked for; skip any overlap all the same.
            if line_no >= next_line {
                self.send(Event::default().id(line_no.to_string()).data(line)).await?;
                next_line = line_no + 1;
            }
        }
        Ok(next_line)
    }
}

/// Follows run `run`'s log from `from_line` to its end, then sends its result.
async fn follow(state: AppState, run: RunRecord, from_line: i64, subscriber: Subscriber) {
    crate::metrics::admin().log_streams.inc();
    let _ = follow_inner(&state, run, from_line, &subscriber).await;
    crate::metrics::admin().log_streams.dec();
}

async fn follow_inner(
    state: &AppState,
    mut run: RunRecord,
    from_line: i64,
    subscriber: &Subscriber,
) -> Result<(), Gone> {
    let mut backoff = Backoff::default();
    // Wait for the run to reach an executor, or to end without one.
    let address = loop {
        match (&run.executor_address, run.trigger_code) {
            (Some(address), code::SUCCESS) => break Some(address.clone()),
            _ if run.state.is_terminal() => break None,
            _ => {}
        }
        subscriber.pause(backoff.quiet().min(MAX_DISPATCH_BACKOFF)).await?;
        run = reload(state, run).await;
    };
    let mut next_line = from_line;
    if let Some(address) = address {
        next_line = follow_executor(state, &run, &address, next_line, subscriber).await?;
    }
    let mut backoff = Backoff::default();
    while !run.state.is_terminal() {
        subscriber.pause(backoff.quiet()).await?;
        run = reload(state, run).await;
    }
    let end = EndEvent {
        state: run.state.as_str(),
        handle_code: run.handle_code,
        handle_msg: run.handle_msg.clone(),
        last_line: next_line - 1,
    };
    let event = Event::default().event("end").json_data(&end).unwrap_or_default();
    subscriber.send(event).await
}

/// Sends the lines from `next_line` until the executor says the log ended; the next line's
/// number then.
async fn follow_executor(
    state: &AppState,
    run: &RunRecord,
    address: &str,
    mut next_line: i64,
    subscriber: &Subscriber,
) -> Result<i64, Gone> {
    let mut backoff = Backoff::default();
    let mut push = true;
    loop {
        if push {
            match follow_push(state, run, address, next_line, subscriber).await? {
                Pushed::Ended(line) => return Ok(line),
                Pushed::Cut(line) => next_line = line,
                Pushed::Unsupported => push = false,
            }
        }
        let param = LogParam {
            log_date_tim: run.trigger_time_ms,
            log_id: run.id,
            from_line_num: next_line,
        };
        let page: Result<Option<LogResult>, _> =
            state.dispatcher.client().call(address, "log", &param).await;
        match page {
            Ok(Some(page)) => {
                let has_lines = page.to_line_num >= page.from_line_num;
                next_line = subscriber.send_page(&page, next_line).await?;
                if page.is_end {
                    return Ok(next_line);
                }
                if has_lines {
                    backoff.reset();
                    continue;
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(run.id = run.id, %error, "reading run {}'s log", run.id);
            }
        }
        subscriber.pause(backoff.quiet()).await?;
    }
}

/// How a push stream ended.
enum Pushed {
    /// At the end of the log; the next line's number.
    Ended(i64),
    /// Cut short (connection lost, silence): resume from this line.
    Cut(i64),
    /// The executor does not push: poll it.
    Unsupported,
}

async fn follow_push(
    state: &AppState,
    run: &RunRecord,
    address: &str,
    mut next_line: i64,
    subscriber: &Subscriber,
) -> Result<Pushed, Gone> {
    let url = format!(
        "{}?logId={}&logDateTim={}&fromLineNum={next_line}",
        join_url(address, "log/stream"),
        run.id,
        run.trigger_time_ms
    );
    let request =
        push_client().get(&url).header(ACCESS_TOKEN_HEADER, &state.config.access_token).send();
    let mut response = tokio::select! {
        response = request => match response {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(run.id = run.id, %error, "following {url}");
                return Ok(Pushed::Unsupported);
            }
        },
        () = subscriber.sender.closed() => return Err(Gone),
    };
    let is_json_lines = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/x-ndjson"));
    if !response.status().is_success() || !is_json_lines {
        return Ok(Pushed::Unsupported);
    }
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            chunk = tokio::time::timeout(PUSH_SILENCE, response.chunk()) => chunk,
            () = subscriber.sender.closed() => return Err(Gone),
        };
        let Ok(Ok(Some(chunk))) = chunk else {
            return Ok(Pushed::Cut(next_line));
        };
        buffer.extend_from_slice(&chunk);
        while let Some(newline) = buffer.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = buffer.drain(..=newline).collect();
            let Ok(page) = serde_json::from_slice::<LogResult>(&line) else {
                return Ok(Pushed::Cut(next_line));
            };
            next_line = subscriber.send_page(&page, next_line).await?;
            if page.is_end {
                return Ok(Pushed::Ended(next_line));
            }
        }
        if buffer.len() > MAX_PUSH_LINE {
            return Ok(Pushed::Cut(next_line));
        }
    }
}

/// The client for push streams: no overall timeout, since a stream lasts as long as its run.
fn push_client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .build()
            .unwrap_or_default()
    })
}

/// The run record again, or the one we had if it cannot be read right now.
async fn reload(state: &AppState, run: RunRecord) -> RunRecord {
    match state.db.get_run(run.id).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => run,
        Err(error) => {
            tracing::warn!(run.id = run.id, %error, "reading run {} for its log stream", run.id);
            run
        }
    }
}

/// Pauses that double while nothing changes, from [`MIN_BACKOFF`] to [`MAX_BACKOFF`].
#[derive(Default)]
struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// The pause after a poll that found nothing new.
    fn quiet(&mut self) -> Duration {
        let pause = self.next.unwrap_or(MIN_BACKOFF);
        self.next = Some((pause * 2).min(MAX_BACKOFF));
        pause
    }

    fn reset(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_reader_that_leaves_its_queue_full_is_dropped() {
        let (sender, mut receiver) = mpsc::channel(2);
        let subscriber = Subscriber { sender, grace: Duration::from_millis(10) };
        let page = LogResult {
            from_line_num: 1,
            to_line_num: 3,
            log_content: "a\nb\nc\n".to_owned(),
            is_end: false,
        };
        // Two lines fit the queue; the third waits for the grace period, then gives up.
        assert_eq!(subscriber.send_page(&page, 1).await, Err(Gone));
        assert!(receiver.recv().await.is_some());
        assert!(receiver.recv().await.is_some());
        // A client that left is gone at once.
        let subscriber = Subscriber { sender: mpsc::channel(8).0, grace: Duration::ZERO };
        assert_eq!(subscriber.send_page(&page, 1).await, Err(Gone));
        // Lines before the next one wanted are not sent again.
        let (sender, _receiver) = mpsc::channel(8);
        let subscriber = Subscriber { sender, grace: Duration::ZERO };
        assert_eq!(subscriber.send_page(&page, 3).await, Ok(4));
    }

    #[tokio::test]
    async fn idle_streams_get_heartbeats() {
        use axum::response::IntoResponse;

        let (sender, receiver) = mpsc::channel(1);
        let body = sse(receiver, Duration::from_millis(10)).into_response().into_body();
        let mut frames = body.into_data_stream();
        let first = frames.next().await.and_then(Result::ok).unwrap_or_default();
        assert_eq!(String::from_utf8_lossy(&first), ": heartbeat\n\n");
        sender.send(Event::default().id("1").data("a")).await.ok();
        let mut next = frames.next().await.and_then(Result::ok).unwrap_or_default();
        while next.as_ref() == b": heartbeat\n\n" {
            next = frames.next().await.and_then(Result::ok).unwrap_or_default();
        }
        assert_eq!(String::from_utf8_lossy(&next), "id: 1\ndata: a\n\n");
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::default();
        let pauses: Vec<u128> = (0..8).map(|_| backoff.quiet().as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.quiet(), MIN_BACKOFF);
    }
}
