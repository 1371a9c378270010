//! Backfills and the runs they created (`crate::backfill`).
//!
//! A backfill row holds its window, the schedule it walks, a cursor (the last instant
//! released) and a lease. The admin holding the lease releases the next instants in one
//! transaction that moves the cursor by compare-and-set and creates the instants' runs with
//! their rows in `backfill_runs`, so a crash or a second admin can neither skip an instant nor
//! release one twice. Without `rerun` the runs carry the instant as their fire time, and the
//! runs' unique key on `(job_id, fire_time, shard_index, attempt)` keeps one run per instant
//! across every fire and backfill of the job: an instant that has one is recorded with no run.
//!
//! This module does not decide what to release or when; `admin::backfill` does.

use super::query::query;
use sqlx::Row;

use super::run_inserts::{Insert, insert_many};
use super::runs::{Claim, NewRun, UNFINISHED};
use super::statement::Cells;
use super::{Db, Result, StorageError, parse_column};
use crate::backfill::{Backfill, BackfillState, Progress, WindowSchedule};

const COLUMNS: &str = "id, job_id, from_ms, to_ms, max_concurrent, rerun, schedule_type,
    schedule_conf, time_zone, anchor_ms, total, released, cursor_ms, state, reason, created_by,
    created_at, updated_at, finished_at";

/// A backfill to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBackfill {
    /// The job.
    pub job_id: i64,
    /// The window's first instant (ms), inclusive.
    pub from_ms: i64,
    /// The window's last instant (ms), inclusive.
    pub to_ms: i64,
    /// The most of its runs unfinished at once.
    pub max_concurrent: i64,
    /// Whether instants that already have a run get another.
    pub rerun: bool,
    /// The schedule it walks.
    pub window: WindowSchedule,
    /// How many instants the window holds.
    pub total: i64,
    /// Who asks for it.
    pub created_by: String,
}

/// One release step of a backfill: the instants after its cursor and their runs.
#[derive(Debug, Clone)]
pub struct Release<'a> {
    /// The backfill.
    pub backfill_id: i64,
    /// The admin holding its lease.
    pub owner: &'a str,
    /// The cursor the step was planned from; the step does nothing if it moved.
    pub cursor_ms: i64,
    /// The instants released, in time order, each with its runs (one per shard).
    pub instants: &'a [(i64, Vec<NewRun>)],
    /// Create the runs claimed by this owner until this instant, or pending.
    pub claim_until_ms: Option<i64>,
    /// Now (ms).
    pub now_ms: i64,
}

