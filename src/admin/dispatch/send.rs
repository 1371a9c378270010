//! Sending a run under its lease: the timer that sends it at its instant (ahead of it to
//! executors that hold early triggers), the claim, the decision before the send
//! (`lifecycle::before_send`), routing and recording the executor, posting `/run` while the
//! lease is renewed, and the handshake with the result: an accepted send is recorded with the
//! run's result when that comes within [`SENT_RECORD_WAIT`], in one write.

use foldhash::{HashMap, HashMapExt};
use std::time::Duration;

use anyhow::Context;
use tracing::Instrument;

use super::sender::PostError;
use super::{Dispatcher, LEASE_MS, PeerKind, now_ms};
use crate::failpoint;
use crate::lifecycle::{self, Event, JobNow, SendFacts};
use crate::model::{GlueType, Job, RunRecord, TriggerType};
use crate::protocol::{
    GLUE_WASM, NodeOutputParam, ShardOutputParam, ShardingItemParam, TriggerParam,
    WORKFLOW_INPUTS_LINE, run_reply,
};
use crate::schedule::Schedule;
use crate::storage::{Claim, Fired, NodeInput};

/// How often a dispatcher renews the lease of a run it is sending.
const LEASE_RENEWAL: Duration = Duration::from_millis(5_000);
/// How long before its instant a scheduled run is sent to an executor that holds early triggers
/// (within the scheduler's lookahead, which creates the run before this).
const SEND_AHEAD_MS: i64 = 500;
/// How long past a job's timeout the admin waits for a run's result before it ends the run.
pub const RESULT_GRACE_MS: i64 = 60_000;
/// How long the record of a send an executor accepted waits for the run's result: a run that
/// ends within it gets one write saying both (its result, with the acceptance), not two.
const SENT_RECORD_WAIT: Duration = Duration::from_millis(1_000);

/// A send posted to an executor, or accepted by it, that its dispatcher has not recorded yet.
pub(super) struct Unrecorded {
    /// The executor.
    address: String,
    /// When it accepted the run (ms); `None` while the post waits for its answer.
    pub(super) at_ms: Option<i64>,
    /// Wakes the dispatcher to record it now.
    wake: Option<tokio::sync::oneshot::Sender<()>>,
    /// A kill asked for it to be recorded without waiting.
    record_now: bool,
    /// The run as this admin posted it, until a result takes it
    /// ([`Dispatcher::take_posted_runs`]) to be judged without reading it again: the result's
    /// write compares the run's state and kill request with the stored ones, and reads
    /// the run again if any changed meanwhile.
    run: Option<Box<RunRecord>>,
}

impl Dispatcher {
    /// Sends run `run_id` of job `job_id` at `due_ms` (now if that has passed).
    pub fn send_at(&self, run_id: i64, job_id: i64, due_ms: i64) {
        self.send_created_at(Fired::Pending { id: run_id, job_id }, due_ms);
    }

