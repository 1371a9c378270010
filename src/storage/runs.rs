//! Run records (XXL-JOB's `xxl_job_log`) and their lifecycle as stored state.
//!
//! A run is created `pending` (by a fire, a manual trigger, a retry or a parent), claimed by one
//! dispatcher under a lease (`claim_run`: owner, expiry, and a fencing counter that every claim
//! bumps), and then moved by `apply_transition`: one compare-and-set on the run's state (and, for
//! a dispatcher's events, on its lease owner and fence) in the same transaction as the runs the
//! transition implies. A retry or a child run therefore exists exactly when its cause committed,
//! and an old lease holder can record nothing once its lease moved on. The same transaction sets
//! a `FIX_DELAY` job's next fire when the run was the last unfinished one of its fire, and
//! inserts the alarm event of a final failure.

use sqlx::{AnyConnection, Row};

use super::reports::Deltas;
use super::statement::{Cells, Exec, Statement};
use super::{Db, Result, parse_column};
use crate::lifecycle::Transition;
use crate::model::{RunRecord, RunState, ShardingItem, TriggerType};

const COLUMNS: &str = "id, job_id, executor_address, trigger_type, trigger_time, param, trigger_code,
    trigger_msg, handle_time, handle_code, handle_msg, shard_index, shard_total, attempt, version, sha256,
    fuel_used, state, parent_run_id, kill_requested, dispatched_at, started_at, claimed_at,
    fire_time, sharding_items";

/// SQL for "the run has ended".
const TERMINAL: &str = "state in ('success', 'failed', 'timed_out', 'killed', 'lost', 'skipped')";
/// SQL for "the run has not ended".
const UNFINISHED: &str = "state in ('pending', 'dispatching', 'running')";

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
    /// The ElasticJob sharding items it processes (empty when the job is not sharded).
    pub sharding_items: Vec<ShardingItem>,
    /// Retry number.
    pub attempt: i64,
    /// The module version pinned for this run, and its digest.
    pub version: Option<(i64, String)>,
    /// The run this one follows (the failed run it retries, or the parent job's run).
    pub parent_run_id: Option<i64>,
}

/// A run a dispatcher now holds the lease on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The run, as claimed.
    pub run: RunRecord,
    /// The fencing counter of this claim: 1 for the first claim, more when an earlier holder's
    /// lease ran out (that holder may have sent the run before it died).
    pub fence: i64,
}

/// Which runs to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only this job's.
    pub job_id: Option<i64>,
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs triggered at or after this instant (ms).
    pub from_ms: Option<i64>,
    /// Only runs triggered at or before this instant (ms).
    pub to_ms: Option<i64>,
    /// Page size.
    pub limit: i64,
    /// Rows to skip.
    pub offset: i64,
    /// Count the matching runs only up to this many (`None`: all of them). A page of a large
    /// table then costs its rows and at most this many index entries, not a scan of the table.
    pub count_up_to: Option<i64>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPage {
    /// How many runs match the filter, counted up to the filter's `count_up_to`.
    pub total: i64,
    /// Whether more runs match than `total` says (the count stopped at `count_up_to`).
    pub total_capped: bool,
    /// Whether runs past this page match the filter.
    pub has_more: bool,
    /// This page.
    pub items: Vec<RunRecord>,
}

