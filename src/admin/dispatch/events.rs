//! Lifecycle events applied to runs: the executor's results, kills, reconciliation with what an
//! executor holds, and the consequences each transition implies.
//!
//! [`Dispatcher::apply`] reads the run and its job, asks `lifecycle::transition` what the event
//! means, plans the follow-up runs (the retry, the child jobs' runs) and has storage commit the
//! transition and the follow-ups together, compare-and-set on the state the run was read in.
//! Only after that commit are the follow-ups sent and kills delivered, so a crash in between
//! leaves pending runs for the sweep, never a transition without its consequences.

use std::sync::Arc;

use super::{Dispatcher, Peer, PeerKind, PlannedTrigger, now_ms};
use crate::lifecycle::retry::{RetryPolicy, retry_due_ms};
use crate::lifecycle::{self, Event, JobFacts, RunFacts, Transition};
use crate::model::{Job, MAX_CHILD_JOBS, RunRecord, RunState, ScheduleType, TriggerType};
use crate::protocol::JobIdParam;
use crate::schedule::Schedule;
use crate::storage::NewRun;

/// `Killed::scope` of a kill that stops the one run.
pub const KILLS_RUN: &str = "run";
/// `Killed::scope` of a kill that stops the job's whole queue on an XXL-JOB executor.
pub const KILLS_JOB_QUEUE: &str = "job_queue";
/// `Killed::scope` of a kill sent to an executor whose kind this admin does not know.
pub const KILLS_RUN_OR_JOB_QUEUE: &str = "run_or_job_queue";

/// What a kill did, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    /// A sentence.
    pub message: String,
    /// What it stops: [`KILLS_RUN`], [`KILLS_JOB_QUEUE`] or [`KILLS_RUN_OR_JOB_QUEUE`].
    pub scope: &'static str,
}

/// How many times an event is tried again when the run changed between reading and writing it.
const RACE_RETRIES: usize = 5;
/// A run an executor accepted less than this long before it beat may be missing from the held
/// runs it reported (the beat's snapshot and the acceptance crossed): it is judged next time.
pub const RECONCILE_GRACE_MS: i64 = 10_000;

impl Dispatcher {
    /// Applies `event` to run `run_id`: returns the run after the transition, or `None` when
    /// the event did not apply (the run ended already, the event is illegal in its state, or
    /// the lease `lease` moved on). Follow-up runs are created with it and sent after.
    pub async fn apply(
        &self,
        run_id: i64,
        event: Event,
        lease: Option<(&str, i64)>,
        fuel_used: Option<i64>,
    ) -> anyhow::Result<Option<RunRecord>> {
        self.apply_to(run_id, None, None, event, lease, fuel_used).await
    }

