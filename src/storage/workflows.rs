//! Workflows (`crate::workflow`) as stored: the document of each, and the reads of their runs.
//!
//! A workflow row keeps the JSON document the API takes. A workflow run keeps the document as
//! it was triggered, with one row per node (`workflow_nodes`): its state, its round (how many
//! times it was started) and, once it ended, its output. The node's runs are ordinary runs that
//! name it (`NodeOfRun`). What changes a workflow run is `workflow_runs.rs`.

use super::query::query;
use sqlx::Row;

use super::partitions::partition_filter;
use super::runs::{COLUMNS as RUN_COLUMNS, run_from_row};
use super::statement::Cells;
use super::{Db, Result, StorageError, parse_column};
use crate::model::{MisfireStrategy, RunRecord, ScheduleType, TriggerType};
use crate::partition::Held;
use crate::workflow::{Graph, NodeState, RunState, WorkflowSpec};

const COLUMNS: &str = "id, group_id, name, spec, schedule_type, schedule_conf, time_zone,
    misfire_strategy, running, next_fire_ms, created_by, created_at, updated_at";
pub(super) const RUN_COLUMNS_OF_WORKFLOW: &str =
    "id, workflow_id, group_id, spec, trigger_type, state, created_by, created_at, updated_at,
    ended_at";

/// When a workflow fires on its own, as a job's schedule says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowSchedule {
    /// `NONE` (triggered only), `CRON` or `FIX_RATE` (`FIX_DELAY` is a job's only).
    pub schedule_type: ScheduleType,
    /// The cron expression or the rate in seconds.
    pub schedule_conf: String,
    /// The IANA time zone of a cron schedule; `None` for UTC.
    pub time_zone: Option<String>,
    /// What a fire missed by more than the misfire threshold does.
    pub misfire_strategy: MisfireStrategy,
}

impl Default for WorkflowSchedule {
    fn default() -> Self {
        WorkflowSchedule {
            schedule_type: ScheduleType::None,
            schedule_conf: String::new(),
            time_zone: None,
            misfire_strategy: MisfireStrategy::DoNothing,
        }
    }
}

/// A stored workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workflow {
    /// Its id.
    pub id: i64,
    /// The document, as the API took it (its name and group included).
    pub spec: WorkflowSpec,
    /// Its schedule.
    pub schedule: WorkflowSchedule,
    /// Started: it fires on its schedule.
    pub running: bool,
    /// Its next fire (ms), 0 when it has none.
    pub next_fire_ms: i64,
    /// Who created it.
    pub created_by: String,
    /// When (ms).
    pub created_at_ms: i64,
    /// When it last changed (ms).
    pub updated_at_ms: i64,
}

/// One run of a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowRun {
    /// Its id.
    pub id: i64,
    /// The workflow (which may have been deleted or changed since).
    pub workflow_id: i64,
    /// The document as it was triggered.
    pub spec: WorkflowSpec,
    /// Why it runs (`MANUAL` or `API`).
    pub trigger_type: TriggerType,
    /// Where it is.
    pub state: RunState,
    /// Who triggered it.
    pub created_by: String,
    /// When (ms).
    pub created_at_ms: i64,
    /// When it last changed (ms).
    pub updated_at_ms: i64,
    /// When it ended (ms), 0 while running.
    pub ended_at_ms: i64,
}

/// One node of a workflow run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its index in the run's spec.
    pub node: usize,
    /// Its state; `Running` from the moment it is decided to start.
    pub state: NodeState,
    /// Decided to start, its runs not created yet.
    pub starting: bool,
    /// How many times it was started.
    pub round: i64,
    /// Why it failed without runs (its job is gone, say), or empty.
    pub reason: String,
    /// Once it ended: its output, the JSON list of its shards' ok messages.
    pub output: String,
    /// When its runs were created (ms), 0 before.
    pub started_at_ms: i64,
    /// When it ended (ms), 0 before.
    pub ended_at_ms: i64,
}

