//! The scheduler loop: fires due jobs at their scheduled millisecond, never twice, never lost.
//!
//! Each pass reads the running jobs due within [`LOOKAHEAD_MS`], asks `schedule::decide` what to
//! do with each (fire on time, misfire, skip), and commits every job's next fire time together
//! with its fire's run records in one transaction (`Db::fire_jobs`; one transaction per job if
//! the batch fails). Only then is each run handed to the dispatcher, which sends it at its
//! scheduled instant, or a little before it to an executor that holds it until then
//! (`Dispatcher::send_created_at`). A crash after the commit leaves pending
//! runs that the dispatcher's sweep sends; a crash before it leaves the job due, to fire again.
//! Two admins racing for the same fire cannot both create it: `fire_job` moves the job only from
//! the fire time it read, and runs are unique per (job, fire time, shard, attempt).
//!
//! A job that names a business calendar is decided by `schedule::calendar::decide`: an instant
//! the calendar excludes commits the job's next allowed fire and no run, and is not a misfire.
//!
//! A `FIX_DELAY` job's fire leaves it running without a next fire time; the transaction that
//! ends the fire's last run sets it (`lifecycle`), and the next pass, within a second, sees it.
//!
//! A pass reads of each due job its due instant and its stamp (`DueJob`: the revision that every
//! change to the job bumps, and its change time); the job itself comes from the dispatcher's
//! copy of it, as for its sends and manual triggers, when that copy has the same stamp. A copy
//! with another stamp (the job was changed through another admin since) is not used: the job is
//! read again whole, so every change reaches the next pass.
//!
//! Workflows with a schedule fire in a loop of their own ([`run_workflows`]), the same way.
//!
//! An admin fires only the jobs and workflows of the partitions it holds (`admin::partitions`),
//! and a fire commits only while its partition's lease is still the one the pass read: admins
//! that share a database share the schedule instead of racing for it.
//!
//! Each completed pass is recorded in `AppState::scheduler_pulse`, which `/readyz` reads.
//!
//! Between passes the loop sleeps until the earliest next fire (at most [`MAX_SLEEP`]), or until
//! woken by a job change. While the bound on unfinished runs is reached (`admission`), a pass
//! fires only the due jobs with no run in flight, and looks again after [`HELD_FOR_MS`].

use foldhash::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::admission::AdmitError;
use super::dispatch::PlannedTrigger;
use super::{AppState, now_ms};
use crate::model::DEFAULT_MISFIRE_THRESHOLD_MS;
use crate::model::Job;
use crate::model::ScheduleType;
use crate::schedule::calendar::{self, CalendarDecision};
use crate::schedule::{FireDecision, NextFire, Schedule, ScheduleError, decide};
use crate::storage::{DueJob, Fire};

/// How far ahead of its instant a fire is committed, so that sending can start on time. A
/// tenth past the second: the pass that commits the next fires of the jobs firing every second
/// then comes before the sends of their fires of this second, and the copies of the jobs it
/// confirms by their stamps (`Cache::confirmed_job`) are fresh for those sends and their
/// results, instead of each send finding its job's copy a second old and reading its stamp.
pub const LOOKAHEAD_MS: i64 = 1_100;
/// The longest the loop sleeps without looking.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Jobs handled per pass.
const BATCH: i64 = 1_000;
/// How long a pass held at the bound on unfinished runs waits before it looks again.
const HELD_FOR_MS: i64 = 100;

