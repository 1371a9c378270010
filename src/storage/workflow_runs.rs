//! The changes of a workflow run: its trigger, the decision that follows each end of a node's
//! run, the creation of a node's runs, a kill, and a retry by hand.
//!
//! Every change first bumps the workflow run's `version` ([`lock`]): on PostgreSQL and MariaDB
//! that row lock orders the transactions deciding for one workflow run, and at read committed
//! each reads the node states and runs the one before it committed. So two shards of a node
//! ending at once on two admins cannot both see the other still running: the second to take the
//! lock sees both ended, and starts what follows.
//!
//! What follows an end is decided in the transaction that ends the run ([`advance`], called by
//! the group commit after the run's transition): the nodes whose runs all ended are recorded
//! with their outputs, and `workflow::decide` marks the nodes to start `starting` (a new round),
//! the nodes to skip `skipped`, and the workflow run's end. A `starting` node's runs are planned
//! by the dispatcher (their version, executors and shards are its to choose) and created by
//! [`Db::start_workflow_node`], a compare-and-set from `starting` to `running` in the
//! transaction that inserts them, under the runs' unique key on (workflow run, node, round,
//! shard, attempt). A crash between the decision and the creation leaves the node `starting`,
//! which the sweep finds ([`Db::starting_workflow_nodes`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::query::query;
use sqlx::{AnyConnection, Row};

use super::partitions::held_now;
use super::run_inserts::{Insert, insert_many};
use super::runs::{NewRun, UNFINISHED};
use super::statement::{Cells, Exec, Statement};
use super::workflows::{Workflow, node_index, parse_spec, spec_text, stored_state};
use super::{Db, Result, StorageError, parse_column};
use crate::model::{NodeOfRun, RunState as RunEnd, TriggerType};
use crate::partition::{self, Held};
use crate::workflow::{
    Graph, NodeState, RunState, WorkflowError, WorkflowSpec, decide, node_state, reopen,
};

/// The longest message of one shard kept in a node's output, in bytes.
pub const MAX_OUTPUT_MESSAGE_BYTES: usize = 64 * 1024;

/// A node decided to start whose runs are not created yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartingNode {
    /// The workflow run.
    pub workflow_run_id: i64,
    /// The node's index.
    pub node: usize,
    /// The round its runs belong to.
    pub round: i64,
    /// The job it runs.
    pub job_id: i64,
    /// Its parameter, `None` for the job's own.
    pub param: Option<String>,
    /// Whether its upstream nodes' outputs go to its job.
    pub pass_inputs: bool,
    /// When it was decided to start (ms).
    pub decided_at_ms: i64,
}

impl StartingNode {
    /// What its runs carry.
    pub fn of_run(&self) -> NodeOfRun {
        NodeOfRun {
            workflow_run_id: self.workflow_run_id,
            node: self.node as i64,
            round: self.round,
        }
    }
}

/// What came of a retry by hand.
#[derive(Debug)]
pub enum NodeRetry {
    /// The node is starting again.
    Started,
    /// No such workflow run.
    NoRun,
    /// The workflow run was killed: nothing of it starts again.
    Killed,
    /// The node cannot be retried (it did not fail, or does not exist).
    Refused(WorkflowError),
}

