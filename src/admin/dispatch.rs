//! Dispatch: turning a job trigger into runs, sending each run to an executor at its instant,
//! and applying the executor's result (retries and child jobs follow a result exactly once).
//!
//! A run is sent by whoever claims it (`Db::claim_run`): the timer set when it was created, or
//! the sweep that picks up runs left pending by a crash or a restart. Routing happens at send
//! time among the group's online executors, except for broadcast shards and runs aimed at an
//! address by the operator, which carry their executor from creation.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::now_ms;
use crate::model::{
    AddressType, GlueType, Group, Job, RouteStrategy, RunRecord, TriggerType, code,
};
use crate::protocol::{self, GLUE_WASM, JobIdParam, REGISTRY_GROUP_EXECUTOR, TriggerParam};
use crate::routing::{Probe, Route, RouterState};
use crate::storage::{Db, NewRun};

/// A claim older than this is considered abandoned (its admin died mid-send).
const CLAIM_TTL_MS: i64 = 30_000;
/// A run is judged lost only once it was sent this long ago and its executor is offline.
const LOST_AFTER_MS: i64 = 60_000;
/// How often the sweep looks for abandoned pending runs.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Why a trigger was refused before any run was created.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    /// A `GLUE_WASM` job without an uploaded version.
    #[error("job {0} has no module version: upload one first")]
    NoVersion(i64),
    /// An address that is neither online in the job's group nor configured for it.
    #[error("address `{0}` is not an executor of the job's group")]
    AddressNotAllowed(String),
    /// The job's group is gone.
    #[error("group {0} of the job does not exist")]
    NoGroup(i64),
    /// The database failed.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// Sends runs and applies results. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    client: protocol::Client,
    router: Mutex<RouterState>,
    online_window_ms: i64,
    timers: CancellationToken,
}

impl Dispatcher {
    /// A dispatcher over `db`; an executor is online if it beat within `online_window_ms`.
    pub fn new(db: Db, client: protocol::Client, online_window_ms: i64) -> Dispatcher {
        let inner = Inner {
            db,
            client,
            router: Mutex::new(RouterState::new()),
            online_window_ms,
            timers: CancellationToken::new(),
        };
        Dispatcher { inner: Arc::new(inner) }
    }

    /// The protocol client (reading executor logs goes through it too).
    pub fn client(&self) -> &protocol::Client {
        &self.inner.client
    }

    /// Cancels the pending send timers (their runs stay pending for the next start).
    pub fn stop(&self) {
        self.inner.timers.cancel();
    }

    /// The addresses runs of `group` may go to now: heartbeats for `AUTO`, configuration for `MANUAL`.
    pub async fn online_addresses(
        &self,
        group: &Group,
        now_ms: i64,
    ) -> anyhow::Result<Vec<String>> {
        Ok(match group.address_type {
            AddressType::Manual => group.addresses.clone(),
            AddressType::Auto => {
                let since = now_ms - self.inner.online_window_ms;
                self.inner
                    .db
                    .online_addresses(REGISTRY_GROUP_EXECUTOR, &group.app_name, since)
                    .await?
            }
        })
    }