    /// [`Dispatcher::apply`] with the run as the caller just read it (the first compare uses it;
    /// if the run changed since, it is read afresh) and its job.
    pub(super) async fn apply_to(
        &self,
        run_id: i64,
        mut known_run: Option<RunRecord>,
        mut known_job: Option<Option<Arc<Job>>>,
        event: Event,
        lease: Option<(&str, i64)>,
        fuel_used: Option<i64>,
    ) -> anyhow::Result<Option<RunRecord>> {
        let db = &self.inner.db;
        for _ in 0..RACE_RETRIES {
            let run = match known_run.take() {
                Some(run) => run,
                None => match db.get_run(run_id).await? {
                    Some(run) => run,
                    None => return Ok(None),
                },
            };
            let job = match known_job.take() {
                Some(job) => job,
                None => self.inner.cache.job(run.job_id).await?,
            };
            let facts = RunFacts::of(&run);
            let job_facts = job.as_ref().map(|job| JobFacts {
                retry_count: job.spec.retry_count,
                has_children: !job.spec.child_job_ids.is_empty(),
                fix_delay_ms: fix_delay_ms(job),
            });
            let transition = match lifecycle::transition(&facts, job_facts.as_ref(), &event) {
                Ok(transition) => transition,
                Err(illegal) => {
                    tracing::debug!(job.id = run.job_id, "run {run_id}: {illegal}");
                    return Ok(None);
                }
            };
            let follow_ups = self.follow_ups(&run, job.as_deref(), &transition).await?;
            let now = now_ms();
            let applied = db.apply_to(run, &transition, lease, fuel_used, &follow_ups, now).await?;
            // The run changed since it was read (a kill request, a result, another dispatcher):
            // read it again and judge the event anew.
            let Some((run, ids)) = applied else { continue };
            if transition.to.is_terminal() {
                // An end makes room under the caps of the run's job and group.
                if let Some(job) = job.as_deref()
                    && let Some(group_id) = self.cap_group(job).await?
                {
                    let this = self.clone();
                    tokio::spawn(async move {
                        if let Err(error) = this.release_held(group_id).await {
                            tracing::warn!("releasing held runs of group {group_id}: {error:#}");
                        }
                    });
                }
                crate::metrics::admin().run_ended(run.state.as_str(), fuel_used);
                // Its end was decided on in its workflow run in the same commit: start what
                // that decision started.
                if let Some(node) = run.node {
                    let this = self.clone();
                    tokio::spawn(async move { this.start_nodes(node.workflow_run_id).await });
                }
                // A line per successful run would cost a busy admin more than the run's own
                // writes (the run's record says it all): it is a debug line, the others info.
                macro_rules! ended {
                    ($level:ident) => {
                        tracing::$level!(
                            run.id = run_id,
                            job.id = run.job_id,
                            executor = run.executor_address.as_deref().unwrap_or_default(),
                            run.state = %run.state,
                            "run {run_id} ended {}: {}",
                            run.state,
                            run.handle_msg
                        )
                    };
                }
                if run.state == RunState::Success {
                    ended!(debug);
                } else {
                    ended!(info);
                }
            }
            // The kill goes first, so a lost run's executor is asked to stop it before its
            // retry is sent; the retry does not wait for the kill's answer.
            if transition.send_kill {
                let this = self.clone();
                let run = run.clone();
                tokio::spawn(async move {
                    if run.state == RunState::Lost {
                        this.kill_lost(&run).await;
                    } else if let Err(error) = this.send_kill(&run).await {
                        tracing::warn!(
                            job.id = run.job_id,
                            "run {}: kill not delivered: {error:#}",
                            run.id
                        );
                    }
                });
            }
            for (id, follow_up) in ids.iter().zip(&follow_ups) {
                tracing::info!(
                    job.id = follow_up.job_id,
                    "run {run_id} {}: run {id} of job {} follows",
                    run.state,
                    follow_up.job_id
                );
                self.send_at(*id, follow_up.job_id, follow_up.trigger_time_ms);
            }
            return Ok(Some(run));
        }
        if lease.is_some() {
            // A lease that moved on fails every compare: the new holder records the outcome.
            return Ok(None);
        }
        anyhow::bail!("run {run_id} kept changing while applying {}", event.name())
    }

    /// The runs `transition` implies for `run`: its retry and the child jobs' runs.
    async fn follow_ups(
        &self,
        run: &RunRecord,
        job: Option<&Job>,
        transition: &Transition,
    ) -> anyhow::Result<Vec<NewRun>> {
        let mut runs = Vec::new();
        let now = now_ms();
        if transition.retry {
            // The retry is due after the job's retry interval; without a job (deleted) there
            // is no retry.
            let policy = job.map_or(RetryPolicy::IMMEDIATE, |job| RetryPolicy {
                interval_secs: job.spec.retry_interval_secs,
                backoff: job.spec.retry_backoff,
                max_interval_secs: job.spec.retry_max_interval_secs,
            });
            let attempt = run.attempt + 1;
            let due_ms = retry_due_ms(now, policy, attempt, rand::random::<f64>());
            runs.push(NewRun {
                job_id: run.job_id,
                trigger_type: TriggerType::Retry,
                trigger_time_ms: due_ms,
                // A retry belongs to its run's fire: unique with it per attempt, and a
                // `FIX_DELAY` job waits for it before it fires again.
                fire_time_ms: run.fire_time_ms,
                param: run.param.clone(),
                // A shard retries on its own executor, with its own items alone; a routed run
                // is routed again.
                executor_address: (run.shard_total > 1 || !run.sharding_items.is_empty())
                    .then(|| run.executor_address.clone())
                    .flatten(),
                shard_index: run.shard_index,
                shard_total: run.shard_total,
                sharding_items: run.sharding_items.clone(),
                attempt,
                version: run.version.zip(run.sha256.clone()),
                parent_run_id: Some(run.id),
                // A retry of a workflow node's run does the same node's work.
                node: run.node,
            });
        }
        if let (true, Some(job)) = (transition.children, job) {
            // The API refuses duplicates and more than `MAX_CHILD_JOBS`; a row written before
            // it did still creates no more.
            let mut seen = foldhash::HashSet::default();
            let children = job.spec.child_job_ids.iter().filter(|id| seen.insert(**id));
            for child_id in children.take(MAX_CHILD_JOBS) {
                let Some(child) = self.inner.db.get_job(*child_id).await? else {
                    tracing::warn!(job.id = job.id, "child job {child_id} does not exist");
                    continue;
                };
                let trigger = PlannedTrigger {
                    trigger_type: TriggerType::Parent,
                    at_ms: now,
                    fire_time_ms: None,
                    param: child.spec.param.clone(),
                };
                match self.plan_runs(&child, trigger, None).await {
                    Ok(planned) => runs.extend(planned.into_iter().map(|mut planned| {
                        planned.parent_run_id = Some(run.id);
                        planned
                    })),
                    Err(error) => {
                        tracing::warn!(
                            job.id = job.id,
                            "child job {child_id} not triggered: {error}"
                        )
                    }
                }
            }
        }
        Ok(runs)
    }

