//! Concurrency caps at the admin: a capped job's runs are claimed under its job's and group's
//! `max_concurrent_runs` (storage's `caps.rs` holds the rule), and a run that finds no room
//! is handled as its job's block strategy says:
//!
//! - `SERIAL_EXECUTION` waits: the run is held, pending, and claimed when a run of its job or
//!   group ends, oldest first;
//! - `DISCARD_LATER` ends the new run `skipped`, with the reason;
//! - `COVER_EARLY` kills the job's oldest runs in flight, and the new run waits for their end.
//!
//! Executors still apply the block strategy to the runs each of them holds.

use super::{Dispatcher, LEASE_MS, now_ms};
use crate::lifecycle::Event;
use crate::model::{BlockStrategy, Job};
use crate::storage::{CappedClaim, Claim, Fired};

/// The most held runs one release looks at.
const RELEASE_BATCH: i64 = 100;

impl Dispatcher {
    /// The group whose caps apply to `job`'s runs, if its own cap or its group's is set.
    pub(super) async fn cap_group(&self, job: &Job) -> anyhow::Result<Option<i64>> {
        if job.spec.max_concurrent_runs > 0 {
            return Ok(Some(job.spec.group_id));
        }
        let group = self.inner.cache.group(job.spec.group_id).await?;
        Ok(group.filter(|group| group.max_concurrent_runs > 0).map(|group| group.id))
    }

    /// Claims run `run_id` of capped `job` (in `group_id`), or holds it and applies the job's
    /// block strategy.
    pub(super) async fn claim_capped(
        &self,
        run_id: i64,
        job: &Job,
        group_id: i64,
    ) -> anyhow::Result<Option<Claim>> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        match self.inner.db.claim_capped(run_id, group_id, owner, now, now + LEASE_MS).await? {
            CappedClaim::Claimed(claim) => Ok(Some(*claim)),
            CappedClaim::Gone => Ok(None),
            CappedClaim::Held => {
                self.over_cap(run_id, job).await?;
                Ok(None)
            }
        }
    }

    /// What `job`'s block strategy does with its run `run_id`, held at a cap.
    async fn over_cap(&self, run_id: i64, job: &Job) -> anyhow::Result<()> {
        match job.spec.block_strategy {
            BlockStrategy::SerialExecution => {
                tracing::info!(job.id = job.id, "run {run_id} waits for a place under its cap");
            }
            BlockStrategy::DiscardLater => {
                let cap = job.spec.max_concurrent_runs;
                let reason = if cap > 0 {
                    format!("skipped: the job has {cap} runs in flight, its cap (DISCARD_LATER)")
                } else {
                    "skipped: the job's group is at its cap of runs in flight (DISCARD_LATER)"
                        .to_owned()
                };
                self.apply(run_id, Event::Discard { reason }, None, None).await?;
            }
            BlockStrategy::CoverEarly => {
                // The job's oldest run in flight gives its place (at a group's cap too); each
                // new run held covers one more.
                if let Some(id) = self.inner.db.runs_in_flight(job.id, 1).await?.first()
                    && let Some(run) = self.inner.db.get_run(*id).await?
                {
                    tracing::info!(
                        job.id = job.id,
                        "run {id} is killed to make room for run {run_id} (COVER_EARLY)"
                    );
                    self.kill(&run).await?;
                }
            }
        }
        Ok(())
    }

    /// Claims and sends the held runs of group `group_id`'s jobs that fit under their caps now:
    /// after a run ends, and after a cap was raised.
    pub async fn release_held(&self, group_id: i64) -> anyhow::Result<()> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        let claims =
            self.inner.db.release_held(group_id, owner, now, now + LEASE_MS, RELEASE_BATCH).await?;
        for claim in claims {
            tracing::info!(
                job.id = claim.run.job_id,
                "run {} is released by its cap",
                claim.run.id
            );
            self.send_created_at(Fired::Claimed(Box::new(claim)), now);
        }
        Ok(())
    }
}
