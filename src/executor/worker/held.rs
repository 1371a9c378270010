//! Triggers sent ahead of their instant (`notBefore`): accepted and journaled at once, held
//! outside their job's queue, and queued at their instant by the rules of a trigger arriving
//! then, the runs of one instant together.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::Instrument;

use super::run::journal_starts;
use super::{Pushed, Queued, Workers, block_strategy, held_size, lock};
use crate::executor::journal;
use crate::protocol::TriggerParam;
use crate::runtime::{Level, LogSink};

impl Workers {
    /// Accepts `param` to be held until `until` (after `now`): journaled, kept outside its job's
    /// queue, and queued at `until` by one timer for all the runs of that instant. Called by
    /// `push`, under the map's lock.
    pub(super) fn hold(&self, param: TriggerParam, now: i64, until: i64) -> Result<Pushed, String> {
        let bytes = held_size(&param);
        self.check_bytes(bytes, 0)?;
        let ticket = match self.journal_accept(&param)? {
            Pushed::Accepted(ticket) => ticket,
            duplicate => return Ok(duplicate),
        };
        self.ctx.logs.started(param.log_id, param.log_date_time);
        if let Ok(mut log) = self.ctx.logs.open(param.log_id, param.log_date_time) {
            let ahead = until - now;
            log.line(
                Level::Info,
                &format!(
                    "run {} of job {} accepted {ahead} ms ahead of its instant: held until then",
                    param.log_id, param.job_id
                ),
            );
        }
        let log_id = param.log_id;
        let first_of_its_instant = {
            let mut held = lock(&self.held);
            held.runs.insert(log_id, Queued { param, ticket, bytes, started_at: None });
            // Counted once held, as in `push`.
            self.ctx.held_bytes.fetch_add(bytes, Ordering::SeqCst);
            let runs = held.instants.entry(until).or_default();
            runs.push(log_id);
            runs.len() == 1
        };
        if first_of_its_instant {
            let this = self.clone();
            // Ends at the instant, at most `MAX_HOLD_MS` from now; a stop kills the runs it
            // would queue, and it then finds none.
            let span = tracing::info_span!("held", instant = until);
            tokio::spawn(
                async move {
                    let wait = u64::try_from(until - journal::now_ms()).unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    // Off the async runtime: a refusal or a cover stores a result.
                    let _ = tokio::task::spawn_blocking(move || this.release(until)).await;
                }
                .instrument(span),
            );
        }
        Ok(Pushed::Accepted(ticket))
    }

    /// Queues the runs held until `instant`, in the order they arrived, as `push` would have
    /// then; a refusal by its block strategy or a full queue ends a run failed. A run a kill
    /// took first is not there. Blocks on file writes (a refusal's result, the starts).
    ///
    /// A run whose job's queue is idle is taken by its worker next, so its start is journaled
    /// here, with the other such runs of the instant in one write: the runs of one instant all
    /// start at it, instead of each start waiting for the guests that started before it.
    pub(super) fn release(&self, instant: i64) {
        let mut map = lock(&self.map);
        let mut held = lock(&self.held);
        let ids = held.instants.remove(&instant).unwrap_or_default();
        let runs: Vec<Queued> = ids.iter().filter_map(|id| held.runs.remove(id)).collect();
        drop(held);
        let mut refused = Vec::new();
        let mut admitted = Vec::with_capacity(runs.len());
        for queued in runs {
            let job_id = queued.param.job_id;
            let worker = map.entry(job_id).or_insert_with(|| self.spawn(job_id)).clone();
            let queue = lock(&worker.queue);
            match self.admit(&queue, &queued.param, block_strategy(&queued.param)) {
                // Only `push` and this enqueue, both under the map's lock, which is held until
                // every run here is queued: an idle queue stays idle until then.
                Ok(covering) => {
                    let idle = queue.running.is_none() && queue.pending.is_empty();
                    drop(queue);
                    admitted.push((worker, queued, covering, idle));
                }
                Err(reason) => refused.push((queued, reason)),
            }
        }
        let starting = admitted.iter().filter(|(_, _, _, idle)| *idle);
        let log_ids: Vec<i64> =
            starting.clone().map(|(_, queued, ..)| queued.param.log_id).collect();
        let tickets = starting.map(|(_, queued, ..)| queued.ticket);
        let started_at = journal::now_ms();
        let journaled = journal_starts(&self.ctx.journal, tickets, &log_ids, started_at).is_ok();
        for (worker, mut queued, covering, idle) in admitted {
            if idle && journaled {
                queued.started_at = Some(started_at);
            }
            let mut queue = lock(&worker.queue);
            self.enqueue(&mut queue, queued, covering);
            drop(queue);
            worker.notify.notify_one();
        }
        drop(map);
        for (queued, reason) in &refused {
            self.report_unrun(queued, reason);
        }
    }
}
