//! Job workers: one per job id, each with a FIFO queue, so runs of one job follow its block
//! strategy while different jobs run in parallel.
//!
//! `push` applies the trigger's block strategy under the worker's lock: `SERIAL_EXECUTION`
//! queues, `DISCARD_LATER` refuses while the job is busy, `COVER_EARLY` kills the running run and
//! drops the queue. A worker idle for [`IDLE_TIMEOUT`] ends and is removed. An accepted run
//! ends with one result in the outbox (or, when the disk refuses it, in memory on its way to
//! the admin), whether it ran, failed to start, or was killed while queued, unless the process
//! dies first (the journal then counts it lost at the next start).
//!
//! This module does not talk HTTP or decide what a run reports beyond its outcome: `http.rs`
//! answers the admin, the runtime classifies outcomes.
//!
//! Queues are bounded: a job holds at most `max_queue_per_job` runs waiting, and the runs an
//! executor accepted and has not ended hold at most `max_queued_bytes` of triggers, all jobs
//! together (a parameter may be megabytes); a trigger past either limit is refused, not queued.
//! [`Workers::close`] refuses every new trigger from then on (a stopping executor).
//! A run killed while it fetches or compiles its module, or waits for a run slot, ends as
//! killed at once.
//!
//! A trigger sent ahead of its instant (`notBefore`) is accepted and journaled at once, held
//! outside its job's queue, and queued at its instant by the same rules as a trigger arriving
//! then; a refusal at that point (its block strategy, a full queue) ends it failed with the
//! reason. A kill takes a held run before its instant.
//!
//! Acceptance goes through the run journal: a `logId` the journal knows is answered with where
//! that run is and never queued again, also after a restart within the journal's window. A
//! trigger refused (bad module reference, `DISCARD_LATER`, a full queue, a stopping executor) is
//! not journaled. A worker runs a trigger only once its acceptance is durable.
//!
//! A run's file work (its start's journal line; its result in the outbox, synced, then its
//! end's journal line) goes through [`Batched`] queues: the runs starting or ending together
//! share one blocking call and one sync. A run's reported start (`startedAt`) is taken once its
//! start is journaled, just before its module is looked up and its guest instantiated; the held
//! runs of an instant that find their jobs idle are journaled as started together when they are
//! released, and their guests then follow one another on the cores.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::batched::Batched;
use super::journal::{self, Admission, Journal, RunState, Ticket};
use super::logs::LogStore;
use super::modules::Modules;
use super::outbox::Outbox;
use crate::config::RunDefaults;
use crate::model::{BlockStrategy, code};
use crate::protocol::{HandleCallbackParam, MAX_HOLD_MS, TriggerParam};
use crate::runtime::{Level, LogSink, Runtime};

mod held;
mod run;

use self::run::{finish, journal_starts, store_results};

/// How long a worker waits for work before it ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What runs a job needs, shared by all workers.
pub struct RunContext {
    pub(super) runtime: Arc<Runtime>,
    pub(super) modules: Modules,
    pub(super) logs: LogStore,
    pub(super) outbox: Outbox,
    pub(super) journal: Arc<Journal>,
    pub(super) defaults: RunDefaults,
    /// The URL the admins call this executor at, named on the log lines of its runs.
    pub(super) address: String,
    /// Bytes held by accepted runs that have not ended (see [`held_size`]). Grows only in
    /// `push`, under the workers' map lock, so a check and its addition cannot interleave;
    /// shrinks in [`finish`], before the result can reach an admin.
    pub(super) held_bytes: AtomicUsize,
}

/// What [`Workers::push`] did with a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Newly accepted and queued; confirm it with [`Workers::confirm`] before answering.
    Accepted(Ticket),
    /// Accepted before: where that run is now. Nothing was queued.
    Duplicate(RunState),
}

/// All job workers of an executor.
#[derive(Clone)]
pub struct Workers {
    map: Arc<Mutex<HashMap<i64, Arc<Worker>>>>,
    ctx: Arc<RunContext>,
    /// Set under the map's lock by [`Workers::close`]; read under it by `push`.
    closed: Arc<AtomicBool>,
    /// Accepted runs held until their `notBefore`.
    held: Arc<Mutex<Held>>,
    io: Arc<RunIo>,
}

