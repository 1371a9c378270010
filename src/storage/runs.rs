//! Run records (XXL-JOB's `xxl_job_log`): created pending, claimed for dispatch, finished once.
//!
//! A run's life: created with `trigger_code` 0 (by a fire, a manual trigger, a retry or a parent);
//! claimed by one dispatcher (`claim_run`, a compare-and-set on `claimed_at`, so two admins never
//! send the same run at once, and a crashed admin's claim expires); sent (`set_trigger_result`);
//! finished by the executor's callback (`finish_run`, which applies a result at most once).

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::{Db, Result, parse_column};
use crate::model::{RunRecord, TriggerType, code};

const COLUMNS: &str = "id, job_id, executor_address, trigger_type, trigger_time, param, trigger_code,
    trigger_msg, handle_time, handle_code, handle_msg, shard_index, shard_total, attempt, version, sha256,
    fuel_used";

/// A run to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    /// The job.
    pub job_id: i64,
    /// Why.
    pub trigger_type: TriggerType,
    /// The scheduled instant (ms).
    pub trigger_time_ms: i64,
    /// For schedule fires, the fire's instant: unique per job with shard and attempt.
    pub fire_time_ms: Option<i64>,
    /// The parameter.
    pub param: String,
    /// A fixed executor (broadcast, or addresses given with a manual trigger); `None` to route.
    pub executor_address: Option<String>,
    /// Shard index.
    pub shard_index: i64,
    /// Shard total.
    pub shard_total: i64,
    /// Retry number.
    pub attempt: i64,
    /// The module version pinned for this run, and its digest.
    pub version: Option<(i64, String)>,
}

/// Which runs to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only this job's.
    pub job_id: Option<i64>,
    /// Only runs with this handle code (0 running, 200, 500, 502).
    pub handle_code: Option<i32>,
    /// Page size.
    pub limit: i64,
    /// Rows to skip.
    pub offset: i64,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPage {
    /// How many runs match the filter.
    pub total: i64,
    /// This page.
    pub items: Vec<RunRecord>,
}

impl Db {
    /// Creates one run outside a fire (manual, API, retry, parent). `None` when a run with the
    /// same fire, shard and attempt exists already.
    pub async fn create_run(&self, run: &NewRun, now_ms: i64) -> Result<Option<i64>> {
        let mut tx = self.pool.begin().await?;
        let id = insert_run(&mut tx, run, now_ms).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Run `id`, if it exists.
    pub async fn get_run(&self, id: i64) -> Result<Option<RunRecord>> {
        let row = sqlx::query(&format!("select {COLUMNS} from runs where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Runs matching `filter`, newest first.
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        let condition = "($1 = 0 or job_id = $1) and ($2 < 0 or handle_code = $2)";
        let job_id = filter.job_id.unwrap_or(0);
        let handle_code = filter.handle_code.map_or(-1, i64::from);
        let total: i64 = sqlx::query(&format!("select count(*) as n from runs where {condition}"))
            .bind(job_id)
            .bind(handle_code)
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        let rows = sqlx::query(&format!(
            "select {COLUMNS} from runs where {condition} order by id desc limit $3 offset $4"
        ))
        .bind(job_id)
        .bind(handle_code)
        .bind(filter.limit)
        .bind(filter.offset)
        .fetch_all(&self.pool)
        .await?;
        let items = rows.iter().map(run_from_row).collect::<Result<_>>()?;
        Ok(RunPage { total, items })
    }

    /// Ids of pending runs due at or before `due_ms` that nobody holds a fresh claim on.
    pub async fn pending_runs(
        &self,
        due_ms: i64,
        claimed_before_ms: i64,
        limit: i64,
    ) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "select id from runs
             where trigger_code = 0 and handle_code = 0 and claimed_at < $1 and trigger_time <= $2
             order by id limit $3",
        )
        .bind(claimed_before_ms)
        .bind(due_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Runs sent before `sent_before_ms` that have no result yet: candidates for the lost-run
    /// monitor, which fails those whose executor is gone.
    pub async fn unfinished_runs(&self, sent_before_ms: i64, limit: i64) -> Result<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "select {COLUMNS} from runs
             where trigger_code = 200 and handle_code = 0 and trigger_time < $1
             order by id limit $2"
        ))
        .bind(sent_before_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Claims pending run `id` for dispatch unless someone claimed it after `claimed_before_ms`.
    /// Returns the run when this caller now holds it.
    pub async fn claim_run(
        &self,
        id: i64,
        now_ms: i64,
        claimed_before_ms: i64,
    ) -> Result<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "update runs set claimed_at = $1
             where id = $2 and trigger_code = 0 and handle_code = 0 and claimed_at < $3
             returning {COLUMNS}"
        ))
        .bind(now_ms)
        .bind(id)
        .bind(claimed_before_ms)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Records where run `id` was sent and whether the executor took it.
    pub async fn set_trigger_result(
        &self,
        id: i64,
        executor_address: Option<&str>,
        trigger_code: i32,
        trigger_msg: &str,
    ) -> Result<()> {
        sqlx::query(
            "update runs set executor_address = $1, trigger_code = $2, trigger_msg = $3 where id = $4",
        )
        .bind(executor_address)
        .bind(i64::from(trigger_code))
        .bind(trigger_msg)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Applies the result of run `id` unless it has one already. Returns the finished run when
    /// this call applied it, so retries and child jobs follow a result exactly once.
    pub async fn finish_run(
        &self,
        id: i64,
        handle_code: i32,
        handle_msg: &str,
        fuel_used: Option<i64>,
        now_ms: i64,
    ) -> Result<Option<RunRecord>> {
        let handle_code = if handle_code == code::PENDING { code::FAILURE } else { handle_code };
        let row = sqlx::query(&format!(
            "update runs set handle_code = $1, handle_msg = $2, handle_time = $3, fuel_used = $4
             where id = $5 and handle_code = 0 returning {COLUMNS}"
        ))
        .bind(i64::from(handle_code))
        .bind(handle_msg)
        .bind(now_ms)
        .bind(fuel_used)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from_row).transpose()
    }
}

