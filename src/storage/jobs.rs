//! Jobs (XXL-JOB's `xxl_job_info`) and the scheduler's fire transaction.

use super::query::query;
use sqlx::{AnyConnection, Row};

use super::job_rows::{
    COLUMNS, DUE_COLUMNS, DueJob, JobStamp, due_job_from_row, job_from_row, stamp_from_row,
};
use super::partitions::{held_now, partition_filter};
use super::run_writes::{Insert, insert_many};
use super::runs::{Claim, NewRun};
use super::statement::Cells;
use super::{Db, Dialect, Result, split_list};
use crate::model::{Job, JobSpec, child_job_cycle};
use crate::partition::{self, Held};
use crate::schedule::NextFire;

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

    /// The due jobs that also meet `condition` (a SQL `and …` over `jobs`, or nothing).
    async fn due_jobs_where(
        &self,
        until_ms: i64,
        limit: i64,
        condition: &str,
    ) -> Result<Vec<DueJob>> {
        let rows = query(&format!(
            "select {DUE_COLUMNS} from jobs
             where running = 1 and next_fire_ms > 0 and next_fire_ms <= $1 {condition}
             order by next_fire_ms limit $2"
        ))
        .bind(until_ms)
        .bind(limit)
        .fetch_all(&self.pool)
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

    /// The scheduler's atomic step: moves job `job_id` from the fire at `expected_fire_ms` to
    /// `next` (`NextFire::Never` stops the job; `NextFire::WhenRunsEnd` leaves it running without
    /// a next fire time until the lifecycle sets one) and creates `runs`, all in one
    /// transaction. Nothing happens, and no run ids come back, if another scheduler got there
    /// first (the job's next fire is no longer `expected_fire_ms`) or a run of the same fire
    /// exists already.
    pub async fn fire_job(
        &self,
        job_id: i64,
        expected_fire_ms: i64,
        next: NextFire,
        runs: &[NewRun],
        now_ms: i64,
    ) -> Result<Vec<i64>> {
        let fire = Fire { job_id, expected_fire_ms, next, runs: runs.to_vec(), claim: None };
        let mut fired = self.fire_jobs(std::slice::from_ref(&fire), now_ms, None).await?;
        Ok(fired.pop().unwrap_or_default().iter().map(Fired::id).collect())
    }

    /// [`Db::fire_job`] for many jobs in one transaction: each job moves, with its runs, only
    /// from the fire it was read at, and, with `lease`, only while its partition is held under
    /// the lease (owner and fence) the fire was planned under, checked in the transaction; the
    /// answer holds each job's new runs, in order (claimed ones for a fire with a `claim`).
    pub async fn fire_jobs(
        &self,
        fires: &[Fire],
        now_ms: i64,
        lease: Option<&Held>,
    ) -> Result<Vec<Vec<Fired>>> {
        let started = std::time::Instant::now();
        let mut tx = self.writer().begin().await?;
        let allowed: Vec<bool> = match lease {
            Some(held) => {
                let wanted = fires.iter().map(|fire| partition::of(fire.job_id)).collect();
                let now_held = held_now(&mut tx, self.dialect, held, &wanted).await?;
                fires.iter().map(|fire| now_held.contains(&partition::of(fire.job_id))).collect()
            }
            None => vec![true; fires.len()],
        };
        let mut moved = vec![false; fires.len()];
        for round in super::distinct_rounds(fires.iter().map(|fire| fire.job_id)) {
            let round: Vec<usize> = round.into_iter().filter(|&index| allowed[index]).collect();
            let mut rest = &round[..];
            for rows in super::statement_sizes(round.len(), 256) {
                let chunk: Vec<&Fire> = rest[..rows].iter().map(|&index| &fires[index]).collect();
                let ids = move_fires(&mut tx, &chunk, now_ms).await?;
                for &index in &rest[..rows] {
                    moved[index] = ids.contains(&fires[index].job_id);
                }
                rest = &rest[rows..];
            }
        }
        let inserts: Vec<Insert<'_>> = fires
            .iter()
            .zip(&moved)
            .filter(|(_, moved)| **moved)
            .flat_map(|(fire, _)| {
                let claim = fire.claim.as_ref().map(|(owner, until)| (owner.as_str(), *until));
                fire.runs.iter().map(move |run| Insert { run, claim, now_ms })
            })
            .collect();
        let mut created = insert_many(&mut tx, &inserts).await?.into_iter();
        tx.commit().await?;
        crate::metrics::admin().db_transaction("fire", started.elapsed());
        let mut all_fired = Vec::with_capacity(fires.len());
        for (fire, moved) in fires.iter().zip(moved) {
            let count = if moved { fire.runs.len() } else { 0 };
            let fired = created.by_ref().take(count).flatten().map(|claim| match fire.claim {
                Some(_) => Fired::Claimed(Box::new(claim)),
                None => Fired::Pending { id: claim.run.id, job_id: claim.run.job_id },
            });
            all_fired.push(fired.collect());
        }
        Ok(all_fired)
    }
}