    /// Sends a newly created run at `due_ms` (now if that has passed): a pending one is claimed
    /// first. A run routed at its creation to an executor that holds early triggers is sent
    /// [`SEND_AHEAD_MS`] before its instant with `notBefore`, so that the send is over when the
    /// instant comes and the executor starts it on time. A claimed run whose timer a stop
    /// cancels stays claimed until its lease runs out; the sweep sends it then.
    pub fn send_created_at(&self, run: Fired, due_ms: i64) {
        let this = self.clone();
        let run_id = run.id();
        // The job and the executor are recorded once known (`send_claimed`), so that every
        // line of the run's dispatch names them. A span per run, like a line per run, is at
        // `debug`: at `info` its fields were formatted for every run, about 1 % of the
        // admin's instructions per fire, and each line of a dispatch names its run and job.
        let span = tracing::debug_span!(
            "dispatch",
            run.id = run_id,
            job.id = tracing::field::Empty,
            executor = tracing::field::Empty
        );
        tokio::spawn(
            async move {
                let ahead = match &run {
                    Fired::Claimed(claim) if due_ms > now_ms() => {
                        match claim.run.executor_address.as_deref() {
                            Some(address) => Box::pin(this.peer(address))
                                .await
                                .is_some_and(|peer| peer.holds_triggers),
                            None => false,
                        }
                    }
                    _ => false,
                };
                let send_at = if ahead { due_ms - SEND_AHEAD_MS } else { due_ms };
                let wait = u64::try_from(send_at - now_ms()).unwrap_or(0);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    () = this.inner.timers.cancelled() => return,
                }
                // The send's state (6.5 KiB) goes on the heap only now: inline, it made this
                // task as large, and was copied with every spawn.
                let sent = match run {
                    Fired::Pending { id, job_id } => Box::pin(this.send(id, job_id)).await,
                    Fired::Claimed(claim) => Box::pin(this.send_claimed(*claim)).await,
                };
                if let Err(error) = sent {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "dispatching run {run_id} failed"
                    );
                }
            }
            .instrument(span),
        );
    }

    /// Claims run `run_id` of job `job_id` and sends it to an executor, recording what came of
    /// it. A capped job's run is claimed under its caps, or held (see `caps.rs`).
    pub async fn send(&self, run_id: i64, job_id: i64) -> anyhow::Result<()> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        let job = self.inner.cache.job(job_id).await?;
        let cap_group = match job.as_deref() {
            Some(job) => self.cap_group(job).await?,
            None => None,
        };
        let claim = match (cap_group, job) {
            (Some(group_id), Some(job)) => self.claim_capped(run_id, &job, group_id).await?,
            _ => self.inner.db.claim_run(run_id, owner, now, now + LEASE_MS).await?,
        };
        match claim {
            Some(claim) => self.send_claimed(claim).await,
            None => Ok(()),
        }
    }

    /// Sends a run this admin holds the lease of, recording what came of it.
    async fn send_claimed(&self, Claim { run, fence }: Claim) -> anyhow::Result<()> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        let lease = (owner, fence);
        tracing::Span::current().record("job.id", run.job_id);
        let job = self.inner.cache.job(run.job_id).await?;
        let scheduled = matches!(run.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        let facts = SendFacts {
            job_id: run.job_id,
            scheduled,
            job: job.as_deref().map(|job| JobNow {
                running: job.running,
                // Parsed only where it decides: a scheduled run of a stopped job.
                fires_again: scheduled && !job.running && has_fire_after(job, &run),
            }),
            fence,
            since_first_claim_ms: now - run.first_claimed_at_ms,
        };
        let event = match (lifecycle::before_send(&facts), job.as_deref()) {
            (Some(instead), _) => instead,
            // `before_send` ends every run whose job is gone.
            (None, None) => return Ok(()),
            (None, Some(job)) => {
                let sent = tokio::select! {
                    sent = self.send_to_executor(job, &run, lease) => sent,
                    () = self.keep_lease(run.id, lease) => {
                        tracing::warn!(job.id = run.job_id, "run {}: lease lost while sending", run.id);
                        self.forget_send(run.id);
                        return Ok(());
                    }
                };
                if !matches!(&sent, Sent::Accepted { reply, .. } if reply.as_deref() != Some(run_reply::LOST))
                {
                    self.forget_send(run.id);
                }
                match sent {
                    Sent::Accepted { address, reply }
                        if reply.as_deref() == Some(run_reply::LOST) =>
                    {
                        Event::Lost {
                            reason: format!("lost: {address} accepted it before a restart"),
                        }
                    }
                    Sent::Accepted { address, .. } => {
                        tracing::Span::current().record("executor", address.as_str());
                        tracing::debug!(job.id = run.job_id, "run {} sent to {address}", run.id);
                        let at_ms = now_ms();
                        if !self.await_result(run.id, at_ms).await {
                            // Its result came first and was recorded with the acceptance.
                            return Ok(());
                        }
                        Event::Sent {
                            address,
                            at_ms,
                            timeout_secs: job.spec.timeout_secs,
                            grace_ms: RESULT_GRACE_MS,
                        }
                    }
                    Sent::Refused(reason) => {
                        crate::metrics::admin().dispatch_failures.inc();
                        tracing::warn!(job.id = run.job_id, "run {} not sent: {reason}", run.id);
                        Event::NotSent { reason }
                    }
                    Sent::Unconfirmed(reason) => {
                        crate::metrics::admin().dispatch_failures.inc();
                        tracing::warn!(job.id = run.job_id, "run {} unconfirmed: {reason}", run.id);
                        Event::Lost { reason: format!("lost: {reason}") }
                    }
                    Sent::LeaseLost => return Ok(()),
                }
            }
        };
        let run_id = run.id;
        self.apply_to(run_id, Some(run), Some(job), event, Some(lease), None).await?;
        Ok(())
    }

    /// Notes that run `run_id` is being posted to `address`, so that a result that arrives
    /// before the executor's answer is read records the send with itself; `run` is the run as
    /// stored, for the result to start from.
    fn hold_send(&self, run_id: i64, address: &str, run: Option<Box<RunRecord>>) {
        let posting = Unrecorded {
            address: address.to_owned(),
            at_ms: None,
            wake: None,
            record_now: false,
            run,
        };
        if let Ok(mut sends) = self.inner.unrecorded.lock() {
            sends.insert(run_id, posting);
        }
    }

    /// Takes, of runs `ids`, those this admin is posting or holds the acceptance of, as it
    /// posted them: the results of its own sends need not read them.
    pub(super) fn take_posted_runs(&self, ids: &[i64]) -> HashMap<i64, RunRecord> {
        let Ok(mut sends) = self.inner.unrecorded.lock() else { return HashMap::new() };
        let taken = ids.iter().filter_map(|id| sends.get_mut(id)?.run.take());
        taken.map(|run| (run.id, *run)).collect()
    }

    /// Forgets the send of run `run_id` (not accepted: its outcome is recorded as it is).
    fn forget_send(&self, run_id: i64) {
        if let Ok(mut sends) = self.inner.unrecorded.lock() {
            sends.remove(&run_id);
        }
    }

    /// Holds back the record of run `run_id`'s acceptance at `at_ms` until the run's result
    /// arrives, a kill or this admin's stop wants it recorded, or [`SENT_RECORD_WAIT`] passes.
    /// Whether it is still to be recorded: not when the result took it
    /// ([`Dispatcher::take_unrecorded_send`]) to record both in one write, before or after the
    /// executor's answer.
    ///
    /// Meanwhile the run stays `dispatching` under this admin's lease, as between a send and
    /// its record; a crash then leaves it to the sweep, which sends it again to the same
    /// executor, and the executor answers with where the run is.
    async fn await_result(&self, run_id: i64, at_ms: i64) -> bool {
        let (wake, woken) = tokio::sync::oneshot::channel();
        {
            let Ok(mut sends) = self.inner.unrecorded.lock() else { return true };
            let Some(send) = sends.get_mut(&run_id) else { return false };
            if send.record_now {
                sends.remove(&run_id);
                return true;
            }
            send.at_ms = Some(at_ms);
            send.wake = Some(wake);
        }
        tokio::select! {
            _ = woken => {}
            () = tokio::time::sleep(SENT_RECORD_WAIT) => {}
            () = self.inner.timers.cancelled() => {}
        }
        self.inner.unrecorded.lock().ok().and_then(|mut sends| sends.remove(&run_id)).is_some()
    }

    /// Takes the send of run `run_id` that its sender has not recorded: the executor and when
    /// it accepted the run (when the result came before the executor's answer was read, the
    /// run's start `started_at_ms`, by which it had taken it, else now). The sender then records
    /// nothing, and the caller records the acceptance with the run's result.
    pub(super) fn take_unrecorded_send(
        &self,
        run_id: i64,
        started_at_ms: Option<i64>,
    ) -> Option<(String, i64)> {
        let taken = self.inner.unrecorded.lock().ok()?.remove(&run_id)?;
        Some((taken.address, taken.at_ms.or(started_at_ms).unwrap_or_else(now_ms)))
    }

    /// Has the sender of run `run_id` record its acceptance without waiting (a kill is
    /// delivered with that record).
    pub(super) fn record_send_now(&self, run_id: i64) {
        let wake = self.inner.unrecorded.lock().ok().and_then(|mut sends| {
            let send = sends.get_mut(&run_id)?;
            send.record_now = true;
            send.wake.take()
        });
        if let Some(wake) = wake {
            let _ = wake.send(());
        }
    }

    /// Renews the lease on run `run_id` until it cannot (the lease moved on, or the run left
    /// `dispatching`); a database error is logged and retried at the next renewal.
    async fn keep_lease(&self, run_id: i64, (owner, fence): (&str, i64)) {
        loop {
            tokio::time::sleep(LEASE_RENEWAL).await;
            match self.inner.db.renew_lease(run_id, owner, fence, now_ms() + LEASE_MS).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, "renewing the lease of run {run_id} failed"),
            }
        }
    }

    /// Routes run `run` (unless it carries its executor), records the choice under the lease,
    /// and posts `/run`.
    async fn send_to_executor(&self, job: &Job, run: &RunRecord, lease: (&str, i64)) -> Sent {
        let resent = lease.1 > 1;
        let address = match &run.executor_address {
            Some(address) => address.clone(),
            None => {
                let routed = match self.route_run(job).await {
                    Ok(address) => address,
                    Err(reason) => return Sent::Refused(reason),
                };
                match self.inner.db.set_run_target(run.id, lease.0, lease.1, &routed).await {
                    Ok(true) => routed,
                    Ok(false) => return Sent::LeaseLost,
                    Err(error) => return Sent::Refused(format!("recording the executor: {error}")),
                }
            }
        };
        let mut param = match trigger_param(job, run) {
            Ok(param) => param,
            Err(error) => return Sent::Refused(format!("{error:#}")),
        };
        param.reply_to = self.inner.reply_to.get().cloned();
        // The sender speaks to the executor as its stored registration says (`peers.rs`).
        let peer = self.peer(&address).await;
        if let Some(node) = run.node {
            let xxl_job = peer.is_some_and(|peer| matches!(peer.kind, PeerKind::XxlJob(_)));
            match self.inner.db.workflow_inputs(node.workflow_run_id, node.node).await {
                Ok(Some(inputs)) => with_inputs(&mut param, &inputs, xxl_job),
                Ok(None) => {}
                Err(error) => {
                    return Sent::Refused(format!("reading the workflow node's inputs: {error}"));
                }
            }
        }
        failpoint::hit("dispatch.before_send");
        // As stored: the executor is recorded by now.
        let posted = RunRecord { executor_address: Some(address.clone()), ..run.clone() };
        self.hold_send(run.id, &address, Some(Box::new(posted)));
        match self.inner.senders.post(&address, param).await {
            Ok(reply) => {
                failpoint::hit("dispatch.after_send");
                Sent::Accepted { address, reply }
            }
            // The executor answered and did not take it.
            Err(PostError::Refused(reason)) => Sent::Refused(reason),
            // Nothing reached the executor, and no earlier holder may have sent it either.
            Err(PostError::Unreachable(reason)) if !resent => {
                Sent::Refused(format!("{address} is unreachable: {reason}"))
            }
            Err(PostError::Unreachable(reason) | PostError::NoAnswer(reason)) => {
                Sent::Unconfirmed(format!("no answer from {address} to /run: {reason}"))
            }
        }
    }
}

