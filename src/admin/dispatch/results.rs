//! Applying the results an executor's callback carries, within a time budget.
//!
//! An XXL-JOB executor waits at most 3 s for the answer to `/api/callback` and, without one,
//! keeps the whole batch and sends it again later; after an outage its batch holds everything it
//! kept meanwhile, tens of thousands of results. So a callback is applied a chunk at a time
//! ([`CHUNK`] results: one read, then their writes sharing the database's group commits) for
//! the admin's apply time (`--callback-apply-ms`, [`super::APPLY_WITHIN`] by default). What is
//! left then of a callback of more than one chunk is recorded in the inbox (`inbox.rs`), applied right after in the background, and
//! the callback is acknowledged: a burst's callback of thousands of results is answered in
//! about that time, not in the time its results take to apply.
//!
//! When the inbox has no room (or cannot record in time), no chunk starts once
//! [`ANSWER_WITHIN`] has passed. The first chunk is then waited for up to
//! [`FIRST_CHUNK_WITHIN`], so that a small callback is not sent back for want of a few
//! milliseconds, and no longer: the answer never takes much more than a second, at any load. A
//! chunk still in flight at the answer goes on to its end, so a loaded database still records
//! something of every callback. The answer then says which: every result recorded, or some of
//! them and "send again" ([`protocol::CALLBACK_BUSY`]). A result applies once, so the ones
//! recorded before are ignored when the batch comes again.

use foldhash::HashMap;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::Dispatcher;
use crate::failpoint;
use crate::lifecycle::Event;
use crate::model::{RunRecord, TriggerType};
use crate::protocol::HandleCallbackParam;

/// The most results applied together: one read of their runs, their writes in flight at once.
pub(super) const CHUNK: usize = 512;
/// When the rest of a callback cannot be recorded, it is answered within this much time of its
/// parse: no chunk starts after it, and a chunk still in flight then is left to finish on its
/// own (a chunk whose writes take longer than this still makes progress, one chunk per
/// callback).
pub const ANSWER_WITHIN: Duration = Duration::from_millis(800);
/// How long the first chunk is waited for, past [`ANSWER_WITHIN`] when it must, and how long the
/// rest of a callback may take to record: the answer comes within a second of the parse, well
/// inside XXL-JOB's 3 s client timeout.
pub const FIRST_CHUNK_WITHIN: Duration = Duration::from_millis(950);

/// What came of a callback's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Every result was applied (or had nothing to apply to), or recorded to be applied.
    All,
    /// Some could not be applied (an error); the executor should send them again.
    Failed,
    /// The callback's time passed with `recorded` of the results applied, and the rest could
    /// not be recorded; the executor should send the rest again.
    Partly { recorded: usize },
}

impl Dispatcher {
    /// Applies one callback's results, from `body`, within its time, and records the rest.
    /// Each result is applied on its own, so one that cannot be applied does not hold back the
    /// others, and a chunk's all at once, so that their writes share the database's group
    /// commits.
    pub async fn apply_results(&self, body: &[u8], results: Vec<HandleCallbackParam>) -> Applied {
        crate::metrics::admin().callback_batch_size.observe(results.len() as f64);
        let started = tokio::time::Instant::now();
        let results: Arc<[HandleCallbackParam]> = results.into();
        // A callback of one chunk is applied as it comes, unless the apply time is none:
        // recording it would add a write and a delete to what it saves, and a loaded admin gets
        // many such callbacks.
        let apply_within = self.apply_within();
        let recordable = (results.len() > CHUNK || apply_within.is_zero())
            && self.inner.inbox.has_room(results.len(), body.len());
        let deadline = started + if recordable { apply_within } else { self.answer_within() };
        let first_deadline = match recordable {
            true => deadline,
            false => deadline.max(started + FIRST_CHUNK_WITHIN),
        };
        let mut outcome = Applied::All;
        let mut recorded = 0;
        let mut at = 0;
        let mut in_flight = None;
        while at < results.len() && tokio::time::Instant::now() < deadline {
            let end = (at + CHUNK).min(results.len());
            let mut chunk = tokio::spawn(self.clone().apply_range(results.clone(), at..end));
            let until = if at == 0 { first_deadline } else { deadline };
            match tokio::time::timeout_at(until, &mut chunk).await {
                Ok(Ok(true)) => recorded += end - at,
                Ok(_) => outcome = Applied::Failed,
                Err(_) => {
                    in_flight = Some(chunk);
                    break;
                }
            }
            at = end;
        }
        if at == results.len() {
            return outcome;
        }
        let answer_by = started + FIRST_CHUNK_WITHIN;
        if recordable && self.record_rest(body, results, at, in_flight, answer_by).await {
            return outcome;
        }
        Applied::Partly { recorded }
    }