impl Db {
    /// The runs among `ids` that exist, in no particular order (one query per 500 ids). On
    /// SQLite a results batch reads the runs it is about to end on the group commit's
    /// connection, which just wrote them (`Db::select_by_ids`).
    pub async fn get_runs(&self, ids: &[i64]) -> Result<Vec<RunRecord>> {
        let rows = self.select_by_ids(&format!("select {COLUMNS} from runs"), ids).await?;
        rows.iter().map(run_from_row).collect()
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
        let condition = "($1 = 0 or job_id = $1) and ($2 = '' or state = $2)
            and trigger_time >= $3 and trigger_time <= $4";
        let job_id = filter.job_id.unwrap_or(0);
        let handle_code = filter.state.map_or("", RunState::as_str);
        let from_ms = filter.from_ms.unwrap_or(i64::MIN);
        let to_ms = filter.to_ms.unwrap_or(i64::MAX);
        // One row past the cap says that the count stopped there.
        let counted = match filter.count_up_to {
            Some(_) => format!(
                "select count(*) as n from (select 1 from runs where {condition} limit $5) capped"
            ),
            None => format!("select count(*) as n from runs where {condition}"),
        };
        let cap = filter.count_up_to.unwrap_or(i64::MAX);
        let total: i64 = sqlx::query(&counted)
            .bind(job_id)
            .bind(handle_code)
            .bind(from_ms)
            .bind(to_ms)
            .bind(cap.saturating_add(1))
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        // One row past the page says whether another page follows.
        let rows = sqlx::query(&format!(
            "select {COLUMNS} from runs where {condition} order by id desc limit $5 offset $6"
        ))
        .bind(job_id)
        .bind(handle_code)
        .bind(from_ms)
        .bind(to_ms)
        .bind(filter.limit.saturating_add(1))
        .bind(filter.offset)
        .fetch_all(&self.pool)
        .await?;
        let mut items: Vec<RunRecord> = rows.iter().map(run_from_row).collect::<Result<_>>()?;
        let has_more = items.len() > usize::try_from(filter.limit).unwrap_or(usize::MAX);
        items.truncate(usize::try_from(filter.limit).unwrap_or(0));
        Ok(RunPage { total: total.min(cap), total_capped: total > cap, has_more, items })
    }

    /// Ids of runs a dispatcher may claim now: pending runs due at or before `due_ms`, and runs
    /// whose dispatcher's lease ran out before `now_ms`; the oldest first, at most `limit`.
    pub async fn dispatchable_runs(
        &self,
        due_ms: i64,
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<i64>> {
        let mut ids = Vec::new();
        for (sql, bound) in [
            (
                "select id from runs where state = 'pending' and trigger_time <= $1
                 order by trigger_time limit $2",
                due_ms,
            ),
            (
                "select id from runs where state = 'dispatching' and lease_until < $1
                 order by lease_until limit $2",
                now_ms,
            ),
        ] {
            let rows = sqlx::query(sql).bind(bound).bind(limit).fetch_all(&self.pool).await?;
            for row in rows {
                ids.push(row.try_get("id")?);
            }
        }
        Ok(ids)
    }

    /// Running runs whose admin deadline passed before `now_ms`, at most `limit`.
    pub async fn runs_past_deadline(&self, now_ms: i64, limit: i64) -> Result<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "select {COLUMNS} from runs where state = 'running' and deadline > 0 and deadline < $1
             order by deadline limit $2"
        ))
        .bind(now_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// How many runs have not ended (pending, dispatching or running), counting at most `cap`:
    /// the partial index of unfinished runs answers it, and a read costs at most `cap` of its
    /// entries.
    pub async fn count_unfinished_runs(&self, cap: i64) -> Result<i64> {
        let row = sqlx::query(
            "select count(*) as n from (select 1 from runs
             where state in ('pending', 'dispatching', 'running') limit $1) as unfinished",
        )
        .bind(cap)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("n")?)
    }

    /// The executors that have running runs.
    pub async fn executors_with_running_runs(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "select distinct executor_address from runs
             where state = 'running' and executor_address is not null",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("executor_address")?)).collect()
    }

    /// Ids of the runs running on `address` that an executor accepted before
    /// `dispatched_before_ms`, oldest first, at most `limit`. Ids only: the index of running
    /// runs on `(executor_address, dispatched_at)` answers this without reading a run's row, so a
    /// heartbeat from an executor holding many runs stays cheap.
    pub async fn running_run_ids_on(
        &self,
        address: &str,
        dispatched_before_ms: i64,
        limit: i64,
    ) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "select id from runs
             where state = 'running' and executor_address = $1 and dispatched_at < $2
             order by dispatched_at limit $3",
        )
        .bind(address)
        .bind(dispatched_before_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Deletes at most `limit` ended runs created before `created_before_ms` (log retention);
    /// returns how many. The daily report keeps counting them (`reports`).
    pub async fn delete_ended_runs(&self, created_before_ms: i64, limit: i64) -> Result<u64> {
        let deleted = sqlx::query(&format!(
            "delete from runs where id in (
                select id from runs where created_at < $1 and {TERMINAL}
                order by created_at limit $2)"
        ))
        .bind(created_before_ms)
        .bind(limit)
        .execute(self.writer())
        .await?;
        Ok(deleted.rows_affected())
    }
}