impl Db {
    /// Creates a running backfill; its cursor is just before its window.
    pub async fn create_backfill(&self, new: &NewBackfill, now_ms: i64) -> Result<Backfill> {
        let row = query(&format!(
            "insert into backfills (job_id, from_ms, to_ms, max_concurrent, rerun, schedule_type,
                schedule_conf, time_zone, anchor_ms, total, cursor_ms, created_by, created_at,
                updated_at)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)
             returning {COLUMNS}"
        ))
        .bind(new.job_id)
        .bind(new.from_ms)
        .bind(new.to_ms)
        .bind(new.max_concurrent)
        .bind(i64::from(new.rerun))
        .bind(new.window.schedule_type.as_str())
        .bind(new.window.schedule_conf.as_str())
        .bind(new.window.time_zone.as_deref())
        .bind(new.window.anchor_ms)
        .bind(new.total)
        .bind(new.from_ms - 1)
        .bind(new.created_by.as_str())
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        backfill_from_row(&row)
    }

    /// Whether any backfill is running (the partial index of running backfills answers it).
    pub async fn running_backfills_exist(&self) -> Result<bool> {
        let row = query(
            "select count(*) as n from (select 1 from backfills where state = 'running' limit 1) b",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    /// Backfill `id`, if it exists.
    pub async fn get_backfill(&self, id: i64) -> Result<Option<Backfill>> {
        let row = query(&format!("select {COLUMNS} from backfills where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(backfill_from_row).transpose()
    }

    /// The backfills of job `job_id`, newest first, at most `limit`.
    pub async fn list_backfills(&self, job_id: i64, limit: i64) -> Result<Vec<Backfill>> {
        let rows = query(&format!(
            "select {COLUMNS} from backfills where job_id = $1 order by id desc limit $2"
        ))
        .bind(job_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(backfill_from_row).collect()
    }

    /// How far `backfill` got, per instant: an instant with no run is skipped; else failed if
    /// one of its runs ended otherwise than in success, running if one has not ended, done if
    /// all succeeded (or were deleted by retention since).
    pub async fn backfill_progress(&self, backfill: &Backfill) -> Result<Progress> {
        let row = query(&format!(
            "select cast(coalesce(sum(skipped), 0) as bigint) as skipped,
                cast(coalesce(sum(case when skipped = 0 and unfinished = 1 then 1 else 0 end), 0)
                    as bigint) as running,
                cast(coalesce(sum(case when skipped = 0 and unfinished = 0 and failed = 1
                    then 1 else 0 end), 0) as bigint) as failed,
                count(*) as released
             from (select b.instant,
                    max(case when b.run_id is null then 1 else 0 end) as skipped,
                    max(case when r.{UNFINISHED} then 1 else 0 end) as unfinished,
                    max(case when r.state in ('failed', 'timed_out', 'killed', 'lost', 'skipped')
                        then 1 else 0 end) as failed
                 from backfill_runs b left join runs r on r.id = b.run_id
                 where b.backfill_id = $1
                 group by b.instant) instants"
        ))
        .bind(backfill.id)
        .fetch_one(&self.pool)
        .await?;
        let count = |column: &str| -> Result<i64> { Ok(row.try_get(column)?) };
        let (skipped, running, failed) = (count("skipped")?, count("running")?, count("failed")?);
        let released = count("released")?;
        Ok(Progress {
            done: released - skipped - running - failed,
            failed,
            skipped,
            running,
            pending: (backfill.total - released).max(0),
        })
    }

    /// Moves backfill `id` from one of `from` to `to` (with `reason`), stamping its end when
    /// `to` is final. `None` (and no change) when it is in none of `from` or does not exist.
    pub async fn set_backfill_state(
        &self,
        id: i64,
        from: &[BackfillState],
        to: BackfillState,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<Backfill>> {
        let states: Vec<String> = from.iter().map(|state| format!("'{state}'")).collect();
        let finished = if to.is_final() { now_ms } else { 0 };
        let row = query(&format!(
            "update backfills set state = $1, reason = $2, updated_at = $3, finished_at = $4
             where id = $5 and state in ({})
             returning {COLUMNS}",
            states.join(", ")
        ))
        .bind(to.as_str())
        .bind(reason)
        .bind(now_ms)
        .bind(finished)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(backfill_from_row).transpose()
    }

    /// Takes or renews, for `owner` until `lease_until_ms`, the lease of every running backfill
    /// that `owner` holds or whose lease ran out before `now_ms`, at most `limit`, and returns
    /// them, oldest first. Each row is taken by one admin: the condition is checked again on
    /// the row once locked.
    pub async fn claim_backfills(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: i64,
    ) -> Result<Vec<Backfill>> {
        let rows = query(&format!(
            "update backfills set lease_owner = $1, lease_until = $2
             where id in (select id from (select id from backfills
                 where state = 'running' and (lease_owner = $1 or lease_until < $3)
                 order by id limit $4) as due)
               and state = 'running' and (lease_owner = $1 or lease_until < $3)
             returning {COLUMNS}"
        ))
        .bind(owner)
        .bind(lease_until_ms)
        .bind(now_ms)
        .bind(limit)
        .fetch_all(self.writer())
        .await?;
        let mut backfills: Vec<Backfill> =
            rows.iter().map(backfill_from_row).collect::<Result<_>>()?;
        backfills.sort_by_key(|backfill| backfill.id);
        Ok(backfills)
    }

    /// Gives up `owner`'s leases on backfills (at a graceful stop), so that another admin, or
    /// this one started again, takes them at once instead of when they run out.
    pub async fn release_backfill_leases(&self, owner: &str) -> Result<u64> {
        let released = query(
            "update backfills set lease_owner = null, lease_until = 0 where lease_owner = $1",
        )
        .bind(owner)
        .execute(self.writer())
        .await?;
        Ok(released.rows_affected())
    }

    /// How many runs of backfill `id` have not ended. The index of unfinished runs answers it,
    /// so it costs the unfinished runs of the job, not the backfill's released ones.
    pub async fn unfinished_backfill_runs(&self, id: i64, job_id: i64) -> Result<i64> {
        let row = query(&format!(
            "select count(*) as n from runs r
             where exists (select 1 from backfill_runs b where b.run_id = r.id and b.backfill_id = $1)
               and r.job_id = $2 and r.{UNFINISHED}"
        ))
        .bind(id)
        .bind(job_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("n")?)
    }

    /// Releases `release`'s instants: moves the backfill's cursor to the last of them, adds
    /// them to its released count, creates their runs and records them, in one transaction.
    /// `None`, and nothing changed, when the backfill is not running under `owner`'s lease or
    /// its cursor moved. Otherwise the runs created, in order (claimed ones with their claim);
    /// a run that existed already is left out and its instant recorded without a run.
    pub async fn release_backfill(&self, release: &Release<'_>) -> Result<Option<Vec<Claim>>> {
        let Some(&(last, _)) = release.instants.last() else { return Ok(Some(Vec::new())) };
        let mut tx = self.writer().begin().await?;
        let moved = query(
            "update backfills set cursor_ms = $1, released = released + $2, updated_at = $3
             where id = $4 and lease_owner = $5 and cursor_ms = $6 and state = 'running'",
        )
        .bind(last)
        .bind(release.instants.len() as i64)
        .bind(release.now_ms)
        .bind(release.backfill_id)
        .bind(release.owner)
        .bind(release.cursor_ms)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(None);
        }
        let claim = release.claim_until_ms.map(|until| (release.owner, until));
        let inserts: Vec<Insert<'_>> = release
            .instants
            .iter()
            .flat_map(|(_, runs)| runs.iter())
            .map(|run| Insert { run, claim, now_ms: release.now_ms })
            .collect();
        let created = insert_many(&mut tx, &inserts).await?;
        let mut rows = Recorded::with_capacity(created.len());
        let mut created = created.into_iter();
        for (instant, runs) in release.instants {
            for run in runs {
                let claim = created.next().flatten();
                rows.push((*instant, run.shard_index, claim.as_ref().map(|claim| claim.run.id)));
                if let Some(claim) = claim {
                    rows.push_claim(claim);
                }
            }
        }
        for chunk in rows.records.chunks(100) {
            let values: Vec<String> = (0..chunk.len())
                .map(|row| {
                    let n = row * 4;
                    format!("(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4)
                })
                .collect();
            let sql = format!(
                "insert into backfill_runs (backfill_id, instant, shard_index, run_id) values {}",
                values.join(", ")
            );
            let mut query = query(&sql);
            for (instant, shard_index, run_id) in chunk {
                query =
                    query.bind(release.backfill_id).bind(*instant).bind(*shard_index).bind(*run_id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Some(rows.claims))
    }

    /// Ends backfill `id` as done if `owner` holds it, it is running, every instant is
    /// released and none of its runs is unfinished. Whether it ended.
    pub async fn finish_backfill(&self, id: i64, owner: &str, now_ms: i64) -> Result<bool> {
        let done = query(&format!(
            "update backfills set state = 'done', updated_at = $1, finished_at = $1
             where id = $2 and lease_owner = $3 and state = 'running' and released >= total
               and not exists (select 1 from backfill_runs b join runs r on r.id = b.run_id
                   where b.backfill_id = $2 and r.{UNFINISHED})"
        ))
        .bind(now_ms)
        .bind(id)
        .bind(owner)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }
}

/// The rows a release records and the runs it created.
struct Recorded {
    records: Vec<(i64, i64, Option<i64>)>,
    claims: Vec<Claim>,
}

impl Recorded {
    fn with_capacity(capacity: usize) -> Recorded {
        Recorded { records: Vec::with_capacity(capacity), claims: Vec::with_capacity(capacity) }
    }

    fn push(&mut self, record: (i64, i64, Option<i64>)) {
        self.records.push(record);
    }

    fn push_claim(&mut self, claim: Claim) {
        self.claims.push(claim);
    }
}

fn backfill_from_row(row: &impl Cells) -> Result<Backfill> {
    Ok(Backfill {
        id: row.required_int("id")?,
        job_id: row.required_int("job_id")?,
        from_ms: row.required_int("from_ms")?,
        to_ms: row.required_int("to_ms")?,
        max_concurrent: row.required_int("max_concurrent")?,
        rerun: row.required_int("rerun")? != 0,
        window: WindowSchedule {
            schedule_type: parse_column(row, "schedule_type")?,
            schedule_conf: row.required_text("schedule_conf")?,
            time_zone: row.text("time_zone")?,
            anchor_ms: row.required_int("anchor_ms")?,
        },
        total: row.required_int("total")?,
        released: row.required_int("released")?,
        cursor_ms: row.required_int("cursor_ms")?,
        state: row
            .required_text("state")?
            .parse()
            .map_err(|error: String| StorageError::Corrupt(format!("state: {error}")))?,
        reason: row.required_text("reason")?,
        created_by: row.required_text("created_by")?,
        created_at_ms: row.required_int("created_at")?,
        updated_at_ms: row.required_int("updated_at")?,
        finished_at_ms: row.required_int("finished_at")?,
    })
}