/// What came of posting `/run`.
enum Sent {
    /// The executor took it (now, or before: `reply` says which, for wasmjob executors).
    Accepted { address: String, reply: Option<String> },
    /// No executor took it.
    Refused(String),
    /// The request may have reached the executor, but no answer came: nobody knows whether it
    /// runs, so it must not be sent anywhere else.
    Unconfirmed(String),
    /// Another dispatcher holds the run now.
    LeaseLost,
}

/// Gives `param` the inputs of its workflow node: in `workflowInputs` for a wasmjob executor,
/// appended to `executorParams` as a line of JSON for an XXL-JOB executor, whose handler has
/// no other way to see them.
fn with_inputs(param: &mut TriggerParam, inputs: &[NodeInput], xxl_job: bool) {
    let inputs: Vec<NodeOutputParam> = inputs
        .iter()
        .map(|input| NodeOutputParam {
            node: input.node.clone(),
            job_id: input.job_id,
            state: input.state.to_string(),
            outputs: input
                .outputs
                .iter()
                .map(|(shard, message)| ShardOutputParam {
                    shard: u32::try_from(*shard).unwrap_or(0),
                    message: message.clone(),
                })
                .collect(),
        })
        .collect();
    if !xxl_job {
        param.workflow_inputs = Some(inputs);
        return;
    }
    let json = serde_json::to_string(&inputs).unwrap_or_default();
    param.executor_params = if param.executor_params.is_empty() {
        format!("{WORKFLOW_INPUTS_LINE}{json}")
    } else {
        format!("{}\n{WORKFLOW_INPUTS_LINE}{json}", param.executor_params)
    };
}

