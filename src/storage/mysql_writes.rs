//! The multi-row writes of a fire and of the group commit on MySQL and MariaDB, which have
//! neither `update … from (values …)` nor `update … returning`. Each batch is three statements
//! in the caller's transaction, whatever its size: the rows are read and locked
//! (`select … for update`), each row's compare is checked here, the rows whose compare holds are
//! updated in one multi-table `update … join (select … union all select …)`, and read back.
//! The statements carry their values as literals ([`super::query::literal`]) and run
//! unprepared: each batch's text is new, and preparing it would cost a round trip and a
//! statement kept for nothing.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::fmt::Write as _;

use sqlx::{AnyConnection, Row as _};

use super::Result;
use super::query::{fetch_text, int_literal, text_literal};
use super::runs::{CHANGING, Update};
use super::statement::Row;

/// One job's move to its next fire: a fire's compare-and-set.
pub(super) struct Move {
    pub job_id: i64,
    /// The fire the job must still be at.
    pub expected_fire_ms: i64,
    pub next_fire_ms: i64,
    /// 0 once the job has no next fire.
    pub running: i64,
}

/// Moves each of `fires` (of distinct jobs) to its next fire if the job is still running at the
/// fire it was read at; the ids of the jobs moved.
pub(super) async fn move_fires(
    conn: &mut AnyConnection,
    fires: &[Move],
    now_ms: i64,
) -> Result<HashSet<i64>> {
    let ids = id_list(fires.iter().map(|fire| fire.job_id));
    let rows = fetch_text(
        conn,
        &format!("select id, running, next_fire_ms from jobs where id in ({ids}) for update"),
    )
    .await?;
    let mut current = HashMap::new();
    for row in &rows {
        let at: (i64, i64) = (row.try_get("running")?, row.try_get("next_fire_ms")?);
        current.insert(row.try_get::<i64, _>("id")?, at);
    }
    let moving: Vec<&Move> = fires
        .iter()
        .filter(|fire| current.get(&fire.job_id) == Some(&(1, fire.expected_fire_ms)))
        .collect();
    if moving.is_empty() {
        return Ok(HashSet::new());
    }
    let mut values = String::new();
    for (at, fire) in moving.iter().enumerate() {
        let cells =
            [("id", fire.job_id), ("next_fire_ms", fire.next_fire_ms), ("running", fire.running)];
        row_of(
            &mut values,
            at,
            cells.iter().map(|(name, value)| (*name, int_literal(Some(*value)))),
        );
    }
    fetch_text(
        conn,
        &format!(
            "update jobs join ({values}) as v on jobs.id = v.id
             set jobs.next_fire_ms = v.next_fire_ms, jobs.running = v.running,
                 jobs.revision = jobs.revision + 1 - v.running,
                 jobs.updated_at = case when v.running = 0 then {now_ms} else jobs.updated_at end"
        ),
    )
    .await?;
    Ok(moving.iter().map(|fire| fire.job_id).collect())
}