    /// How long a callback's results are applied before the rest is recorded.
    fn apply_within(&self) -> Duration {
        Duration::from_micros(self.inner.apply_within_us.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// [`Dispatcher::apply_chunk`] of `results[range]`, as a task of its own: a callback
    /// answered before it ends leaves it to run on.
    async fn apply_range(self, results: Arc<[HandleCallbackParam]>, range: Range<usize>) -> bool {
        self.apply_chunk(&results[range]).await
    }

    /// Applies `results` together; whether all were applied.
    pub(super) async fn apply_chunk(&self, results: &[HandleCallbackParam]) -> bool {
        // The runs this admin is posting are taken as it posted them, and the others read in
        // one read; a run that changed since is read again on its own.
        let ids: Vec<i64> = results.iter().map(|result| result.log_id).collect();
        let mut runs: HashMap<i64, RunRecord> = self.take_posted_runs(&ids);
        let unread: Vec<i64> = ids.into_iter().filter(|id| !runs.contains_key(id)).collect();
        let read = match unread.is_empty() {
            true => true,
            false => match self.inner.db.get_runs(&unread).await {
                Ok(read) => {
                    runs.extend(read.into_iter().map(|run| (run.id, run)));
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "reading a batch of runs failed: reading them one by one");
                    false
                }
            },
        };
        // Applied side by side in this task, not each in a task of its own: each mostly waits
        // for its group commit, and a task a result cost more to spawn and join than to poll.
        let mut applying = FuturesUnordered::new();
        let mut all_read = true;
        for result in results {
            let run = match runs.remove(&result.log_id) {
                Some(run) => run,
                // A run the chunk's read did not find does not exist (deleted past the
                // retention, or never): its result has nothing to apply to, and is not read
                // again alone.
                None if read => {
                    tracing::debug!(
                        "result for run {} that does not exist: ignored",
                        result.log_id
                    );
                    continue;
                }
                None => match self.inner.db.get_run(result.log_id).await {
                    Ok(Some(run)) => run,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::error!(%error, "reading run {} failed", result.log_id);
                        all_read = false;
                        continue;
                    }
                },
            };
            // The result of another run that had this id (a database restored from a copy, or
            // one that lost synced commits, handed the id out again): acknowledged, so that its
            // executor forgets it, and never applied to this run. Executors that send no fire
            // time (0) are taken at their word.
            if result.log_date_tim != 0 && result.log_date_tim != run.trigger_time_ms {
                tracing::warn!(
                    run.id = run.id,
                    job.id = run.job_id,
                    "a result for run {} of the fire at {} ms came for the run of {} ms: ignored",
                    run.id,
                    result.log_date_tim,
                    run.trigger_time_ms
                );
                continue;
            }
            // Sent again (a callback answered "send again", or one whose answer was lost): it
            // was applied, and nothing is left to do.
            if run.state.is_terminal() {
                continue;
            }
            if run.trigger_type == TriggerType::Cron {
                // When it started there, or, from an executor that does not say, when it took it.
                let started = result.started_at.unwrap_or(run.dispatched_at_ms);
                crate::metrics::admin().fire_started(started - run.trigger_time_ms);
            }
            let accepted = self.take_unrecorded_send(result.log_id, result.started_at);
            let span = tracing::debug_span!("result", run.id = result.log_id);
            let apply = async move {
                failpoint::hit("callback.apply_result");
                let (handle_code, message) = result.code_and_msg();
                let started_at_ms = result.started_at;
                let event = Event::Result { handle_code, message, started_at_ms, accepted };
                // On the heap, not inline: each result's future stays small.
                let apply =
                    self.apply_to(result.log_id, Some(run), None, event, None, result.fuel_used);
                Box::pin(apply).await
            }
            .instrument(span);
            // A panic fails its own result, as an error does, and not the others of the chunk.
            let log_id = result.log_id;
            applying.push(async move { (log_id, AssertUnwindSafe(apply).catch_unwind().await) });
        }
        let mut all_applied = all_read;
        let mut done = 0;
        while let Some((log_id, applied)) = applying.next().await {
            done += 1;
            if done == 1 && results.len() > 1 {
                failpoint::hit("callback.mid_batch");
            }
            let error = match applied {
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => format!("run {log_id}: {error:#}"),
                Err(_) => format!("run {log_id}: applying its result panicked"),
            };
            tracing::error!(%error, "applying a result failed");
            all_applied = false;
        }
        all_applied
    }
}