/// The blocking file work of starting and ending runs, done in batches (`batched.rs`): a
/// start's journal line (after its acceptance is durable), an end's result in the outbox and
/// its journal line.
struct RunIo {
    starts: Batched<(Ticket, i64), Result<(), String>>,
    ends: Batched<(HandleCallbackParam, usize), ()>,
}

impl RunIo {
    fn start(ctx: &Arc<RunContext>) -> RunIo {
        let journal = ctx.journal.clone();
        let starts = Batched::start("run starts", move |starts: Vec<(Ticket, i64)>| {
            let log_ids: Vec<i64> = starts.iter().map(|(_, log_id)| *log_id).collect();
            let tickets = starts.into_iter().map(|(ticket, _)| ticket);
            let answer = journal_starts(&journal, tickets, &log_ids, journal::now_ms());
            vec![answer; log_ids.len()]
        });
        let ctx = ctx.clone();
        let ends = Batched::start("run ends", move |ends: Vec<(HandleCallbackParam, usize)>| {
            store_results(&ctx, &ends);
            vec![(); ends.len()]
        });
        RunIo { starts, ends }
    }
}

/// Runs held until their instant: a run leaves `runs` once, queued at its instant or taken by a
/// kill. The runs of one instant are queued together, by one timer.
#[derive(Default)]
struct Held {
    runs: HashMap<i64, Queued>,
    instants: HashMap<i64, Vec<i64>>,
}

struct Worker {
    queue: Mutex<Queue>,
    notify: Notify,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Queued>,
    running: Option<(i64, CancellationToken)>,
}

struct Queued {
    param: TriggerParam,
    ticket: Ticket,
    /// What this run counts in `held_bytes` until it ends.
    bytes: usize,
    /// When its start was journaled, if it was before its worker took it: a held run released
    /// into an idle queue, whose worker takes it next (see [`Workers::release`]).
    started_at: Option<i64>,
}