/// Runs the loop until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let mut schedules = Schedules::default();
    loop {
        let next = match pass(&state, &mut schedules).await {
            Ok(next) => {
                state.scheduler_pulse.beat(now_ms());
                next
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "scheduler pass failed");
                state.scheduler_pulse.clear();
                None
            }
        };
        let sleep = match next {
            Some(at) => {
                Duration::from_millis(u64::try_from(at - LOOKAHEAD_MS - now_ms()).unwrap_or(0))
                    .min(MAX_SLEEP)
            }
            None => MAX_SLEEP,
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = state.scheduler_wake.notified() => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Fires workflows on their schedules until `shutdown`, as [`run`] fires jobs: each due
/// workflow's next fire moves by compare-and-set in the transaction that creates its run
/// (`Db::fire_workflow`), so two admins fire it once, and a crash before the commit leaves it
/// due. The loop looks at least every [`MAX_SLEEP`].
pub async fn run_workflows(state: AppState, shutdown: CancellationToken) {
    loop {
        let next = match workflow_pass(&state).await {
            Ok(next) => next,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "workflow scheduler pass failed");
                None
            }
        };
        let sleep = next.map_or(MAX_SLEEP, |at| {
            Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)).min(MAX_SLEEP)
        });
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Fires every due workflow once; returns the earliest next fire.
async fn workflow_pass(state: &AppState) -> anyhow::Result<Option<i64>> {
    let now = now_ms();
    let held = state.dispatcher.partitions().held();
    for workflow in state.db.due_workflows(now, BATCH, &held).await? {
        let schedule = &workflow.schedule;
        let parsed = Schedule::parse(
            schedule.schedule_type,
            &schedule.schedule_conf,
            schedule.time_zone.as_deref(),
        );
        // The API checked it; should a stored one not read, the workflow stops.
        let decision = match parsed {
            Ok(parsed) => decide(
                &parsed,
                schedule.misfire_strategy,
                DEFAULT_MISFIRE_THRESHOLD_MS,
                workflow.next_fire_ms,
                now,
            ),
            Err(error) => {
                tracing::warn!(workflow.id = workflow.id, "workflow {}: {error}", workflow.id);
                FireDecision { fire: None, next: NextFire::Never }
            }
        };
        let next = decision.next.at().unwrap_or(0);
        match state.db.fire_workflow(&workflow, next, decision.fire, now, &held).await? {
            Some(Some(run_id)) => {
                crate::metrics::admin().workflow_runs_started.inc();
                tracing::info!(
                    workflow.id = workflow.id,
                    "workflow {} fired: run {run_id}",
                    workflow.id
                );
                state.dispatcher.start_nodes(run_id).await;
            }
            Some(None) if decision.fire.is_none() && next > 0 => {
                crate::metrics::admin().misfires.inc();
            }
            Some(None) | None => {}
        }
    }
    Ok(state.db.next_workflow_fire(&held).await?)
}

/// Fires every due job once, in one transaction; returns the earliest next fire.
async fn pass(state: &AppState, schedules: &mut Schedules) -> anyhow::Result<Option<i64>> {
    let now = now_ms();
    let lease = state.dispatcher.partitions().held();
    let mut due = state.db.due_jobs(now + LOOKAHEAD_MS, BATCH, &lease).await?;
    if due.is_empty() {
        return Ok(state.db.earliest_fire(&lease).await?);
    }
    // Past the bound, only the due jobs with no run in flight fire (`admission`); the others
    // stay due, and are not read, so that however many they are they hold back no other job.
    let held = match state.admission.admit(due.len() as u64).await {
        Ok(()) => false,
        Err(AdmitError::Overloaded(overloaded)) => {
            crate::metrics::admin().admission_refused("schedule");
            due =
                state.db.due_jobs_without_runs_in_flight(now + LOOKAHEAD_MS, BATCH, &lease).await?;
            if overloaded.newly {
                tracing::warn!("holding the fires of the jobs with runs in flight: {overloaded}");
            }
            true
        }
        Err(AdmitError::Internal(error)) => return Err(error.into()),
    };
    let due = resolve(state, due, now).await?;
    let mut fires = Vec::with_capacity(due.len());
    for (row, job) in &due {
        match plan(state, schedules, job, row.next_fire_ms, now).await {
            Ok(Some(fire)) => fires.push(fire),
            Ok(None) => {}
            Err(error) => tracing::error!(
                job.id = job.id,
                error = format!("{error:#}"),
                "firing job {} failed",
                job.id
            ),
        }
    }
    let (planned, fire_at): (Vec<Fire>, Vec<i64>) = fires.into_iter().unzip();
    if planned.is_empty() && held {
        return Ok(Some(now + LOOKAHEAD_MS + HELD_FOR_MS));
    }
    let committed = match state.db.fire_jobs(&planned, now, Some(&lease)).await {
        Ok(ids) => ids,
        Err(error) => {
            // One bad fire must not hold back the others: fall back to one transaction each.
            tracing::warn!(%error, "firing {} jobs together failed: firing them one by one", planned.len());
            let mut ids = Vec::with_capacity(planned.len());
            for fire in &planned {
                let one = state.db.fire_jobs(std::slice::from_ref(fire), now, Some(&lease)).await;
                ids.push(one.map_or_else(
                    |error| {
                        tracing::error!(job.id = fire.job_id, %error, "firing job {} failed", fire.job_id);
                        Vec::new()
                    },
                    |mut fired| fired.pop().unwrap_or_default(),
                ));
            }
            ids
        }
    };
    crate::metrics::admin()
        .fires
        .inc_by(committed.iter().filter(|ids| !ids.is_empty()).count() as u64);
    if held {
        let runs: usize = committed.iter().map(Vec::len).sum();
        state.admission.count_created_runs(runs as u64);
    }
    if committed.iter().any(|ids| !ids.is_empty()) {
        crate::failpoint::hit("scheduler.after_fire_commit");
    }
    for (fire_at, fired) in fire_at.into_iter().zip(committed) {
        for run in fired {
            state.dispatcher.send_created_at(run, fire_at);
        }
    }
    if held {
        // Jobs held past the bound stay due: look again shortly.
        return Ok(Some(now + LOOKAHEAD_MS + HELD_FOR_MS));
    }
    if due.len() as i64 == BATCH {
        // More jobs are due than one pass takes: go again at once.
        return Ok(Some(now));
    }
    Ok(state.db.earliest_fire(&lease).await?)
}

