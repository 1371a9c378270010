//! Running an accepted run to its end: the worker's loop over its queue, the start made
//! durable before the guest runs, the run through the runtime, and the result stored in the
//! outbox before its end is journaled.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{IDLE_TIMEOUT, Queued, RunContext, Worker, Workers, lock};
use crate::config::RunDefaults;
use crate::executor::journal::{self, Journal, Ticket};
use crate::model::code;
use crate::protocol::{HandleCallbackParam, MAX_RESULT_MESSAGE_BYTES, TriggerParam};
use crate::runtime::{
    Imports, Level, LogSink, NodeOutput, RunLimits, RunOutcome, ShardOutput, ShardingItem, Trigger,
};

impl Workers {
    pub(super) async fn work(self, job_id: i64, worker: Arc<Worker>) {
        loop {
            let next = {
                let mut queue = lock(&worker.queue);
                queue.pending.pop_front().map(|queued| {
                    let cancel = CancellationToken::new();
                    queue.running = Some((queued.param.log_id, cancel.clone()));
                    (queued, cancel)
                })
            };
            if let Some((queued, cancel)) = next {
                let span = tracing::info_span!("run", run.id = queued.param.log_id);
                self.execute(queued, cancel).instrument(span).await;
                lock(&worker.queue).running = None;
                continue;
            }
            tokio::select! {
                () = worker.notify.notified() => {}
                () = tokio::time::sleep(IDLE_TIMEOUT) => {
                    // Lock order: the map, then the queue (as in `push`), so no trigger slips in
                    // between the emptiness check and the removal.
                    let mut map = lock(&self.map);
                    let idle = {
                        let queue = lock(&worker.queue);
                        queue.pending.is_empty() && queue.running.is_none()
                    };
                    if idle {
                        if map.get(&job_id).is_some_and(|current| Arc::ptr_eq(current, &worker)) {
                            map.remove(&job_id);
                        }
                        return;
                    }
                }
            }
        }
    }

    /// Reports a run that was accepted but will never run.
    pub(super) fn report_unrun(&self, queued: &Queued, reason: &str) {
        let param = &queued.param;
        if let Ok(mut log) = self.ctx.logs.open(param.log_id, param.log_date_time) {
            log.line(Level::Warn, reason);
        }
        finish(&self.ctx, param, queued.bytes, code::FAILURE, reason, None, None);
    }

