//! New runs, many to an insert statement, each answered with the run as created.
//!
//! On PostgreSQL and MySQL an insert returns its rows' ids with what tells each from the others
//! of its statement ([`RowIdentity`]), and each row goes to the insert it matches. On the SQLite
//! writer's connection an insert returns nothing: SQLite numbers a statement's new rows one after
//! another, in the order of its values, each past every id the table has had (`runs.id` is
//! `autoincrement`), so when every row of the statement was inserted their ids are the last
//! `n` up to the connection's last inserted id. Returning the rows cost nearly a quarter of
//! the insert (SQLite gathers them in a table of their own) and a read of each of them. When
//! the key of one fire skipped a row, the rows inserted are read back, the newest of the table,
//! and matched as on the other databases.

use sqlx::AnyConnection;

use super::reports::Deltas;
use super::runs::{Claim, NewRun, format_items};
use super::statement::{Cells, Exec, Row, Statement};
use super::{Result, parse_column};
use crate::model::{RunRecord, RunState, TriggerType};

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
const INSERT_PARAMS: usize = 22;
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
    let returning = !matches!(exec, Exec::Sqlite(_));
    let name = if returning { "insert into runs" } else { "insert into runs, returning nothing" };
    let sql = super::statement::shaped(exec, name, inserts.len(), || {
        insert_sql(exec.placeholder(), inserts.len(), returning)
    });
    let mut statement = Statement::new(sql);
    for insert in inserts {
        bind_insert(&mut statement, insert);
    }
    let created = match exec {
        Exec::Sqlite(conn) => match sqlite_insert(conn, &statement, inserts.len())? {
            Inserted::Numbered(ids) => {
                inserts.iter().zip(ids).map(|(insert, id)| Some(inserted(insert, id))).collect()
            }
            Inserted::Some(0) => vec![None; inserts.len()],
            Inserted::Some(count) => {
                let mut newest = Statement::new(format!(
                    "select id, {IDENTITY} from runs order by id desc limit ?"
                ));
                newest.bind(i64::try_from(count).unwrap_or(i64::MAX));
                matched(inserts, &exec.fetch_all(&newest).await?)?
            }
        },
        Exec::Sqlx(_) => matched(inserts, &exec.fetch_all(&statement).await?)?,
    };
    let created_at = inserts.iter().zip(&created).filter(|(_, created)| created.is_some());
    deltas.created(created_at.map(|(insert, _)| insert.now_ms));
    Ok(created)
}

/// The insert of `rows` runs with placeholders `p`, returning each new row's id and
/// [`IDENTITY`] when `returning`.
fn insert_sql(p: fn(usize) -> String, rows: usize, returning: bool) -> String {
    let values = (0..rows)
        .map(|row| {
            let cells = (1..=INSERT_PARAMS).map(|n| p(row * INSERT_PARAMS + n));
            format!("({})", cells.collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let returning = if returning { format!("returning id, {IDENTITY}") } else { String::new() };
    format!(
        "insert into runs (job_id, executor_address, trigger_type, trigger_time, fire_time,
            param, shard_index, shard_total, attempt, version, sha256, parent_run_id,
            created_at, sharding_items, state, lease_owner, lease_until, fence, claimed_at,
            workflow_run_id, workflow_node, workflow_round)
         values {values}
         on conflict (job_id, fire_time, shard_index, attempt) where fire_time is not null
            do nothing
         {returning}"
    )
}

/// Binds `insert`'s [`INSERT_PARAMS`] arguments, in the order of [`insert_sql`]'s columns.
fn bind_insert<'a>(statement: &mut Statement<'a>, insert: &Insert<'a>) {
    let Insert { run, claim, now_ms } = *insert;
    let (version, sha256) = match &run.version {
        Some((version, sha256)) => (Some(*version), Some(sha256.as_str())),
        None => (None, None),
    };
    let (state, fence, claimed_at) = match claim {
        Some(_) => (RunState::Dispatching, 1, now_ms),
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
        .bind(now_ms)
        .bind(format_items(&run.sharding_items))
        .bind(state.as_str())
        .bind(owner)
        .bind(lease_until_ms.unwrap_or(0))
        .bind(fence)
        .bind(claimed_at)
        .bind(run.node.map(|node| node.workflow_run_id))
        .bind(run.node.map(|node| node.node))
        .bind(run.node.map(|node| node.round));
}

/// What an insert on the SQLite writer's connection created.
#[derive(Debug, PartialEq, Eq)]
enum Inserted {
    /// Every row, with these ids in the order of the statement's values.
    Numbered(std::ops::RangeInclusive<i64>),
    /// This many rows, the newest of the table: the others were skipped by a fire's key.
    Some(usize),
}

/// Runs `statement`, an insert of `rows` runs returning nothing, on the SQLite writer's
/// connection.
fn sqlite_insert(
    conn: &mut rusqlite::Connection,
    statement: &Statement<'_>,
    rows: usize,
) -> Result<Inserted> {
    let count = conn
        .prepare_cached(&statement.sql)?
        .execute(rusqlite::params_from_iter(&statement.args))?;
    Ok(numbered(count, rows, conn.last_insert_rowid()))
}

/// What an insert of `rows` rows that inserted `count` of them, the last as row `last`, created.
fn numbered(count: usize, rows: usize, last: i64) -> Inserted {
    match i64::try_from(count) {
        Ok(n) if count == rows && n > 0 && last >= n => Inserted::Numbered(last - n + 1..=last),
        _ => Inserted::Some(count),
    }
}

/// Each of `inserts` answered from `rows` (ids and [`IDENTITY`], in no promised order): each row
/// goes to the first unanswered insert it matches. Inserts that match the same rows are alike
/// in everything stored for them. A new row holds what was inserted and the columns' defaults,
/// so only its id and what tells it from the others are read.
fn matched(inserts: &[Insert<'_>], rows: &[Row]) -> Result<Vec<Option<Claim>>> {
    let mut created: Vec<Option<Claim>> = vec![None; inserts.len()];
    for row in rows {
        let id = row.required_int("id")?;
        let identity = identity_from_row(row)?;
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
    Ok(created)
}

/// The columns that tell apart the rows of one insert (see [`RowIdentity`]).
const IDENTITY: &str =
    "job_id, fire_time, shard_index, attempt, trigger_time, trigger_type, parent_run_id,
    executor_address, param, workflow_run_id, workflow_node, workflow_round";

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
    node: Option<(i64, i64, i64)>,
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
            && new.node.map(|node| (node.workflow_run_id, node.node, node.round)) == self.node
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
        node: match row.int("workflow_run_id")? {
            Some(run) => {
                Some((run, row.required_int("workflow_node")?, row.required_int("workflow_round")?))
            }
            None => None,
        },
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
        held: false,
        node: run.node,
        created_at_ms: *now_ms,
    };
    Claim { run, fence }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_insert_numbers_its_rows_only_when_it_inserted_every_one() {
        let cases = [
            // (inserted, rows, last inserted id, created)
            (3, 3, 12, Inserted::Numbered(10..=12)),
            (1, 1, 1, Inserted::Numbered(1..=1)),
            (2, 3, 12, Inserted::Some(2)),
            (0, 3, 12, Inserted::Some(0)),
            // A last id that cannot end `rows` new rows is never trusted.
            (3, 3, 2, Inserted::Some(3)),
            (0, 0, 0, Inserted::Some(0)),
        ];
        for (count, rows, last, created) in cases {
            assert_eq!(numbered(count, rows, last), created, "{count} of {rows}, last {last}");
        }
    }
}