/// One upstream node's output, as a node's runs get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInput {
    /// The upstream node's name.
    pub node: String,
    /// The job it ran.
    pub job_id: i64,
    /// How it ended.
    pub state: NodeState,
    /// Each of its shards whose run succeeded: (shard index, message).
    pub outputs: Vec<(i64, String)>,
}

impl Db {
    /// The inputs of node `node` of workflow run `id`: the outputs of its upstream nodes, in
    /// the workflow's order, as stored when each ended (so a retry, or another admin, sends the
    /// same). `None` when the node does not pass inputs, or the workflow run does not exist.
    pub async fn workflow_inputs(&self, id: i64, node: i64) -> Result<Option<Vec<NodeInput>>> {
        let Some(run) = self.get_workflow_run(id).await? else { return Ok(None) };
        let graph = Graph::of_stored(&run.spec)
            .map_err(|error| StorageError::Corrupt(format!("workflow run {id}: {error}")))?;
        let index = node_index(node)?;
        if !graph.nodes().get(index).is_some_and(|node| node.pass_inputs) {
            return Ok(None);
        }
        let records = self.workflow_nodes(id).await?;
        let mut inputs = Vec::new();
        for upstream in graph.upstream(index) {
            let Some(record) = records.iter().find(|record| record.node == upstream) else {
                continue;
            };
            let spec = &graph.nodes()[upstream];
            inputs.push(NodeInput {
                node: spec.name.clone(),
                job_id: spec.job_id,
                state: record.state,
                outputs: parse_output(&record.output)?,
            });
        }
        Ok(Some(inputs))
    }

