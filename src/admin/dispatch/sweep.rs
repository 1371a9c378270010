//! The sweep: a periodic pass that finds lifecycle work whose owner is gone.
//!
//! Admins that share a database share the sweep as they share the schedule: the scans of runs
//! (abandoned sends, deadlines) cover the jobs of the partitions this admin holds, and the
//! duties one admin does for all (executors gone silent or offline, stranded workflow nodes,
//! the retention) are the holder of partition 0's. Every duty's writes are compare-and-sets
//! anyway, so two admins that both do one for a moment (a handover) change a thing once.
//!
//! Each pass sends pending runs whose timer was lost (a restart, a crash) and runs whose
//! dispatcher's lease ran out; ends runs past the admin's deadline as timed out; ends runs
//! whose executor went offline as lost; raises an alarm for an executor that stopped beating;
//! forgets long-silent executors; starts the workflow nodes whose start was decided and not
//! carried out (`workflows.rs`); takes recorded callbacks whose admin's time to apply them ran
//! out (`inbox.rs`); and deletes ended runs past the retention, in bounded batches. Every scan goes through an index on the run's state
//! and is bounded, so a pass costs what there is to do, not the size of the history, and one
//! run that cannot be handled is logged and skipped, never stopping the pass.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, now_ms};
use crate::lifecycle::Event;
use crate::model::AddressType;
use crate::partition::Held;
use crate::protocol::REGISTRY_GROUP_EXECUTOR;

/// How often the sweep runs.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// A run is judged lost only once it was accepted this long ago and its executor is offline.
const LOST_AFTER_MS: i64 = 60_000;
/// The most runs of each kind one pass handles.
const BATCH: i64 = 500;
/// The most ended runs one pass deletes.
const RETENTION_BATCHES: usize = 10;

