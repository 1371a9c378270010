//! `GET /api/v1/logs/{id}/stream`: a run's log as Server-Sent Events, line by line as the
//! executor writes it, then one `end` event with the run's result.
//!
//! Each line is an event whose id is its line number, so a client that reconnects with
//! `Last-Event-ID: n` gets line n + 1 onwards: no gap, no repeat. (`?from_line=` starts
//! elsewhere on a first connection.) Idle connections get a comment every [`HEARTBEAT`].
//!
//! Each stream has a queue of [`SUBSCRIBER_EVENTS`] events to the client: memory per subscriber
//! is bounded, and a client that leaves the queue full for [`SLOW_READER_GRACE`] is dropped
//! (its stream ends; it may resume with `Last-Event-ID`).
//!
//! The lines come from the run's executor, read once per run however many watch it: a run's
//! streams share one [`Feed`], a task that follows the log, broadcasts each line and keeps the
//! last [`FEED_LINES`] for streams that join late. A stream that wants older lines, or falls
//! more than [`FEED_EVENTS`] lines behind, reads the lines it lacks from the executor's `/log`
//! pages itself, then takes the broadcast again. A
//! wasmjob executor pushes the lines to the feed (its `GET /log/stream`, JSON lines of `/log`
//! pages, read through the protocol client like every call to an executor, by its rules);
//! any other executor (XXL-JOB's) answers that with something else, and its `/log` is
//! polled instead, backing off while the log is quiet. Before the run reaches an executor, and
//! after its log ends until its result is recorded, the feed polls the run record the same way.
//! A feed stops once no stream is left. Every stream and feed ends when the admin stops, so
//! that open streams do not hold its shutdown (a client resumes with `Last-Event-ID`).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::ApiError;
use super::error::{BadRequest, Internal, NotFound, Unauthorized};
use super::extract::{Path, Query};
use crate::admin::AppState;
use crate::model::{RunRecord, code};
use crate::protocol::{LogParam, LogResult};

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
/// The events a feed holds for a stream that has not taken them yet; one further behind reads
/// what it missed from the executor.
const FEED_EVENTS: usize = 1024;
/// The most recent lines a feed keeps for streams that join late.
const FEED_LINES: usize = 1024;
/// The most bytes of recent lines a feed keeps.
const FEED_BYTES: usize = 1024 * 1024;
/// How often a feed looks whether any stream is left while it waits.
const FEED_CHECK: Duration = Duration::from_millis(500);
/// How many times in a row a stream catching up may find the executor without the lines.
const CATCH_UP_ATTEMPTS: u32 = 5;
/// The longest JSON line accepted from an executor's push stream.
const MAX_PUSH_LINE: usize = 4 * 1024 * 1024;
/// What an executor's push stream is: JSON lines.
const PUSH_CONTENT_TYPE: &str = "application/x-ndjson";

pub fn router() -> Router<AppState> {
    Router::new().route("/logs/{id}/stream", get(stream_log))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// The first line to send (default 1), unless `Last-Event-ID` says where to resume.
    from_line: Option<i64>,
}

/// The data of the `end` event.
#[derive(Debug, Clone, Serialize)]
struct EndEvent {
    state: &'static str,
    handle_code: i32,
    handle_msg: String,
    /// The number of the log's last line (0 when it has none).
    last_line: i64,
}

/// A run's log as Server-Sent Events: one event per line (its id the line number), then an
/// `end` event with the run's result as JSON.
#[utoipa::path(get, path = "/logs/{id}/stream", tag = "runs",
    params(
        ("id" = i64, Path),
        StreamQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "The number of the last line received: the stream resumes after it."),
    ),
    responses(
        (status = 200, description = "The stream.", content_type = "text/event-stream", body = String),
        BadRequest, Unauthorized, NotFound, Internal,
))]
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
    let shutdown = state.shutdown.clone();
    tokio::spawn(
        follow(state, run, from_line, subscriber)
            .instrument(tracing::debug_span!("log_stream", run.id = id)),
    );
    Ok(sse(receiver, HEARTBEAT, shutdown))
}