    /// Runs one trigger to its end and reports the result.
    pub(super) async fn execute(&self, queued: Queued, cancel: CancellationToken) {
        let ctx = &self.ctx;
        let Queued { param, ticket, bytes, started_at } = queued;
        // A run starts only once its acceptance is durable, so a restart never forgets a run
        // that began. This is normally already true (the `/run` answer waited for it). A run
        // released at its instant may have been journaled as started then.
        let recorded = match started_at {
            Some(_) => Some(Ok(())),
            None => self.io.starts.call((ticket, param.log_id)).await,
        };
        let not_recorded = match recorded {
            Some(Ok(())) => None,
            Some(Err(error)) => Some(error),
            None => Some("the journal's writer failed".to_owned()),
        };
        if let Some(error) = not_recorded {
            tracing::error!(%error, "run {} not started: its acceptance is not durable", param.log_id);
            let reason = format!("host error: the run could not be recorded durably: {error}");
            self.end(&param, bytes, code::FAILURE, reason, None, None).await;
            return;
        }
        // The start: its journal line is written, and nothing but the guest is left to do.
        let started_at = started_at.unwrap_or_else(journal::now_ms);
        ctx.logs.running(param.log_id);
        let mut log = match ctx.logs.open(param.log_id, param.log_date_time) {
            Ok(log) => log,
            Err(error) => {
                tracing::error!(%error, "cannot open the log of run {}", param.log_id);
                let reason = format!("host error: cannot open the run log: {error}");
                self.end(&param, bytes, code::FAILURE, reason, None, Some(started_at)).await;
                return;
            }
        };
        let source =
            if param.glue_type == "BEAN" { &param.executor_handler } else { &param.glue_source };
        log.line(
            Level::Info,
            &format!(
                "run {} of job {} started: {} {source}, param `{}`",
                param.log_id, param.job_id, param.glue_type, param.executor_params
            ),
        );
        let started = std::time::Instant::now();
        // A kill must not wait for a slow admin or a long compilation: the run ends as killed
        // at once, and a compilation already under way finishes on its blocking thread for the
        // cache.
        let resolve =
            ctx.modules.resolve(&param.glue_type, &param.glue_source, &param.executor_handler);
        let resolved = tokio::select! {
            resolved = resolve => Some(resolved),
            () = cancel.cancelled() => None,
        };
        let outcome = match resolved {
            Some(Ok(job)) => {
                let limits = limits(&ctx.defaults, &param);
                let (trigger, imports) = (trigger(&param), imports(&param));
                if ctx.runtime.free_slots() == Some(0) {
                    let total = ctx.defaults.max_concurrent_runs;
                    log.line(
                        Level::Info,
                        &format!("waiting for a run slot: all {total} are in use"),
                    );
                }
                ctx.runtime
                    .run(&job, trigger, imports, &limits, Box::new(log.clone()), &cancel)
                    .await
            }
            Some(Err(error)) => RunOutcome::Host(format!("module unavailable: {error:#}")),
            None => {
                log.line(Level::Warn, "killed while its module was being fetched or compiled");
                RunOutcome::Killed
            }
        };
        let level = if outcome.handle_code() == code::SUCCESS { Level::Info } else { Level::Error };
        log.line(level, &format!("run ended in {} ms: {outcome}", started.elapsed().as_millis()));
        tracing::info!(
            handle.code = outcome.handle_code(),
            "run {} ended: {outcome}",
            param.log_id
        );
        let fuel_used = match &outcome {
            RunOutcome::Success { fuel_used, .. } => {
                fuel_used.and_then(|fuel| i64::try_from(fuel).ok())
            }
            _ => None,
        };
        let (handle_code, handle_msg) = (outcome.handle_code(), outcome.handle_msg());
        self.end(&param, bytes, handle_code, handle_msg, fuel_used, Some(started_at)).await;
    }

    /// [`finish`], batched with other runs' ends off the async runtime (it syncs files).
    pub(super) async fn end(
        &self,
        param: &TriggerParam,
        bytes: usize,
        handle_code: i32,
        handle_msg: String,
        fuel_used: Option<i64>,
        started_at: Option<i64>,
    ) {
        let result = result(param, handle_code, &handle_msg, fuel_used, started_at);
        if self.io.ends.call((result, bytes)).await.is_none() {
            tracing::error!("reporting the result of run {} failed", param.log_id);
        }
    }
}

/// Queues the result of a run for the admin, journals its end and closes its log; the `bytes`
/// the run held are released first, so an admin that sees the result finds the room free.
pub(super) fn finish(
    ctx: &RunContext,
    param: &TriggerParam,
    bytes: usize,
    handle_code: i32,
    handle_msg: &str,
    fuel_used: Option<i64>,
    started_at: Option<i64>,
) {
    let result = result(param, handle_code, handle_msg, fuel_used, started_at);
    store_results(ctx, &[(result, bytes)]);
}

/// The result of a run for the admin, its message cut to [`MAX_RESULT_MESSAGE_BYTES`] (so a
/// callback batch has a bound the admin's body limit fits).
pub(super) fn result(
    param: &TriggerParam,
    handle_code: i32,
    handle_msg: &str,
    fuel_used: Option<i64>,
    started_at: Option<i64>,
) -> HandleCallbackParam {
    let mut cut = handle_msg.len().min(MAX_RESULT_MESSAGE_BYTES);
    while !handle_msg.is_char_boundary(cut) {
        cut -= 1;
    }
    HandleCallbackParam {
        log_id: param.log_id,
        log_date_tim: param.log_date_time,
        handle_code,
        handle_msg: Some(handle_msg[..cut].to_owned()),
        fuel_used,
        started_at,
        execute_result: None,
        reply_to: param.reply_to.clone(),
    }
}