/// Moves each of `fires` (of distinct jobs) to its next fire if the job is still at the fire it
/// was read at, in one statement; the ids of the jobs moved.
async fn move_fires(
    conn: &mut AnyConnection,
    fires: &[&Fire],
    now_ms: i64,
) -> Result<std::collections::HashSet<i64>> {
    if super::query::is_mysql(conn) {
        let moves: Vec<super::mysql_writes::Move> = fires
            .iter()
            .map(|fire| super::mysql_writes::Move {
                job_id: fire.job_id,
                expected_fire_ms: fire.expected_fire_ms,
                next_fire_ms: fire.next.at().unwrap_or(0),
                running: i64::from(fire.next != NextFire::Never),
            })
            .collect();
        return super::mysql_writes::move_fires(conn, &moves, now_ms).await;
    }
    let p = super::placeholder(conn);
    let values = (0..fires.len())
        .map(|row| {
            let cells = (2..=5).map(|n| format!("cast({} as bigint)", p(row * 4 + n)));
            format!("({})", cells.collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "update jobs set next_fire_ms = v.column3, running = v.column4,
            revision = jobs.revision + 1 - v.column4,
            updated_at = case when v.column4 = 0 then {} else jobs.updated_at end
         from (values {values}) as v
         where jobs.id = v.column1 and jobs.running = 1 and jobs.next_fire_ms = v.column2
         returning id",
        p(1)
    );
    let mut query = query(&sql).bind(now_ms);
    for fire in fires {
        query = query
            .bind(fire.job_id)
            .bind(fire.expected_fire_ms)
            .bind(fire.next.at().unwrap_or(0))
            .bind(i64::from(fire.next != NextFire::Never));
    }
    let rows = query.fetch_all(&mut *conn).await?;
    rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
}

/// One job's fire, for [`Db::fire_jobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The job.
    pub job_id: i64,
    /// The next fire time the scheduler read: the compare of the compare-and-set.
    pub expected_fire_ms: i64,
    /// The fire after this one.
    pub next: NextFire,
    /// The fire's runs (none for a skipped misfire).
    pub runs: Vec<NewRun>,
    /// Create the runs already claimed by this owner until this instant (ms), each with its
    /// executor recorded, instead of pending.
    pub claim: Option<(String, i64)>,
}

/// A newly created run: pending, or claimed at its creation.
#[derive(Debug)]
pub enum Fired {
    /// Pending: to be claimed before it is sent.
    Pending {
        /// The run's id.
        id: i64,
        /// Its job's id.
        job_id: i64,
    },
    /// Claimed at creation.
    Claimed(Box<Claim>),
}

impl Fired {
    /// The run's id.
    pub fn id(&self) -> i64 {
        match self {
            Fired::Pending { id, .. } => *id,
            Fired::Claimed(claim) => claim.run.id,
        }
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