    /// Kills run `run`: a pending run ends here, a run being sent is stopped once its executor
    /// has it, a running run is stopped by its executor. Returns what happened, for the operator.
    ///
    /// A wasmjob executor stops the one run (the kill names its `logId`). An XXL-JOB executor's
    /// `/kill` takes only `jobId` and stops the job's thread: the running run and every run of
    /// that job queued behind it (each reported failed by the executor). The kill still goes, as
    /// XXL-JOB's own admin sends it, and the answer says so plainly.
    pub async fn kill(&self, run: &RunRecord) -> anyhow::Result<Killed> {
        let run_only = |message: &str| Killed { message: message.to_owned(), scope: KILLS_RUN };
        if run.state.is_terminal() {
            return Ok(run_only("the run has ended already"));
        }
        let Some(after) = self.apply(run.id, Event::Kill, None, None).await? else {
            return Ok(run_only("the run has ended already"));
        };
        // A send accepted but not recorded yet is recorded now, and the kill goes with it.
        self.record_send_now(run.id);
        Ok(match (run.state, after.state, &after.executor_address) {
            (_, RunState::Killed, _) => run_only("killed before it was sent"),
            (RunState::Dispatching, _, address) => {
                let sent = "kill requested: the run is being sent and is stopped as soon as its \
                     executor has it";
                match address {
                    Some(address) => kill_scope(sent, run.job_id, self.peer(address).await),
                    None => run_only(sent),
                }
            }
            (_, _, Some(address)) => {
                let sent = format!("kill sent to {address}");
                kill_scope(&sent, run.job_id, self.peer(address).await)
            }
            (_, _, None) => run_only("kill requested"),
        })
    }

    /// Asks the executor of `run` to stop it (our executors stop that run only, XXL-JOB executors
    /// the job's whole queue).
    pub(super) async fn send_kill(&self, run: &RunRecord) -> anyhow::Result<()> {
        let Some(address) = &run.executor_address else { return Ok(()) };
        let param = JobIdParam { job_id: run.job_id, log_id: Some(run.id) };
        let peer = self.peer(address).await;
        let app_name = peer.as_ref().and_then(|peer| peer.app_name_header());
        self.inner.client.call_as::<_, String>(address, "kill", &param, app_name).await?;
        Ok(())
    }

    /// Asks the executor a lost run was sent to, if any, to stop it, at best: the run may still
    /// be held there (a send whose answer was lost, an executor cut off from this admin), and
    /// its retry is on its way. Only a wasmjob executor is asked, whose kill names the run: an
    /// XXL-JOB executor's kill stops the job's whole queue, the other runs of the job (the
    /// retry among them) included. A failure is expected (the executor is often gone) and
    /// logged only.
    async fn kill_lost(&self, run: &RunRecord) {
        let Some(address) = &run.executor_address else { return };
        let peer = self.peer(address).await;
        if !peer.is_some_and(|peer| peer.kind == PeerKind::Wasmjob) {
            tracing::debug!(
                job.id = run.job_id,
                "lost run {}: no kill sent to {address}, whose kill would stop the job's queue",
                run.id
            );
            return;
        }
        match self.send_kill(run).await {
            Ok(()) => tracing::info!(
                job.id = run.job_id,
                "lost run {}: asked {address} to stop it, should it hold it",
                run.id
            ),
            Err(error) => tracing::info!(
                job.id = run.job_id,
                "lost run {}: kill not delivered to {address}: {error:#}",
                run.id
            ),
        }
    }