/// Claims run `id` on `conn` (see [`Db::claim_run`]).
pub(super) async fn claim(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Option<Claim>> {
    let row = sqlx::query(&format!(
        "update runs set state = 'dispatching', lease_owner = $1, lease_until = $2,
            fence = fence + 1, claimed_at = case when claimed_at = 0 then $3 else claimed_at end
         where id = $4 and (state = 'pending' or (state = 'dispatching' and lease_until < $3))
         returning {COLUMNS}, fence"
    ))
    .bind(owner)
    .bind(lease_until_ms)
    .bind(now_ms)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Claim { run: run_from_row(&row)?, fence: row.try_get("fence")? }))
}

/// Renews a lease on `conn` (see [`Db::renew_lease`]).
pub(super) async fn renew(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    fence: i64,
    lease_until_ms: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "update runs set lease_until = $1
         where id = $2 and state = 'dispatching' and lease_owner = $3 and fence = $4",
    )
    .bind(lease_until_ms)
    .bind(id)
    .bind(owner)
    .bind(fence)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a run's executor on `conn` (see [`Db::set_run_target`]).
pub(super) async fn target(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    fence: i64,
    address: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "update runs set executor_address = $1
         where id = $2 and state = 'dispatching' and lease_owner = $3 and fence = $4",
    )
    .bind(address)
    .bind(id)
    .bind(owner)
    .bind(fence)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Applies a transition and creates its follow-ups on `conn`, which must be inside a
/// transaction or savepoint (see [`Db::apply_transition`]).
pub(super) async fn apply(
    conn: &mut AnyConnection,
    update: &Update<'_>,
    follow_ups: &[NewRun],
) -> Result<Option<(RunRecord, Vec<i64>)>> {
    let Some(run) = update_many(conn, std::slice::from_ref(update)).await?.pop() else {
        return Ok(None);
    };
    let mut ids = Vec::with_capacity(follow_ups.len());
    for follow_up in follow_ups {
        if let Some(id) = insert_run(conn, follow_up, update.now_ms).await? {
            ids.push(id);
        }
    }
    let delay = update.transition.next_fire_delay_ms;
    if let (Some(delay_ms), Some(fire_ms)) = (delay, run.fire_time_ms) {
        let next_fire_ms = update.now_ms.saturating_add(delay_ms);
        schedule_after_fire(conn, run.job_id, fire_ms, next_fire_ms, update.now_ms).await?;
    }
    if update.transition.alarm {
        super::alarms::insert_run_failed(conn, &run, update.now_ms).await?;
    }
    Ok(Some((run, ids)))
}

/// One run's transition to record: the compare-and-set of [`update_many`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Update<'a> {
    pub id: i64,
    pub transition: &'a Transition,
    /// The lease (owner, fence) the run must still be under.
    pub lease: Option<(&'a str, i64)>,
    pub fuel_used: Option<i64>,
    pub now_ms: i64,
}

/// The parameters of one row of [`update_many`]'s `values` list.
const UPDATE_PARAMS: usize = 17;
/// The most rows in one update statement.
const MAX_UPDATE_ROWS: usize = 256;

