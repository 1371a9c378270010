//! A Server-Sent Events reader for the admin's log streams.

use std::time::Duration;

use reqwest::StatusCode;

use super::Api;

/// One Server-Sent Event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// A strict enough SSE reader over a response body: `id`, `event` and `data` fields, comments
/// skipped, an event ends at a blank line.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
    pending: SseEvent,
    /// Comments (heartbeats) seen so far.
    pub comments: usize,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> SseReader {
        SseReader { response, buffer: String::new(), pending: SseEvent::default(), comments: 0 }
    }

    /// The next event, or `None` when the stream ended. Gives up after 30 s of silence.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            while let Some(newline) = self.buffer.find('\n') {
                let line: String = self.buffer.drain(..=newline).collect();
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if self.pending.id.is_some() || self.pending.event.is_some() {
                        return Some(std::mem::take(&mut self.pending));
                    }
                    continue;
                }
                if line.starts_with(':') {
                    self.comments += 1;
                    continue;
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                match field {
                    "id" => self.pending.id = Some(value),
                    "event" => self.pending.event = Some(value),
                    "data" if self.pending.data.is_empty() => self.pending.data = value,
                    "data" => self.pending.data = format!("{}\n{value}", self.pending.data),
                    other => panic!("unexpected SSE field {other:?} in {line:?}"),
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("the stream went silent for 30 s")
                .expect("reading the stream")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8 events"));
        }
    }
}

/// Opens run `log_id`'s stream, resuming after `last_event_id` if given.
pub async fn open_stream(api: &Api, log_id: i64, last_event_id: Option<&str>) -> SseReader {
    let mut request =
        api.http.get(api.url(&format!("/api/v1/logs/{log_id}/stream"))).bearer_auth(&api.token);
    if let Some(last) = last_event_id {
        request = request.header("last-event-id", last);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    SseReader::new(response)
}
