//! Following a run's log for its feed: the pushed stream from its executor while the run
//! runs, pages read to catch up, the end event once the run ended, and the backoff between
//! tries.

use super::*;

/// Feeds one client run `run`'s log from `from_line`, then its result: from the run's
/// [`Feed`], reading what it no longer holds from the executor.
pub(super) async fn follow(
    state: AppState,
    run: RunRecord,
    from_line: i64,
    subscriber: Subscriber,
) {
    crate::metrics::admin().log_streams.inc();
    tokio::select! {
        _ = follow_inner(&state, run, from_line, &subscriber) => {}
        () = state.shutdown.cancelled() => {}
    }
    crate::metrics::admin().log_streams.dec();
}

pub(super) async fn follow_inner(
    state: &AppState,
    mut run: RunRecord,
    from_line: i64,
    subscriber: &Subscriber,
) -> Result<(), Gone> {
    let mut next_line = from_line;
    loop {
        let Joined { mut events, first_line, lines, end } =
            state.log_feeds.join(state, &run, next_line);
        if next_line < first_line {
            run = reload(state, run).await;
            next_line = catch_up(state, &run, next_line, first_line, subscriber).await?;
        }
        for (line_no, line) in lines {
            if line_no == next_line {
                subscriber.send(line_event(line_no, &line)).await?;
                next_line += 1;
            }
        }
        if let Some(end) = end {
            return send_end(state, run, &end, next_line, subscriber).await;
        }
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = subscriber.sender.closed() => return Err(Gone),
            };
            match event {
                Ok(FeedEvent::Line(line_no, line)) => {
                    if line_no > next_line {
                        run = reload(state, run).await;
                        next_line = catch_up(state, &run, next_line, line_no, subscriber).await?;
                    }
                    if line_no == next_line {
                        subscriber.send(line_event(line_no, &line)).await?;
                        next_line += 1;
                    }
                }
                Ok(FeedEvent::End(end)) => {
                    return send_end(state, run, &end, next_line, subscriber).await;
                }
                // Fell behind the feed: the next line shows the gap, which is read from the
                // executor.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                // The feed stopped without an end (it found no stream left just as this one
                // joined): join again.
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    }
}

/// Sends the lines up to the end's last line that the stream still lacks, then the end.
pub(super) async fn send_end(
    state: &AppState,
    mut run: RunRecord,
    end: &EndEvent,
    mut next_line: i64,
    subscriber: &Subscriber,
) -> Result<(), Gone> {
    if end.last_line >= next_line {
        run = reload(state, run).await;
        next_line = catch_up(state, &run, next_line, end.last_line + 1, subscriber).await?;
    }
    let end = EndEvent { last_line: next_line - 1, ..end.clone() };
    subscriber.send(Event::default().event("end").json_data(&end).unwrap_or_default()).await
}

/// Sends the lines from `next_line` up to `until` (excluded) read from the run's executor's
/// `/log` pages; the next line's number then.
pub(super) async fn catch_up(
    state: &AppState,
    run: &RunRecord,
    mut next_line: i64,
    until: i64,
    subscriber: &Subscriber,
) -> Result<i64, Gone> {
    let Some(address) = run.executor_address.as_deref() else { return Ok(next_line) };
    let mut failures = 0;
    while next_line < until {
        match read_page(state, run, address, next_line).await {
            Ok(Some(page)) if page.to_line_num >= page.from_line_num => {
                next_line = subscriber.send_page(&page, next_line).await?;
                failures = 0;
                continue;
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(run.id = run.id, %error, "reading run {}'s log", run.id),
        }
        failures += 1;
        if failures > CATCH_UP_ATTEMPTS {
            // The executor cannot give the lines now: end the stream; the client resumes
            // from its last line.
            return Err(Gone);
        }
        tokio::time::sleep(MIN_BACKOFF * failures).await;
    }
    Ok(next_line)
}

/// A page of run `run`'s log from line `from_line`, read from its executor's `/log`.
pub(super) async fn read_page(
    state: &AppState,
    run: &RunRecord,
    address: &str,
    from_line: i64,
) -> Result<Option<LogResult>, crate::protocol::ProtocolError> {
    let param =
        LogParam { log_date_tim: run.trigger_time_ms, log_id: run.id, from_line_num: from_line };
    state.dispatcher.client().call(address, "log", &param).await
}

/// Sends the lines from `next_line` until the executor says the log ended; the next line's
/// number then.
pub(super) async fn follow_executor(
    state: &AppState,
    run: &RunRecord,
    address: &str,
    mut next_line: i64,
    subscriber: &Feed,
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
        match read_page(state, run, address, next_line).await {
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
pub(super) enum Pushed {
    /// At the end of the log; the next line's number.
    Ended(i64),
    /// Cut short (connection lost, silence): resume from this line.
    Cut(i64),
    /// The executor does not push: poll it.
    Unsupported,
}

pub(super) async fn follow_push(
    state: &AppState,
    run: &RunRecord,
    address: &str,
    mut next_line: i64,
    subscriber: &Feed,
) -> Result<Pushed, Gone> {
    let path = format!(
        "log/stream?logId={}&logDateTim={}&fromLineNum={next_line}",
        run.id, run.trigger_time_ms
    );
    // The protocol client, with its rules: no redirect followed, the executor address policy,
    // no proxy, the CA file; and for a stream, a cap per line and a bound on silence.
    let client = state.dispatcher.client();
    let opened = client.get_lines(address, &path, PUSH_CONTENT_TYPE, MAX_PUSH_LINE, PUSH_SILENCE);
    let mut lines = tokio::select! {
        opened = opened => match opened {
            Ok(lines) => lines,
            Err(error) => {
                tracing::debug!(run.id = run.id, %error, "following run {}'s pushed log", run.id);
                return Ok(Pushed::Unsupported);
            }
        },
        gone = subscriber.closed() => return Err(gone),
    };
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            gone = subscriber.closed() => return Err(gone),
        };
        let Ok(Some(line)) = line else {
            return Ok(Pushed::Cut(next_line));
        };
        let Ok(page) = serde_json::from_slice::<LogResult>(&line) else {
            return Ok(Pushed::Cut(next_line));
        };
        next_line = subscriber.send_page(&page, next_line).await?;
        if page.is_end {
            return Ok(Pushed::Ended(next_line));
        }
    }
}

/// The run record again, or the one we had if it cannot be read right now.
pub(super) async fn reload(state: &AppState, run: RunRecord) -> RunRecord {
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
pub(super) struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// The pause after a poll that found nothing new.
    pub(super) fn quiet(&mut self) -> Duration {
        let pause = self.next.unwrap_or(MIN_BACKOFF);
        self.next = Some((pause * 2).min(MAX_BACKOFF));
        pause
    }

    pub(super) fn reset(&mut self) {
        self.next = None;
    }
}