/// The SSE response over the events `receiver` gets, with a comment every `heartbeat`. It ends
/// when the admin stops (`shutdown`), so that an open stream does not hold the server's
/// graceful shutdown; the client resumes from its last line on the next admin.
fn sse(
    receiver: mpsc::Receiver<Event>,
    heartbeat: Duration,
    shutdown: CancellationToken,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok(event), receiver))
    });
    let events = events.take_until(shutdown.cancelled_owned());
    Sse::new(events).keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat"))
}

/// The client's end of a stream, as seen by the task that feeds it.
struct Subscriber {
    sender: mpsc::Sender<Event>,
    grace: Duration,
}

/// The client left, or was dropped for reading too slowly; or, for a [`Feed`], every
/// subscriber left: stop.
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

    /// Sends the lines of `page` (numbered from its `from_line_num`); the next line's number.
    async fn send_page(&self, page: &LogResult, next_line: i64) -> Result<i64, Gone> {
        let mut next_line = next_line;
        for (line_no, line) in (page.from_line_num..).zip(page.log_content.split_terminator('\n')) {
            // A page never starts before the line asked for; skip any overlap all the same.
            if line_no >= next_line {
                self.send(line_event(line_no, line)).await?;
                next_line = line_no + 1;
            }
        }
        Ok(next_line)
    }
}

fn line_event(line_no: i64, line: &str) -> Event {
    Event::default().id(line_no.to_string()).data(line)
}

/// The runs whose logs are followed now, each by one [`Feed`] that all its streams share: a
/// thousand clients watching one run cost its executor one push stream, not a thousand.
#[derive(Clone, Default)]
pub struct Feeds(Arc<Mutex<HashMap<i64, Arc<Feed>>>>);

/// What a feed broadcasts.
#[derive(Clone)]
enum FeedEvent {
    /// A line and its number.
    Line(i64, Arc<str>),
    /// The log ended and the run has its result.
    End(Arc<EndEvent>),
}

/// One run's log as its executor writes it, broadcast to the run's streams by one task, which
/// also keeps the last [`FEED_LINES`] lines (at most [`FEED_BYTES`]) for streams that join late.
/// A stream that wants older lines, or falls more than [`FEED_EVENTS`] events behind, reads the
/// lines it lacks from the executor's `/log` pages itself.
struct Feed {
    run_id: i64,
    feeds: Feeds,
    /// Taken to send an event and to join, so a joining stream finds each line either in the
    /// tail or in its receiver.
    tail: Mutex<Tail>,
}

struct Tail {
    events: broadcast::Sender<FeedEvent>,
    /// The last lines sent, oldest first.
    lines: VecDeque<(i64, Arc<str>)>,
    bytes: usize,
    /// The number of the next line to send: every line before it went out.
    next_line: i64,
    /// The end, once sent.
    end: Option<Arc<EndEvent>>,
}

impl Tail {
    /// A feed's state before its first line.
    fn new() -> Tail {
        Tail {
            events: broadcast::channel(FEED_EVENTS).0,
            lines: VecDeque::new(),
            bytes: 0,
            next_line: 1,
            end: None,
        }
    }
}

/// What a stream finds when it joins a feed.
struct Joined {
    events: broadcast::Receiver<FeedEvent>,
    /// The number of the oldest line the feed still holds (its next line when it holds none).
    first_line: i64,
    /// The lines held from the stream's next line on.
    lines: Vec<(i64, Arc<str>)>,
    end: Option<Arc<EndEvent>>,
}

impl Feeds {
    /// Joins run `run`'s feed (starting it if none runs) wanting lines from `from_line` on.
    fn join(&self, state: &AppState, run: &RunRecord, from_line: i64) -> Joined {
        let mut feeds = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(feed) = feeds.get(&run.id) {
            return feed.joined(from_line);
        }
        let tail = Tail::new();
        let feed = Arc::new(Feed { run_id: run.id, feeds: self.clone(), tail: Mutex::new(tail) });
        feeds.insert(run.id, feed.clone());
        let joined = feed.joined(from_line);
        tokio::spawn(
            feed.run(state.clone(), run.clone())
                .instrument(tracing::debug_span!("log_feed", run.id = run.id)),
        );
        joined
    }
}