/// Inserts `run` inside `tx`; `None` when the same fire, shard and attempt exist already.
pub(super) async fn insert_run(
    tx: &mut Transaction<'static, Any>,
    run: &NewRun,
    now_ms: i64,
) -> Result<Option<i64>> {
    let (version, sha256) = match &run.version {
        Some((version, sha256)) => (Some(*version), Some(sha256.as_str())),
        None => (None, None),
    };
    let row = sqlx::query(
        "insert into runs (job_id, executor_address, trigger_type, trigger_time, fire_time, param,
            shard_index, shard_total, attempt, version, sha256, created_at)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         on conflict (job_id, fire_time, shard_index, attempt) do nothing
         returning id",
    )
    .bind(run.job_id)
    .bind(run.executor_address.as_deref())
    .bind(run.trigger_type.as_str())
    .bind(run.trigger_time_ms)
    .bind(run.fire_time_ms)
    .bind(&run.param)
    .bind(run.shard_index)
    .bind(run.shard_total)
    .bind(run.attempt)
    .bind(version)
    .bind(sha256)
    .bind(now_ms)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|row| Ok(row.try_get("id")?)).transpose()
}

fn run_from_row(row: &AnyRow) -> Result<RunRecord> {
    let code = |column: &str| -> Result<i32> {
        let value: i64 = row.try_get(column)?;
        i32::try_from(value).map_err(|_| super::StorageError::Corrupt(format!("{column}: {value}")))
    };
    Ok(RunRecord {
        id: row.try_get("id")?,
        job_id: row.try_get("job_id")?,
        executor_address: row.try_get("executor_address")?,
        trigger_type: parse_column(row, "trigger_type")?,
        trigger_time_ms: row.try_get("trigger_time")?,
        param: row.try_get("param")?,
        trigger_code: code("trigger_code")?,
        trigger_msg: row.try_get("trigger_msg")?,
        handle_time_ms: row.try_get("handle_time")?,
        handle_code: code("handle_code")?,
        handle_msg: row.try_get("handle_msg")?,
        shard_index: row.try_get("shard_index")?,
        shard_total: row.try_get("shard_total")?,
        attempt: row.try_get("attempt")?,
        version: row.try_get("version")?,
        sha256: row.try_get("sha256")?,
        fuel_used: row.try_get("fuel_used")?,
    })
}