/// Records each of `updates` (of distinct runs) whose compare holds; the runs as they are now,
/// as `run_writes::update_rows`'s statement returns them.
pub(super) async fn update_runs(
    conn: &mut AnyConnection,
    updates: &[Update<'_>],
) -> Result<Vec<Row>> {
    let ids = id_list(updates.iter().map(|update| update.run.id));
    let rows = fetch_text(
        conn,
        &format!(
            "select id, state, kill_requested, lease_owner, fence from runs
             where id in ({ids}) for update"
        ),
    )
    .await?;
    let mut current = HashMap::new();
    for row in &rows {
        let owner: Option<String> = row.try_get("lease_owner")?;
        let facts: (String, i64, Option<String>, i64) =
            (row.try_get("state")?, row.try_get("kill_requested")?, owner, row.try_get("fence")?);
        current.insert(row.try_get::<i64, _>("id")?, facts);
    }
    let holding: Vec<&Update<'_>> = updates
        .iter()
        .filter(|update| {
            let Some((state, kill_requested, owner, fence)) = current.get(&update.run.id) else {
                return false;
            };
            let transition = update.transition;
            state == transition.from.as_str()
                && *kill_requested == i64::from(transition.kill_requested_before)
                && update.lease.is_none_or(|(lease_owner, lease_fence)| {
                    owner.as_deref() == Some(lease_owner) && *fence == lease_fence
                })
        })
        .collect();
    if holding.is_empty() {
        return Ok(Vec::new());
    }
    let mut values = String::new();
    for (at, update) in holding.iter().enumerate() {
        row_of(&mut values, at, update_cells(update).into_iter());
    }
    fetch_text(
        conn,
        &format!(
            "update runs join ({values}) as v on runs.id = v.id
             set runs.state = v.state,
                runs.trigger_code = coalesce(v.trigger_code, runs.trigger_code),
                runs.trigger_msg = coalesce(v.trigger_msg, runs.trigger_msg),
                runs.executor_address = coalesce(v.executor_address, runs.executor_address),
                runs.dispatched_at = coalesce(v.dispatched_at, runs.dispatched_at),
                runs.deadline = coalesce(v.deadline, runs.deadline),
                runs.handle_code = coalesce(v.handle_code, runs.handle_code),
                runs.handle_msg = coalesce(v.handle_msg, runs.handle_msg),
                runs.handle_time = case when v.handle_code is null then runs.handle_time
                    else v.now_ms end,
                runs.fuel_used = coalesce(v.fuel_used, runs.fuel_used),
                runs.kill_requested = case when v.request_kill = 1 then 1
                    else runs.kill_requested end,
                runs.lease_owner = case when v.state = 'dispatching' then runs.lease_owner
                    else null end,
                runs.started_at = coalesce(v.started_at, runs.started_at)"
        ),
    )
    .await?;
    let ids = id_list(holding.iter().map(|update| update.run.id));
    let rows =
        fetch_text(conn, &format!("select {CHANGING} from runs where id in ({ids}) order by id"))
            .await?;
    Ok(rows.into_iter().map(Row::Any).collect())
}

/// The named literal cells of `update`'s row of the join.
fn update_cells(update: &Update<'_>) -> Vec<(&'static str, String)> {
    let transition = update.transition;
    let (handle_code, handle_msg) = match &transition.handle {
        Some((code, msg)) => (Some(i64::from(*code)), Some(msg.as_str())),
        None => (None, None),
    };
    let (dispatched_at, deadline) = transition.dispatched.unzip();
    vec![
        ("id", int_literal(Some(update.run.id))),
        ("state", text_literal(Some(transition.to.as_str()))),
        ("trigger_code", int_literal(transition.trigger_code.map(i64::from))),
        ("trigger_msg", text_literal(transition.trigger_msg.as_deref())),
        ("executor_address", text_literal(transition.executor_address.as_deref())),
        ("dispatched_at", int_literal(dispatched_at)),
        ("deadline", int_literal(deadline)),
        ("handle_code", int_literal(handle_code)),
        ("handle_msg", text_literal(handle_msg)),
        ("now_ms", int_literal(Some(update.now_ms))),
        ("fuel_used", int_literal(update.fuel_used)),
        ("request_kill", int_literal(Some(i64::from(transition.request_kill)))),
        ("started_at", int_literal(transition.started_at)),
    ]
}

/// Appends one `select` of a `union all` to `values`: named cells on the first row, which
/// names the derived table's columns.
fn row_of(values: &mut String, at: usize, cells: impl Iterator<Item = (&'static str, String)>) {
    values.push_str(if at == 0 { "select " } else { " union all select " });
    for (column, (name, cell)) in cells.enumerate() {
        if column > 0 {
            values.push_str(", ");
        }
        values.push_str(&cell);
        if at == 0 {
            let _ = write!(values, " as {name}");
        }
    }
}

/// `ids` as a comma-separated list.
fn id_list(ids: impl Iterator<Item = i64>) -> String {
    ids.map(|id| id.to_string()).collect::<Vec<_>>().join(", ")
}