/// Whether the schedule of `job` fires again after the fire of `run`.
fn has_fire_after(job: &Job, run: &RunRecord) -> bool {
    let spec = &job.spec;
    let fire_ms = run.fire_time_ms.unwrap_or(run.trigger_time_ms);
    Schedule::parse(spec.schedule_type, &spec.schedule_conf, spec.time_zone.as_deref())
        .map_or(true, |schedule| schedule.next_after(fire_ms).is_some())
}

fn trigger_param(job: &Job, run: &RunRecord) -> anyhow::Result<TriggerParam> {
    // A GLUE_PYTHON or GLUE_JAVASCRIPT job runs the component its source was built into, sent
    // exactly as a GLUE_WASM one: the source text never travels to an executor.
    let (glue_source, handler) = match job.spec.glue_type {
        GlueType::GlueWasm | GlueType::GluePython | GlueType::GlueJavascript => {
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
        glue_type: if job.spec.glue_type.runs_a_version() {
            GLUE_WASM.to_owned()
        } else {
            "BEAN".to_owned()
        },
        glue_source,
        glue_updatetime: 0,
        broadcast_index: run.shard_index,
        broadcast_total: run.shard_total,
        sharding_items: (!run.sharding_items.is_empty()).then(|| {
            run.sharding_items
                .iter()
                .map(|item| ShardingItemParam {
                    item: item.item,
                    parameter: item.parameter.clone(),
                })
                .collect()
        }),
        attempt: Some(run.attempt),
        fuel_limit: job.spec.fuel_limit,
        memory_limit_mb: job.spec.memory_limit_mb,
        // Sent ahead of its instant (`send_created_at`): it must not start before it.
        not_before: (run.trigger_time_ms > now_ms()).then_some(run.trigger_time_ms),
        workflow_inputs: None,
        reply_to: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::dispatch::Cache;
    use crate::protocol;
    use crate::storage::Db;

    /// A dispatcher over a fresh SQLite database (kept while the directory lives).
    async fn dispatcher() -> (Dispatcher, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("dispatch.db").display());
        let db = Db::connect(&url).await.unwrap();
        let client = protocol::Client::new("dispatch-test-token-5c1e9a", Duration::from_secs(1));
        let cache = Cache::new(db.clone(), 90_000);
        (Dispatcher::new(db, cache, client.unwrap(), 90_000, None), dir)
    }

    /// Posts `run_id` and, once its executor accepted it at 500, holds back the record; returns
    /// once it is held.
    async fn held(dispatcher: &Dispatcher, run_id: i64) -> tokio::task::JoinHandle<bool> {
        dispatcher.hold_send(run_id, "http://e:1", None);
        let sender = dispatcher.clone();
        let waiting = tokio::spawn(async move { sender.await_result(run_id, 500).await });
        let accepted = |sends: &HashMap<i64, Unrecorded>| sends[&run_id].at_ms.is_some();
        while !accepted(&dispatcher.inner.unrecorded.lock().unwrap()) {
            tokio::task::yield_now().await;
        }
        waiting
    }

    #[test]
    fn an_xxl_job_executor_gets_a_nodes_inputs_in_its_params() {
        let inputs = [NodeInput {
            node: "extract".to_owned(),
            job_id: 3,
            state: crate::workflow::NodeState::Succeeded,
            outputs: vec![(0, "rows=3".to_owned())],
        }];
        let mut ours = TriggerParam { executor_params: "p".to_owned(), ..TriggerParam::default() };
        with_inputs(&mut ours, &inputs, false);
        assert_eq!(ours.executor_params, "p");
        assert_eq!(ours.workflow_inputs.as_ref().map(Vec::len), Some(1));
        let mut xxl = TriggerParam { executor_params: "p".to_owned(), ..TriggerParam::default() };
        with_inputs(&mut xxl, &inputs, true);
        assert_eq!(xxl.workflow_inputs, None);
        expect_test::expect![[r#"
            p
            wasmjob-workflow-inputs: [{"node":"extract","jobId":3,"state":"succeeded","outputs":[{"shard":0,"message":"rows=3"}]}]"#]]
        .assert_eq(&xxl.executor_params);
    }

    #[tokio::test]
    async fn a_result_starts_from_the_run_as_posted_and_reads_it_again_if_it_changed() {
        let (dispatcher, _dir) = dispatcher().await;
        let db = &dispatcher.inner.db;
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let spec = crate::admin::dispatch::cache::tests::job_spec(group.id);
        let job = db.create_job(&spec, 0).await.unwrap();
        let new = crate::storage::NewRun {
            job_id: job.id,
            trigger_type: TriggerType::Manual,
            trigger_time_ms: 1_000,
            fire_time_ms: None,
            param: String::new(),
            executor_address: None,
            shard_index: 0,
            shard_total: 1,
            sharding_items: Vec::new(),
            attempt: 0,
            version: None,
            parent_run_id: None,
            node: None,
        };
        let id = db.create_run(&new, 1_000).await.unwrap().unwrap();
        let posted = db.claim_run(id, "admin-a", 1_000, i64::MAX).await.unwrap().unwrap().run;
        let result = |code: i32, message: &str| {
            let json = serde_json::json!({"logId": id, "logDateTim": 1_000, "handleCode": code,
                "handleMsg": message});
            serde_json::from_value::<crate::protocol::HandleCallbackParam>(json).unwrap()
        };
        // Posted: the run is held as posted, for its result to take once.
        dispatcher.hold_send(id, "http://e:1", Some(Box::new(posted.clone())));
        let taken = dispatcher.take_posted_runs(&[id, id + 1]);
        assert_eq!(taken.into_iter().collect::<Vec<_>>(), vec![(id, posted.clone())]);
        assert!(dispatcher.take_posted_runs(&[id]).is_empty());
        assert!(dispatcher.take_unrecorded_send(id, None).is_some());
        // A result ends the run; another, for a copy held from before, finds the run changed
        // since it was posted, reads it again, and changes nothing.
        assert!(dispatcher.apply_chunk(&[result(500, "first")]).await);
        dispatcher.hold_send(id, "http://e:1", Some(Box::new(posted)));
        assert!(dispatcher.apply_chunk(&[result(200, "second")]).await);
        let stored = db.get_run(id).await.unwrap().unwrap();
        assert_eq!((stored.handle_code, stored.handle_msg.as_str()), (500, "first"));
    }

    #[tokio::test]
    async fn an_accepted_send_is_recorded_unless_its_result_takes_it() {
        let (dispatcher, _dir) = dispatcher().await;
        // The result comes first: it takes the acceptance, and the sender records nothing.
        let waiting = held(&dispatcher, 1).await;
        let taken = dispatcher.take_unrecorded_send(1, Some(700));
        assert_eq!(taken, Some(("http://e:1".to_owned(), 500)));
        assert!(!waiting.await.unwrap());
        // The result comes before the executor's answer is read: it records the send, as of
        // the run's start, and the sender, once it reads the answer, records nothing.
        dispatcher.hold_send(5, "http://e:1", None);
        let taken = dispatcher.take_unrecorded_send(5, Some(700));
        assert_eq!(taken, Some(("http://e:1".to_owned(), 700)));
        assert!(!dispatcher.await_result(5, 800).await);
        // A kill during the post has the acceptance recorded as soon as it is read.
        dispatcher.hold_send(6, "http://e:1", None);
        dispatcher.record_send_now(6);
        assert!(dispatcher.await_result(6, 800).await);
        // A kill has it recorded now; a result after that finds nothing to take.
        let waiting = held(&dispatcher, 2).await;
        dispatcher.record_send_now(2);
        assert!(waiting.await.unwrap());
        assert_eq!(dispatcher.take_unrecorded_send(2, None), None);
        // No result within the wait: the sender records it.
        let waiting = held(&dispatcher, 3).await;
        assert!(waiting.await.unwrap());
        assert_eq!(dispatcher.take_unrecorded_send(3, None), None);
        // A stopping admin records what it holds.
        let waiting = held(&dispatcher, 4).await;
        dispatcher.stop();
        assert!(waiting.await.unwrap());
        assert!(dispatcher.inner.unrecorded.lock().unwrap().is_empty());
    }
}
