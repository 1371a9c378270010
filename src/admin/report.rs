//! The daily report's upkeep: the task that recounts recent days into the report table.
//!
//! Every 30 s the days from yesterday to today are recounted from the run table (and the counts
//! retention kept for deleted runs), in one transaction, as XXL-JOB's log report thread does;
//! at start, the recount reaches back to the latest day in the table, so days an admin was down
//! for are counted too. The run lifecycle writes nothing for the report, so the hot path does
//! not get slower, and reading the report counts yesterday and today live, so it is exact.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::now_ms;
use crate::storage::{DAY_MS, Db};

/// How often recent days are recounted.
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// Recounts recent days until `shutdown`.
pub async fn run(db: Db, shutdown: CancellationToken) {
    let mut from = match db.report_latest_day().await {
        Ok(latest) => latest.unwrap_or(now_ms() - DAY_MS).min(now_ms() - DAY_MS),
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "reading the daily report failed");
            now_ms() - DAY_MS
        }
    };
    loop {
        let now = now_ms();
        match db.refresh_report(from, now).await {
            Ok(()) => from = now - DAY_MS,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "recounting the daily report failed");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(REFRESH_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