    /// The runs one trigger of `job` creates: one, or one per executor for broadcast jobs.
    /// `addresses`, if given, restricts the executors (they must belong to the job's group).
    pub async fn plan_runs(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
    ) -> Result<Vec<NewRun>, TriggerError> {
        let db = &self.inner.db;
        let version = match (job.spec.glue_type, job.active_version) {
            (GlueType::GlueWasm, Some(version)) => {
                let found =
                    db.get_job_version(job.id, version).await.map_err(anyhow::Error::from)?;
                found.map(|found| (found.version, found.sha256))
            }
            _ => None,
        };
        // A schedule fire without a version still creates its run, which then fails visibly;
        // an explicit trigger is refused at once.
        let scheduled = matches!(trigger.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        if job.spec.glue_type == GlueType::GlueWasm && version.is_none() && !scheduled {
            return Err(TriggerError::NoVersion(job.id));
        }
        let run = |executor_address: Option<String>, shard_index: i64, shard_total: i64| NewRun {
            job_id: job.id,
            trigger_type: trigger.trigger_type,
            trigger_time_ms: trigger.at_ms,
            fire_time_ms: trigger.fire_time_ms,
            param: trigger.param.clone(),
            executor_address,
            shard_index,
            shard_total,
            attempt: 0,
            version: version.clone(),
        };
        let broadcast = job.spec.route_strategy == RouteStrategy::ShardingBroadcast;
        if addresses.is_none() && !broadcast {
            return Ok(vec![run(None, 0, 1)]);
        }
        let group = db.get_group(job.spec.group_id).await.map_err(anyhow::Error::from)?;
        let group = group.ok_or(TriggerError::NoGroup(job.spec.group_id))?;
        let online = self.online_addresses(&group, trigger.at_ms.max(now_ms())).await?;
        let targets = match addresses {
            Some(given) => {
                if let Some(stranger) = given
                    .iter()
                    .find(|address| !online.contains(address) && !group.addresses.contains(address))
                {
                    return Err(TriggerError::AddressNotAllowed(stranger.clone()));
                }
                given.to_vec()
            }
            None => online,
        };
        if broadcast {
            let total = targets.len().max(1) as i64;
            if targets.is_empty() {
                // No executor to shard over: one run that fails visibly at dispatch.
                return Ok(vec![run(None, 0, 1)]);
            }
            return Ok(targets
                .into_iter()
                .enumerate()
                .map(|(index, address)| run(Some(address), index as i64, total))
                .collect());
        }
        let picked = self.route(job, &targets, now_ms()).await;
        Ok(vec![run(picked, 0, 1)])
    }

    /// Creates the runs of a manual, API or parent trigger and sends them now.
    pub async fn trigger(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
    ) -> Result<Vec<i64>, TriggerError> {
        let runs = self.plan_runs(job, trigger, addresses).await?;
        let now = now_ms();
        let mut ids = Vec::with_capacity(runs.len());
        for run in &runs {
            if let Some(id) =
                self.inner.db.create_run(run, now).await.map_err(anyhow::Error::from)?
            {
                ids.push(id);
                self.send_at(id, run.trigger_time_ms);
            }
        }
        Ok(ids)
    }

    /// Sends run `run_id` at `due_ms` (now if that has passed).
    pub fn send_at(&self, run_id: i64, due_ms: i64) {
        let this = self.clone();
        let span = tracing::info_span!("dispatch", run.id = run_id);
        tokio::spawn(
            async move {
                let wait = u64::try_from(due_ms - now_ms()).unwrap_or(0);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    () = this.inner.timers.cancelled() => return,
                }
                if let Err(error) = this.send(run_id).await {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "dispatching run {run_id} failed"
                    );
                }
            }
            .instrument(span),
        );
    }

    /// Claims run `run_id` and sends it to an executor, recording the outcome of the trigger.
    pub async fn send(&self, run_id: i64) -> anyhow::Result<()> {
        let db = &self.inner.db;
        let now = now_ms();
        let Some(run) = db.claim_run(run_id, now, now - CLAIM_TTL_MS).await? else {
            return Ok(());
        };
        let job = db.get_job(run.job_id).await?;
        let scheduled = matches!(run.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        if scheduled && job.as_ref().is_some_and(|job| !job.running) {
            // The fire was committed just before the job was stopped: an operator who stopped
            // a job expects no further scheduled run, so it ends here, without a retry.
            let reason = "skipped: the job was stopped before this fire was sent";
            db.set_trigger_result(run.id, None, code::FAILURE, reason).await?;
            db.finish_run(run.id, code::FAILURE, reason, None, now).await?;
            return Ok(());
        }
        let sent = match job {
            Some(job) => self.send_to_executor(&job, &run).await,
            None => Err(format!("job {} no longer exists", run.job_id)),
        };
        match sent {
            Ok(address) => {
                db.set_trigger_result(
                    run.id,
                    Some(&address),
                    code::SUCCESS,
                    &format!("sent to {address}"),
                )
                .await?;
                tracing::info!(job.id = run.job_id, executor.address = %address, "run {} sent to {address}", run.id);
            }
            Err(reason) => {
                tracing::warn!(job.id = run.job_id, "run {} not sent: {reason}", run.id);
                db.set_trigger_result(
                    run.id,
                    run.executor_address.as_deref(),
                    code::FAILURE,
                    &reason,
                )
                .await?;
                self.apply_result(
                    run.id,
                    code::FAILURE,
                    &format!("trigger failed: {reason}"),
                    None,
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn send_to_executor(&self, job: &Job, run: &RunRecord) -> Result<String, String> {
        let address = match &run.executor_address {
            Some(address) => address.clone(),
            None => {
                let group =
                    self.inner.db.get_group(job.spec.group_id).await.map_err(|e| e.to_string())?;
                let group =
                    group.ok_or_else(|| format!("group {} does not exist", job.spec.group_id))?;
                let online =
                    self.online_addresses(&group, now_ms()).await.map_err(|e| format!("{e:#}"))?;
                if online.is_empty() {
                    return Err(format!("no executor online in group `{}`", group.app_name));
                }
                self.route(job, &online, now_ms())
                    .await
                    .ok_or_else(|| "no executor passed the route's probe".to_owned())?
            }
        };
        let param = trigger_param(job, run).map_err(|e| format!("{e:#}"))?;
        match self.inner.client.call::<_, String>(&address, "run", &param).await {
            Ok(_) => Ok(address),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Picks one executor among `addresses` with the job's strategy, probing if it asks for it.
    async fn route(&self, job: &Job, addresses: &[String], now_ms: i64) -> Option<String> {
        let route = {
            let mut router = self.inner.router.lock().ok()?;
            router.route(job.spec.route_strategy, job.id, addresses, now_ms, &mut rand::rng())?
        };
        match route {
            Route::One(address) => Some(address),
            Route::Broadcast(targets) => targets.into_iter().next().map(|(address, _, _)| address),
            Route::FirstPassing { probe, candidates } => {
                for candidate in candidates {
                    let passed = match probe {
                        Probe::Beat => {
                            self.inner.client.call::<_, String>(&candidate, "beat", &()).await
                        }
                        Probe::IdleBeat => {
                            let param = JobIdParam { job_id: job.id, log_id: None };
                            self.inner
                                .client
                                .call::<_, String>(&candidate, "idleBeat", &param)
                                .await
                        }
                    };
                    if passed.is_ok() {
                        return Some(candidate);
                    }
                }
                None
            }
        }
    }

    /// Applies a run's result unless it has one; then retries a failure or triggers the children
    /// of a success. A result for a finished or unknown run is ignored.
    pub async fn apply_result(
        &self,
        run_id: i64,
        handle_code: i32,
        handle_msg: &str,
        fuel_used: Option<i64>,
    ) -> anyhow::Result<()> {
        let db = &self.inner.db;
        let finished = db.finish_run(run_id, handle_code, handle_msg, fuel_used, now_ms()).await?;
        let Some(run) = finished else {
            return Ok(());
        };
        let Some(job) = db.get_job(run.job_id).await? else { return Ok(()) };
        if run.handle_code != code::SUCCESS {
            if run.attempt < job.spec.retry_count {
                let retry = NewRun {
                    job_id: run.job_id,
                    trigger_type: TriggerType::Retry,
                    trigger_time_ms: now_ms(),
                    fire_time_ms: None,
                    param: run.param.clone(),
                    executor_address: (run.shard_total > 1)
                        .then(|| run.executor_address.clone())
                        .flatten(),
                    shard_index: run.shard_index,
                    shard_total: run.shard_total,
                    attempt: run.attempt + 1,
                    version: run.version.zip(run.sha256.clone()),
                };
                if let Some(id) = db.create_run(&retry, now_ms()).await? {
                    tracing::info!(
                        job.id = job.id,
                        "run {} failed: retry {} as run {id}",
                        run.id,
                        retry.attempt
                    );
                    self.send_at(id, retry.trigger_time_ms);
                }
            }
            return Ok(());
        }
        for child_id in &job.spec.child_job_ids {
            let Some(child) = db.get_job(*child_id).await? else {
                tracing::warn!(job.id = job.id, "child job {child_id} does not exist");
                continue;
            };
            let trigger = PlannedTrigger::now(TriggerType::Parent, child.spec.param.clone());
            match self.trigger(&child, trigger, None).await {
                Ok(ids) => tracing::info!(
                    job.id = job.id,
                    "run {} triggered child job {child_id}: runs {ids:?}",
                    run.id
                ),
                Err(error) => {
                    tracing::warn!(job.id = job.id, "child job {child_id} not triggered: {error}")
                }
            }
        }
        Ok(())
    }

    /// Asks the executor of run `run_id` to stop it; a run not sent yet ends here.
    pub async fn kill(&self, run: &RunRecord) -> anyhow::Result<String> {
        if run.handle_code != code::PENDING {
            return Ok("the run has ended already".to_owned());
        }
        match (&run.executor_address, run.trigger_code) {
            (Some(address), code::SUCCESS) => {
                let param = JobIdParam { job_id: run.job_id, log_id: Some(run.id) };
                self.inner
                    .client
                    .call::<_, String>(address, "kill", &param)
                    .await
                    .context("asking the executor")?;
                Ok(format!("kill sent to {address}"))
            }
            _ => {
                self.inner
                    .db
                    .finish_run(run.id, code::FAILURE, "killed before it was sent", None, now_ms())
                    .await?;
                Ok("killed before it was sent".to_owned())
            }
        }
    }

    /// Sends pending runs whose timer was lost (a restart, a crash, another admin's death).
    async fn sweep_once(&self) -> anyhow::Result<()> {
        let now = now_ms();
        // Executors silent for ten heartbeat windows are forgotten (they are long offline).
        let stale_before = now - 10 * self.inner.online_window_ms;
        let removed = self.inner.db.remove_stale_registrations(stale_before).await?;
        if removed > 0 {
            tracing::info!("forgot {removed} executors not heard from in a long while");
        }
        let ids = self.inner.db.pending_runs(now, now - CLAIM_TTL_MS, 100).await?;
        for id in ids {
            self.send(id).await?;
        }
        self.fail_lost_runs(now).await
    }

    /// Fails runs whose executor went offline while they ran (XXL-JOB's lost-result monitor):
    /// without it they would show as running forever. Only executors that heartbeat can be
    /// judged gone; runs on a `MANUAL` group's addresses are left alone.
    async fn fail_lost_runs(&self, now: i64) -> anyhow::Result<()> {
        let db = &self.inner.db;
        let candidates = db.unfinished_runs(now - LOST_AFTER_MS, 100).await?;
        if candidates.is_empty() {
            return Ok(());
        }
        let since = now - self.inner.online_window_ms;
        let online: Vec<String> = db
            .list_registrations(REGISTRY_GROUP_EXECUTOR)
            .await?
            .into_iter()
            .filter(|row| row.updated_at_ms >= since)
            .map(|row| row.address)
            .collect();
        for run in candidates {
            let Some(address) = &run.executor_address else { continue };
            if online.contains(address) {
                continue;
            }
            let job = db.get_job(run.job_id).await?;
            let group = match &job {
                Some(job) => db.get_group(job.spec.group_id).await?,
                None => None,
            };
            if group.is_some_and(|group| group.address_type == AddressType::Manual) {
                continue;
            }
            let reason = format!("lost: executor {address} went offline before reporting a result");
            tracing::warn!(job.id = run.job_id, "run {}: {reason}", run.id);
            self.apply_result(run.id, code::FAILURE, &reason, None).await?;
        }
        Ok(())
    }
}

/// When and why runs are created.
#[derive(Debug, Clone)]
pub struct PlannedTrigger {
    /// Why.
    pub trigger_type: TriggerType,
    /// The instant the runs are for (ms).
    pub at_ms: i64,
    /// For schedule fires, the fire's key.
    pub fire_time_ms: Option<i64>,
    /// The parameter.
    pub param: String,
}

impl PlannedTrigger {
    /// A trigger for now.
    pub fn now(trigger_type: TriggerType, param: String) -> PlannedTrigger {
        PlannedTrigger { trigger_type, at_ms: now_ms(), fire_time_ms: None, param }
    }
}

/// Sweeps until `shutdown`.
pub async fn sweep(dispatcher: Dispatcher, shutdown: CancellationToken) {
    loop {
        if let Err(error) = dispatcher.sweep_once().await {
            tracing::error!(error = format!("{error:#}"), "sweeping pending runs failed");
        }
        tokio::select! {
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn trigger_param(job: &Job, run: &RunRecord) -> anyhow::Result<TriggerParam> {
    let (glue_source, handler) = match job.spec.glue_type {
        GlueType::GlueWasm => {
            let sha256 = run
                .sha256
                .clone()
                .with_context(|| format!("job {} has no module version: upload one", job.id))?;
            (sha256, String::new())
        }
        GlueType::Bean => (String::new(), job.spec.handler.clone().unwrap_or_default()),
    };
    Ok(TriggerParam {
        job_id: job.id,
        executor_handler: handler,
        executor_params: run.param.clone(),
        executor_block_strategy: job.spec.block_strategy.as_str().to_owned(),
        executor_timeout: job.spec.timeout_secs,
        log_id: run.id,
        log_date_time: run.trigger_time_ms,
        glue_type: if job.spec.glue_type == GlueType::GlueWasm {
            GLUE_WASM.to_owned()
        } else {
            "BEAN".to_owned()
        },
        glue_source,
        glue_updatetime: 0,
        broadcast_index: run.shard_index,
        broadcast_total: run.shard_total,
        attempt: Some(run.attempt),
        fuel_limit: job.spec.fuel_limit,
        memory_limit_mb: job.spec.memory_limit_mb,
    })
}
