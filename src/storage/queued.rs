//! The writes of the run lifecycle as the rest of the admin asks for them: creating runs,
//! claiming and renewing leases, recording targets, applying transitions, and audit records.
//! Each is queued for the group commit (`batch`) and answered once it committed; what each
//! write does in SQL is `runs` and `audit`, which the batch calls.

use super::audit::AuditEntry;
use super::batch::{Write, Written};
use super::runs::{Claim, NewRun};
use super::{Db, Result};
use crate::lifecycle::Transition;
use crate::model::RunRecord;

impl Db {
    /// Creates one run outside a fire (manual, API, retry, parent). `None` when a run with the
    /// same fire, shard and attempt exists already.
    pub async fn create_run(&self, run: &NewRun, now_ms: i64) -> Result<Option<i64>> {
        let mut ids = self.create_runs(std::slice::from_ref(run), now_ms).await?;
        Ok(ids.pop().flatten())
    }

    /// Creates the runs of one trigger (a broadcast's shards) together: all or none. Each id
    /// is `None` when a run with the same fire, shard and attempt exists already.
    pub async fn create_runs(&self, runs: &[NewRun], now_ms: i64) -> Result<Vec<Option<i64>>> {
        self.create_audited_runs(runs, now_ms, None).await
    }

    /// [`Db::create_runs`], recording `audit` (the trigger that asked for them) in the same
    /// transaction, with the created runs' ids added to its after JSON as `log_ids`.
    pub async fn create_audited_runs(
        &self,
        runs: &[NewRun],
        now_ms: i64,
        audit: Option<&AuditEntry>,
    ) -> Result<Vec<Option<i64>>> {
        let write = Write::CreateRuns { runs: runs.to_vec(), now_ms, audit: audit.cloned() };
        match self.batch(write).await? {
            Written::Ids(ids) => Ok(ids),
            other => Err(other.unexpected()),
        }
    }

    /// Creates runs already claimed by `owner` until `lease_until_ms` (`dispatching`, fence 1),
    /// for a dispatcher that sends them at once: one write instead of a creation and a claim.
    /// Each claim is `None` when a run with the same fire, shard and attempt exists already.
    /// Like [`Db::create_audited_runs`], all or none, with `audit` recorded in their transaction.
    pub async fn create_claimed_runs(
        &self,
        runs: &[NewRun],
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        audit: Option<&AuditEntry>,
    ) -> Result<Vec<Option<Claim>>> {
        let write = Write::CreateClaimed {
            runs: runs.to_vec(),
            owner: owner.to_owned(),
            now_ms,
            lease_until_ms,
            audit: audit.cloned(),
        };
        match self.batch(write).await? {
            Written::Claims(claims) => Ok(claims),
            other => Err(other.unexpected()),
        }
    }

    /// Takes the lease on run `id` for `owner` until `lease_until_ms`, if the run is pending or
    /// its lease ran out before `now_ms`. Every claim bumps the run's fence.
    pub async fn claim_run(
        &self,
        id: i64,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<Option<Claim>> {
        let write = Write::Claim { id, owner: owner.to_owned(), now_ms, lease_until_ms };
        match self.batch(write).await? {
            Written::Claim(claim) => Ok(claim),
            other => Err(other.unexpected()),
        }
    }

    /// Extends `owner`'s lease on run `id` to `lease_until_ms`. False when the lease moved on
    /// (another dispatcher claimed the run) or the run left `dispatching`.
    pub async fn renew_lease(
        &self,
        id: i64,
        owner: &str,
        fence: i64,
        lease_until_ms: i64,
    ) -> Result<bool> {
        let write = Write::Renew { id, owner: owner.to_owned(), fence, lease_until_ms };
        match self.batch(write).await? {
            Written::Done(done) => Ok(done),
            other => Err(other.unexpected()),
        }
    }

    /// Records the executor `owner` is about to send run `id` to, before it sends, so that a
    /// dispatcher taking over after a crash sends it to the same executor. False when the lease
    /// moved on.
    pub async fn set_run_target(
        &self,
        id: i64,
        owner: &str,
        fence: i64,
        address: &str,
    ) -> Result<bool> {
        let write =
            Write::Target { id, owner: owner.to_owned(), fence, address: address.to_owned() };
        match self.batch(write).await? {
            Written::Done(done) => Ok(done),
            other => Err(other.unexpected()),
        }
    }

    /// Applies `transition` to run `id` and creates `follow_ups` (its retry or child runs), in
    /// one transaction: [`apply_to`](Self::apply_to) the run as read now. `None` also when
    /// there is no run `id`.
    pub async fn apply_transition(
        &self,
        id: i64,
        transition: &Transition,
        lease: Option<(&str, i64)>,
        fuel_used: Option<i64>,
        follow_ups: &[NewRun],
        now_ms: i64,
    ) -> Result<Option<(RunRecord, Vec<i64>)>> {
        let Some(run) = self.get_run(id).await? else { return Ok(None) };
        self.apply_to(run, transition, lease, fuel_used, follow_ups, now_ms).await
    }

    /// Applies `transition` to `run` and creates `follow_ups` (its retry or child runs), in one
    /// transaction. The run must still be in `transition.from` and, with `lease`, still be held
    /// by that owner and fence; `run` may be older in its other columns, of which the write
    /// reads back those that change. Returns the updated run and the new runs' ids, or `None`
    /// (and changes nothing) when the compare failed.
    pub async fn apply_to(
        &self,
        run: RunRecord,
        transition: &Transition,
        lease: Option<(&str, i64)>,
        fuel_used: Option<i64>,
        follow_ups: &[NewRun],
        now_ms: i64,
    ) -> Result<Option<(RunRecord, Vec<i64>)>> {
        let write = Write::Apply {
            run: Box::new(run),
            transition: transition.clone(),
            lease: lease.map(|(owner, fence)| (owner.to_owned(), fence)),
            fuel_used,
            follow_ups: follow_ups.to_vec(),
            now_ms,
        };
        match self.batch(write).await? {
            Written::Applied(applied) => Ok(applied),
            other => Err(other.unexpected()),
        }
    }

    /// Appends `entry` at `now_ms`, committed with the lifecycle's other writes (see `batch`).
    pub async fn record_audit(&self, entry: &AuditEntry, now_ms: i64) -> Result<()> {
        match self.batch(Write::Audit { entry: entry.clone(), now_ms }).await? {
            Written::Done(_) => Ok(()),
            other => Err(other.unexpected()),
        }
    }
}
