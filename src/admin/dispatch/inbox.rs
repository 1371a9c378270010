//! The callback inbox: what a callback's answer does not wait for.
//!
//! A callback's results are applied a chunk at a time (`results.rs`) for
//! [`APPLY_WITHIN`] (`--callback-apply-ms`). What is left then, the chunk in flight included, is
//! recorded in one row of the inbox (`storage::callbacks`): the callback's body as it came, one
//! insert however many results it carries. Then the callback is acknowledged, and its executor
//! forgets those results. This admin applies the rest at once, in the background, and deletes
//! the row.
//!
//! If this admin dies before that, the row is taken by the admin that takes over its partitions
//! (its own next incarnation included, `sweep::take_over_sends`). Failing that, any admin's
//! sweep takes it once its time ([`TAKEN_FOR_MS`]) runs out. A row is applied again from its
//! first result, and a result applies once, so what was applied before is ignored.
//!
//! The inbox holds at most [`LIMIT`] results, of at most [`LIMIT_BYTES`] of callback bodies, that
//! this admin has not applied yet (the callbacks' results are held in memory until applied). Past
//! that, a callback is applied for
//! [`super::ANSWER_WITHIN`] and answered with what it applied and "send again", as an admin
//! without an inbox would: results then come back no faster than they are applied.

use foldhash::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::results::CHUNK;
use super::{Dispatcher, now_ms};
use crate::failpoint;
use crate::protocol::{HandleCallbackParam, parse_callbacks};

/// How long a callback's results are applied before the rest is recorded and the callback
/// answered, by default.
pub const APPLY_WITHIN: Duration = Duration::from_millis(100);
/// The most results that this admin holds recorded and not yet applied: a few seconds of
/// results at the rates workload (x) of `cargo bench --bench e2e` measures. An admin whose
/// results come back faster than it applies them soon stops recording, and applies each
/// callback for up to [`super::ANSWER_WITHIN`] again, which slows the executors' callbacks to
/// its pace.
pub const LIMIT: usize = 20_000;
/// The most bytes of callback bodies that this admin holds recorded and not yet applied.
pub const LIMIT_BYTES: usize = 128 * 1024 * 1024;
/// How long a recorded callback is its recorder's (or taker's) to apply before any admin may
/// take it: far longer than applying [`LIMIT`] results takes.
pub const TAKEN_FOR_MS: i64 = 60_000;
/// The most rows one look at the inbox takes.
const TAKE_BATCH: i64 = 100;
/// Recorded callbacks applied at once, a chunk at a time each: results come back in bursts, and
/// the rest of every callback of a burst applied at once queued more writes than the database
/// commits in a second, ahead of the fires, the API's writes and the next callbacks (at 10,000
/// jobs a second, `cargo bench --bench e2e -- --workload x`, stopping the jobs through the API
/// then took minutes).
const APPLIERS: usize = 1;

/// This admin's side of the inbox.
pub(super) struct Inbox {
    /// Results recorded (or taken) and not applied yet.
    pending: AtomicUsize,
    /// The bytes of their callbacks' bodies.
    pending_bytes: AtomicUsize,
    /// [`LIMIT`] unless set.
    limit: AtomicUsize,
    /// The rows being applied here.
    applying: Mutex<HashSet<i64>>,
    /// One permit per [`APPLIERS`].
    appliers: tokio::sync::Semaphore,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            pending: AtomicUsize::new(0),
            pending_bytes: AtomicUsize::new(0),
            limit: AtomicUsize::new(LIMIT),
            applying: Mutex::default(),
            appliers: tokio::sync::Semaphore::new(APPLIERS),
        }
    }
}

impl Inbox {
    /// Whether `results` more, of a body of `bytes`, may be recorded.
    pub(super) fn has_room(&self, results: usize, bytes: usize) -> bool {
        let pending = self.pending.load(Ordering::Relaxed);
        let pending_bytes = self.pending_bytes.load(Ordering::Relaxed);
        pending.saturating_add(results) <= self.limit.load(Ordering::Relaxed)
            && pending_bytes.saturating_add(bytes) <= LIMIT_BYTES
    }

    fn start(&self, id: i64, (results, bytes): (usize, usize)) -> bool {
        let started = self.applying.lock().map(|mut rows| rows.insert(id)).unwrap_or(false);
        if started {
            self.pending.fetch_add(results, Ordering::Relaxed);
            self.pending_bytes.fetch_add(bytes, Ordering::Relaxed);
            crate::metrics::admin().callback_results_unapplied.set(self.pending());
        }
        started
    }

    fn end(&self, id: i64, (results, bytes): (usize, usize)) {
        if let Ok(mut rows) = self.applying.lock() {
            rows.remove(&id);
        }
        self.pending.fetch_sub(results, Ordering::Relaxed);
        self.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
        crate::metrics::admin().callback_results_unapplied.set(self.pending());
    }

    fn is_applying(&self, id: i64) -> bool {
        self.applying.lock().map(|rows| rows.contains(&id)).unwrap_or(true)
    }

