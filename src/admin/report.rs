//! The daily report's upkeep: the task that folds the lifecycle's report deltas into the report
//! table.
//!
//! The run lifecycle counts each run into the report in the transaction that creates or ends it,
//! as a delta row (`storage::reports`); every few seconds this task folds the waiting deltas into
//! the per-day counts, so reads stay short. Reads sum both, so folding late (an admin down for a
//! while) changes nothing a reader sees.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::partitions::Partitions;
use crate::storage::Db;

/// How often waiting deltas are folded.
const FOLD_INTERVAL: Duration = Duration::from_secs(5);
/// The most deltas folded in one transaction.
const FOLD_BATCH: i64 = 10_000;

/// Folds report deltas until `shutdown`, while this admin holds partition 0: of admins that
/// share a database, one folds.
pub async fn run(db: Db, partitions: Partitions, shutdown: CancellationToken) {
    loop {
        let folded = match partitions.leads() {
            false => 0,
            true => match db.fold_report(FOLD_BATCH).await {
                Ok(folded) => folded,
                Err(error) => {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "folding the daily report failed"
                    );
                    0
                }
            },
        };
        if folded == FOLD_BATCH as u64 {
            // More wait than one transaction takes: go on at once.
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(FOLD_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