    /// Reconciles what executor `address` says it holds with what this admin believes runs
    /// there: a run it does not hold, accepted long enough before this beat, is lost.
    pub async fn reconcile(&self, address: &str, held: &[i64]) -> anyhow::Result<usize> {
        let now = now_ms();
        let believed =
            self.inner.db.running_run_ids_on(address, now - RECONCILE_GRACE_MS, 10_000).await?;
        let held: foldhash::HashSet<i64> = held.iter().copied().collect();
        let mut lost = 0;
        for run_id in believed.into_iter().filter(|run_id| !held.contains(run_id)) {
            let reason = format!("lost: its executor {address} no longer holds it");
            match self.apply(run_id, Event::Lost { reason }, None, None).await {
                Ok(Some(_)) => lost += 1,
                Ok(None) => {}
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "reconciling run {run_id} failed")
                }
            }
        }
        Ok(lost)
    }
}

/// What a kill sent to `address` (now, or once the run being sent reaches it) does, by what
/// answers there: `sent` and then why.
fn kill_scope(sent: &str, job_id: i64, peer: Option<Peer>) -> Killed {
    let (what, scope) = match peer.map(|peer| peer.kind) {
        Some(PeerKind::Wasmjob) => ("it stops this run only".to_owned(), KILLS_RUN),
        Some(PeerKind::XxlJob(_)) => (
            format!(
                "it is an XXL-JOB executor, whose kill takes only the job: it stops job \
                 {job_id}'s whole queue, this run and every run of job {job_id} waiting \
                 behind it there"
            ),
            KILLS_JOB_QUEUE,
        ),
        None => (
            format!(
                "its kind is not known (its registration does not say it): a wasmjob executor \
                 stops this run only, an XXL-JOB executor stops job {job_id}'s whole queue"
            ),
            KILLS_RUN_OR_JOB_QUEUE,
        ),
    };
    Killed { message: format!("{sent}; {what}"), scope }
}

/// The delay of `job` if it is a `FIX_DELAY` job whose schedule reads.
fn fix_delay_ms(job: &Job) -> Option<i64> {
    if job.spec.schedule_type != ScheduleType::FixDelay {
        return None;
    }
    Schedule::parse(job.spec.schedule_type, &job.spec.schedule_conf, job.spec.time_zone.as_deref())
        .ok()
        .and_then(|schedule| schedule.fix_delay_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Generation;

    #[test]
    fn a_kill_says_what_it_stops() {
        let peer = |kind| Some(Peer { kind, app_name: "app".into(), holds_triggers: false });
        let rows = [
            peer(PeerKind::Wasmjob),
            peer(PeerKind::XxlJob(Generation::Classic)),
            peer(PeerKind::XxlJob(Generation::V3_5)),
            None,
        ];
        let out: Vec<String> = rows
            .into_iter()
            .map(|peer| {
                let killed = kill_scope("kill sent to http://e:9999", 7, peer);
                format!("{}: {}", killed.scope, killed.message)
            })
            .collect();
        expect_test::expect![[r#"
            [
                "run: kill sent to http://e:9999; it stops this run only",
                "job_queue: kill sent to http://e:9999; it is an XXL-JOB executor, whose kill takes only the job: it stops job 7's whole queue, this run and every run of job 7 waiting behind it there",
                "job_queue: kill sent to http://e:9999; it is an XXL-JOB executor, whose kill takes only the job: it stops job 7's whole queue, this run and every run of job 7 waiting behind it there",
                "run_or_job_queue: kill sent to http://e:9999; its kind is not known (its registration does not say it): a wasmjob executor stops this run only, an XXL-JOB executor stops job 7's whole queue",
            ]
        "#]].assert_debug_eq(&out);
    }
}