impl Db {
    /// Creates a run of `workflow` (as given: validated, stored) triggered by `created_by`,
    /// with its roots decided to start, in one transaction. Returns its id.
    pub async fn trigger_workflow(
        &self,
        workflow_id: i64,
        spec: &WorkflowSpec,
        trigger_type: TriggerType,
        created_by: &str,
        now_ms: i64,
    ) -> Result<i64> {
        let mut tx = self.writer().begin().await?;
        let id = insert_run(&mut tx, workflow_id, spec, trigger_type, created_by, now_ms).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Moves `workflow`'s next fire from the one it was read with to `next_fire_ms` (0: none,
    /// and it stops) and, with `fire` (its instant and trigger type), creates its run, in one
    /// transaction. `None`, and nothing changed, when the next fire moved since (another admin
    /// fired it, or it was stopped or changed) or `lease` no longer holds the workflow's
    /// partition; else the new run's id, if any.
    pub async fn fire_workflow(
        &self,
        workflow: &Workflow,
        next_fire_ms: i64,
        fire: Option<(i64, TriggerType)>,
        now_ms: i64,
        lease: &Held,
    ) -> Result<Option<Option<i64>>> {
        let mut tx = self.writer().begin().await?;
        let partition = BTreeSet::from([partition::of(workflow.id)]);
        if held_now(&mut Exec::Sqlx(&mut tx), self.dialect, lease, &partition).await?.is_empty() {
            tx.rollback().await?;
            return Ok(None);
        }
        let moved = query(
            "update workflows set next_fire_ms = $1, running = case when $1 = 0 then 0 else 1 end
             where id = $2 and running = 1 and next_fire_ms = $3",
        )
        .bind(next_fire_ms)
        .bind(workflow.id)
        .bind(workflow.next_fire_ms)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        let mut created = None;
        if let Some((_, trigger_type)) = fire {
            let spec = &workflow.spec;
            let id = insert_run(&mut tx, workflow.id, spec, trigger_type, "schedule", now_ms).await;
            created = Some(id?);
        }
        tx.commit().await?;
        Ok(Some(created))
    }

    /// The nodes decided to start, whose runs are not created yet: of workflow run `id` only
    /// with `Some`, and decided at or before `decided_before_ms`; the oldest first, at most
    /// `limit`.
    pub async fn starting_workflow_nodes(
        &self,
        id: Option<i64>,
        decided_before_ms: i64,
        limit: i64,
    ) -> Result<Vec<StartingNode>> {
        let rows = query(
            "select n.workflow_run_id, n.node, n.round, n.updated_at, w.spec
             from workflow_nodes n join workflow_runs w on w.id = n.workflow_run_id
             where n.state = 'starting' and ($1 = 0 or n.workflow_run_id = $1)
               and n.updated_at <= $2
             order by n.updated_at, n.workflow_run_id, n.node limit $3",
        )
        .bind(id.unwrap_or(0))
        .bind(decided_before_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut specs: HashMap<i64, WorkflowSpec> = HashMap::new();
        let mut starting = Vec::with_capacity(rows.len());
        for row in rows {
            let workflow_run_id: i64 = row.try_get("workflow_run_id")?;
            let node = node_index(row.try_get("node")?)?;
            if let std::collections::hash_map::Entry::Vacant(entry) = specs.entry(workflow_run_id) {
                entry.insert(parse_spec(&row.try_get::<String, _>("spec")?)?);
            }
            let Some(spec) = specs.get(&workflow_run_id).and_then(|spec| spec.nodes.get(node))
            else {
                return Err(StorageError::Corrupt(format!(
                    "workflow run {workflow_run_id} has no node {node}"
                )));
            };
            starting.push(StartingNode {
                workflow_run_id,
                node,
                round: row.try_get("round")?,
                job_id: spec.job_id,
                param: spec.param.clone(),
                pass_inputs: spec.pass_inputs,
                decided_at_ms: row.try_get("updated_at")?,
            });
        }
        Ok(starting)
    }

    /// Creates the runs of `node` (pending, each made to name the node) if it is still
    /// `starting` in its round, and records it `running`, in one transaction. `None`, and
    /// nothing created, when it is not: another admin created them, or the run was killed.
    pub async fn start_workflow_node(
        &self,
        node: &StartingNode,
        runs: &[NewRun],
        now_ms: i64,
    ) -> Result<Option<Vec<i64>>> {
        let mut tx = self.writer().begin().await?;
        lock(&mut Exec::Sqlx(&mut tx), node.workflow_run_id).await?;
        let moved = query(
            "update workflow_nodes set state = 'running', started_at = $1, updated_at = $1
             where workflow_run_id = $2 and node = $3 and round = $4 and state = 'starting'",
        )
        .bind(now_ms)
        .bind(node.workflow_run_id)
        .bind(node.node as i64)
        .bind(node.round)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        let runs: Vec<NewRun> =
            runs.iter().map(|run| NewRun { node: Some(node.of_run()), ..run.clone() }).collect();
        let inserts: Vec<Insert<'_>> =
            runs.iter().map(|run| Insert { run, claim: None, now_ms }).collect();
        let created = insert_many(&mut tx, &inserts).await?;
        let ids = created.into_iter().flatten().map(|claim| claim.run.id).collect();
        tx.commit().await?;
        Ok(Some(ids))
    }

    /// Ends `node` failed with `reason`, without runs (its job is gone, or it could not be
    /// planned), if it is still `starting` in its round, and decides what follows, in one
    /// transaction. False when it was not.
    pub async fn fail_workflow_node(
        &self,
        node: &StartingNode,
        reason: &str,
        now_ms: i64,
    ) -> Result<bool> {
        let mut tx = self.writer().begin().await?;
        lock(&mut Exec::Sqlx(&mut tx), node.workflow_run_id).await?;
        let failed = query(
            "update workflow_nodes set state = 'failed', reason = $1, ended_at = $2,
                updated_at = $2
             where workflow_run_id = $3 and node = $4 and round = $5 and state = 'starting'",
        )
        .bind(reason)
        .bind(now_ms)
        .bind(node.workflow_run_id)
        .bind(node.node as i64)
        .bind(node.round)
        .execute(&mut *tx)
        .await?;
        if failed.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        advance(&mut Exec::Sqlx(&mut tx), node.workflow_run_id, now_ms).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Kills workflow run `id`: it ends `killed`, and its nodes not started are skipped, in
    /// one transaction. Returns the ids of its runs not ended, for the caller to kill, or
    /// `None` when it is not running.
    pub async fn kill_workflow_run(&self, id: i64, now_ms: i64) -> Result<Option<Vec<i64>>> {
        let mut tx = self.writer().begin().await?;
        lock(&mut Exec::Sqlx(&mut tx), id).await?;
        let killed = query(
            "update workflow_runs set state = 'killed', ended_at = $1, updated_at = $1
             where id = $2 and state = 'running'",
        )
        .bind(now_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if killed.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        query(
            "update workflow_nodes set state = 'skipped', ended_at = $1, updated_at = $1
             where workflow_run_id = $2 and state in ('waiting', 'starting')",
        )
        .bind(now_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let rows =
            query(&format!("select id from runs where workflow_run_id = $1 and {UNFINISHED}"))
                .bind(id)
                .fetch_all(&mut *tx)
                .await?;
        let ids = rows.iter().map(|row| row.try_get("id")).collect::<sqlx::Result<_>>()?;
        tx.commit().await?;
        Ok(Some(ids))
    }

    /// Retries failed node `node` of workflow run `id` by hand: it and the nodes skipped
    /// because of it wait again (`workflow::reopen`), the workflow run runs again if it had
    /// ended, and the node is decided to start in a new round, in one transaction.
    pub async fn retry_workflow_node(
        &self,
        id: i64,
        node: usize,
        now_ms: i64,
    ) -> Result<NodeRetry> {
        let mut tx = self.writer().begin().await?;
        let retry = retry_in(&mut Exec::Sqlx(&mut tx), id, node, now_ms).await?;
        if matches!(retry, NodeRetry::Started) {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(retry)
    }
}

/// [`Db::retry_workflow_node`] in the caller's transaction, which it commits only on
/// [`NodeRetry::Started`].
async fn retry_in(exec: &mut Exec<'_>, id: i64, node: usize, now_ms: i64) -> Result<NodeRetry> {
    lock(exec, id).await?;
    let Some(read) = read(exec, id).await? else { return Ok(NodeRetry::NoRun) };
    if read.state == RunState::Killed {
        return Ok(NodeRetry::Killed);
    }
    let states: Vec<NodeState> = read.nodes.iter().map(|node| node.state).collect();
    let reopened = match reopen(&read.graph, &states, node) {
        Ok(reopened) => reopened,
        Err(error) => return Ok(NodeRetry::Refused(error)),
    };
    for index in reopened {
        let mut reset = Statement::new(
            "update workflow_nodes set state = 'waiting', reason = '', output = '',
                ended_at = 0, updated_at = $1
             where workflow_run_id = $2 and node = $3",
        );
        reset.bind(now_ms).bind(id).bind(index as i64);
        exec.fetch_all(&reset).await?;
    }
    let mut again = Statement::new(
        "update workflow_runs set state = 'running', ended_at = 0, updated_at = $1 where id = $2",
    );
    again.bind(now_ms).bind(id);
    exec.fetch_all(&again).await?;
    advance(exec, id, now_ms).await?;
    Ok(NodeRetry::Started)
}

/// Creates a run of workflow `workflow_id` (`spec` as triggered) with a row per node, and
/// decides its roots to start, in the caller's transaction; its id.
async fn insert_run(
    conn: &mut AnyConnection,
    workflow_id: i64,
    spec: &WorkflowSpec,
    trigger_type: TriggerType,
    created_by: &str,
    now_ms: i64,
) -> Result<i64> {
    let row = query(
        "insert into workflow_runs (workflow_id, group_id, spec, trigger_type, created_by,
            created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, $6)
         returning id",
    )
    .bind(workflow_id)
    .bind(spec.group_id)
    .bind(spec_text(spec)?)
    .bind(trigger_type.as_str())
    .bind(created_by)
    .bind(now_ms)
    .fetch_one(&mut *conn)
    .await?;
    let id: i64 = row.try_get("id")?;
    for chunk in (0..spec.nodes.len() as i64).collect::<Vec<_>>().chunks(100) {
        let values: Vec<String> =
            (0..chunk.len()).map(|at| format!("($1, ${}, $2)", at + 3)).collect();
        let sql = format!(
            "insert into workflow_nodes (workflow_run_id, node, updated_at) values {}",
            values.join(", ")
        );
        let mut insert = query(&sql).bind(id).bind(now_ms);
        for node in chunk {
            insert = insert.bind(*node);
        }
        insert.execute(&mut *conn).await?;
    }
    advance(&mut Exec::Sqlx(conn), id, now_ms).await?;
    Ok(id)
}

/// Takes workflow run `id`'s lock until the transaction ends (see the module's documentation).
async fn lock(exec: &mut Exec<'_>, id: i64) -> Result<()> {
    let mut statement =
        Statement::new("update workflow_runs set version = version + 1 where id = $1");
    statement.bind(id);
    exec.fetch_all(&statement).await?;
    Ok(())
}

/// A workflow run as [`advance`] reads it under its lock.
struct Read {
    state: RunState,
    graph: Graph,
    nodes: Vec<StoredNode>,
}

struct StoredNode {
    /// The node's state, its runs' ends not yet applied (`Running` while starting).
    state: NodeState,
    /// Stored as `running`: its runs may have ended since.
    running: bool,
    round: i64,
}

/// Workflow run `id`'s state, graph and nodes, or `None` if it does not exist.
async fn read(exec: &mut Exec<'_>, id: i64) -> Result<Option<Read>> {
    let mut statement = Statement::new("select state, spec from workflow_runs where id = $1");
    statement.bind(id);
    let rows = exec.fetch_all(&statement).await?;
    let Some(row) = rows.first() else { return Ok(None) };
    let state: RunState = parse_column(row, "state")?;
    let spec = parse_spec(&row.required_text("spec")?)?;
    let graph = Graph::of_stored(&spec)
        .map_err(|error| StorageError::Corrupt(format!("workflow run {id}: {error}")))?;
    let mut statement = Statement::new(
        "select node, state, round from workflow_nodes where workflow_run_id = $1 order by node",
    );
    statement.bind(id);
    let mut nodes: Vec<StoredNode> = (0..graph.node_count())
        .map(|_| StoredNode { state: NodeState::Waiting, running: false, round: 0 })
        .collect();
    for row in exec.fetch_all(&statement).await? {
        let index = node_index(row.required_int("node")?)?;
        let text = row.required_text("state")?;
        let (state, starting) = stored_state(&text)?;
        if let Some(node) = nodes.get_mut(index) {
            *node = StoredNode {
                state,
                running: state == NodeState::Running && !starting,
                round: row.required_int("round")?,
            };
        }
    }
    Ok(Some(Read { state, graph, nodes }))
}

/// Decides what follows in workflow run `id`, under its lock, in the caller's transaction:
/// records the nodes whose runs all ended (with their outputs), and, while the workflow run
/// runs, marks the nodes `workflow::decide` starts and skips, and its end.
pub(super) async fn advance(exec: &mut Exec<'_>, id: i64, now_ms: i64) -> Result<()> {
    lock(exec, id).await?;
    let Some(read) = read(exec, id).await? else { return Ok(()) };
    let mut states: Vec<NodeState> = read.nodes.iter().map(|node| node.state).collect();
    if read.nodes.iter().any(|node| node.running) {
        // Only the running nodes' runs: a wide workflow has few nodes running at once.
        let running: Vec<String> = (0..read.nodes.len())
            .filter(|&index| read.nodes[index].running)
            .map(|index| index.to_string())
            .collect();
        let mut statement = Statement::new(format!(
            "select workflow_node, workflow_round, shard_index, attempt, state, handle_msg
             from runs where workflow_run_id = $1 and workflow_node in ({})",
            running.join(", ")
        ));
        statement.bind(id);
        // Each running node's runs of its round: (shard, attempt, state, message).
        let mut runs: BTreeMap<usize, Vec<(i64, i64, RunEnd, String)>> = BTreeMap::new();
        for row in exec.fetch_all(&statement).await? {
            let index = node_index(row.required_int("workflow_node")?)?;
            let Some(node) = read.nodes.get(index).filter(|node| node.running) else { continue };
            if row.required_int("workflow_round")? != node.round {
                continue;
            }
            runs.entry(index).or_default().push((
                row.required_int("shard_index")?,
                row.required_int("attempt")?,
                parse_column(&row, "state")?,
                row.required_text("handle_msg")?,
            ));
        }
        for index in (0..read.nodes.len()).filter(|&index| read.nodes[index].running) {
            let of_node = runs.get(&index).map_or(&[][..], Vec::as_slice);
            let ends: Vec<(i64, i64, RunEnd)> = of_node
                .iter()
                .map(|(shard, attempt, state, _)| (*shard, *attempt, *state))
                .collect();
            let state = node_state(&ends);
            // A node with no runs (all deleted) stays running: nothing will end it.
            if !state.is_done() {
                continue;
            }
            states[index] = state;
            let mut end = Statement::new(
                "update workflow_nodes set state = $1, output = $2, ended_at = $3, updated_at = $3
                 where workflow_run_id = $4 and node = $5",
            );
            end.bind(state.as_str()).bind(output(of_node)).bind(now_ms).bind(id).bind(index as i64);
            exec.fetch_all(&end).await?;
        }
    }
    if read.state != RunState::Running {
        return Ok(());
    }
    let decision = decide(&read.graph, &states);
    for index in decision.start {
        let mut start = Statement::new(
            "update workflow_nodes set state = 'starting', round = round + 1, updated_at = $1
             where workflow_run_id = $2 and node = $3",
        );
        start.bind(now_ms).bind(id).bind(index as i64);
        exec.fetch_all(&start).await?;
    }
    for index in decision.skip {
        let mut skip = Statement::new(
            "update workflow_nodes set state = 'skipped', ended_at = $1, updated_at = $1
             where workflow_run_id = $2 and node = $3",
        );
        skip.bind(now_ms).bind(id).bind(index as i64);
        exec.fetch_all(&skip).await?;
    }
    if let Some(outcome) = decision.end {
        let mut end = Statement::new(
            "update workflow_runs set state = $1, ended_at = $2, updated_at = $2 where id = $3",
        );
        end.bind(RunState::from(outcome).as_str()).bind(now_ms).bind(id);
        exec.fetch_all(&end).await?;
    }
    Ok(())
}

/// A node's output: the message of each shard whose latest attempt succeeded, in shard order,
/// as JSON (`[{"shard": 0, "message": "…"}]`), each message cut to
/// [`MAX_OUTPUT_MESSAGE_BYTES`].
fn output(runs: &[(i64, i64, RunEnd, String)]) -> String {
    let mut latest: BTreeMap<i64, (i64, RunEnd, &str)> = BTreeMap::new();
    for (shard, attempt, state, message) in runs {
        let entry = latest.entry(*shard).or_insert((*attempt, *state, message));
        if *attempt > entry.0 {
            *entry = (*attempt, *state, message);
        }
    }
    let shards: Vec<serde_json::Value> = latest
        .into_iter()
        .filter(|(_, (_, state, _))| *state == RunEnd::Success)
        .map(|(shard, (_, _, message))| {
            serde_json::json!({ "shard": shard, "message": cut(message, MAX_OUTPUT_MESSAGE_BYTES) })
        })
        .collect();
    serde_json::Value::Array(shards).to_string()
}

/// `text` cut to at most `bytes` bytes, at a character boundary.
fn cut(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_holds_each_shards_latest_success() {
        let runs = [
            (1, 0, RunEnd::Failed, "boom".to_owned()),
            (1, 1, RunEnd::Success, "one".to_owned()),
            (0, 0, RunEnd::Success, "zero".to_owned()),
            (2, 0, RunEnd::Failed, "two failed".to_owned()),
        ];
        expect_test::expect![[r#"[{"message":"zero","shard":0},{"message":"one","shard":1}]"#]]
            .assert_eq(&output(&runs));
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
    }
}
