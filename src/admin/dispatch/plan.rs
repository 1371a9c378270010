//! Planning a trigger: which runs one fire or trigger of a job creates (one, one per executor
//! for broadcast jobs, one per executor that gets items for sharded jobs), and their creation,
//! claimed at once when they can be routed without probing.

use super::{Dispatcher, LEASE_MS, now_ms};
use crate::model::{Job, RouteStrategy, ShardingItem, TriggerType};
use crate::routing::sharding;
use crate::storage::{AuditEntry, Fired, NewRun};

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

impl Dispatcher {
    /// The runs one trigger of `job` creates: one, one per executor for broadcast jobs, or one
    /// per executor that gets items for sharded jobs. `addresses`, if given, restricts the
    /// executors (they must belong to the job's group).
    pub async fn plan_runs(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
    ) -> Result<Vec<NewRun>, TriggerError> {
        let version = match (job.spec.glue_type.runs_a_version(), job.active_version) {
            (true, Some(version)) => self
                .inner
                .cache
                .version_digest(job.id, version)
                .await?
                .map(|sha256| (version, sha256)),
            _ => None,
        };
        // A schedule fire without a version still creates its run, which then fails visibly;
        // an explicit trigger is refused at once.
        let scheduled = matches!(trigger.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        if job.spec.glue_type.runs_a_version() && version.is_none() && !scheduled {
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
            sharding_items: Vec::new(),
            attempt: 0,
            version: version.clone(),
            parent_run_id: None,
            node: None,
        };
        let sharded = job.spec.sharding_total_count > 0;
        let broadcast = job.spec.route_strategy == RouteStrategy::ShardingBroadcast;
        if addresses.is_none() && !broadcast && !sharded {
            return Ok(vec![run(None, 0, 1)]);
        }
        let group = self.inner.cache.group(job.spec.group_id).await?;
        let group = group.ok_or(TriggerError::NoGroup(job.spec.group_id))?;
        let online = self.inner.cache.online_addresses(&group, trigger.at_ms.max(now_ms())).await?;
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
        if sharded {
            let assigned = sharded_targets(job, &targets);
            if assigned.is_empty() {
                // No executor to give the items to: one run that fails visibly at dispatch.
                return Ok(vec![run(None, 0, 1)]);
            }
            let total = assigned.len() as i64;
            return Ok(assigned
                .into_iter()
                .enumerate()
                .map(|(index, (address, items))| NewRun {
                    sharding_items: items,
                    ..run(Some(address), index as i64, total)
                })
                .collect());
        }
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

    /// Creates the runs of a manual, API or parent trigger and sends them now; `audit`, the
    /// operator's request, is recorded in the runs' transaction with their ids.
    pub async fn trigger(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
        audit: Option<&AuditEntry>,
    ) -> Result<Vec<i64>, TriggerError> {
        let mut runs = self.plan_runs(job, trigger, addresses).await?;
        let now = now_ms();
        let due_now = runs.iter().all(|run| run.trigger_time_ms <= now);
        let claim = if due_now { self.preroute(job, &mut runs, now).await } else { None };
        if let Some((owner, lease_until_ms)) = claim {
            let claims = self
                .inner
                .db
                .create_claimed_runs(&runs, &owner, now, lease_until_ms, audit)
                .await
                .map_err(anyhow::Error::from)?;
            let mut ids = Vec::with_capacity(claims.len());
            for claim in claims.into_iter().flatten() {
                ids.push(claim.run.id);
                self.send_created_at(Fired::Claimed(Box::new(claim)), now);
            }
            return Ok(ids);
        }
        let created = self.inner.db.create_audited_runs(&runs, now, audit).await;
        let created = created.map_err(anyhow::Error::from)?;
        let mut ids = Vec::with_capacity(runs.len());
        for (run, id) in runs.iter().zip(created) {
            if let Some(id) = id {
                ids.push(id);
                self.send_at(id, run.job_id, run.trigger_time_ms);
            }
        }
        Ok(ids)
    }

    /// Routes `runs` of `job`, due at `due_ms`, so they can be created already claimed by this
    /// admin: the owner and lease to create them with, or `None` (they are created pending and
    /// claimed at their instant) when the job's route probes executors (`FAILOVER`,
    /// `BUSYOVER`) or no executor is online. Claimed creation is one write instead of a
    /// creation, a claim and the record of the executor. A crash before the send leaves the
    /// runs `dispatching` under a lease that runs out, and the sweep then sends each to its
    /// recorded executor, as after a crash between that record and the send.
    pub async fn preroute(
        &self,
        job: &Job,
        runs: &mut [NewRun],
        due_ms: i64,
    ) -> Option<(String, i64)> {
        if matches!(job.spec.route_strategy, RouteStrategy::Failover | RouteStrategy::Busyover) {
            return None;
        }
        // A capped job's runs are claimed only under its cap.
        if self.cap_group(job).await.ok()?.is_some() {
            return None;
        }
        for run in runs.iter_mut().filter(|run| run.executor_address.is_none()) {
            run.executor_address = Some(self.route_run(job).await.ok()?);
        }
        Some((self.inner.owner.clone(), due_ms.max(now_ms()) + LEASE_MS))
    }
}

/// The executors among `targets` that `job`'s sharding strategy gives items to, each with its
/// items and their parameters, in the order of the executors' addresses.
fn sharded_targets(job: &Job, targets: &[String]) -> Vec<(String, Vec<ShardingItem>)> {
    let total = u32::try_from(job.spec.sharding_total_count).unwrap_or(0);
    // Item parameters are validated when the job is saved; should stored ones not read, the
    // items still run, without parameters.
    let parameters = sharding::parse_item_parameters(&job.spec.sharding_item_parameters, total)
        .unwrap_or_default();
    sharding::assign(job.spec.sharding_strategy, &job.spec.name, total, targets)
        .into_iter()
        .filter(|(_, items)| !items.is_empty())
        .map(|(address, items)| (address, sharding::items_with_parameters(&items, &parameters)))
        .collect()
}
