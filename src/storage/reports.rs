//! The daily run report (XXL-JOB's `xxl_job_log_report`) and the dashboard's failing jobs.
//!
//! `run_report` holds the runs created per UTC day, by state. It is not written by the run
//! lifecycle: the admin's report task recounts the recent days (yesterday and today) every
//! half minute, each recount one statement over the `runs_by_age` index, so the hot path pays
//! nothing for it. Reading a recent day counts it live the same way, so the report is exact
//! for today; older days are read from the table as last recounted.
//!
//! Retention deletes old runs, and a recount must not forget them: the transaction that deletes
//! ended runs adds their counts to `run_report_retired` (`retire`), and a day's count is its
//! runs still stored plus its retired ones.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use super::{Db, Result, parse_column};
use crate::model::RunState;

/// A day's milliseconds.
pub const DAY_MS: i64 = 86_400_000;

/// The runs created on one UTC day, by state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayCounts {
    /// The day's first millisecond.
    pub day_ms: i64,
    /// Runs that succeeded.
    pub success: i64,
    /// Runs that failed.
    pub failed: i64,
    /// Runs that timed out.
    pub timed_out: i64,
    /// Runs killed by an operator.
    pub killed: i64,
    /// Runs whose executor went away.
    pub lost: i64,
    /// Scheduled runs skipped because their job was stopped.
    pub skipped: i64,
    /// Runs not ended yet (pending, being sent, or running).
    pub running: i64,
    /// All of them.
    pub total: i64,
}

impl DayCounts {
    fn add(&mut self, state: RunState, runs: i64) {
        let slot = match state {
            RunState::Success => &mut self.success,
            RunState::Failed => &mut self.failed,
            RunState::TimedOut => &mut self.timed_out,
            RunState::Killed => &mut self.killed,
            RunState::Lost => &mut self.lost,
            RunState::Skipped => &mut self.skipped,
            RunState::Pending | RunState::Dispatching | RunState::Running => &mut self.running,
        };
        *slot += runs;
        self.total += runs;
    }
}

impl Db {
    /// The report of every UTC day from the one holding `from_ms` to the one holding `to_ms`,
    /// oldest first, days without runs included. Days from yesterday (by `now_ms`) on are
    /// counted live; older ones are read from the report table.
    pub async fn report_days(
        &self,
        from_ms: i64,
        to_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<DayCounts>> {
        let (first, last) = (from_ms.div_euclid(DAY_MS), to_ms.div_euclid(DAY_MS));
        let live_from = now_ms.div_euclid(DAY_MS) - 1;
        let mut days: BTreeMap<i64, DayCounts> = (first..=last)
            .map(|day| (day, DayCounts { day_ms: day * DAY_MS, ..DayCounts::default() }))
            .collect();
        let stored = sqlx::query(
            "select day, state, runs from run_report where day >= $1 and day <= $2 and day < $3",
        )
        .bind(first)
        .bind(last)
        .bind(live_from)
        .fetch_all(&self.pool)
        .await?;
        let live = if last >= live_from {
            let sql = format!("{COUNT_DAYS} where day >= $1 and day <= $2 group by day, state");
            sqlx::query(&sql)
                .bind(first.max(live_from))
                .bind(last)
                .bind(DAY_MS)
                .fetch_all(&self.pool)
                .await?
        } else {
            Vec::new()
        };
        for row in stored.iter().chain(&live) {
            let day: i64 = row.try_get("day")?;
            let state: RunState = parse_column(row, "state")?;
            if let Some(counts) = days.get_mut(&day) {
                counts.add(state, row.try_get("runs")?);
            }
        }
        Ok(days.into_values().collect())
    }

    /// Recounts the report of the UTC days from the one holding `from_ms` to the one holding
    /// `to_ms`, in one transaction.
    pub async fn refresh_report(&self, from_ms: i64, to_ms: i64) -> Result<()> {
        let (first, last) = (from_ms.div_euclid(DAY_MS), to_ms.div_euclid(DAY_MS));
        let mut tx = self.writer().begin().await?;
        sqlx::query("delete from run_report where day >= $1 and day <= $2")
            .bind(first)
            .bind(last)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!(
            "insert into run_report (day, state, runs)
             {COUNT_DAYS} where day >= $1 and day <= $2 group by day, state"
        ))
        .bind(first)
        .bind(last)
        .bind(DAY_MS)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The first millisecond of the latest day in the report table, if any.
    pub async fn report_latest_day(&self) -> Result<Option<i64>> {
        let row =
            sqlx::query("select max(day) as day from run_report").fetch_one(&self.pool).await?;
        let day: Option<i64> = row.try_get("day")?;
        Ok(day.map(|day| day * DAY_MS))
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

/// Runs per day (`$3` = a day's ms) and state, stored and retired: add a `where` on `day` with
/// `$1` and `$2`, and `group by day, state`.
const COUNT_DAYS: &str = "select day, state, cast(sum(runs) as bigint) as runs from (
        select created_at / $3 as day, state, count(*) as runs from runs
        where created_at >= $1 * $3 and created_at < ($2 + 1) * $3
        group by created_at / $3, state
        union all
        select day, state, runs from run_report_retired
    ) as counted";

/// Adds the runs deleted by retention, as `(created_at, state)`, to their days' retired counts
/// on `conn`, which must be the transaction that deleted them.
pub(super) async fn retire(conn: &mut AnyConnection, deleted: &[(i64, String)]) -> Result<()> {
    let mut counts: BTreeMap<(i64, &str), i64> = BTreeMap::new();
    for (created_at, state) in deleted {
        *counts.entry((created_at.div_euclid(DAY_MS), state.as_str())).or_default() += 1;
    }
    for ((day, state), runs) in counts {
        sqlx::query(
            "insert into run_report_retired (day, state, runs) values ($1, $2, $3)
             on conflict (day, state) do update set runs = run_report_retired.runs + excluded.runs",
        )
        .bind(day)
        .bind(state)
        .bind(runs)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
