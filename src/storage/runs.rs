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

use super::query::query;
use sqlx::Row;

use super::partitions::partition_filter;
use super::statement::Cells;
use super::{Db, Result, parse_column};
use crate::lifecycle::Transition;
use crate::model::{NodeOfRun, RunRecord, RunState, ShardingItem, TriggerType};
use crate::partition::Held;

pub(super) const COLUMNS: &str = "id, job_id, executor_address, trigger_type, trigger_time, param, trigger_code,
    trigger_msg, handle_time, handle_code, handle_msg, shard_index, shard_total, attempt, version, sha256,
    fuel_used, state, parent_run_id, kill_requested, dispatched_at, started_at, claimed_at,
    fire_time, sharding_items, held, workflow_run_id, workflow_node, workflow_round, created_at";

/// The columns of [`COLUMNS`] that a write may change once the run is inserted, with its id: a
/// transition, a claim, a target, a hold. The others (its job, fire, trigger, parameter,
/// shards, attempt, version, parent and workflow node) are written once, by its insert, so a
/// write that holds the run as read returns only these and takes the rest from it
/// ([`changed_run`]).
pub(super) const CHANGING: &str = "id, executor_address, trigger_code, trigger_msg, handle_time,
    handle_code, handle_msg, fuel_used, state, kill_requested, dispatched_at, started_at, claimed_at,
    held";

/// SQL for "the run has ended".
const TERMINAL: &str = "state in ('success', 'failed', 'timed_out', 'killed', 'lost', 'skipped')";
/// SQL for "the run has not ended".
pub(super) const UNFINISHED: &str = "state in ('pending', 'dispatching', 'running')";

/// How many runs have not ended, counting at most `$1` of each kind (see
/// [`Db::count_unfinished_runs`]).
pub(super) const COUNT_UNFINISHED: &str = "select
        (select count(*) from (select 1 from runs
            where state = 'pending' and held = 0 limit $1) as pending)
        + (select count(*) from (select 1 from runs
            where state = 'pending' and held = 1 limit $1) as held)
        + (select count(*) from (select 1 from runs
            where state in ('dispatching', 'running') limit $1) as in_flight) as n";

/// How many runs are in each unfinished state, each counted from its sweep's partial index:
/// pending (its two indexes, held and not), dispatching and running. The count costs the
/// unfinished runs (which admission bounds while `--max-unfinished-runs` is above 0), not the
/// runs kept (see [`Db::count_runs_by_unfinished_state`]).
pub(super) const COUNT_BY_UNFINISHED_STATE: &str = "select
        (select count(*) from runs where state = 'pending' and held = 0)
        + (select count(*) from runs where state = 'pending' and held = 1) as pending,
        (select count(*) from runs where state = 'dispatching') as dispatching,
        (select count(*) from runs where state = 'running') as running";

/// SQL for "the run is in `state`". An unfinished state is spelled as the ids that its sweeps'
/// partial indexes hold, which bounds what a list or a count of it reads by the unfinished runs
/// (SQLite does not read an index whose condition a parameter's value would imply, and would
/// read every run kept); an ended state is compared as it is.
pub(super) fn in_state(state: RunState) -> String {
    match state {
        RunState::Pending => "id in (select id from runs where state = 'pending' and held = 0
            union all select id from runs where state = 'pending' and held = 1)"
            .to_owned(),
        RunState::Dispatching | RunState::Running => {
            format!("id in (select id from runs where state = '{}')", state.as_str())
        }
        ended => format!("state = '{}'", ended.as_str()),
    }
}

