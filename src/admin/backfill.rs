//! The backfill driver: releases the runs of running backfills, a few instants at a time, in
//! time order, under a lease on each backfill.
//!
//! Each pass, the admin takes or renews the lease of the running backfills no other live admin
//! holds (`Db::claim_backfills`), and for each asks `backfill::release_count` how many instants
//! it may release: as many as keep the backfill's unfinished runs within its `max_concurrent`,
//! and the admin's within the three quarters of `--max-unfinished-runs` left to backfills
//! (`Admission::room_for_backfills`), so scheduled fires keep a quarter of the bound. The next
//! instants after the backfill's cursor are planned as a trigger of the job is (one run, or
//! one per shard) with trigger type `BACKFILL` and the instant as trigger time, and released
//! by `Db::release_backfill`, which moves the cursor by compare-and-set in the transaction
//! that creates the runs; the runs are then sent as a manual trigger's are. A backfill whose
//! instants are all released ends `done` once its last run ended.
//!
//! Nothing is released while no executor of the job's group is online: those runs would only
//! fail. A backfill runs whether its job is started or stopped: like a manual trigger, it is an
//! operator's explicit request, and `lifecycle::before_send` skips only scheduled runs of a
//! stopped job. A backfill whose job is deleted is cancelled; one whose job has no version to
//! run, or was changed to `FIX_DELAY` or `NONE`, is paused with the reason.
//!
//! It does not kill runs: pausing or cancelling a backfill stops its releases, and the runs
//! released before finish (kill them as any run). A failed run's retries follow the job's
//! `retry_count` as ordinary `RETRY` runs; the backfill counts the instant by its first run.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::dispatch::{PlannedTrigger, TriggerError};
use super::{AppState, now_ms};
use crate::backfill::{Backfill, BackfillState, Instants, ReleaseFacts, release_count};
use crate::model::{Job, ScheduleType, TriggerType};
use crate::storage::{Fired, NewRun, Release};

/// How long an admin's lease on a backfill lasts without renewal.
const LEASE_MS: i64 = 15_000;
/// The pause between two passes while backfills run.
const ACTIVE_PAUSE: Duration = Duration::from_millis(50);
/// The pause between two passes while this admin drives none. A backfill created or resumed
/// through this admin wakes it at once; through another admin, it is found within this pause
/// (the other admin takes it at once). Each pass reads the database, so an idle admin does not
/// ask twice a second.
const IDLE_PAUSE: Duration = Duration::from_secs(5);
/// The most backfills one admin drives at once.
const MAX_HELD: i64 = 100;

/// Drives the running backfills until `shutdown`, then gives up their leases.
pub(super) async fn run(state: AppState, shutdown: CancellationToken) {
    loop {
        let busy = match pass(&state).await {
            Ok(busy) => busy,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "a backfill pass failed");
                false
            }
        };
        let pause = if busy { ACTIVE_PAUSE } else { IDLE_PAUSE };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = state.backfill_wake.notified() => {}
            () = shutdown.cancelled() => break,
        }
    }
    // Another admin, or this one started again, takes the backfills at once.
    if let Err(error) = state.db.release_backfill_leases(state.dispatcher.owner()).await {
        tracing::warn!(%error, "giving up the leases of backfills failed: they run out in 15 s");
    }
}

/// One pass over the backfills this admin holds; whether it holds any.
async fn pass(state: &AppState) -> anyhow::Result<bool> {
    if !state.db.running_backfills_exist().await? {
        return Ok(false);
    }
    let now = now_ms();
    let owner = state.dispatcher.owner();
    let held = state.db.claim_backfills(owner, now, now + LEASE_MS, MAX_HELD).await?;
    for backfill in &held {
        if let Err(error) = drive(state, backfill).await {
            tracing::error!(
                backfill.id = backfill.id,
                job.id = backfill.job_id,
                error = format!("{error:#}"),
                "driving backfill {} of job {} failed",
                backfill.id,
                backfill.job_id
            );
        }
    }
    Ok(!held.is_empty())
}