impl Feed {
    fn tail(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn joined(&self, from_line: i64) -> Joined {
        let tail = self.tail();
        Joined {
            events: tail.events.subscribe(),
            first_line: tail.lines.front().map_or(tail.next_line, |(line_no, _)| *line_no),
            lines: tail
                .lines
                .iter()
                .filter(|(line_no, _)| *line_no >= from_line)
                .cloned()
                .collect(),
            end: tail.end.clone(),
        }
    }

    /// Follows the log to its end, then the run record to its result, or until the admin stops.
    async fn run(self: Arc<Self>, state: AppState, run: RunRecord) {
        tokio::select! {
            _ = self.follow(&state, run) => {}
            () = state.shutdown.cancelled() => {}
        }
        // Whether it ended or everyone left: forget it, so that a later stream starts afresh.
        let mut feeds = self.feeds.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if feeds.get(&self.run_id).is_some_and(|feed| Arc::ptr_eq(feed, &self)) {
            feeds.remove(&self.run_id);
        }
    }

    async fn follow(&self, state: &AppState, mut run: RunRecord) -> Result<(), Gone> {
        let mut backoff = Backoff::default();
        // Wait for the run to reach an executor, or to end without one.
        let address = loop {
            match (&run.executor_address, run.trigger_code) {
                (Some(address), code::SUCCESS) => break Some(address.clone()),
                _ if run.state.is_terminal() => break None,
                _ => {}
            }
            self.pause(backoff.quiet().min(MAX_DISPATCH_BACKOFF)).await?;
            run = reload(state, run).await;
        };
        if let Some(address) = address {
            follow_executor(state, &run, &address, 1, self).await?;
        }
        let mut backoff = Backoff::default();
        while !run.state.is_terminal() {
            self.pause(backoff.quiet()).await?;
            run = reload(state, run).await;
        }
        let mut tail = self.tail();
        let end = Arc::new(EndEvent {
            state: run.state.as_str(),
            handle_code: run.handle_code,
            handle_msg: run.handle_msg.clone(),
            last_line: tail.next_line - 1,
        });
        tail.end = Some(end.clone());
        let _ = tail.events.send(FeedEvent::End(end));
        Ok(())
    }

    /// Sends the lines of `page` from `next_line` on; the next line's number.
    async fn send_page(&self, page: &LogResult, next_line: i64) -> Result<i64, Gone> {
        let mut next_line = next_line;
        let mut tail = self.tail();
        for (line_no, line) in (page.from_line_num..).zip(page.log_content.split_terminator('\n')) {
            if line_no >= next_line {
                let line: Arc<str> = Arc::from(line);
                tail.bytes += line.len();
                tail.lines.push_back((line_no, line.clone()));
                while tail.lines.len() > FEED_LINES || tail.bytes > FEED_BYTES {
                    let Some((_, old)) = tail.lines.pop_front() else { break };
                    tail.bytes -= old.len();
                }
                tail.next_line = line_no + 1;
                let _ = tail.events.send(FeedEvent::Line(line_no, line));
                next_line = line_no + 1;
            }
        }
        drop(tail);
        self.still_watched()?;
        Ok(next_line)
    }

    /// Sleeps `pause`, or less if every stream leaves.
    async fn pause(&self, pause: Duration) -> Result<(), Gone> {
        tokio::select! {
            () = tokio::time::sleep(pause) => self.still_watched(),
            gone = self.closed() => Err(gone),
        }
    }

    /// Returns once no stream is left (checked every [`FEED_CHECK`]).
    async fn closed(&self) -> Gone {
        loop {
            tokio::time::sleep(FEED_CHECK).await;
            if let Err(gone) = self.still_watched() {
                return gone;
            }
        }
    }

    /// `Gone` once no stream is left. Decided under the feeds' lock, where streams join, and
    /// then the feed is forgotten at once, so a stream joins a feed that will feed it or a
    /// new one.
    fn still_watched(&self) -> Result<(), Gone> {
        let watched = || self.tail().events.receiver_count() > 0;
        if watched() {
            return Ok(());
        }
        let mut feeds = self.feeds.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if watched() {
            return Ok(());
        }
        if feeds.get(&self.run_id).is_some_and(|feed| std::ptr::eq(Arc::as_ptr(feed), self)) {
            feeds.remove(&self.run_id);
        }
        Err(Gone)
    }
}

mod follow;
#[cfg(test)]
mod tests;

use self::follow::{Backoff, follow, follow_executor, reload};
