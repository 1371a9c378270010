//! What a group commit (`batch`) runs for the run lifecycle's changes: claims, lease renewals,
//! targets and transitions as updates, many rows to a statement (on SQLite, transitions one run
//! to a statement, [`counted_updates`]). New runs are `run_inserts.rs`.

use foldhash::HashMap;
use std::borrow::Cow;

use sqlx::{AnyConnection, Row};

use super::Result;
use super::query::query;
use super::reports::Deltas;
use super::run_inserts::insert_run;
pub(super) use super::runs::Update;
use super::runs::{
    CHANGING, COLUMNS, Claim, NewRun, UNFINISHED, changed_run, run_from_row, transitioned,
};
use super::statement::{Arg, Cells, Exec, Statement};
use crate::model::RunRecord;

/// Claims run `id` on `conn` (see [`Db::claim_run`](super::Db::claim_run)).
pub(super) async fn claim(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Option<Claim>> {
    let row = query(&format!(
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

/// Renews a lease on `conn` (see [`Db::renew_lease`](super::Db::renew_lease)).
pub(super) async fn renew(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    fence: i64,
    lease_until_ms: i64,
) -> Result<bool> {
    let done = query(
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

/// Records a run's executor on `conn` (see [`Db::set_run_target`](super::Db::set_run_target)).
pub(super) async fn target(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    fence: i64,
    address: &str,
) -> Result<bool> {
    let done = query(
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
/// transaction or savepoint (see [`Db::apply_transition`](super::Db::apply_transition)).
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
        schedule_after_fire(conn, run.job_id, fire_ms, next_fire_ms).await?;
    }
    if update.transition.alarm {
        super::alarms::insert_run_failed(conn, &run, update.now_ms).await?;
    }
    Ok(Some((run, ids)))
}

/// The most ids [`lock_in_order`] locks in one statement.
const MAX_LOCKED_IDS: usize = 1024;

/// Locks the rows of runs `ids` on PostgreSQL and MySQL, in id order, before a group commit
/// changes them in the order its writes came.
///
/// Admins that share a database apply results and record sends of the same runs: an executor
/// posts a run's result to any admin while the admin that sent it records the acceptance. Were
/// each batch to lock its rows in its own order, two batches could each hold a row the other
/// waits for, and the database would abort one of them as a deadlock. In one order, the later
/// one only waits. SQLite has a single writer and no row locks: nothing to do.
pub(super) async fn lock_in_order(
    exec: &mut Exec<'_>,
    ids: impl Iterator<Item = i64>,
) -> Result<()> {
    let Exec::Sqlx(conn) = exec else { return Ok(()) };
    if conn.backend_name() == <sqlx::Sqlite as sqlx::Database>::NAME {
        return Ok(());
    }
    let mut ids: Vec<i64> = ids.collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() < 2 {
        return Ok(());
    }
    // A list of a power of two ids, the last repeated to fill it: a few shapes, prepared once,
    // rather than one for every count, which would crowd the connection's statement cache.
    for chunk in ids.chunks(MAX_LOCKED_IDS) {
        let shape = chunk.len().next_power_of_two();
        let sql = super::statement::shaped(exec, "lock runs", shape, || {
            let p = exec.placeholder();
            let list = (1..=shape).map(p).collect::<Vec<_>>().join(", ");
            format!("select id from runs where id in ({list}) order by id for update")
        });
        let mut statement = Statement::new(sql);
        let last = chunk[chunk.len() - 1];
        for id in chunk.iter().copied().chain(std::iter::repeat_n(last, shape - chunk.len())) {
            statement.bind(id);
        }
        exec.fetch_all(&statement).await?;
    }
    Ok(())
}

/// The parameters of one row of [`update_many`]'s `values` list.
pub(super) const UPDATE_PARAMS: usize = 17;
/// The types of the parameters of one row of [`update_many`]'s `values` list.
const TYPES: [&str; UPDATE_PARAMS] = [
    "bigint", "text", "bigint", "text", "text", "bigint", "bigint", "bigint", "text", "bigint",
    "bigint", "bigint", "text", "text", "bigint", "bigint", "bigint",
];
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
    let returned: Cow<'_, [Update<'_>]> = match exec {
        Exec::Sqlite(conn) => {
            let (counted, rest) = counted_updates(conn, updates, deltas)?;
            updated.extend(counted);
            Cow::Owned(rest)
        }
        Exec::Sqlx(_) => Cow::Borrowed(updates),
    };
    let mut rest = &returned[..];
    for (rows, shape) in super::statement_shapes(rest.len(), MAX_UPDATE_ROWS, exec.pads()) {
        updated.extend(update_rows(exec, &rest[..rows], shape, deltas).await?);
        rest = &rest[rows..];
    }
    Ok(updated)
}

/// Records `updates` in one statement of `shape` rows, the rows past theirs padding (all
/// null, so that no run matches them), returning the runs it changed.
async fn update_rows(
    exec: &mut Exec<'_>,
    updates: &[Update<'_>],
    shape: usize,
    deltas: &mut Deltas,
) -> Result<Vec<RunRecord>> {
    if let Exec::Sqlx(conn) = exec
        && super::query::is_mysql(conn)
    {
        let rows = super::mysql_writes::update_runs(conn, updates).await?;
        return changed_rows(&rows, updates, deltas);
    }
    let sql = super::statement::shaped(exec, "update runs", shape, || {
        update_runs_sql(exec.placeholder(), shape)
    });
    let mut statement = Statement::new(sql);
    for update in updates {
        bind_update(&mut statement, update);
    }
    for _ in updates.len()..shape {
        for kind in TYPES {
            statement.bind(if kind == "text" { Arg::Text(None) } else { Arg::Int(None) });
        }
    }
    let rows = exec.fetch_all(&statement).await?;
    changed_rows(&rows, updates, deltas)
}

/// Records `updates` on the SQLite writer's connection one run at a time, in the statement of
/// [`update_run_sql`], which returns nothing: SQLite gathers the rows a statement returns in a
/// temporary table, and an update joined to a list of values gathers the joined rows in another,
/// most of what a run's update cost in one statement for many. The runs it changed, and the
/// updates it left to the statement that returns them.
///
/// Each row also compares the run's executor, hold and first claim with the run as read
/// ([`COUNTED_PARAMS`]): the other columns that a transition may leave as they were change only
/// with the run's state or its kill request, which every row compares and which never return
/// to an earlier value. So a run it changed is as [`transitioned`] computes it. An update whose
/// compare is not the run as read, or that changed nothing (the run changed since it was read,
/// or its transition no longer applies), is left to the statement that returns what it changed.
fn counted_updates<'a>(
    conn: &mut rusqlite::Connection,
    updates: &[Update<'a>],
    deltas: &mut Deltas,
) -> Result<(Vec<RunRecord>, Vec<Update<'a>>)> {
    let as_read = |update: &Update<'_>| {
        update.transition.from == update.run.state
            && update.transition.kill_requested_before == update.run.kill_requested
    };
    let mut update_run = conn.prepare_cached(update_run_sql())?;
    let (mut runs, mut rest) = (Vec::with_capacity(updates.len()), Vec::new());
    let args = Vec::with_capacity(UPDATE_PARAMS + COUNTED_PARAMS);
    let mut statement = Statement { sql: update_run_sql().into(), args };
    for update in updates {
        if !as_read(update) {
            rest.push(*update);
            continue;
        }
        statement.args.clear();
        bind_update(&mut statement, update);
        statement
            .bind(update.run.executor_address.as_deref())
            .bind(i64::from(update.run.held))
            .bind(update.run.first_claimed_at_ms);
        if update_run.execute(rusqlite::params_from_iter(&statement.args))? == 0 {
            rest.push(*update);
            continue;
        }
        runs.push(transitioned(update));
    }
    drop(update_run);
    // A transition never leaves an ended state: each ended run here ended in its statement.
    deltas.ended(runs.iter().map(|run| (run.created_at_ms, run.state, run.job_id)));
    #[cfg(test)]
    COUNTED_UPDATES.fetch_add(runs.len(), std::sync::atomic::Ordering::Relaxed);
    Ok((runs, rest))
}

/// How many runs [`counted_updates`] changed, for the tests to see that it did.
#[cfg(test)]
pub(super) static COUNTED_UPDATES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The arguments of [`update_run_sql`] past [`UPDATE_PARAMS`]: the run's executor, hold and
/// first claim as read.
pub(super) const COUNTED_PARAMS: usize = 3;

/// [`update_rows`]'s statement of `shape` rows, with placeholders `p`. Each run is found by its
/// id, one row of the values at a time: the values' columns are compared as expressions
/// (`+ 0`, `|| ''`), so that SQLite cannot index them. Compared bare, from 256 rows on SQLite
/// indexed the values and scanned every run kept instead, tens of milliseconds a statement at a
/// few hundred thousand runs (`storage::tests::plans`).
pub(super) fn update_runs_sql(p: fn(usize) -> String, shape: usize) -> String {
    let values = (0..shape)
        .map(|row| {
            let cells = TYPES
                .iter()
                .enumerate()
                .map(|(column, kind)| super::typed(p, row * UPDATE_PARAMS + column + 1, kind));
            format!("({})", cells.collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let from = format!("from (values {values}) as v");
    update_sql(|n| format!("v.column{n}"), &from, "", &format!("returning {CHANGING}"))
}

/// [`counted_updates`]'s statement, of one run, on SQLite: [`update_runs_sql`]'s arguments for
/// one row (`?1` to `?17`), then the run's executor (`?18`), hold (`?19`) and first claim (`?20`)
/// as read, also compared (`is` matches an executor read as none).
pub(super) fn update_run_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let read = "and runs.executor_address is ?18 and runs.held = ?19 and runs.claimed_at = ?20";
        update_sql(|n| format!("?{n}"), "", read, "")
    });
    &SQL
}

/// The update of a run's transition, its arguments' `n`th read as `value(n)`: 1 id, 2 to,
/// 3 trigger code, 4 trigger msg, 5 executor, 6 dispatched at, 7 deadline, 8 handle code,
/// 9 handle msg, 10 now, 11 fuel used, 12 request kill, 13 from, 14 lease owner ('' for none),
/// 15 fence, 16 kill requested before, 17 started at; `from` the list they come from, `and`
/// more of the compare.
fn update_sql(value: impl Fn(usize) -> String, from: &str, and: &str, returning: &str) -> String {
    let v = value;
    format!(
        "update runs set state = {v2},
            trigger_code = coalesce({v3}, runs.trigger_code),
            trigger_msg = coalesce({v4}, runs.trigger_msg),
            executor_address = coalesce({v5}, runs.executor_address),
            dispatched_at = coalesce({v6}, runs.dispatched_at),
            deadline = coalesce({v7}, runs.deadline),
            handle_code = coalesce({v8}, runs.handle_code),
            handle_msg = coalesce({v9}, runs.handle_msg),
            handle_time = case when {v8} is null then runs.handle_time else {v10} end,
            fuel_used = coalesce({v11}, runs.fuel_used),
            kill_requested = case when {v12} = 1 then 1 else runs.kill_requested end,
            lease_owner = case when {v2} = 'dispatching' then runs.lease_owner else null end,
            started_at = coalesce({v17}, runs.started_at)
         {from}
         where runs.id = {v1} + 0 and runs.state = {v13} || ''
            and runs.kill_requested = {v16} + 0
            and ({v14} = '' or (runs.lease_owner = {v14} and runs.fence = {v15}))
            {and}
         {returning}",
        v1 = v(1),
        v2 = v(2),
        v3 = v(3),
        v4 = v(4),
        v5 = v(5),
        v6 = v(6),
        v7 = v(7),
        v8 = v(8),
        v9 = v(9),
        v10 = v(10),
        v11 = v(11),
        v12 = v(12),
        v13 = v(13),
        v14 = v(14),
        v15 = v(15),
        v16 = v(16),
        v17 = v(17),
    )
}

/// The runs of `updates` that `rows` (their [`CHANGING`] columns) hold, the ended ones counted
/// in `deltas`.
fn changed_rows(
    rows: &[super::statement::Row],
    updates: &[Update<'_>],
    deltas: &mut Deltas,
) -> Result<Vec<RunRecord>> {
    // Rows come back in no promised order, and the updates are of distinct runs.
    let known: HashMap<i64, &RunRecord> =
        updates.iter().map(|update| (update.run.id, update.run)).collect();
    let mut runs = Vec::with_capacity(rows.len());
    let mut ended = Vec::new();
    for row in rows {
        let id = row.required_int("id")?;
        let Some(run) = known.get(&id) else {
            return Err(super::StorageError::Corrupt(format!(
                "updated run {id} matches no update"
            )));
        };
        let run = changed_run(run, row)?;
        // A transition never leaves an ended state: each ended run here ended in this statement.
        if run.state.is_terminal() {
            ended.push((run.created_at_ms, run.state, run.job_id));
        }
        runs.push(run);
    }
    deltas.ended(ended);
    Ok(runs)
}

/// Binds `update`'s 17 arguments, in the order of `update_rows`'s columns.
fn bind_update<'a>(statement: &mut Statement<'a>, update: &'a Update<'_>) {
    let transition = update.transition;
    let (handle_code, handle_msg) = match &transition.handle {
        Some((code, msg)) => (Some(i64::from(*code)), Some(msg.as_str())),
        None => (None, None),
    };
    let (dispatched_at, deadline) = transition.dispatched.unzip();
    let (owner, fence) = update.lease.unzip();
    statement
        .bind(update.run.id)
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

/// Sets the next fire of `FIX_DELAY` job `job_id` to `next_fire_ms` if it is running, waits for
/// its fire at `fire_ms` to end, and no run of that fire is unfinished any more. Like a fire,
/// this moves the job on without changing it: its `revision` and `updated_at` stay.
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
) -> Result<()> {
    query("update jobs set next_fire_ms = next_fire_ms where id = $1")
        .bind(job_id)
        .execute(&mut *conn)
        .await?;
    query(&format!(
        "update jobs set next_fire_ms = $1
         where id = $2 and running = 1 and next_fire_ms = 0 and schedule_type = 'FIX_DELAY'
            and not exists (select 1 from runs where job_id = $2 and fire_time = $3 and {UNFINISHED})"
    ))
    .bind(next_fire_ms)
    .bind(job_id)
    .bind(fire_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