/// Records each of `updates` (of distinct runs) whose compare holds, a statement for many, and
/// returns those runs as they are now.
pub(super) async fn update_many(
    conn: &mut AnyConnection,
    updates: &[Update<'_>],
) -> Result<Vec<RunRecord>> {
    let mut deltas = Deltas::default();
    let mut exec = Exec::Sqlx(conn);
    let updated = update_many_with(&mut exec, updates, &mut deltas).await?;
    deltas.write(&mut exec).await?;
    Ok(updated)
}

/// [`update_many`], adding the runs it ends to `deltas` instead of to the report: the caller
/// writes them in the same transaction.
pub(super) async fn update_many_with(
    exec: &mut Exec<'_>,
    updates: &[Update<'_>],
    deltas: &mut Deltas,
) -> Result<Vec<RunRecord>> {
    let mut updated = Vec::with_capacity(updates.len());
    let mut rest = updates;
    for rows in super::statement_sizes(updates.len(), MAX_UPDATE_ROWS) {
        updated.extend(update_rows(exec, &rest[..rows], deltas).await?);
        rest = &rest[rows..];
    }
    Ok(updated)
}

async fn update_rows(
    exec: &mut Exec<'_>,
    updates: &[Update<'_>],
    deltas: &mut Deltas,
) -> Result<Vec<RunRecord>> {
    const TYPES: [&str; UPDATE_PARAMS] = [
        "bigint", "text", "bigint", "text", "text", "bigint", "bigint", "bigint", "text", "bigint",
        "bigint", "bigint", "text", "text", "bigint", "bigint", "bigint",
    ];
    let sql = super::statement::shaped(exec, "update runs", updates.len(), || {
        let p = exec.placeholder();
        let values = (0..updates.len())
            .map(|row| {
                let cells = TYPES.iter().enumerate().map(|(column, kind)| {
                    format!("cast({} as {kind})", p(row * UPDATE_PARAMS + column + 1))
                });
                format!("({})", cells.collect::<Vec<_>>().join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ");
        // v.column1 id, 2 to, 3 trigger code, 4 trigger msg, 5 executor, 6 dispatched at,
        // 7 deadline, 8 handle code, 9 handle msg, 10 now, 11 fuel used, 12 request kill,
        // 13 from, 14 lease owner ('' for none), 15 fence, 16 kill requested before, 17 started
        // at.
        format!(
            "update runs set state = v.column2,
                trigger_code = coalesce(v.column3, runs.trigger_code),
                trigger_msg = coalesce(v.column4, runs.trigger_msg),
                executor_address = coalesce(v.column5, runs.executor_address),
                dispatched_at = coalesce(v.column6, runs.dispatched_at),
                deadline = coalesce(v.column7, runs.deadline),
                handle_code = coalesce(v.column8, runs.handle_code),
                handle_msg = coalesce(v.column9, runs.handle_msg),
                handle_time = case when v.column8 is null then runs.handle_time else v.column10 end,
                fuel_used = coalesce(v.column11, runs.fuel_used),
                kill_requested = case when v.column12 = 1 then 1 else runs.kill_requested end,
                lease_owner = case when v.column2 = 'dispatching' then runs.lease_owner else null end,
                started_at = coalesce(v.column17, runs.started_at)
             from (values {values}) as v
             where runs.id = v.column1 and runs.state = v.column13
                and runs.kill_requested = v.column16
                and (v.column14 = '' or (runs.lease_owner = v.column14 and runs.fence = v.column15))
             returning {COLUMNS}, created_at"
        )
    });
    let mut statement = Statement::new(sql);
    for update in updates {
        let transition = update.transition;
        let (handle_code, handle_msg) = match &transition.handle {
            Some((code, msg)) => (Some(i64::from(*code)), Some(msg.as_str())),
            None => (None, None),
        };
        let (dispatched_at, deadline) = transition.dispatched.unzip();
        let (owner, fence) = update.lease.unzip();
        statement
            .bind(update.id)
            .bind(transition.to.as_str())
            .bind(transition.trigger_code.map(i64::from))
            .bind(transition.trigger_msg.as_deref())
            .bind(transition.executor_address.as_deref())
            .bind(dispatched_at)
            .bind(deadline)
            .bind(handle_code)
            .bind(handle_msg)
            .bind(update.now_ms)
            .bind(update.fuel_used)
            .bind(i64::from(transition.request_kill))
            .bind(transition.from.as_str())
            .bind(owner.unwrap_or(""))
            .bind(fence.unwrap_or(0))
            .bind(i64::from(transition.kill_requested_before))
            .bind(transition.started_at);
    }
    let rows = exec.fetch_all(&statement).await?;
    let runs = rows.iter().map(run_from_row).collect::<Result<Vec<_>>>()?;
    // A transition never leaves an ended state: each ended run here ended in this statement.
    let created_at = rows.iter().map(|row| row.required_int("created_at"));
    let ended = created_at.zip(&runs).map(|(at, run)| Ok((at?, run.state, run.job_id)));
    deltas.ended(ended.collect::<Result<Vec<_>>>()?);
    Ok(runs)
}

/// Sets the next fire of `FIX_DELAY` job `job_id` to `next_fire_ms` if it is running, waits for
/// its fire at `fire_ms` to end, and no run of that fire is unfinished any more.
///
/// Two runs of one fire (shards) may end in concurrent transactions on PostgreSQL. Each first
/// locks the job's row with a no-op update, and only then looks at the fire's other runs with a
/// fresh statement: whichever locks second sees the first's run ended (it committed before
/// releasing the lock), so the last run to end always sets the next fire.
async fn schedule_after_fire(
    conn: &mut AnyConnection,
    job_id: i64,
    fire_ms: i64,
    next_fire_ms: i64,
    now_ms: i64,
) -> Result<()> {
    sqlx::query("update jobs set next_fire_ms = next_fire_ms where id = $1")
        .bind(job_id)
        .execute(&mut *conn)
        .await?;
    sqlx::query(&format!(
        "update jobs set next_fire_ms = $1, updated_at = $2
         where id = $3 and running = 1 and next_fire_ms = 0 and schedule_type = 'FIX_DELAY'
            and not exists (select 1 from runs where job_id = $3 and fire_time = $4 and {UNFINISHED})"
    ))
    .bind(next_fire_ms)
    .bind(now_ms)
    .bind(job_id)
    .bind(fire_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts `run` on `conn`; `None` when the same fire, shard and attempt exist already.
pub(super) async fn insert_run(
    conn: &mut AnyConnection,
    run: &NewRun,
    now_ms: i64,
) -> Result<Option<i64>> {
    let insert = Insert { run, claim: None, now_ms };
    let mut created = insert_many(conn, std::slice::from_ref(&insert)).await?;
    Ok(created.pop().flatten().map(|created| created.run.id))
}

/// A run to create with [`insert_many`]: pending, or with `claim` (owner, lease end)
/// `dispatching` under fence 1.
#[derive(Debug, Clone, Copy)]
pub(super) struct Insert<'a> {
    pub run: &'a NewRun,
    pub claim: Option<(&'a str, i64)>,
    pub now_ms: i64,
}

/// The parameters of one row of an insert.
const INSERT_PARAMS: usize = 19;
/// The most rows in one insert statement.
const MAX_INSERT_ROWS: usize = 512;

/// Inserts `inserts`, each answered with the run as created (and its fence), or `None` when the
/// same fire, shard and attempt exist already.
pub(super) async fn insert_many(
    conn: &mut AnyConnection,
    inserts: &[Insert<'_>],
) -> Result<Vec<Option<Claim>>> {
    let mut deltas = Deltas::default();
    let mut exec = Exec::Sqlx(conn);
    let created = insert_many_with(&mut exec, inserts, &mut deltas).await?;
    deltas.write(&mut exec).await?;
    Ok(created)
}

/// [`insert_many`], adding the runs it creates to `deltas` instead of to the report: the caller
/// writes them in the same transaction.
pub(super) async fn insert_many_with(
    exec: &mut Exec<'_>,
    inserts: &[Insert<'_>],
    deltas: &mut Deltas,
) -> Result<Vec<Option<Claim>>> {
    let mut created = Vec::with_capacity(inserts.len());
    let mut rest = inserts;
    for rows in super::statement_sizes(inserts.len(), MAX_INSERT_ROWS) {
        created.extend(insert_rows(exec, &rest[..rows], deltas).await?);
        rest = &rest[rows..];
    }
    Ok(created)
}

async fn insert_rows(
    exec: &mut Exec<'_>,
    inserts: &[Insert<'_>],
    deltas: &mut Deltas,
) -> Result<Vec<Option<Claim>>> {
    let sql = super::statement::shaped(exec, "insert into runs", inserts.len(), || {
        let p = exec.placeholder();
        let values = (0..inserts.len())
            .map(|row| {
                let cells = (1..=INSERT_PARAMS).map(|n| p(row * INSERT_PARAMS + n));
                format!("({})", cells.collect::<Vec<_>>().join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "insert into runs (job_id, executor_address, trigger_type, trigger_time, fire_time,
                param, shard_index, shard_total, attempt, version, sha256, parent_run_id,
                created_at, sharding_items, state, lease_owner, lease_until, fence, claimed_at)
             values {values}
             on conflict (job_id, fire_time, shard_index, attempt) where fire_time is not null
                do nothing
             returning id, {IDENTITY}"
        )
    });
    let mut statement = Statement::new(sql);
    for Insert { run, claim, now_ms } in inserts {
        let (version, sha256) = match &run.version {
            Some((version, sha256)) => (Some(*version), Some(sha256.as_str())),
            None => (None, None),
        };
        let (state, fence, claimed_at) = match claim {
            Some(_) => (RunState::Dispatching, 1, *now_ms),
            None => (RunState::Pending, 0, 0),
        };
        let (owner, lease_until_ms) = claim.unzip();
        statement
            .bind(run.job_id)
            .bind(run.executor_address.as_deref())
            .bind(run.trigger_type.as_str())
            .bind(run.trigger_time_ms)
            .bind(run.fire_time_ms)
            .bind(run.param.as_str())
            .bind(run.shard_index)
            .bind(run.shard_total)
            .bind(run.attempt)
            .bind(version)
            .bind(sha256)
            .bind(run.parent_run_id)
            .bind(*now_ms)
            .bind(format_items(&run.sharding_items))
            .bind(state.as_str())
            .bind(owner)
            .bind(lease_until_ms.unwrap_or(0))
            .bind(fence)
            .bind(claimed_at);
    }
    // The rows come back in no promised order: each goes to the first unanswered insert it
    // matches. Inserts that match the same rows are alike in everything stored for them. A
    // new row holds what was inserted and the columns' defaults, so only its id and what tells
    // it from the others come back.
    let mut created: Vec<Option<Claim>> = vec![None; inserts.len()];
    for row in exec.fetch_all(&statement).await? {
        let id = row.required_int("id")?;
        let identity = identity_from_row(&row)?;
        let slot = inserts
            .iter()
            .zip(&created)
            .position(|(insert, created)| created.is_none() && identity.is(insert.run));
        match slot {
            Some(slot) => created[slot] = Some(inserted(&inserts[slot], id)),
            None => {
                let message = format!("inserted run {id} matches no insert");
                return Err(super::StorageError::Corrupt(message));
            }
        }
    }
    let created_at = inserts.iter().zip(&created).filter(|(_, created)| created.is_some());
    deltas.created(created_at.map(|(insert, _)| insert.now_ms));
    Ok(created)
}

/// The columns that tell apart the rows of one insert (see [`RowIdentity`]).
const IDENTITY: &str =
    "job_id, fire_time, shard_index, attempt, trigger_time, trigger_type, parent_run_id,
    executor_address, param";

/// What tells a new run's row from the others of its insert: the unique key and what else two
/// runs of one job inserted together may differ in.
struct RowIdentity {
    job_id: i64,
    fire_time_ms: Option<i64>,
    shard_index: i64,
    attempt: i64,
    trigger_time_ms: i64,
    trigger_type: TriggerType,
    parent_run_id: Option<i64>,
    executor_address: Option<String>,
    param: String,
}

impl RowIdentity {
    /// Whether this is the row stored for `new`.
    fn is(&self, new: &NewRun) -> bool {
        new.job_id == self.job_id
            && new.fire_time_ms == self.fire_time_ms
            && new.shard_index == self.shard_index
            && new.attempt == self.attempt
            && new.trigger_time_ms == self.trigger_time_ms
            && new.trigger_type == self.trigger_type
            && new.parent_run_id == self.parent_run_id
            && new.executor_address == self.executor_address
            && new.param == self.param
    }
}

fn identity_from_row(row: &impl Cells) -> Result<RowIdentity> {
    Ok(RowIdentity {
        job_id: row.required_int("job_id")?,
        fire_time_ms: row.int("fire_time")?,
        shard_index: row.required_int("shard_index")?,
        attempt: row.required_int("attempt")?,
        trigger_time_ms: row.required_int("trigger_time")?,
        trigger_type: parse_column(row, "trigger_type")?,
        parent_run_id: row.int("parent_run_id")?,
        executor_address: row.text("executor_address")?,
        param: row.required_text("param")?,
    })
}

/// The run `insert` created as row `id`: what was inserted, and the columns' defaults.
fn inserted(insert: &Insert<'_>, id: i64) -> Claim {
    let Insert { run, claim, now_ms } = insert;
    let (state, fence, first_claimed_at_ms) = match claim {
        Some(_) => (RunState::Dispatching, 1, *now_ms),
        None => (RunState::Pending, 0, 0),
    };
    let (version, sha256) = run.version.clone().unzip();
    let run = RunRecord {
        id,
        job_id: run.job_id,
        executor_address: run.executor_address.clone(),
        trigger_type: run.trigger_type,
        trigger_time_ms: run.trigger_time_ms,
        fire_time_ms: run.fire_time_ms,
        param: run.param.clone(),
        trigger_code: 0,
        trigger_msg: String::new(),
        handle_time_ms: 0,
        handle_code: 0,
        handle_msg: String::new(),
        shard_index: run.shard_index,
        shard_total: run.shard_total,
        sharding_items: run.sharding_items.clone(),
        attempt: run.attempt,
        version,
        sha256,
        fuel_used: None,
        state,
        parent_run_id: run.parent_run_id,
        kill_requested: false,
        dispatched_at_ms: 0,
        started_at_ms: 0,
        first_claimed_at_ms,
    };
    Claim { run, fence }
}

fn run_from_row(row: &impl Cells) -> Result<RunRecord> {
    let code = |column: &str| -> Result<i32> {
        let value = row.required_int(column)?;
        i32::try_from(value).map_err(|_| super::StorageError::Corrupt(format!("{column}: {value}")))
    };
    Ok(RunRecord {
        id: row.required_int("id")?,
        job_id: row.required_int("job_id")?,
        executor_address: row.text("executor_address")?,
        trigger_type: parse_column(row, "trigger_type")?,
        trigger_time_ms: row.required_int("trigger_time")?,
        param: row.required_text("param")?,
        trigger_code: code("trigger_code")?,
        trigger_msg: row.required_text("trigger_msg")?,
        handle_time_ms: row.required_int("handle_time")?,
        handle_code: code("handle_code")?,
        handle_msg: row.required_text("handle_msg")?,
        shard_index: row.required_int("shard_index")?,
        shard_total: row.required_int("shard_total")?,
        attempt: row.required_int("attempt")?,
        version: row.int("version")?,
        sha256: row.text("sha256")?,
        fuel_used: row.int("fuel_used")?,
        state: parse_column(row, "state")?,
        parent_run_id: row.int("parent_run_id")?,
        kill_requested: row.required_int("kill_requested")? != 0,
        dispatched_at_ms: row.required_int("dispatched_at")?,
        started_at_ms: row.required_int("started_at")?,
        first_claimed_at_ms: row.required_int("claimed_at")?,
        fire_time_ms: row.int("fire_time")?,
        sharding_items: parse_items(&row.required_text("sharding_items")?)?,
    })
}

/// Sharding items as stored: `item=parameter` pairs separated by commas. Parameters come from
/// the job's comma-separated list, so they hold no comma.
fn format_items(items: &[ShardingItem]) -> String {
    let pairs: Vec<String> =
        items.iter().map(|item| format!("{}={}", item.item, item.parameter)).collect();
    pairs.join(",")
}

fn parse_items(text: &str) -> Result<Vec<ShardingItem>> {
    super::split_list(text)
        .map(|pair| {
            let corrupt = || super::StorageError::Corrupt(format!("sharding_items: `{pair}`"));
            let (item, parameter) = pair.split_once('=').ok_or_else(corrupt)?;
            let item = item.parse().map_err(|_| corrupt())?;
            Ok(ShardingItem { item, parameter: parameter.to_owned() })
        })
        .collect()
}