/// [`finish`] for runs' `(result, bytes held)`, with one outbox sync for all.
pub(super) fn store_results(ctx: &RunContext, ended: &[(HandleCallbackParam, usize)]) {
    for (_, bytes) in ended {
        ctx.held_bytes.fetch_sub(*bytes, Ordering::SeqCst);
        crate::failpoint::hit("executor.before_report");
    }
    let results: Vec<HandleCallbackParam> =
        ended.iter().map(|(result, _)| result.clone()).collect();
    let stored = ctx.outbox.push_all(&results);
    let now = journal::now_ms();
    let in_outbox: Vec<(i64, i32)> = results
        .iter()
        .zip(&stored)
        .filter(|(_, stored)| stored.is_ok())
        .map(|(result, _)| (result.log_id, result.handle_code))
        .collect();
    if let Err(error) = ctx.journal.finished_all(&in_outbox, now) {
        let count = in_outbox.len();
        tracing::error!(%error, "cannot journal the end of {count} runs");
    }
    for (result, stored) in results.iter().zip(stored) {
        let log_id = result.log_id;
        match stored {
            Ok(()) => {}
            Err(error) => {
                tracing::error!(
                    %error,
                    run.id = log_id,
                    "cannot store the result of run {log_id} on disk: it is kept in memory and \
                     sent directly, and is lost if this executor stops before an admin takes it",
                );
                ctx.journal.reported_in_memory(log_id);
            }
        }
    }
    let log_ids: Vec<i64> = results.iter().map(|result| result.log_id).collect();
    ctx.logs.finished_all(&log_ids);
}

/// Journals the start of the runs `log_ids` once their acceptances (`tickets`) are durable,
/// with one sync and one write. Blocks on the files.
pub(super) fn journal_starts(
    journal: &Journal,
    tickets: impl IntoIterator<Item = Ticket>,
    log_ids: &[i64],
    now_ms: i64,
) -> Result<(), String> {
    // A sync makes every line written before it durable: the last ticket stands for all.
    if let Some(last) = tickets.into_iter().max() {
        journal.sync(last).map_err(|error| error.to_string())?;
    }
    if let Err(error) = journal.started_all(log_ids, now_ms) {
        // The runs go on: without these lines a restart counts them lost, which they would be.
        let count = log_ids.len();
        tracing::error!(%error, "cannot journal the start of {count} runs");
    }
    Ok(())
}

fn limits(defaults: &RunDefaults, param: &TriggerParam) -> RunLimits {
    let fuel = param.fuel_limit.and_then(|fuel| u64::try_from(fuel).ok()).filter(|fuel| *fuel > 0);
    let memory = param
        .memory_limit_mb
        .and_then(|mb| usize::try_from(mb).ok())
        .filter(|mb| *mb > 0)
        .map(|mb| mb.saturating_mul(1024 * 1024));
    let timeout = u64::try_from(param.executor_timeout)
        .ok()
        .filter(|secs| *secs > 0)
        .map(Duration::from_secs);
    RunLimits {
        fuel: fuel.unwrap_or(defaults.fuel),
        timeout,
        memory_bytes: memory.unwrap_or(defaults.memory_bytes),
        ..RunLimits::default()
    }
}

fn trigger(param: &TriggerParam) -> Trigger {
    Trigger {
        job_id: param.job_id,
        log_id: param.log_id,
        param: param.executor_params.clone(),
        shard_index: u32::try_from(param.broadcast_index).unwrap_or(0),
        shard_total: u32::try_from(param.broadcast_total).unwrap_or(1).max(1),
        trigger_time_ms: param.log_date_time,
        attempt: param.attempt.and_then(|attempt| u32::try_from(attempt).ok()).unwrap_or(0),
    }
}

/// What the guest's `sharding` and `workflow` imports answer: the run's sharding items (none
/// for a job not sharded) and its workflow node's inputs (none for a run of no node).
fn imports(param: &TriggerParam) -> Imports {
    let items = param.sharding_items.iter().flatten();
    let sharding_items =
        items.map(|item| ShardingItem { item: item.item, parameter: item.parameter.clone() });
    let inputs = param.workflow_inputs.iter().flatten();
    let workflow_inputs = inputs.map(|input| NodeOutput {
        node: input.node.clone(),
        job_id: input.job_id,
        state: input.state.clone(),
        outputs: input
            .outputs
            .iter()
            .map(|output| ShardOutput { shard: output.shard, message: output.message.clone() })
            .collect(),
    });
    Imports { sharding_items: sharding_items.collect(), workflow_inputs: workflow_inputs.collect() }
}