/// The due jobs `due`, read at or after `read_at` (ms), with the whole of each job: the
/// dispatcher's copy where it has the stamp the row read has, which then counts as read at
/// `read_at` (`Cache::confirmed_job`), else the job read again, all of them with one query
/// (one changed through another admin since the copy was read, or one this admin has no copy
/// of, as after it took partitions over); a stale copy is forgotten. A job deleted since the
/// due read is left out.
async fn resolve(
    state: &AppState,
    due: Vec<DueJob>,
    read_at: i64,
) -> anyhow::Result<Vec<(DueJob, Arc<Job>)>> {
    let mut resolved = Vec::with_capacity(due.len());
    let mut stale = Vec::new();
    for row in due {
        match state.cache.confirmed_job(row.id, read_at, |job| row.matches(job)) {
            Some(job) => resolved.push((row, job)),
            None => stale.push(row),
        }
    }
    if stale.is_empty() {
        return Ok(resolved);
    }
    let ids: Vec<i64> = stale.iter().map(|row| row.id).collect();
    let mut read: HashMap<i64, Job> =
        state.db.get_jobs(&ids).await?.into_iter().map(|job| (job.id, job)).collect();
    for row in stale {
        state.cache.forget_job(row.id);
        if let Some(job) = read.remove(&row.id) {
            resolved.push((row, Arc::new(job)));
        }
    }
    Ok(resolved)
}

/// What firing `job` at its due fire `next_fire_ms` now means: its fire (next fire time and
/// runs) and the instant to send the runs at, or `None` when the job stops because its schedule
/// no longer parses.
async fn plan(
    state: &AppState,
    schedules: &mut Schedules,
    job: &Job,
    next_fire_ms: i64,
    now: i64,
) -> anyhow::Result<Option<(Fire, i64)>> {
    let spec = &job.spec;
    let schedule = match schedules.of(
        job.id,
        spec.schedule_type,
        &spec.schedule_conf,
        &spec.time_zone,
    ) {
        Ok(schedule) => schedule,
        Err(error) => {
            // Schedules are validated on the way in; one that no longer parses (a time zone
            // removed from the database, say) stops its job instead of failing every pass.
            tracing::error!(job.id = job.id, %error, "stopping job {}: its schedule is invalid", job.id);
            state.db.set_job_running(job.id, None, now).await?;
            return Ok(None);
        }
    };
    let (misfire, threshold) = (job.spec.misfire_strategy, job.spec.misfire_threshold_ms);
    let decision = match job.spec.calendar.as_deref() {
        None => decide(schedule, misfire, threshold, next_fire_ms, now),
        Some(name) => {
            let Some(calendar) = state.cache.calendar(name).await? else {
                tracing::error!(
                    job.id = job.id,
                    "stopping job {}: its calendar `{name}` is gone or invalid",
                    job.id
                );
                state.db.set_job_running(job.id, None, now).await?;
                return Ok(None);
            };
            match calendar::decide(&calendar, schedule, misfire, threshold, next_fire_ms, now) {
                CalendarDecision::Decided(decision) => decision,
                CalendarDecision::Excluded { exclusion, next } => {
                    tracing::debug!(
                        job.id = job.id,
                        "job {} not fired at {}: excluded by {} of calendar `{name}`",
                        job.id,
                        next_fire_ms,
                        exclusion.rule
                    );
                    let fire = Fire {
                        job_id: job.id,
                        expected_fire_ms: next_fire_ms,
                        next,
                        runs: Vec::new(),
                        claim: None,
                    };
                    return Ok(Some((fire, now)));
                }
            }
        }
    };
    let fire_at = decision.fire.map_or(now, |(at_ms, _)| at_ms);
    let mut claim = None;
    let runs = match decision.fire {
        Some((at_ms, trigger_type)) => {
            let trigger = PlannedTrigger {
                trigger_type,
                at_ms,
                fire_time_ms: Some(at_ms),
                param: job.spec.param.clone(),
            };
            let mut runs = state.dispatcher.plan_runs(job, trigger, None).await?;
            // Routed now and created claimed, the fire's runs need no write at their instant
            // but the send's outcome (see `Dispatcher::preroute`).
            claim = state.dispatcher.preroute(job, &mut runs, at_ms).await;
            runs
        }
        None => {
            crate::metrics::admin().misfires.inc();
            tracing::info!(job.id = job.id, "job {} misfired at {}: skipped", job.id, next_fire_ms);
            Vec::new()
        }
    };
    if decision.next == NextFire::Never {
        tracing::info!(job.id = job.id, "job {} has no further fire time: stopped", job.id);
    }
    let fire =
        Fire { job_id: job.id, expected_fire_ms: next_fire_ms, next: decision.next, runs, claim };
    Ok(Some((fire, fire_at)))
}