impl Workers {
    /// No workers yet. Starts the tasks that batch the runs' file work: call it on the async
    /// runtime.
    pub fn new(ctx: RunContext) -> Workers {
        let ctx = Arc::new(ctx);
        Workers {
            map: Arc::default(),
            io: Arc::new(RunIo::start(&ctx)),
            ctx,
            closed: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Accepts a trigger (journaled, not yet durable) or refuses it (the reason). Blocks on
    /// file writes: call it off the async runtime.
    ///
    /// A trigger whose `notBefore` is ahead is accepted without looking at its job's queue and
    /// held until that instant (at most [`MAX_HOLD_MS`] from now); its block strategy applies
    /// then, against the queue as it is then, and a refusal at that point ends the run failed
    /// with the reason, as a result instead of an answer.
    pub fn push(&self, param: TriggerParam) -> Result<Pushed, String> {
        if param.log_id <= 0 {
            return Err("logId must be a positive run id".to_owned());
        }
        if param.job_id <= 0 {
            return Err("jobId must be a positive job id".to_owned());
        }
        // Every acceptance happens under this lock, so a duplicate cannot slip in between the
        // journal's answer here and its record below.
        let mut map = lock(&self.map);
        match self.ctx.journal.seen(param.log_id, param.job_id, param.log_date_time) {
            Some(Admission::Duplicate(state)) => return Ok(Pushed::Duplicate(state)),
            Some(Admission::Conflict(state)) => return Err(conflict(&param, state)),
            Some(Admission::New(_)) | None => {}
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err("this executor is shutting down and takes no new runs: send the \
                        trigger to another executor"
                .to_owned());
        }
        self.ctx.modules.check(&param.glue_type, &param.glue_source, &param.executor_handler)?;
        let now = journal::now_ms();
        if let Some(until) = param.not_before.filter(|at| *at > now) {
            // Under the map's lock, as every acceptance.
            let pushed = self.hold(param, now, until.min(now + MAX_HOLD_MS));
            drop(map);
            return pushed;
        }
        let worker = map.entry(param.job_id).or_insert_with(|| self.spawn(param.job_id)).clone();
        let mut queue = lock(&worker.queue);
        crate::failpoint::hit("executor.accept");
        let strategy = block_strategy(&param);
        let covering = self.admit(&queue, &param, strategy)?;
        let bytes = held_size(&param);
        let freed: usize = if covering { queue.pending.iter().map(|q| q.bytes).sum() } else { 0 };
        self.check_bytes(bytes, freed)?;
        let ticket = match self.journal_accept(&param)? {
            Pushed::Accepted(ticket) => ticket,
            duplicate => return Ok(duplicate),
        };
        self.ctx.logs.started(param.log_id, param.log_date_time);
        self.enqueue(&mut queue, Queued { param, ticket, bytes, started_at: None }, covering);
        // Counted once queued (under the queue's lock, so it cannot end first): a run the
        // journal took and a panic kept from its queue holds nothing ([`Workers::settle_panic`]).
        self.ctx.held_bytes.fetch_add(bytes, Ordering::SeqCst);
        drop(queue);
        drop(map);
        worker.notify.notify_one();
        Ok(Pushed::Accepted(ticket))
    }

    /// Whether job's queue takes `param` now by its block strategy and the queue's bound: `Ok`
    /// with whether it covers (`COVER_EARLY` on a busy job), or the refusal.
    fn admit(
        &self,
        queue: &Queue,
        param: &TriggerParam,
        strategy: BlockStrategy,
    ) -> Result<bool, String> {
        let busy = queue.running.is_some() || !queue.pending.is_empty();
        if strategy == BlockStrategy::DiscardLater && busy {
            return Err(
                "block strategy effect: DISCARD_LATER (the job is running or queued)".to_owned()
            );
        }
        // COVER_EARLY empties the queue, so it never finds it full.
        let covering = strategy == BlockStrategy::CoverEarly && busy;
        if !covering && queue.pending.len() >= self.ctx.defaults.max_queue_per_job {
            return Err(format!(
                "queue full: job {} already has {} runs waiting on this executor (its limit, \
                 --max-queue-per-job)",
                param.job_id,
                queue.pending.len()
            ));
        }
        Ok(covering)
    }

    /// Refuses a trigger of `bytes` that would take the accepted runs past `--max-queued-mb`
    /// (`freed`: what it would drop from its job's queue).
    fn check_bytes(&self, bytes: usize, freed: usize) -> Result<(), String> {
        let held = self.ctx.held_bytes.load(Ordering::SeqCst).saturating_sub(freed);
        if held.saturating_add(bytes) > self.ctx.defaults.max_queued_bytes {
            return Err(format!(
                "queue full: this executor's accepted runs hold {held} bytes of triggers and this \
                 one needs {bytes} more, past its limit of {} (--max-queued-mb)",
                self.ctx.defaults.max_queued_bytes
            ));
        }
        Ok(())
    }

    /// Records the acceptance of `param` in the journal (not yet durable).
    fn journal_accept(&self, param: &TriggerParam) -> Result<Pushed, String> {
        let accepted = self.ctx.journal.accept(
            param.log_id,
            param.job_id,
            param.log_date_time,
            journal::now_ms(),
        );
        match accepted {
            Ok(Admission::New(ticket)) => Ok(Pushed::Accepted(ticket)),
            Ok(Admission::Duplicate(state)) => Ok(Pushed::Duplicate(state)),
            Ok(Admission::Conflict(state)) => Err(conflict(param, state)),
            Err(error) => {
                tracing::error!(run.id = param.log_id, %error, "cannot journal run {}", param.log_id);
                Err(format!("the executor cannot record the run: {error}"))
            }
        }
    }

    /// Puts an admitted run in its job's queue (covering what runs and waits, for `covering`).
    fn enqueue(&self, queue: &mut Queue, queued: Queued, covering: bool) {
        if covering {
            if let Some((log_id, cancel)) = &queue.running {
                tracing::info!(
                    job.id = queued.param.job_id,
                    run.id = log_id,
                    "covering run {log_id}"
                );
                cancel.cancel();
            }
            for dropped in queue.pending.drain(..) {
                self.report_unrun(&dropped, "discarded: covered by a later trigger (COVER_EARLY)");
            }
        }
        let param = &queued.param;
        if let Ok(mut log) = self.ctx.logs.open(param.log_id, param.log_date_time) {
            log.line(
                Level::Info,
                &format!(
                    "run {} of job {} queued ({} ahead of it)",
                    param.log_id,
                    param.job_id,
                    queue.pending.len() + usize::from(queue.running.is_some())
                ),
            );
        }
        queue.pending.push_back(queued);
    }

    /// After a panic while the trigger of run `log_id` (of job `job_id`, for `log_date_time`)
    /// was judged: if the journal took it but no queue or hold did, it ends failed with
    /// `reason` now, its result on its way to the admin, instead of staying accepted and never
    /// running. A panic before the journal took it leaves nothing to settle: the trigger is
    /// refused, and sent again it is judged anew.
    pub fn settle_panic(&self, job_id: i64, log_id: i64, log_date_time: i64, reason: &str) {
        if self.ctx.journal.state(log_id).is_none_or(|state| state != RunState::Queued) {
            return;
        }
        let map = lock(&self.map);
        let queued = map.get(&job_id).is_some_and(|worker| {
            let queue = lock(&worker.queue);
            queue.running.as_ref().is_some_and(|(running, _)| *running == log_id)
                || queue.pending.iter().any(|queued| queued.param.log_id == log_id)
        });
        if queued || lock(&self.held).runs.contains_key(&log_id) {
            return;
        }
        drop(map);
        tracing::error!(job.id = job_id, run.id = log_id, "run {log_id} ends failed: {reason}");
        let param = TriggerParam { job_id, log_id, log_date_time, ..TriggerParam::default() };
        if let Ok(mut log) = self.ctx.logs.open(log_id, log_date_time) {
            log.line(Level::Warn, reason);
        }
        // Its bytes were never counted: `push` counts them once the run is queued.
        finish(&self.ctx, &param, 0, code::FAILURE, reason, None, None);
    }

    /// Returns once an accepted trigger is durable; only then may it be confirmed to the admin.
    /// Blocks on a disk sync (shared with concurrent acceptances).
    pub fn confirm(&self, ticket: Ticket) -> Result<(), String> {
        self.ctx.journal.sync(ticket).map_err(|error| {
            tracing::error!(%error, "the run journal cannot be synced");
            format!("the executor cannot record the run durably: {error}")
        })
    }

    /// Kills job `job_id`'s running run and drops its queue, or, given `log_id`, only that run.
    /// Whether anything was found.
    pub fn kill(&self, job_id: i64, log_id: Option<i64>) -> bool {
        let matches = |param: &TriggerParam| {
            param.job_id == job_id && log_id.is_none_or(|id| id == param.log_id)
        };
        let held: Vec<Queued> = {
            let mut held = lock(&self.held);
            let ids: Vec<i64> = held
                .runs
                .values()
                .filter(|queued| matches(&queued.param))
                .map(|queued| queued.param.log_id)
                .collect();
            ids.iter().filter_map(|id| held.runs.remove(id)).collect()
        };
        for queued in &held {
            self.report_unrun(queued, "killed before its instant (it was held until then)");
        }
        let Some(worker) = lock(&self.map).get(&job_id).cloned() else {
            return !held.is_empty();
        };
        let mut queue = lock(&worker.queue);
        let mut found = false;
        if let Some((running_id, cancel)) = &queue.running
            && log_id.is_none_or(|id| id == *running_id)
        {
            cancel.cancel();
            found = true;
        }
        let (dropped, kept): (Vec<_>, Vec<_>) = queue
            .pending
            .drain(..)
            .partition(|queued| log_id.is_none_or(|id| id == queued.param.log_id));
        queue.pending.extend(kept);
        for queued in &dropped {
            self.report_unrun(queued, "killed before it started");
        }
        found || !dropped.is_empty() || !held.is_empty()
    }

    /// Whether job `job_id` has nothing running or queued here.
    pub fn is_idle(&self, job_id: i64) -> bool {
        let worker = lock(&self.map).get(&job_id).cloned();
        worker.is_none_or(|worker| {
            let queue = lock(&worker.queue);
            queue.running.is_none() && queue.pending.is_empty()
        })
    }

    /// How many runs are running or queued.
    pub fn busy_count(&self) -> usize {
        // Under the map's lock, where a held run moves to its queue, so none is missed.
        let (held, workers): (usize, Vec<_>) = {
            let map = lock(&self.map);
            (lock(&self.held).runs.len(), map.values().cloned().collect())
        };
        held + workers
            .iter()
            .map(|worker| {
                let queue = lock(&worker.queue);
                queue.pending.len() + usize::from(queue.running.is_some())
            })
            .sum::<usize>()
    }

    /// Runs queued and running now, and results not yet acknowledged: the metrics' levels.
    pub fn levels(&self) -> crate::metrics::ExecutorLevels {
        let workers: Vec<_> = lock(&self.map).values().cloned().collect();
        let mut levels = crate::metrics::ExecutorLevels::default();
        levels.queued += lock(&self.held).runs.len() as i64;
        for queue in workers.iter().map(|worker| lock(&worker.queue)) {
            levels.queued += queue.pending.len() as i64;
            levels.running += i64::from(queue.running.is_some());
        }
        let (waiting, oldest_ms) = self.ctx.outbox.backlog();
        levels.outbox = waiting as i64;
        levels.outbox_oldest_age =
            oldest_ms.map_or(0.0, |ms| (journal::now_ms() - ms).max(0) as f64 / 1000.0);
        levels
    }

    /// Refuses every trigger from now on (a `logId` accepted before is still answered with
    /// where its run is). Once this returns, no new run is queued.
    pub fn close(&self) {
        // Under the map's lock, so no `push` is between its check and its queueing.
        let _map = lock(&self.map);
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Bytes of triggers held by accepted runs that have not ended.
    pub fn held_bytes(&self) -> usize {
        self.ctx.held_bytes.load(Ordering::SeqCst)
    }

    /// Kills everything running or queued, fetching or compiling its module or waiting for a
    /// run slot included (shutdown after the grace period).
    pub fn kill_all(&self) {
        let mut job_ids: Vec<i64> = lock(&self.map).keys().copied().collect();
        job_ids.extend(lock(&self.held).runs.values().map(|queued| queued.param.job_id));
        job_ids.sort_unstable();
        job_ids.dedup();
        for job_id in job_ids {
            self.kill(job_id, None);
        }
    }

    fn spawn(&self, job_id: i64) -> Arc<Worker> {
        let worker = Arc::new(Worker { queue: Mutex::default(), notify: Notify::new() });
        let this = self.clone();
        let span = tracing::info_span!("worker", job.id = job_id, executor = %self.ctx.address);
        tokio::spawn(this.work(job_id, worker.clone()).instrument(span));
        worker
    }
}

impl Workers {}

/// The refusal of a trigger whose `logId` was accepted here for another job or fire time: the
/// admin reused a run id (its database lost its last commits), so this is not the run the
/// journal holds, and answering it as a duplicate would leave it never run. Logged as an error.
fn conflict(param: &TriggerParam, state: RunState) -> String {
    tracing::error!(
        job.id = param.job_id,
        run.id = param.log_id,
        "trigger for run {} of job {} at {} refused: this executor accepted run {} for another \
         job or fire time ({}); the admin reused a run id",
        param.log_id,
        param.job_id,
        param.log_date_time,
        param.log_id,
        state.reply()
    );
    format!(
        "run id conflict: logId {} was accepted by this executor for another job or fire time \
         (that run is {}); the admin reused a run id, as after its database lost commits",
        param.log_id,
        state.reply()
    )
}

/// Locks `mutex`, also after a panic while it was held. The workers' table, the queues and the
/// held runs stay whole at every step of the code that changes them (an entry is added or
/// removed in one call), so after a panic they are used as they are: a poisoned lock refusing
/// every later trigger of the executor, or of a job, would be the worse outcome.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The trigger's block strategy (`SERIAL_EXECUTION` when it names none we know).
fn block_strategy(param: &TriggerParam) -> BlockStrategy {
    param.executor_block_strategy.parse::<BlockStrategy>().unwrap_or(BlockStrategy::SerialExecution)
}

/// What a queued trigger counts against the executor's byte limit: its text fields and a fixed
/// share for the rest of the record.
fn held_size(param: &TriggerParam) -> usize {
    let items = param.sharding_items.iter().flatten();
    let item_bytes: usize = items.map(|item| item.parameter.len() + 16).sum();
    let inputs = param.workflow_inputs.iter().flatten();
    let outputs = inputs.flat_map(|input| &input.outputs);
    let input_bytes: usize = outputs.map(|output| output.message.len() + 16).sum();
    [
        &param.executor_params,
        &param.executor_handler,
        &param.glue_source,
        &param.executor_block_strategy,
        &param.glue_type,
    ]
    .iter()
    .map(|text| text.len())
    .sum::<usize>()
        + item_bytes
        + input_bytes
        + 256
}
