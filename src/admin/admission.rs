//! Admission: the bound on unfinished runs that keeps an overloaded admin working.
//!
//! Each unfinished run (pending, dispatching or running) costs the admin memory and the database
//! index entries its sweeps walk. When fires and triggers come faster than executors and the
//! database can finish runs, that backlog would grow without end, and every pass over it would
//! get slower, until nothing moved. So the admin admits new runs only while fewer than
//! `--max-unfinished-runs` are unfinished:
//! - while the bound is reached, the scheduler fires only the due jobs that have no run in
//!   flight (sent, or running on an executor). A job whose runs pile up (its executor or the
//!   results path is slower than its schedule) waits, and when it fires its lateness is judged as
//!   any late fire is: by the job's misfire strategy and threshold (`schedule::decide`). So an
//!   overload slows the fires of the jobs that cause it to the pace their results come back,
//!   while jobs whose runs finish keep their schedule; it shows as misfires of those jobs, never
//!   as an unbounded queue. Each such job adds at most one fire's runs past the bound at a time;
//! - a manual or API trigger is refused with 503 `overloaded` and `Retry-After`;
//! - retries and child jobs, which follow from runs already admitted, are never refused: they
//!   are created, pending, in the transaction that ends their run, so none is lost, and they
//!   count among the unfinished runs from then on, holding back fires and triggers. One ending
//!   run creates at most one retry and one run of each of at most `MAX_CHILD_JOBS` (100)
//!   distinct child jobs (a broadcast child, one per online executor), so follow-ups can take
//!   the count past the bound by that much per ending run, never by an unbounded fan-out.
//!
//! The count is read from the database (counting stops at the bound, so a read costs at most
//! that many index entries) and reused for [`REREAD_MS`], with the runs this admin created since
//! added to it. In a cluster every admin reads the same count, so the bound holds for the whole
//! database, give or take one reuse window of creations per admin.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::now_ms;
use crate::storage::Db;

/// How long a count of unfinished runs is reused.
const REREAD_MS: i64 = 200;

/// Why new runs are not admitted now.
#[derive(Debug, thiserror::Error)]
#[error(
    "{unfinished} runs are unfinished and the admin admits new ones only below {limit} \
     (--max-unfinished-runs): try again once executors have caught up"
)]
pub struct Overloaded {
    /// The unfinished runs counted (at most the bound).
    pub unfinished: u64,
    /// The bound.
    pub limit: u64,
    /// Whether the runs admitted before were admitted: the first refusal of an overload.
    pub newly: bool,
}

/// The bound on unfinished runs and the last count of them.
pub struct Admission {
    db: Db,
    /// `None`: no bound.
    limit: Option<u64>,
    /// When the count was read, and the count plus the runs admitted since.
    seen: Mutex<Option<(i64, u64)>>,
    /// Whether the last call was refused.
    refusing: AtomicBool,
    /// Held while the count is read again: callers that find it stale at once wait for that
    /// one read instead of each reading it (under load, every trigger of the moment would).
    rereading: tokio::sync::Mutex<()>,
    /// How many times the count was read.
    reads: AtomicU64,
}

impl Admission {
    /// A bound of `limit` unfinished runs over `db` (`None` admits everything).
    pub fn new(db: Db, limit: Option<u64>) -> Admission {
        Admission {
            db,
            limit,
            seen: Mutex::new(None),
            refusing: AtomicBool::new(false),
            rereading: tokio::sync::Mutex::new(()),
            reads: AtomicU64::new(0),
        }
    }

    /// Admits `runs` new runs, or says why not. With no bound this reads nothing.
    pub async fn admit(&self, runs: u64) -> Result<(), AdmitError> {
        let Some(limit) = self.limit else { return Ok(()) };
        let mut now = now_ms();
        let mut fresh = self.fresh(now);
        // The guard is held to the end, so that the count read is in `seen` before another
        // caller looks again.
        let mut _rereading = None;
        if fresh.is_none() {
            _rereading = Some(self.rereading.lock().await);
            now = now_ms();
            fresh = self.fresh(now);
        }
        let unfinished = match fresh {
            Some((_, count)) => count,
            None => {
                let cap = i64::try_from(limit).unwrap_or(i64::MAX);
                self.reads.fetch_add(1, Ordering::Relaxed);
                let count = self.db.count_unfinished_runs(cap).await?;
                u64::try_from(count).unwrap_or(0)
            }
        };
        let admitted = unfinished < limit;
        if let Ok(mut seen) = self.seen.lock() {
            let read_at = fresh.map_or(now, |(read_at, _)| read_at);
            *seen = Some((read_at, if admitted { unfinished + runs } else { unfinished }));
        }
        let was_refusing = self.refusing.swap(!admitted, Ordering::Relaxed);
        if admitted {
            Ok(())
        } else {
            Err(AdmitError::Overloaded(Overloaded { unfinished, limit, newly: !was_refusing }))
        }
    }

    /// How many runs backfills may add now: they keep out of the last quarter of the bound
    /// (`backfill::room_for_backfills`), which stays for fires and triggers. The count is the
    /// one [`Admission::admit`] reuses, read again when stale.
    pub async fn room_for_backfills(&self) -> Result<u64, crate::storage::StorageError> {
        let Some(limit) = self.limit else { return Ok(u64::MAX) };
        let now = now_ms();
        let unfinished = match self.fresh(now) {
            Some((_, count)) => count,
            None => {
                let cap = i64::try_from(limit).unwrap_or(i64::MAX);
                self.reads.fetch_add(1, Ordering::Relaxed);
                let count = u64::try_from(self.db.count_unfinished_runs(cap).await?).unwrap_or(0);
                if let Ok(mut seen) = self.seen.lock() {
                    *seen = Some((now, count));
                }
                count
            }
        };
        Ok(crate::backfill::room_for_backfills(Some(limit), unfinished))
    }

    /// Counts `runs` created past [`Admission::admit`] (a backfill's, or fires of jobs with
    /// nothing in flight past the bound) in the reused count, as it counts the runs it admits.
    pub fn count_created_runs(&self, runs: u64) {
        if let Ok(mut seen) = self.seen.lock()
            && let Some((_, count)) = seen.as_mut()
        {
            *count += runs;
        }
    }

    /// The count read at most [`REREAD_MS`] before `now`, with when it was read.
    fn fresh(&self, now: i64) -> Option<(i64, u64)> {
        let seen = self.seen.lock().ok().and_then(|seen| *seen);
        seen.filter(|(read_at, _)| now - read_at < REREAD_MS && *read_at <= now)
    }
}

/// Why [`Admission::admit`] did not admit.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The bound is reached.
    #[error(transparent)]
    Overloaded(Overloaded),
    /// The count could not be read.
    #[error(transparent)]
    Internal(#[from] crate::storage::StorageError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_that_find_the_count_stale_together_share_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("admission.db").display());
        let admission =
            std::sync::Arc::new(Admission::new(Db::connect(&url).await.unwrap(), Some(50)));
        let callers = (0..40).map(|_| {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit(1).await.is_ok() })
        });
        let admitted = futures_util::future::join_all(callers).await;
        assert!(admitted.into_iter().all(|admitted| admitted.unwrap()), "40 of a bound of 50");
        // Each finds no count and reads it without the lock; with it, the first reads and the
        // others use its count (one more read only if the machine stalled past `REREAD_MS`).
        let reads = admission.reads.load(Ordering::Relaxed);
        assert!(reads <= 2, "40 callers read the count {reads} times");
    }
}
