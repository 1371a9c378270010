//! The daily run report (XXL-JOB's `xxl_job_log_report`) and the dashboard's failing jobs.
//!
//! `run_report` holds the runs created per UTC day, by state, the unfinished ones under
//! `running`. The run lifecycle keeps it exact in its own transactions, so no one recounts the
//! run table (a day holds millions of runs at load): the transaction that creates runs adds one
//! to their day's `running` and the transaction that ends runs moves each from `running` to its
//! state, both as rows of `run_report_delta` ([`Deltas`], written with one insert per
//! transaction, or per statement outside a group commit; appending takes no lock another
//! transaction waits for). The admin's report task folds those rows into
//! `run_report` ([`Db::fold_report`]), and a read sums both tables, so a report is exact at
//! every commit whether folded or not. Deleting runs (retention) leaves the counts alone.
//!
//! The dashboard's failing jobs are kept the same way: the transaction that ends runs failed,
//! timed out or lost appends one row per job and day to `job_failure_delta`, folded into
//! `job_failures` with the report, so the dashboard reads a few rows per job and day instead of
//! a week of runs.

use super::query::query;
use std::collections::BTreeMap;

use sqlx::Row;

use super::statement::{Exec, Statement};
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
    /// oldest first, days without runs included.
    pub async fn report_days(&self, from_ms: i64, to_ms: i64) -> Result<Vec<DayCounts>> {
        let (first, last) = (from_ms.div_euclid(DAY_MS), to_ms.div_euclid(DAY_MS));
        let mut days: BTreeMap<i64, DayCounts> = (first..=last)
            .map(|day| (day, DayCounts { day_ms: day * DAY_MS, ..DayCounts::default() }))
            .collect();
        let rows = query(
            "select day, state, cast(sum(runs) as bigint) as runs from (
                select day, state, runs from run_report where day >= $1 and day <= $2
                union all
                select day, state, runs from run_report_delta where day >= $1 and day <= $2
             ) as counted group by day, state",
        )
        .bind(first)
        .bind(last)
        .fetch_all(&self.pool)
        .await?;
        for row in &rows {
            let day: i64 = row.try_get("day")?;
            let state: RunState = parse_column(row, "state")?;
            if let Some(counts) = days.get_mut(&day) {
                counts.add(state, row.try_get("runs")?);
            }
        }
        Ok(days.into_values().collect())
    }

    /// Folds at most `limit` of the oldest report deltas into the report, in one transaction;
    /// returns how many. Each delta is deleted by the transaction that adds it, so two admins
    /// folding at once never add one twice.
    pub async fn fold_report(&self, limit: i64) -> Result<u64> {
        let mut tx = self.writer().begin().await?;
        let rows = query(
            "delete from run_report_delta where id in (select id from (
                select id from run_report_delta order by id limit $1) as oldest)
             returning day, state, runs",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut sums: BTreeMap<(i64, String), i64> = BTreeMap::new();
        for row in &rows {
            *sums.entry((row.try_get("day")?, row.try_get("state")?)).or_default() +=
                row.try_get::<i64, _>("runs")?;
        }
        for ((day, state), runs) in sums.into_iter().filter(|(_, runs)| *runs != 0) {
            query(
                "insert into run_report (day, state, runs) values ($1, $2, $3)
                 on conflict (day, state) do update set runs = run_report.runs + excluded.runs",
            )
            .bind(day)
            .bind(state)
            .bind(runs)
            .execute(&mut *tx)
            .await?;
        }
        let failures = query(
            "delete from job_failure_delta where id in (select id from (
                select id from job_failure_delta order by id limit $1) as oldest)
             returning day, job_id, runs",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut per_job: BTreeMap<(i64, i64), i64> = BTreeMap::new();
        for row in &failures {
            *per_job.entry((row.try_get("day")?, row.try_get("job_id")?)).or_default() +=
                row.try_get::<i64, _>("runs")?;
        }
        for ((day, job_id), runs) in per_job {
            query(
                "insert into job_failures (day, job_id, runs) values ($1, $2, $3)
                 on conflict (day, job_id) do update set runs = job_failures.runs + excluded.runs",
            )
            .bind(day)
            .bind(job_id)
            .bind(runs)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(rows.len().max(failures.len()) as u64)
    }

    /// The `limit` jobs with the most failed, timed-out or lost runs
    /// created on the UTC days from the one holding `since_ms`: `(job id, failures)`, most
    /// first. Read from the per-job counts, never from the run table.
    pub async fn top_failing_jobs(&self, since_ms: i64, limit: i64) -> Result<Vec<(i64, i64)>> {
        let rows = query(
            "select job_id, cast(sum(runs) as bigint) as n from (
                select job_id, runs from job_failures where day >= $1
                union all
                select job_id, runs from job_failure_delta where day >= $1
             ) as counted
             group by job_id having sum(runs) > 0 order by n desc, job_id limit $2",
        )
        .bind(since_ms.div_euclid(DAY_MS))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok((row.try_get("job_id")?, row.try_get("n")?))).collect()
    }
}