/// The schedules of the jobs the loop fires, each parsed once: parsing a cron expression at
/// every fire was about 1 % of the admin's instructions per fire. A job's entry is parsed again
/// when its schedule changes, and the whole is dropped past [`Schedules::MOST`] entries, so
/// that deleted jobs do not pile up.
#[derive(Default)]
struct Schedules {
    parsed: HashMap<i64, Parsed>,
}

/// A job's schedule, with what it was parsed from.
struct Parsed {
    kind: ScheduleType,
    conf: String,
    time_zone: Option<String>,
    schedule: Schedule,
}

impl Schedules {
    /// The most jobs whose schedules are kept.
    const MOST: usize = 100_000;

    /// Job `job_id`'s schedule (`kind`, `conf`, `time_zone`), parsed now only if it was not, or
    /// changed since.
    fn of(
        &mut self,
        job_id: i64,
        kind: ScheduleType,
        conf: &str,
        time_zone: &Option<String>,
    ) -> Result<&Schedule, ScheduleError> {
        if self.parsed.len() >= Self::MOST && !self.parsed.contains_key(&job_id) {
            self.parsed.clear();
        }
        let parsed = match self.parsed.entry(job_id) {
            Entry::Occupied(entry) if entry.get().is_of(kind, conf, time_zone) => entry.into_mut(),
            entry => {
                let schedule = Schedule::parse(kind, conf, time_zone.as_deref())?;
                let parsed =
                    Parsed { kind, conf: conf.to_owned(), time_zone: time_zone.clone(), schedule };
                entry.insert_entry(parsed).into_mut()
            }
        };
        Ok(&parsed.schedule)
    }
}

impl Parsed {
    /// Whether this was parsed from schedule `kind`, `conf`, `time_zone`.
    fn is_of(&self, kind: ScheduleType, conf: &str, time_zone: &Option<String>) -> bool {
        self.kind == kind && self.conf == conf && self.time_zone == *time_zone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_schedule_is_kept_until_it_changes() {
        let mut schedules = Schedules::default();
        let utc = None;
        let paris = Some("Europe/Paris".to_owned());
        let every_minute = "0 * * * * ?";
        let at_nine = "0 0 9 * * ?";
        // 2026-01-01T00:00:30Z.
        let at = 1_767_225_630_000;
        let next = |schedules: &mut Schedules, job, conf, zone: &Option<String>| {
            let schedule = schedules.of(job, ScheduleType::Cron, conf, zone);
            schedule.map(|schedule| schedule.next_after(at))
        };
        // Each row: job, its schedule now, and its next fire after `at`.
        let rows = [
            (1, every_minute, &utc, Ok(Some(at + 30_000))),
            (2, at_nine, &utc, Ok(Some(at + 9 * 3_600_000 - 30_000))),
            (1, every_minute, &utc, Ok(Some(at + 30_000))),
            // Changed: its conf, then its zone, then back.
            (1, at_nine, &utc, Ok(Some(at + 9 * 3_600_000 - 30_000))),
            (1, at_nine, &paris, Ok(Some(at + 8 * 3_600_000 - 30_000))),
            (1, at_nine, &utc, Ok(Some(at + 9 * 3_600_000 - 30_000))),
            (2, at_nine, &utc, Ok(Some(at + 9 * 3_600_000 - 30_000))),
        ];
        for (job, conf, zone, expected) in rows {
            assert_eq!(
                next(&mut schedules, job, conf, zone),
                expected,
                "job {job}: {conf} {zone:?}"
            );
        }
        // One that no longer parses is an error, not the schedule it had.
        assert!(next(&mut schedules, 2, "0 0 25 * * ?", &utc).is_err());
        assert!(next(&mut schedules, 2, at_nine, &Some("Mars/Olympus".to_owned())).is_err());
        assert_eq!(schedules.parsed.len(), 2);
    }
}
