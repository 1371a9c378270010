//! Tests of `stream`.

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
async fn a_feed_keeps_its_last_lines_for_streams_that_join_late() {
    let feeds = Feeds::default();
    let tail = Tail::new();
    let feed = Feed { run_id: 7, feeds, tail: Mutex::new(tail) };
    let early = feed.joined(1);
    let content: String = (1..=1500).map(|i| format!("line {i}\n")).collect();
    let page =
        LogResult { from_line_num: 1, to_line_num: 1500, log_content: content, is_end: false };
    assert_eq!(feed.send_page(&page, 1).await, Ok(1501));
    // Sent before the page is skipped; a line longer than the byte bound evicts the rest.
    assert_eq!(feed.send_page(&page, 1501).await, Ok(1501));

    // A stream that joined first has every line in its receiver, up to the channel's size.
    assert_eq!(early.first_line, 1);
    assert!(early.lines.is_empty());
    let late = feed.joined(1);
    assert_eq!(late.first_line, 1500 - FEED_LINES as i64 + 1);
    assert_eq!(late.lines.len(), FEED_LINES);
    let later = feed.joined(1490);
    let numbers: Vec<i64> = later.lines.iter().map(|(line_no, _)| *line_no).collect();
    assert_eq!(numbers, (1490..=1500).collect::<Vec<_>>());
    assert_eq!(&*later.lines[0].1, "line 1490");

    let huge = LogResult {
        from_line_num: 1501,
        to_line_num: 1501,
        log_content: "x".repeat(FEED_BYTES + 1),
        is_end: false,
    };
    assert_eq!(feed.send_page(&huge, 1501).await, Ok(1502));
    let last = feed.joined(1);
    assert_eq!((last.first_line, last.lines.len()), (1502, 0));
}

#[tokio::test]
async fn idle_streams_get_heartbeats() {
    use axum::response::IntoResponse;

    let (sender, receiver) = mpsc::channel(1);
    let shutdown = CancellationToken::new();
    let body = sse(receiver, Duration::from_millis(10), shutdown).into_response().into_body();
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
