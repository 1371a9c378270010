//! Workflow runs (`crate::workflow`): their trigger, the creation of the runs of the nodes
//! storage decided to start, a kill, and a retry by hand.
//!
//! What follows a node's end is decided by storage in the transaction that ended its last run
//! (`storage::workflow_runs`): the nodes to start are marked `starting` there. Their runs are
//! planned here as a trigger of the node's job is (its version, its executors, its shards) and
//! created by a compare-and-set on the node's state, so of two admins, or of an admin and its
//! sweep, one creates them. The run that decided calls [`Dispatcher::start_nodes`] after its
//! commit; a crash in between leaves the node `starting`, and the sweep starts it.

use super::{Dispatcher, PlannedTrigger, TriggerError, now_ms};
use crate::failpoint;
use crate::model::TriggerType;
use crate::storage::{NodeRetry, StartingNode, Workflow};

/// The most nodes one call starts in one read: a workflow has at most 200.
const START_BATCH: i64 = 200;
/// How many times [`Dispatcher::start_nodes`] reads again: a node that fails at once (its job
/// is gone) may let others start, at most one level of the graph per read.
const START_ROUNDS: usize = 256;
/// A node left `starting` this long is the sweep's: the admin that decided it died, or its
/// start failed.
pub const STRANDED_AFTER_MS: i64 = 10_000;

impl Dispatcher {
    /// Triggers `workflow`: creates its run, its roots decided to start, and starts them.
    pub async fn trigger_workflow(
        &self,
        workflow: &Workflow,
        trigger_type: TriggerType,
        created_by: &str,
    ) -> anyhow::Result<i64> {
        let id = self
            .inner
            .db
            .trigger_workflow(workflow.id, &workflow.spec, trigger_type, created_by, now_ms())
            .await?;
        crate::metrics::admin().workflow_runs_started.inc();
        tracing::info!(workflow.id = workflow.id, "workflow {} run {id} triggered", workflow.id);
        self.start_nodes(id).await;
        Ok(id)
    }

    /// Creates and sends the runs of workflow run `id`'s nodes decided to start.
    pub async fn start_nodes(&self, id: i64) {
        for _ in 0..START_ROUNDS {
            let starting = match self
                .inner
                .db
                .starting_workflow_nodes(Some(id), i64::MAX, START_BATCH)
                .await
            {
                Ok(starting) => starting,
                Err(error) => {
                    tracing::warn!("workflow run {id}: reading its nodes to start: {error}");
                    return;
                }
            };
            if starting.is_empty() {
                return;
            }
            for node in &starting {
                if let Err(error) = self.start_node(node).await {
                    tracing::warn!(
                        "workflow run {id}: starting node {}: {error:#} (the sweep tries again)",
                        node.node
                    );
                    return;
                }
            }
        }
    }

    /// Plans and creates `node`'s runs and sends them; a node whose job is gone or cannot be
    /// triggered fails, without runs, with the reason.
    async fn start_node(&self, node: &StartingNode) -> anyhow::Result<()> {
        let now = now_ms();
        let db = &self.inner.db;
        let Some(job) = self.inner.cache.job(node.job_id).await? else {
            let reason = format!("job {} no longer exists", node.job_id);
            db.fail_workflow_node(node, &reason, now).await?;
            return Ok(());
        };
        let param = node.param.clone().unwrap_or_else(|| job.spec.param.clone());
        let trigger = PlannedTrigger {
            trigger_type: TriggerType::Workflow,
            at_ms: now,
            fire_time_ms: None,
            param,
        };
        let runs = match self.plan_runs(&job, trigger, None).await {
            Ok(runs) => runs,
            Err(TriggerError::Internal(error)) => return Err(error),
            Err(refused) => {
                db.fail_workflow_node(node, &refused.to_string(), now).await?;
                return Ok(());
            }
        };
        // The decision to start it is committed; its runs are not.
        failpoint::hit("workflow.before_start");
        let Some(ids) = db.start_workflow_node(node, &runs, now).await? else { return Ok(()) };
        let late_ms = (now_ms() - node.decided_at_ms).max(0);
        crate::metrics::admin().workflow_node_lateness.observe(late_ms as f64 / 1000.0);
        tracing::info!(
            job.id = job.id,
            "workflow run {} node {} started: runs {ids:?}",
            node.workflow_run_id,
            node.node
        );
        for id in ids {
            self.send_at(id, job.id, now);
        }
        Ok(())
    }

    /// Starts the nodes left `starting` for [`STRANDED_AFTER_MS`], of every workflow run (the
    /// sweep's duty).
    pub(super) async fn start_stranded_nodes(&self, now: i64) -> anyhow::Result<()> {
        let stranded = self
            .inner
            .db
            .starting_workflow_nodes(None, now - STRANDED_AFTER_MS, START_BATCH)
            .await?;
        let mut runs: Vec<i64> = stranded.iter().map(|node| node.workflow_run_id).collect();
        runs.sort_unstable();
        runs.dedup();
        for id in runs {
            self.start_nodes(id).await;
        }
        Ok(())
    }

    /// Kills workflow run `id`: no node starts any more, and its runs not ended are killed.
    /// `None` when it is not running; else how many runs were asked to stop.
    pub async fn kill_workflow_run(&self, id: i64) -> anyhow::Result<Option<usize>> {
        let Some(ids) = self.inner.db.kill_workflow_run(id, now_ms()).await? else {
            return Ok(None);
        };
        tracing::info!("workflow run {id} killed: stopping its runs {ids:?}");
        let mut killed = 0;
        for run_id in ids {
            let Some(run) = self.inner.db.get_run(run_id).await? else { continue };
            match self.kill(&run).await {
                Ok(_) => killed += 1,
                Err(error) => tracing::warn!("workflow run {id}: killing run {run_id}: {error:#}"),
            }
        }
        Ok(Some(killed))
    }

    /// Retries failed node `node` of workflow run `id` by hand, and starts it.
    pub async fn retry_workflow_node(&self, id: i64, node: usize) -> anyhow::Result<NodeRetry> {
        let retry = self.inner.db.retry_workflow_node(id, node, now_ms()).await?;
        if matches!(retry, NodeRetry::Started) {
            tracing::info!("workflow run {id}: node {node} retried by hand");
            self.start_nodes(id).await;
        }
        Ok(retry)
    }
}