/// Changes to the report that a transaction makes, gathered so that its statements that create
/// and end runs add them with one insert ([`Deltas::write`]), in that transaction.
#[derive(Debug, Default)]
pub(super) struct Deltas {
    /// Runs by (day, state).
    states: BTreeMap<(i64, &'static str), i64>,
    /// Failed, timed-out and lost runs by (day, job).
    failures: BTreeMap<(i64, i64), i64>,
}

impl Deltas {
    /// Adds runs created at `created_at_ms` (each of them unfinished).
    pub(super) fn created(&mut self, created_at_ms: impl IntoIterator<Item = i64>) {
        for created_at in created_at_ms {
            let key = (created_at.div_euclid(DAY_MS), RunState::Running.as_str());
            *self.states.entry(key).or_default() += 1;
        }
    }

    /// Moves runs that just ended, as `(created_at, state now, job id)`, from `running` to
    /// their state, and counts a failure of its job for each failed, timed-out or lost one.
    /// Runs not ended are passed over.
    pub(super) fn ended(&mut self, runs: impl IntoIterator<Item = (i64, RunState, i64)>) {
        for (created_at, state, job_id) in runs.into_iter().filter(|run| run.1.is_terminal()) {
            let day = created_at.div_euclid(DAY_MS);
            *self.states.entry((day, state.as_str())).or_default() += 1;
            *self.states.entry((day, RunState::Running.as_str())).or_default() -= 1;
            if matches!(state, RunState::Failed | RunState::TimedOut | RunState::Lost) {
                *self.failures.entry((day, job_id)).or_default() += 1;
            }
        }
    }

    /// Records the changes through `exec`, which must be the transaction that made them, and
    /// forgets them.
    pub(super) async fn write(&mut self, exec: &mut Exec<'_>) -> Result<()> {
        let Deltas { states, failures } = std::mem::take(self);
        let p = exec.placeholder();
        let values = |rows: usize| {
            (0..rows)
                .map(|row| format!("({}, {}, {})", p(row * 3 + 1), p(row * 3 + 2), p(row * 3 + 3)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !states.is_empty() {
            let sql = format!(
                "insert into run_report_delta (day, state, runs) values {}",
                values(states.len())
            );
            let mut statement = Statement::new(sql);
            for ((day, state), runs) in states {
                statement.bind(day).bind(state).bind(runs);
            }
            exec.fetch_all(&statement).await?;
        }
        if !failures.is_empty() {
            let sql = format!(
                "insert into job_failure_delta (day, job_id, runs) values {}",
                values(failures.len())
            );
            let mut statement = Statement::new(sql);
            for ((day, job_id), runs) in failures {
                statement.bind(day).bind(job_id).bind(runs);
            }
            exec.fetch_all(&statement).await?;
        }
        Ok(())
    }
}