/// The statements of a list of runs: its count (`$1` job or 0, `$2` and `$3` the range of
/// trigger times, `$4` the cap when there is one) and its page (the same and `$4` the limit, `$5`
/// the offset).
pub(super) fn list_statements(filter: &RunFilter) -> (String, String) {
    let state = filter.state.map_or_else(String::new, |state| format!("{} and", in_state(state)));
    let condition =
        format!("{state} ($1 = 0 or job_id = $1) and trigger_time >= $2 and trigger_time <= $3");
    // One row past the cap says that the count stopped there.
    let counted = match filter.count_up_to {
        Some(_) => format!(
            "select count(*) as n from (select 1 from runs where {condition} limit $4) capped"
        ),
        None => format!("select count(*) as n from runs where {condition}"),
    };
    let listed =
        format!("select {COLUMNS} from runs where {condition} order by id desc limit $4 offset $5");
    (counted, listed)
}

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
    /// The workflow node whose work it does, if any.
    pub node: Option<NodeOfRun>,
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
    /// The runs among `ids` that exist, in no particular order (one query per 512 ids). On
    /// SQLite a results batch reads the runs it is about to end on the group commit's
    /// connection, which just wrote them (`Db::select_by_ids`).
    pub async fn get_runs(&self, ids: &[i64]) -> Result<Vec<RunRecord>> {
        let rows = self.select_by_ids(&format!("select {COLUMNS} from runs"), ids).await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Run `id`, if it exists.
    pub async fn get_run(&self, id: i64) -> Result<Option<RunRecord>> {
        let row = query(&format!("select {COLUMNS} from runs where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Runs matching `filter`, newest first.
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        let (counted, listed) = list_statements(filter);
        let job_id = filter.job_id.unwrap_or(0);
        let from_ms = filter.from_ms.unwrap_or(i64::MIN);
        let to_ms = filter.to_ms.unwrap_or(i64::MAX);
        let cap = filter.count_up_to.unwrap_or(i64::MAX);
        let mut count = query(&counted).bind(job_id).bind(from_ms).bind(to_ms);
        if filter.count_up_to.is_some() {
            count = count.bind(cap.saturating_add(1));
        }
        let total: i64 = count.fetch_one(&self.pool).await?.try_get("n")?;
        // One row past the page says whether another page follows.
        let rows = query(&listed)
            .bind(job_id)
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

    /// Runs a dispatcher may claim now, as (run id, job id): pending runs due at or before
    /// `due_ms` that no cap holds, and runs whose dispatcher's lease ran out before `now_ms`,
    /// of the jobs of the partitions `held` holds; the oldest first, at most `limit`.
    pub async fn dispatchable_runs(
        &self,
        due_ms: i64,
        now_ms: i64,
        limit: i64,
        held: &Held,
    ) -> Result<Vec<(i64, i64)>> {
        let mut ids = Vec::new();
        let partitions = partition_filter(held, "runs.job_id");
        for (sql, bound) in [
            (
                format!(
                    "select id, job_id from runs
                     where state = 'pending' and held = 0 and trigger_time <= $1 {partitions}
                     order by trigger_time limit $2"
                ),
                due_ms,
            ),
            (
                format!(
                    "select id, job_id from runs
                     where state = 'dispatching' and lease_until < $1 {partitions}
                     order by lease_until limit $2"
                ),
                now_ms,
            ),
        ] {
            let rows = query(&sql).bind(bound).bind(limit).fetch_all(&self.pool).await?;
            for row in rows {
                ids.push((row.try_get("id")?, row.try_get("job_id")?));
            }
        }
        Ok(ids)
    }

    /// Running runs of the jobs of the partitions `held` holds whose admin deadline passed
    /// before `now_ms`, at most `limit`.
    pub async fn runs_past_deadline(
        &self,
        now_ms: i64,
        limit: i64,
        held: &Held,
    ) -> Result<Vec<RunRecord>> {
        let rows =
            query(&past_deadline_sql(held)).bind(now_ms).bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(run_from_row).collect()
    }

    /// How many runs have not ended (pending, dispatching or running), counting at most `cap`.
    /// The partial indexes of the sweeps answer it (pending runs, held ones, and the runs in
    /// flight), each read for at most `cap` entries: SQLite keeps no index of every unfinished
    /// run (migration 0021).
    pub async fn count_unfinished_runs(&self, cap: i64) -> Result<i64> {
        let row = query(COUNT_UNFINISHED).bind(cap).fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>("n")?.min(cap))
    }

    /// How many runs are pending, dispatching and running, each read from its sweep's partial
    /// index: a scrape of the metrics costs the unfinished runs, not the runs kept.
    pub async fn count_runs_by_unfinished_state(&self) -> Result<[(RunState, i64); 3]> {
        let row = query(COUNT_BY_UNFINISHED_STATE).fetch_one(&self.pool).await?;
        Ok([
            (RunState::Pending, row.try_get("pending")?),
            (RunState::Dispatching, row.try_get("dispatching")?),
            (RunState::Running, row.try_get("running")?),
        ])
    }

    /// The executors that have running runs.
    pub async fn executors_with_running_runs(&self) -> Result<Vec<String>> {
        let rows = query(
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
        let rows = query(
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
        let deleted = query(&format!(
            "delete from runs where id in (select id from (
                select id from runs where created_at < $1 and {TERMINAL}
                order by created_at limit $2) as old)"
        ))
        .bind(created_before_ms)
        .bind(limit)
        .execute(self.writer())
        .await?;
        Ok(deleted.rows_affected())
    }
}

/// [`Db::runs_past_deadline`]'s read, of the jobs of the partitions `held` holds, through the
/// partial index `runs_deadlines` of the running runs.
pub(super) fn past_deadline_sql(held: &Held) -> String {
    format!(
        "select {COLUMNS} from runs where state = 'running' and deadline > 0 and deadline < $1
         {} order by deadline limit $2",
        partition_filter(held, "runs.job_id")
    )
}

/// One run's transition to record: the compare-and-set of `run_writes::update_many`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Update<'a> {
    /// The run as read before: its columns that no write changes are taken from it.
    pub run: &'a RunRecord,
    pub transition: &'a Transition,
    /// The lease (owner, fence) the run must still be under.
    pub lease: Option<(&'a str, i64)>,
    pub fuel_used: Option<i64>,
    pub now_ms: i64,
}

/// Run `known` as `row`, the same run's, holds it now: its [`CHANGING`] columns read from
/// `row`, the others taken from `known`.
pub(super) fn changed_run(known: &RunRecord, row: &impl Cells) -> Result<RunRecord> {
    let code = |column: &str| code_column(row, column);
    Ok(RunRecord {
        executor_address: row.text("executor_address")?,
        trigger_code: code("trigger_code")?,
        trigger_msg: row.required_text("trigger_msg")?,
        handle_time_ms: row.required_int("handle_time")?,
        handle_code: code("handle_code")?,
        handle_msg: row.required_text("handle_msg")?,
        fuel_used: row.int("fuel_used")?,
        state: parse_column(row, "state")?,
        kill_requested: row.required_int("kill_requested")? != 0,
        dispatched_at_ms: row.required_int("dispatched_at")?,
        started_at_ms: row.required_int("started_at")?,
        first_claimed_at_ms: row.required_int("claimed_at")?,
        held: row.required_int("held")? != 0,
        id: known.id,
        job_id: known.job_id,
        trigger_type: known.trigger_type,
        trigger_time_ms: known.trigger_time_ms,
        fire_time_ms: known.fire_time_ms,
        param: known.param.clone(),
        shard_index: known.shard_index,
        shard_total: known.shard_total,
        sharding_items: known.sharding_items.clone(),
        attempt: known.attempt,
        version: known.version,
        sha256: known.sha256.clone(),
        parent_run_id: known.parent_run_id,
        node: known.node,
        created_at_ms: known.created_at_ms,
    })
}

/// Run `update.run` as `update` leaves it when it applies and the run's columns that it leaves
/// as they were still hold what the caller read: the assignments of `update_sql`
/// (`run_writes.rs`), in Rust.
pub(super) fn transitioned(update: &Update<'_>) -> RunRecord {
    let transition = update.transition;
    let mut run = update.run.clone();
    run.state = transition.to;
    if let Some(code) = transition.trigger_code {
        run.trigger_code = code;
    }
    if let Some(message) = &transition.trigger_msg {
        run.trigger_msg.clone_from(message);
    }
    if let Some(address) = &transition.executor_address {
        run.executor_address = Some(address.clone());
    }
    if let Some((at_ms, _deadline)) = transition.dispatched {
        run.dispatched_at_ms = at_ms;
    }
    if let Some((code, message)) = &transition.handle {
        run.handle_code = *code;
        run.handle_msg.clone_from(message);
        run.handle_time_ms = update.now_ms;
    }
    if update.fuel_used.is_some() {
        run.fuel_used = update.fuel_used;
    }
    run.kill_requested |= transition.request_kill;
    if let Some(at_ms) = transition.started_at {
        run.started_at_ms = at_ms;
    }
    run
}

/// A result code column, which fits an `i32`.
fn code_column(row: &impl Cells, column: &str) -> Result<i32> {
    let value = row.required_int(column)?;
    i32::try_from(value).map_err(|_| super::StorageError::Corrupt(format!("{column}: {value}")))
}

pub(super) fn run_from_row(row: &impl Cells) -> Result<RunRecord> {
    let code = |column: &str| code_column(row, column);
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
        held: row.required_int("held")? != 0,
        node: node_from_row(row)?,
        created_at_ms: row.required_int("created_at")?,
    })
}

/// The workflow node of a run as stored: its three columns are all set or all null.
fn node_from_row(row: &impl Cells) -> Result<Option<NodeOfRun>> {
    let Some(workflow_run_id) = row.int("workflow_run_id")? else { return Ok(None) };
    Ok(Some(NodeOfRun {
        workflow_run_id,
        node: row.required_int("workflow_node")?,
        round: row.required_int("workflow_round")?,
    }))
}

/// Sharding items as stored: `item=parameter` pairs separated by commas. Parameters come from
/// the job's comma-separated list, so they hold no comma.
pub(super) fn format_items(items: &[ShardingItem]) -> String {
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
