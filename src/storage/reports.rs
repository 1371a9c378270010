//! Figures for the console's dashboard, read from the run table.

use sqlx::Row;

use super::{Db, Result, parse_column};
use crate::model::RunState;

/// A day's milliseconds.
const DAY_MS: i64 = 86_400_000;

/// The runs created on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyRuns {
    /// The day's first millisecond.
    pub day_ms: i64,
    /// Runs that succeeded.
    pub succeeded: i64,
    /// Runs that failed, timed out or were lost (killed and skipped runs are neither).
    pub failed: i64,
    /// All runs, whatever their state.
    pub total: i64,
}

impl Db {
    /// Runs created at or after `since_ms`, counted by state, in the order of the states.
    pub async fn count_runs_by_state(&self, since_ms: i64) -> Result<Vec<(RunState, i64)>> {
        let rows = sqlx::query(
            "select state, count(*) as n from runs where created_at >= $1 group by state",
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut counts = rows
            .iter()
            .map(|row| Ok((parse_column::<RunState>(row, "state")?, row.try_get::<i64, _>("n")?)))
            .collect::<Result<Vec<_>>>()?;
        counts.sort_by_key(|(state, _)| RunState::ALL.iter().position(|s| s == state));
        Ok(counts)
    }

    /// Runs created at or after `since_ms`, per UTC day with any, oldest first.
    pub async fn count_runs_by_day(&self, since_ms: i64) -> Result<Vec<DailyRuns>> {
        let rows = sqlx::query(
            "select created_at / $2 as day,
                sum(case when state = 'success' then 1 else 0 end) as succeeded,
                sum(case when state in ('failed', 'timed_out', 'lost') then 1 else 0 end) as failed,
                count(*) as total
             from runs where created_at >= $1 group by created_at / $2 order by day",
        )
        .bind(since_ms)
        .bind(DAY_MS)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(DailyRuns {
                    day_ms: row.try_get::<i64, _>("day")? * DAY_MS,
                    succeeded: row.try_get("succeeded")?,
                    failed: row.try_get("failed")?,
                    total: row.try_get("total")?,
                })
            })
            .collect()
    }

    /// The `limit` jobs with the most failed, timed-out or lost runs created at or after
    /// `since_ms`: `(job id, failures)`, most first.
    pub async fn top_failing_jobs(&self, since_ms: i64, limit: i64) -> Result<Vec<(i64, i64)>> {
        let rows = sqlx::query(
            "select job_id, count(*) as n from runs
             where created_at >= $1 and state in ('failed', 'timed_out', 'lost')
             group by job_id order by n desc, job_id limit $2",
        )
        .bind(since_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok((row.try_get("job_id")?, row.try_get("n")?))).collect()
    }
}
