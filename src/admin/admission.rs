//! Admission: the bound on unfinished runs that keeps an overloaded admin working.
//!
//! Each unfinished run (pending, dispatching or running) costs the admin memory and the database
//! index entries its sweeps walk. When fires and triggers come faster than executors and the
//! database can finish runs, that backlog would grow without end, and every pass over it would
//! get slower, until nothing moved. So the admin admits new runs only while fewer than
//! `--max-unfinished-runs` are unfinished:
//! - the scheduler does not fire while the bound is reached. Its due jobs wait, and when it fires
//!   them their lateness is judged as any late fire is: by the job's misfire strategy and
//!   threshold (`schedule::decide`), so an overload shows as misfires, never as an unbounded queue;
//! - a manual or API trigger is refused with 503 `overloaded` and `Retry-After`;
//! - retries and child jobs, which follow from runs already admitted, are never refused.
//!
//! The count is read from the database (counting stops at the bound, so a read costs at most
//! that many index entries) and reused for [`REREAD_MS`], with the runs this admin created since
//! added to it. In a cluster every admin reads the same count, so the bound holds for the whole
//! database, give or take one reuse window of creations per admin.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

impl Admission {
    /// A bound of `limit` unfinished runs over `db` (`None` admits everything).
    pub fn new(db: Db, limit: Option<u64>) -> Admission {
        Admission { db, limit, seen: Mutex::new(None), refusing: AtomicBool::new(false) }
    }

    /// Admits `runs` new runs, or says why not. With no bound this reads nothing.
    pub async fn admit(&self, runs: u64) -> Result<(), AdmitError> {
        let Some(limit) = self.limit else { return Ok(()) };
        let now = now_ms();
        let fresh = self
            .seen
            .lock()
            .ok()
            .and_then(|seen| *seen)
            .filter(|(read_at, _)| now - read_at < REREAD_MS && *read_at <= now);
        let unfinished = match fresh {
            Some((_, count)) => count,
            None => {
                let cap = i64::try_from(limit).unwrap_or(i64::MAX);
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