    /// Stores a new workflow, already validated.
    pub async fn create_workflow(
        &self,
        spec: &WorkflowSpec,
        schedule: &WorkflowSchedule,
        created_by: &str,
        now_ms: i64,
    ) -> Result<Workflow> {
        let row = query(&format!(
            "insert into workflows (group_id, name, spec, schedule_type, schedule_conf, time_zone,
                misfire_strategy, created_by, created_at, updated_at)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
             returning {COLUMNS}"
        ))
        .bind(spec.group_id)
        .bind(spec.name.as_str())
        .bind(spec_text(spec)?)
        .bind(schedule.schedule_type.as_str())
        .bind(schedule.schedule_conf.as_str())
        .bind(schedule.time_zone.as_deref())
        .bind(schedule.misfire_strategy.as_str())
        .bind(created_by)
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        workflow_from_row(&row)
    }

    /// Workflow `id`, if it exists.
    pub async fn get_workflow(&self, id: i64) -> Result<Option<Workflow>> {
        let row = query(&format!("select {COLUMNS} from workflows where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(workflow_from_row).transpose()
    }

    /// The workflows of group `group_id` (of every group with `None`), by id, at most `limit`.
    pub async fn list_workflows(&self, group_id: Option<i64>, limit: i64) -> Result<Vec<Workflow>> {
        let rows = query(&format!(
            "select {COLUMNS} from workflows where ($1 = 0 or group_id = $1) order by id limit $2"
        ))
        .bind(group_id.unwrap_or(0))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(workflow_from_row).collect()
    }

    /// Replaces workflow `id`'s document (validated, of the same group) and schedule, and sets
    /// its next fire to `next_fire_ms` (0: none, and a running workflow stops); `None` if it
    /// does not exist. Runs under way keep the document they were triggered with.
    pub async fn update_workflow(
        &self,
        id: i64,
        spec: &WorkflowSpec,
        schedule: &WorkflowSchedule,
        next_fire_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Workflow>> {
        let row = query(&format!(
            "update workflows set running = case when $1 = 0 then 0 else running end,
                next_fire_ms = case when running = 1 then $1 else 0 end, name = $2, spec = $3,
                schedule_type = $4, schedule_conf = $5, time_zone = $6, misfire_strategy = $7,
                updated_at = $8
             where id = $9
             returning {COLUMNS}"
        ))
        .bind(next_fire_ms)
        .bind(spec.name.as_str())
        .bind(spec_text(spec)?)
        .bind(schedule.schedule_type.as_str())
        .bind(schedule.schedule_conf.as_str())
        .bind(schedule.time_zone.as_deref())
        .bind(schedule.misfire_strategy.as_str())
        .bind(now_ms)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(workflow_from_row).transpose()
    }

    /// Starts workflow `id` with its next fire at `next_fire_ms`, or stops it (`None`); `None`
    /// if it does not exist.
    pub async fn set_workflow_running(
        &self,
        id: i64,
        next_fire_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Option<Workflow>> {
        let row = query(&format!(
            "update workflows set running = $1, next_fire_ms = $2, updated_at = $3 where id = $4
             returning {COLUMNS}"
        ))
        .bind(i64::from(next_fire_ms.is_some()))
        .bind(next_fire_ms.unwrap_or(0))
        .bind(now_ms)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(workflow_from_row).transpose()
    }

    /// The running workflows due at or before `until_ms`, the earliest first, at most `limit`.
    pub async fn due_workflows(
        &self,
        until_ms: i64,
        limit: i64,
        held: &Held,
    ) -> Result<Vec<Workflow>> {
        let rows = query(&format!(
            "select {COLUMNS} from workflows where running = 1 and next_fire_ms <= $1 {}
             order by next_fire_ms limit $2",
            partition_filter(held, "workflows.id")
        ))
        .bind(until_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(workflow_from_row).collect()
    }

    /// The earliest next fire of a running workflow of the partitions `held` holds, if any.
    pub async fn next_workflow_fire(&self, held: &Held) -> Result<Option<i64>> {
        let row = query(&format!(
            "select min(next_fire_ms) as next from workflows where running = 1 {}",
            partition_filter(held, "workflows.id")
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("next")?)
    }

    /// Deletes workflow `id`; its runs stay, with their documents. False if it did not exist.
    pub async fn delete_workflow(&self, id: i64) -> Result<bool> {
        let done = query("delete from workflows where id = $1").bind(id).execute(self.writer());
        Ok(done.await?.rows_affected() == 1)
    }

    /// Workflow run `id`, if it exists.
    pub async fn get_workflow_run(&self, id: i64) -> Result<Option<WorkflowRun>> {
        let row =
            query(&format!("select {RUN_COLUMNS_OF_WORKFLOW} from workflow_runs where id = $1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(workflow_run_from_row).transpose()
    }

    /// The runs of workflow `workflow_id`, newest first, at most `limit`.
    pub async fn list_workflow_runs(
        &self,
        workflow_id: i64,
        limit: i64,
    ) -> Result<Vec<WorkflowRun>> {
        let rows = query(&format!(
            "select {RUN_COLUMNS_OF_WORKFLOW} from workflow_runs where workflow_id = $1
             order by id desc limit $2"
        ))
        .bind(workflow_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(workflow_run_from_row).collect()
    }

    /// Deletes workflow runs (with their nodes) that ended before `ended_before_ms`, at most
    /// `limit`; how many.
    pub async fn delete_ended_workflow_runs(
        &self,
        ended_before_ms: i64,
        limit: i64,
    ) -> Result<u64> {
        let mut tx = self.writer().begin().await?;
        let old = "select id from (select id from workflow_runs
                 where state <> 'running' and ended_at > 0 and ended_at < $1
                 order by ended_at limit $2) as old";
        query(&format!("delete from workflow_nodes where workflow_run_id in ({old})"))
            .bind(ended_before_ms)
            .bind(limit)
            .execute(&mut *tx)
            .await?;
        let deleted = query(&format!("delete from workflow_runs where id in ({old})"))
            .bind(ended_before_ms)
            .bind(limit)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted.rows_affected())
    }

    /// How many workflow runs are in each state, by state.
    pub async fn workflow_run_counts(&self) -> Result<Vec<(String, i64)>> {
        let rows =
            query("select state, count(*) as n from workflow_runs group by state order by state")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|row| Ok((row.try_get("state")?, row.try_get("n")?))).collect()
    }

    /// The nodes of workflow run `id`, by index.
    pub async fn workflow_nodes(&self, id: i64) -> Result<Vec<NodeRecord>> {
        let rows = query(
            "select node, state, round, reason, output, started_at, ended_at from workflow_nodes
             where workflow_run_id = $1 order by node",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let text: String = row.try_get("state")?;
                let (state, starting) = stored_state(&text)?;
                Ok(NodeRecord {
                    node: node_index(row.try_get("node")?)?,
                    state,
                    starting,
                    round: row.try_get("round")?,
                    reason: row.try_get("reason")?,
                    output: row.try_get("output")?,
                    started_at_ms: row.try_get("started_at")?,
                    ended_at_ms: row.try_get("ended_at")?,
                })
            })
            .collect()
    }

    /// The runs of workflow run `id`'s nodes, every round, shard and attempt, oldest first.
    pub async fn workflow_node_runs(&self, id: i64) -> Result<Vec<RunRecord>> {
        let rows = query(&format!(
            "select {RUN_COLUMNS} from runs where workflow_run_id = $1 order by id"
        ))
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }
}

/// A node's stored output: `[{"shard": 0, "message": "…"}]`, empty before it ended.
fn parse_output(text: &str) -> Result<Vec<(i64, String)>> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(serde::Deserialize)]
    struct Shard {
        shard: i64,
        message: String,
    }
    let shards: Vec<Shard> = serde_json::from_str(text)
        .map_err(|error| StorageError::Corrupt(format!("output: {error}")))?;
    Ok(shards.into_iter().map(|shard| (shard.shard, shard.message)).collect())
}

/// A node's stored state: `starting` is running whose runs are not created yet.
pub(super) fn stored_state(text: &str) -> Result<(NodeState, bool)> {
    if text == "starting" {
        return Ok((NodeState::Running, true));
    }
    let state = text.parse().map_err(|error| StorageError::Corrupt(format!("state: {error}")))?;
    Ok((state, false))
}

/// A stored node number as an index.
pub(super) fn node_index(node: i64) -> Result<usize> {
    usize::try_from(node).map_err(|_| StorageError::Corrupt(format!("node: {node}")))
}

/// A spec as stored.
pub(super) fn spec_text(spec: &WorkflowSpec) -> Result<String> {
    serde_json::to_string(spec).map_err(|error| StorageError::Corrupt(format!("spec: {error}")))
}

/// A stored spec.
pub(super) fn parse_spec(text: &str) -> Result<WorkflowSpec> {
    serde_json::from_str(text).map_err(|error| StorageError::Corrupt(format!("spec: {error}")))
}

fn workflow_from_row(row: &impl Cells) -> Result<Workflow> {
    let mut spec = parse_spec(&row.required_text("spec")?)?;
    // The columns are the truth for what the listing filters on.
    spec.group_id = row.required_int("group_id")?;
    spec.name = row.required_text("name")?;
    Ok(Workflow {
        id: row.required_int("id")?,
        spec,
        schedule: WorkflowSchedule {
            schedule_type: parse_column(row, "schedule_type")?,
            schedule_conf: row.required_text("schedule_conf")?,
            time_zone: row.text("time_zone")?,
            misfire_strategy: parse_column(row, "misfire_strategy")?,
        },
        running: row.required_int("running")? != 0,
        next_fire_ms: row.required_int("next_fire_ms")?,
        created_by: row.required_text("created_by")?,
        created_at_ms: row.required_int("created_at")?,
        updated_at_ms: row.required_int("updated_at")?,
    })
}

pub(super) fn workflow_run_from_row(row: &impl Cells) -> Result<WorkflowRun> {
    Ok(WorkflowRun {
        id: row.required_int("id")?,
        workflow_id: row.required_int("workflow_id")?,
        spec: parse_spec(&row.required_text("spec")?)?,
        trigger_type: parse_column(row, "trigger_type")?,
        state: parse_column(row, "state")?,
        created_by: row.required_text("created_by")?,
        created_at_ms: row.required_int("created_at")?,
        updated_at_ms: row.required_int("updated_at")?,
        ended_at_ms: row.required_int("ended_at")?,
    })
}
