//! Jobs (XXL-JOB's `xxl_job_info`): their definitions, and the scheduler's reads of the due ones.

use super::query::query;
use sqlx::Row;

use super::job_rows::{
    COLUMNS, DUE_COLUMNS, DueJob, JobStamp, due_job_from_row, job_from_row, stamp_from_row,
};
use super::partitions::partition_filter;
use super::statement::{Cells, Statement};
use super::{Db, Dialect, Result, split_list};
use crate::model::{Job, JobSpec, child_job_cycle};
use crate::partition::Held;

/// The key of the PostgreSQL advisory lock that changes of the child-job graph take, so that
/// they are checked and written one at a time ("wjchild" in ASCII).
const CHILD_GRAPH_LOCK: i64 = 0x0077_6a63_6869_6c64;

/// What [`Db::update_job_checked`] did.
#[derive(Debug)]
pub enum JobUpdate {
    /// The job as it is now.
    Updated(Box<Job>),
    /// There is no such job; nothing changed.
    NotFound,
    /// The new children would let the job trigger itself through this path of job ids (from
    /// the job back to it); nothing changed.
    Cycle(Vec<i64>),
}

impl Db {
    /// Creates a stopped job.
    pub async fn create_job(&self, job: &JobSpec, now_ms: i64) -> Result<Job> {
        let sql = format!(
            "insert into jobs (group_id, name, schedule_type, schedule_conf, time_zone,
                misfire_strategy, route_strategy, block_strategy, timeout_secs, retry_count,
                glue_type, handler, param, child_job_ids, alarm_email, fuel_limit, memory_limit_mb,
                misfire_threshold_ms, sharding_total_count, sharding_item_parameters,
                sharding_strategy, alarm_silence_secs, retry_interval_secs, retry_backoff,
                retry_max_interval_secs, max_concurrent_runs, running, next_fire_ms, created_at,
                updated_at, calendar, description, owner)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                $18, $19, $20, $21, $22, $23, $24, $25, $26, 0, 0, $27, $27, $28, $29, $30)
             returning {COLUMNS}"
        );
        let row = bind_job(query(&sql), job)
            .bind(now_ms)
            .bind(job.calendar.as_deref())
            .bind(&job.description)
            .bind(&job.owner)
            .fetch_one(self.writer())
            .await?;
        job_from_row(&row)
    }

    /// Replaces the operator-set fields of job `id`; `next_fire_ms` is the recomputed next fire
    /// (0 for a stopped job). A running `FIX_DELAY` job that waits for its fire's runs to end
    /// (no next fire time) keeps waiting if it stays `FIX_DELAY`, so that a change never fires
    /// it while a run is unfinished. Returns the job, or `None` if it does not exist.
    pub async fn update_job(
        &self,
        id: i64,
        job: &JobSpec,
        next_fire_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Job>> {
        let row = bind_job(query(&update_sql()), job)
            .bind(now_ms)
            .bind(next_fire_ms)
            .bind(id)
            .bind(job.calendar.as_deref())
            .bind(&job.description)
            .bind(&job.owner)
            .fetch_optional(self.writer())
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// [`Db::update_job`], unless the new children would let the job trigger itself, directly or
    /// through others.
    ///
    /// The child-job graph is read in the transaction that writes, and that transaction is
    /// alone among those that give a job children: SQLite has one writer connection, and on
    /// PostgreSQL each takes the same advisory lock first (and reads after it, so it sees what
    /// the one before it committed). Two updates that would each be harmless alone (A → B and
    /// B → A) cannot both read the graph before the other's write and together close a cycle.
    /// Removing children never closes one, so an update without children checks nothing.
    pub async fn update_job_checked(
        &self,
        id: i64,
        job: &JobSpec,
        next_fire_ms: i64,
        now_ms: i64,
    ) -> Result<JobUpdate> {
        let mut tx = self.writer().begin().await?;
        if !job.child_job_ids.is_empty() {
            if self.dialect == Dialect::Postgres {
                // Wrapped, so that the row read holds no `void` column (which `Any` rows lack).
                query("select 1 as locked from (select pg_advisory_xact_lock($1)) as l")
                    .bind(CHILD_GRAPH_LOCK)
                    .fetch_one(&mut *tx)
                    .await?;
            }
            // On MySQL the read itself locks every job's row, in key order: an update that
            // comes second waits here and then reads the first one's write.
            let read = match self.dialect {
                Dialect::Mysql => "select id, child_job_ids from jobs order by id for update",
                Dialect::Postgres | Dialect::Sqlite => "select id, child_job_ids from jobs",
            };
            let rows = query(read).fetch_all(&mut *tx).await?;
            let mut edges = std::collections::HashMap::new();
            for row in &rows {
                let children: String = row.try_get("child_job_ids")?;
                let children = split_list(&children).filter_map(|id| id.parse().ok()).collect();
                edges.insert(row.try_get::<i64, _>("id")?, children);
            }
            if let Some(cycle) = child_job_cycle(Some(id), &job.child_job_ids, &edges) {
                tx.rollback().await?;
                return Ok(JobUpdate::Cycle(cycle));
            }
        }
        let row = bind_job(query(&update_sql()), job)
            .bind(now_ms)
            .bind(next_fire_ms)
            .bind(id)
            .bind(job.calendar.as_deref())
            .bind(&job.description)
            .bind(&job.owner)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        match row {
            Some(row) => Ok(JobUpdate::Updated(Box::new(job_from_row(&row)?))),
            None => Ok(JobUpdate::NotFound),
        }
    }

    /// Deletes job `id` with its versions; its runs stay as history. Whether it existed.
    pub async fn delete_job(&self, id: i64) -> Result<bool> {
        let mut tx = self.writer().begin().await?;
        query("delete from job_versions where job_id = $1").bind(id).execute(&mut *tx).await?;
        let done = query("delete from jobs where id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Job `id`, if it exists.
    pub async fn get_job(&self, id: i64) -> Result<Option<Job>> {
        let row = query(&format!("select {COLUMNS} from jobs where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// The jobs of `ids` that exist, in no particular order. On SQLite they are read on the
    /// group commit's connection (`Db::select_by_ids`): the dispatcher's cache reads them on
    /// its hot path.
    pub async fn get_jobs(&self, ids: &[i64]) -> Result<Vec<Job>> {
        let rows = self.select_by_ids(&format!("select {COLUMNS} from jobs"), ids).await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The [`JobStamp`] of each of jobs `ids` that exists: whether a copy read earlier is
    /// still the job, for two numbers a job instead of every column.
    pub async fn job_stamps(&self, ids: &[i64]) -> Result<Vec<(i64, JobStamp)>> {
        let rows = self.select_by_ids("select id, revision, updated_at from jobs", ids).await?;
        rows.iter().map(|row| Ok((row.required_int("id")?, stamp_from_row(row)?))).collect()
    }

    /// Jobs by id, optionally of one group.
    pub async fn list_jobs(&self, group_id: Option<i64>) -> Result<Vec<Job>> {
        let rows = query(&format!(
            "select {COLUMNS} from jobs where ($1 = 0 or group_id = $1) order by id"
        ))
        .bind(group_id.unwrap_or(0))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Starts (`next_fire_ms` > 0) or stops (`None`) job `id`. Whether it exists.
    pub async fn set_job_running(
        &self,
        id: i64,
        next_fire_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool> {
        // A start or a stop, while fires lock the job's row: on MariaDB, seen chosen as a
        // deadlock's victim.
        let done = super::contention::retrying_transient(|| async {
            let done = query(
                "update jobs set running = $1, next_fire_ms = $2, updated_at = $3,
                    revision = revision + 1 where id = $4",
            )
            .bind(i64::from(next_fire_ms.is_some()))
            .bind(next_fire_ms.unwrap_or(0))
            .bind(now_ms)
            .bind(id)
            .execute(self.writer())
            .await?;
            Ok(done)
        })
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Running jobs of the partitions `held` holds whose next fire is at or before
    /// `until_ms`, soonest first: their stamps, not the jobs (see [`DueJob`]).
    pub async fn due_jobs(&self, until_ms: i64, limit: i64, held: &Held) -> Result<Vec<DueJob>> {
        self.due_jobs_where(until_ms, limit, &partition_filter(held, "jobs.id")).await
    }

    /// [`Db::due_jobs`] without the jobs that have a run in flight (sent, or running on an
    /// executor): what the scheduler fires past the bound on unfinished runs.
    pub async fn due_jobs_without_runs_in_flight(
        &self,
        until_ms: i64,
        limit: i64,
        held: &Held,
    ) -> Result<Vec<DueJob>> {
        let idle = format!(
            "{} and not exists (select 1 from runs where runs.job_id = jobs.id and runs.{})",
            partition_filter(held, "jobs.id"),
            super::caps::IN_FLIGHT
        );
        self.due_jobs_where(until_ms, limit, &idle).await
    }

    /// The due jobs that also meet `condition` (a SQL `and …` over `jobs`, or nothing), a
    /// [`Db::hot_read`]: on SQLite the fires just moved these rows on the group commit's
    /// connection.
    async fn due_jobs_where(
        &self,
        until_ms: i64,
        limit: i64,
        condition: &str,
    ) -> Result<Vec<DueJob>> {
        let rows = self
            .hot_read(|p| {
                let mut statement = Statement::new(format!(
                    "select {DUE_COLUMNS} from jobs
                     where running = 1 and next_fire_ms > 0 and next_fire_ms <= {} {condition}
                     order by next_fire_ms limit {}",
                    p(1),
                    p(2)
                ));
                statement.bind(until_ms).bind(limit);
                statement
            })
            .await?;
        rows.iter().map(due_job_from_row).collect()
    }

    /// The earliest next fire of any running job of the partitions `held` holds, if there is
    /// one.
    pub async fn earliest_fire(&self, held: &Held) -> Result<Option<i64>> {
        let row = query(&format!(
            "select min(next_fire_ms) as at from jobs where running = 1 and next_fire_ms > 0 {}",
            partition_filter(held, "jobs.id")
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<Option<i64>, _>("at")?)
    }
}

fn bind_job<'q>(query: super::query::Query<'q>, job: &'q JobSpec) -> super::query::Query<'q> {
    let child_job_ids: Vec<String> = job.child_job_ids.iter().map(i64::to_string).collect();
    query
        .bind(job.group_id)
        .bind(&job.name)
        .bind(job.schedule_type.as_str())
        .bind(&job.schedule_conf)
        .bind(job.time_zone.as_deref())
        .bind(job.misfire_strategy.as_str())
        .bind(job.route_strategy.as_str())
        .bind(job.block_strategy.as_str())
        .bind(job.timeout_secs)
        .bind(job.retry_count)
        .bind(job.glue_type.as_str())
        .bind(job.handler.as_deref())
        .bind(&job.param)
        .bind(child_job_ids.join(","))
        .bind(job.alarm_email.as_deref())
        .bind(job.fuel_limit)
        .bind(job.memory_limit_mb)
        .bind(job.misfire_threshold_ms)
        .bind(job.sharding_total_count)
        .bind(&job.sharding_item_parameters)
        .bind(job.sharding_strategy.as_str())
        .bind(job.alarm_silence_secs)
        .bind(job.retry_interval_secs)
        .bind(job.retry_backoff.as_str())
        .bind(job.retry_max_interval_secs)
        .bind(job.max_concurrent_runs)
}

/// The statement of a job's update: its fields, then `updated_at`, the next fire and the id.
/// The next fire is assigned first: it reads the job's old `schedule_type`, and MySQL evaluates
/// assignments in order, each seeing those before it.
fn update_sql() -> String {
    format!(
        "update jobs set next_fire_ms = case
                when running = 0 then 0
                when next_fire_ms = 0 and schedule_type = 'FIX_DELAY' and $3 = 'FIX_DELAY' then 0
                else $28 end,
            group_id = $1, name = $2, schedule_type = $3, schedule_conf = $4,
            time_zone = $5, misfire_strategy = $6, route_strategy = $7, block_strategy = $8,
            timeout_secs = $9, retry_count = $10, glue_type = $11, handler = $12, param = $13,
            child_job_ids = $14, alarm_email = $15, fuel_limit = $16, memory_limit_mb = $17,
            misfire_threshold_ms = $18, sharding_total_count = $19,
            sharding_item_parameters = $20, sharding_strategy = $21,
            alarm_silence_secs = $22, retry_interval_secs = $23, retry_backoff = $24,
            retry_max_interval_secs = $25, max_concurrent_runs = $26, updated_at = $27,
            revision = revision + 1, calendar = $30, description = $31, owner = $32
         where id = $29 returning {COLUMNS}"
    )
}