/// Releases what `backfill` may release now, or ends it.
async fn drive(state: &AppState, backfill: &Backfill) -> anyhow::Result<()> {
    let owner = state.dispatcher.owner();
    let Some(job) = state.cache.job(backfill.job_id).await? else {
        stop(state, backfill, BackfillState::Cancelled, "its job was deleted").await?;
        return Ok(());
    };
    // The backfill walks the schedule it was created with, but its runs are the job's: a run
    // with a fire time of a job turned `FIX_DELAY` would set that job's next fire when it ends.
    if matches!(job.spec.schedule_type, ScheduleType::FixDelay | ScheduleType::None) {
        let reason = format!("the job's schedule is {} now", job.spec.schedule_type);
        stop(state, backfill, BackfillState::Paused, &reason).await?;
        return Ok(());
    }
    let unfinished = state.db.unfinished_backfill_runs(backfill.id, job.id).await?;
    if backfill.released >= backfill.total {
        if unfinished == 0 && state.db.finish_backfill(backfill.id, owner, now_ms()).await? {
            tracing::info!(
                backfill.id = backfill.id,
                job.id = job.id,
                "backfill {} of job {} is done",
                backfill.id,
                job.id
            );
        }
        return Ok(());
    }
    // A run released while no executor of the job's group is online fails at once (a fire
    // cannot wait for one; a backfill can). So a backfill waits for one, and an admin whose
    // executors are stopping or gone leaves its instants for later instead of failing them.
    let Some(group) = state.cache.group(job.spec.group_id).await? else {
        stop(state, backfill, BackfillState::Paused, "the job's group is gone").await?;
        return Ok(());
    };
    if state.cache.online_addresses(&group, now_ms()).await?.is_empty() {
        return Ok(());
    }
    // The job's calendar as it is now: an instant it excludes is passed over.
    let calendar = match job.spec.calendar.as_deref() {
        Some(name) => state.cache.calendar(name).await?,
        None => None,
    };
    let instants = match Instants::new(&backfill.window) {
        Ok(instants) => instants.except(calendar),
        Err(error) => {
            stop(state, backfill, BackfillState::Cancelled, &error.to_string()).await?;
            return Ok(());
        }
    };
    let Some(first) = instants.next_n(backfill.cursor_ms, backfill.to_ms, 1).pop() else {
        // Fewer instants than counted at creation (a time zone's rules changed since): the
        // window is over.
        return Ok(());
    };
    let Some(first_runs) = plan(state, backfill, &job, first).await? else { return Ok(()) };
    let room = state.admission.room_for_backfills().await?;
    let count = release_count(&ReleaseFacts {
        max_concurrent: backfill.max_concurrent,
        unfinished,
        runs_per_instant: first_runs.len() as i64,
        room,
    });
    if count == 0 {
        return Ok(());
    }
    let mut planned = vec![(first, first_runs)];
    for instant in instants.next_n(first, backfill.to_ms, count - 1) {
        let Some(runs) = plan(state, backfill, &job, instant).await? else { return Ok(()) };
        planned.push((instant, runs));
    }
    release(state, backfill, &job, planned).await
}

/// Creates the runs of `planned` (claimed when they route without probing) and sends them.
async fn release(
    state: &AppState,
    backfill: &Backfill,
    job: &Job,
    mut planned: Vec<(i64, Vec<NewRun>)>,
) -> anyhow::Result<()> {
    let now = now_ms();
    let mut claim_until_ms = None;
    for (_, runs) in &mut planned {
        claim_until_ms = state.dispatcher.preroute(job, runs, now).await.map(|(_, until)| until);
        if claim_until_ms.is_none() {
            break;
        }
    }
    let release = Release {
        backfill_id: backfill.id,
        owner: state.dispatcher.owner(),
        cursor_ms: backfill.cursor_ms,
        instants: &planned,
        claim_until_ms,
        now_ms: now,
    };
    let Some(created) = state.db.release_backfill(&release).await? else {
        // Paused, cancelled or taken over since the pass began: nothing was created.
        return Ok(());
    };
    state.admission.count_created_runs(created.len() as u64);
    tracing::debug!(
        backfill.id = backfill.id,
        job.id = job.id,
        "backfill {} released {} instants, {} runs",
        backfill.id,
        planned.len(),
        created.len()
    );
    for claim in created {
        let run_id = claim.run.id;
        if claim_until_ms.is_some() {
            state.dispatcher.send_created_at(Fired::Claimed(Box::new(claim)), now);
        } else {
            state.dispatcher.send_at(run_id, claim.run.job_id, now);
        }
    }
    Ok(())
}

/// The runs of `job` for `instant`, or `None` when the backfill cannot go on (it is paused
/// then, with the reason).
async fn plan(
    state: &AppState,
    backfill: &Backfill,
    job: &Job,
    instant: i64,
) -> anyhow::Result<Option<Vec<NewRun>>> {
    let trigger = PlannedTrigger {
        trigger_type: TriggerType::Backfill,
        at_ms: instant,
        // Without rerun, the instant is the runs' fire key: one run per instant, whoever
        // creates it (`storage::backfills`).
        fire_time_ms: (!backfill.rerun).then_some(instant),
        param: job.spec.param.clone(),
    };
    match state.dispatcher.plan_runs(job, trigger, None).await {
        Ok(runs) => Ok(Some(runs)),
        Err(error @ (TriggerError::NoVersion(_) | TriggerError::NoGroup(_))) => {
            stop(state, backfill, BackfillState::Paused, &error.to_string()).await?;
            Ok(None)
        }
        Err(error) => Err(anyhow::Error::new(error))
            .with_context(|| format!("planning backfill {} at {instant}", backfill.id)),
    }
}

/// Moves a running backfill to `to` for `reason`, and says so.
async fn stop(
    state: &AppState,
    backfill: &Backfill,
    to: BackfillState,
    reason: &str,
) -> anyhow::Result<()> {
    let running = [BackfillState::Running];
    if state.db.set_backfill_state(backfill.id, &running, to, reason, now_ms()).await?.is_some() {
        tracing::warn!(
            backfill.id = backfill.id,
            job.id = backfill.job_id,
            "backfill {} of job {} is {to}: {reason}",
            backfill.id,
            backfill.job_id
        );
    }
    Ok(())
}