/// Sweeps until `shutdown`.
pub async fn sweep(dispatcher: Dispatcher, shutdown: CancellationToken) {
    dispatcher.partitions().first_beat().await;
    loop {
        dispatcher.sweep_once().await;
        tokio::select! {
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

impl Dispatcher {
    /// One pass; each duty logs its own failures. The runs' duties cover the jobs of the
    /// partitions this admin holds; the admin that holds partition 0 also does the duties one
    /// admin does for all.
    pub(crate) async fn sweep_once(&self) {
        let now = now_ms();
        let held = self.inner.partitions.held();
        let mut duties = vec![
            ("sending abandoned runs", self.send_abandoned(now, &held).await),
            ("ending runs past their deadline", self.end_overdue(now, &held).await),
            ("taking over recorded callbacks", self.take_over_callbacks(&[]).await),
        ];
        if self.inner.partitions.leads() {
            duties.extend([
                ("forgetting silent executors", self.forget_silent_executors(now).await),
                ("ending runs of offline executors", self.end_orphaned(now).await),
                ("alarming on lost executors", self.alarm_lost_executors(now).await),
                ("starting stranded workflow nodes", self.start_stranded_nodes(now).await),
                ("deleting old runs", self.delete_old_runs(now).await),
            ]);
        }
        for (duty, done) in duties {
            if let Err(error) = done {
                tracing::error!(error = format!("{error:#}"), "sweep: {duty} failed");
            }
        }
    }

    async fn forget_silent_executors(&self, now: i64) -> anyhow::Result<()> {
        // Executors silent for ten heartbeat windows are long offline.
        let stale_before = now - 10 * self.inner.online_window_ms;
        let removed = self.inner.db.remove_stale_registrations(stale_before).await?;
        if removed > 0 {
            tracing::info!("forgot {removed} executors not heard from in a long while");
        }
        // Admins that died without leaving, once silent as long.
        let admins = self.inner.db.forget_departed_admins(stale_before).await?;
        if admins > 0 {
            tracing::info!("forgot {admins} admins not heard from in a long while");
        }
        Ok(())
    }

    /// Sends now the runs that the admins `gone` claimed and did not send, once this admin took
    /// partitions from them because their leases ran out (they are dead or paused, and fire
    /// nothing): without this, those runs would wait for their dispatch leases (15 s) and the
    /// next pass. The runs of the partitions this admin holds are claimed here; the other
    /// takers do the same for theirs. Safe as any claim of an abandoned run: the claim
    /// bumps the fence, a paused admin that resumes records nothing under its old one, and a run
    /// whose target it recorded goes only there (`lifecycle::before_send`), where the executor
    /// takes a `logId` once.
    pub(crate) async fn take_over_sends(self, gone: Vec<String>) {
        // Their recorded callbacks too, which would otherwise wait for their time to run out.
        if let Err(error) = self.take_over_callbacks(&gone).await {
            tracing::error!(error = format!("{error:#}"), "taking over recorded callbacks failed");
        }
        let now = now_ms();
        let expired = match self.inner.db.expire_dispatch_leases(&gone, now).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::error!(%error, "taking over the sends of {gone:?} failed");
                return;
            }
        };
        if expired > 0 {
            tracing::info!("{expired} runs claimed by {gone:?} and not sent: sending them");
        }
        // Even with none expired here: another admin that took some of the same admin's
        // partitions may have ended the leases, of runs in the partitions taken here too.
        let held = self.inner.partitions.held();
        if let Err(error) = self.send_abandoned(now, &held).await {
            tracing::error!(error = format!("{error:#}"), "sending abandoned runs failed");
        }
    }

    /// Sends pending runs whose timer was lost, and runs whose dispatcher's lease ran out.
    async fn send_abandoned(&self, now: i64, held: &Held) -> anyhow::Result<()> {
        for (id, job_id) in self.inner.db.dispatchable_runs(now, now, BATCH, held).await? {
            self.send_at(id, job_id, now);
        }
        // Held runs whose release was lost with its admin (or raced a run's end).
        for group_id in self.inner.db.groups_with_held_runs(BATCH).await? {
            self.release_held(group_id).await?;
        }
        Ok(())
    }

    /// Ends running runs whose result did not come within the job's timeout plus the grace.
    async fn end_overdue(&self, now: i64, held: &Held) -> anyhow::Result<()> {
        for run in self.inner.db.runs_past_deadline(now, BATCH, held).await? {
            if let Err(error) = self.apply(run.id, Event::DeadlinePassed, None, None).await {
                tracing::error!(
                    error = format!("{error:#}"),
                    "ending overdue run {} failed",
                    run.id
                );
            }
        }
        Ok(())
    }

    /// Ends the runs of executors that went offline before reporting (XXL-JOB's lost-result
    /// monitor). Only executors that beat can be judged gone: a `MANUAL` group's configured
    /// addresses are left alone.
    async fn end_orphaned(&self, now: i64) -> anyhow::Result<()> {
        let db = &self.inner.db;
        let addresses = db.executors_with_running_runs().await?;
        if addresses.is_empty() {
            return Ok(());
        }
        let since = now - self.inner.online_window_ms;
        let online: HashSet<String> = db
            .list_registrations(REGISTRY_GROUP_EXECUTOR)
            .await?
            .into_iter()
            .filter(|row| row.updated_at_ms >= since)
            .map(|row| row.address)
            .collect();
        let configured: HashSet<String> = db
            .list_groups()
            .await?
            .into_iter()
            .filter(|group| group.address_type == AddressType::Manual)
            .flat_map(|group| group.addresses)
            .collect();
        for address in addresses {
            if online.contains(&address) || configured.contains(&address) {
                continue;
            }
            for run_id in db.running_run_ids_on(&address, now - LOST_AFTER_MS, BATCH).await? {
                let reason =
                    format!("lost: executor {address} went offline before reporting a result");
                if let Err(error) = self.apply(run_id, Event::Lost { reason }, None, None).await {
                    tracing::error!(error = format!("{error:#}"), "ending run {run_id} failed");
                }
            }
        }
        Ok(())
    }

    /// Raises an alarm for each executor that stopped beating (offline past the online
    /// window), once per time it goes offline: the registry row is marked in the transaction
    /// that inserts the alarm event. A graceful stop deregisters, so it raises none.
    async fn alarm_lost_executors(&self, now: i64) -> anyhow::Result<()> {
        let offline_before = now - self.inner.online_window_ms;
        let lost =
            self.inner.db.mark_lost_executors(REGISTRY_GROUP_EXECUTOR, offline_before, now).await?;
        for (app_name, address) in lost {
            tracing::warn!("executor {address} of {app_name} is lost: no heartbeat");
        }
        Ok(())
    }

    /// Deletes ended runs older than the retention, a bounded number per pass, and the alarm
    /// history as old.
    async fn delete_old_runs(&self, now: i64) -> anyhow::Result<()> {
        let Some(retention_ms) = self.inner.run_retention_ms else { return Ok(()) };
        let mut deleted = 0;
        for _ in 0..RETENTION_BATCHES {
            let batch = self.inner.db.delete_ended_runs(now - retention_ms, 1_000).await?;
            deleted += batch;
            if batch < 1_000 {
                break;
            }
        }
        if deleted > 0 {
            tracing::info!("deleted {deleted} runs past the retention");
        }
        let workflows = self.inner.db.delete_ended_workflow_runs(now - retention_ms, 1_000).await?;
        if workflows > 0 {
            tracing::info!("deleted {workflows} workflow runs past the retention");
        }
        let alarms = self.inner.db.delete_old_alarms(now - retention_ms).await?;
        if alarms > 0 {
            tracing::info!("deleted {alarms} alarm events and deliveries past the retention");
        }
        Ok(())
    }
}