    fn pending(&self) -> i64 {
        i64::try_from(self.pending.load(Ordering::Relaxed)).unwrap_or(i64::MAX)
    }
}

impl Dispatcher {
    /// The most results this admin holds recorded and not applied ([`LIMIT`] by default); past
    /// it, a callback is sent back for the rest (a test sets 0 to see that).
    pub fn set_inbox_limit(&self, results: usize) {
        self.inner.inbox.limit.store(results, Ordering::Relaxed);
    }

    /// Records `body`, a callback whose `results[from..]` are not applied yet, and applies
    /// those in the background; `in_flight` is the chunk from `from` being applied now. Whether
    /// it was recorded by `answer_by` (if not, the callback is to be sent again: its row, if it
    /// commits later, is applied once its time runs out).
    pub(super) async fn record_rest(
        &self,
        body: &[u8],
        results: Arc<[HandleCallbackParam]>,
        from: usize,
        in_flight: Option<JoinHandle<bool>>,
        answer_by: Instant,
    ) -> bool {
        let id = rand::random::<i64>() & i64::MAX;
        let now = now_ms();
        let count = i64::try_from(results.len()).unwrap_or(i64::MAX);
        let text = String::from_utf8_lossy(body).into_owned();
        let owner = self.owner().to_owned();
        let db = self.inner.db.clone();
        let record = async move {
            db.record_callback(id, text, count, &owner, now, now + TAKEN_FOR_MS).await
        };
        match tokio::time::timeout_at(answer_by, record).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "recording a callback failed: it is sent back");
                return false;
            }
            Err(_) => {
                tracing::warn!("recording a callback took too long: it is sent back");
                return false;
            }
        }
        let rest = results.len() - from;
        let held = (rest, body.len());
        self.inner.inbox.start(id, held);
        crate::metrics::admin().callback_results_recorded.inc_by(rest as u64);
        tokio::spawn(self.clone().apply_recorded(id, results, from, in_flight, held));
        true
    }

    /// Applies `results[from..]` of recorded callback `id` (after `in_flight`, the chunk from
    /// `from` already being applied), then deletes its row and lets go of what it `held` in the
    /// inbox. A result that could not be applied leaves the row, to be applied again once its
    /// time runs out.
    async fn apply_recorded(
        self,
        id: i64,
        results: Arc<[HandleCallbackParam]>,
        from: usize,
        in_flight: Option<JoinHandle<bool>>,
        held: (usize, usize),
    ) {
        failpoint::hit("callback.before_recorded_apply");
        let mut all_applied = true;
        let mut next = from;
        if let Some(chunk) = in_flight {
            all_applied &= chunk.await.unwrap_or(false);
            next = (from + CHUNK).min(results.len());
        }
        let permit = self.inner.inbox.appliers.acquire().await;
        for chunk in results[next..].chunks(CHUNK) {
            all_applied &= self.apply_chunk(chunk).await;
        }
        drop(permit);
        if all_applied {
            if let Err(error) = self.inner.db.forget_callback(id).await {
                // Taken again once its time runs out, it changes nothing.
                tracing::warn!(%error, "deleting applied callback {id} from the inbox failed");
            }
        } else {
            tracing::warn!(
                "recorded callback {id}: some results could not be applied; it is applied again \
                 in {} s",
                TAKEN_FOR_MS / 1000
            );
        }
        self.inner.inbox.end(id, held);
    }

    /// Takes the recorded callbacks of the admins `gone`, and those whose time ran out, as far
    /// as the inbox has room, and applies them in the background.
    pub(crate) async fn take_over_callbacks(&self, gone: &[String]) -> anyhow::Result<()> {
        let db = &self.inner.db;
        let now = now_ms();
        let entries = db.takeable_callbacks(gone, now, TAKE_BATCH).await?;
        for entry in entries {
            let results = usize::try_from(entry.results).unwrap_or(usize::MAX);
            if self.inner.inbox.is_applying(entry.id) || !self.inner.inbox.has_room(results, 0) {
                continue;
            }
            let Some(recorded) = db.take_callback(&entry, self.owner(), now + TAKEN_FOR_MS).await?
            else {
                continue;
            };
            let parsed = match parse_callbacks(recorded.body.as_bytes()) {
                Ok(parsed) => parsed.results,
                Err(reason) => {
                    // It was parsed when it came; a row that no longer parses is not applied.
                    tracing::error!("recorded callback {}: {reason}: deleted", recorded.id);
                    db.forget_callback(recorded.id).await?;
                    continue;
                }
            };
            tracing::info!(
                "taking over recorded callback {} of {} results from admin {}",
                entry.id,
                parsed.len(),
                entry.owner
            );
            let held = (parsed.len(), recorded.body.len());
            if self.inner.inbox.start(entry.id, held) {
                let apply = self.clone().apply_recorded(entry.id, parsed.into(), 0, None, held);
                tokio::spawn(apply);
            }
        }
        Ok(())
    }
}
