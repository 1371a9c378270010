//! A run's life as a state machine: which event may move a run from which state, and what the
//! move implies (a retry run, the child jobs' runs, a kill to send, a failure alarm).
//!
//! ```text
//! pending ──claim──▶ dispatching ──sent──▶ running ──result──▶ success | failed | timed_out | killed
//!    │                   │   │                 │
//!    │                   │   └─not sent──▶ failed        ├─lost (reconciled, executor gone) ──▶ lost
//!    ├──kill──▶ killed    ├─lost ──▶ lost                └─deadline passed ──▶ timed_out
//!    └──skip──▶ skipped   └─skip ──▶ skipped
//! ```
//!
//! [`transition`] is pure: it takes the run's facts, the job's settings and an event, and returns
//! the [`Transition`] to apply, or why the event does not apply.
//!
//! A `FIX_DELAY` job's next fire is a consequence too: when a run of one of its fires ends and
//! no retry follows, [`Transition::next_fire_delay_ms`] asks storage to set the job's next fire
//! to the run's end plus the delay, in the same transaction, provided no other run of that fire
//! (another shard, a retry) is still unfinished. So the job never fires while a run of its
//! previous fire is pending or running, and with retries the delay counts from the end of the
//! last attempt. Storage applies a transition as
//! one compare-and-set on the run's state (and, for a dispatcher's events, its lease) in the same
//! transaction as the runs it implies, so a follow-up exists exactly when its cause committed.
//! This module does not read the clock, route, or talk to anyone; it also does not decide *when*
//! an event happens (the dispatcher, the sweep and the executor API do).
#![warn(missing_docs)]

use crate::model::{RunRecord, RunState, TriggerType, code};

pub mod caps;
pub mod retry;

/// The longest message kept for a run (trigger or handle message), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Something that happened to a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A dispatcher took the lease to send it.
    Claim,
    /// An executor accepted it.
    Sent {
        /// The executor's address.
        address: String,
        /// When it accepted it (ms).
        at_ms: i64,
        /// The job's wall-clock limit in seconds (0 = none), for the admin's own deadline.
        timeout_secs: i64,
        /// How long past the job's timeout the admin waits for a result before it gives up.
        grace_ms: i64,
    },
    /// No executor took it (refused, unreachable before the request was sent, none online).
    NotSent {
        /// Why.
        reason: String,
    },
    /// Its executor reported a result.
    Result {
        /// XXL-JOB's handle code: 200 success, 502 timeout, anything else failure.
        handle_code: i32,
        /// The handler's message.
        message: String,
        /// When the executor started the handler (ms), if it said.
        started_at_ms: Option<i64>,
        /// The executor and instant (ms) of its acceptance of the run, when the dispatcher saw
        /// it and had not recorded it yet: this result's record says the run was sent, and one
        /// write holds both.
        accepted: Option<(String, i64)>,
    },
    /// An operator asked to kill it.
    Kill,
    /// Its job was stopped before this scheduled fire was sent.
    Skip {
        /// Why.
        reason: String,
    },
    /// Its job's or group's concurrency cap is reached and the job's block strategy
    /// (`DISCARD_LATER`) discards the run that found no room.
    Discard {
        /// Why.
        reason: String,
    },
    /// Its executor does not hold it (reconciliation), went away, or never confirmed the send.
    Lost {
        /// Why.
        reason: String,
    },
    /// The admin's deadline (the job's timeout plus a grace period) passed without a result.
    DeadlinePassed,
}

/// What the transition needs to know about the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFacts {
    /// Its state now.
    pub state: RunState,
    /// 0 for the first try.
    pub attempt: i64,
    /// Whether an operator asked to kill it.
    pub kill_requested: bool,
    /// Why it exists.
    pub trigger_type: TriggerType,
    /// Whether it belongs to a schedule fire (a fire's run, or a retry of one).
    pub from_fire: bool,
}

impl RunFacts {
    /// The facts of `run` as it was read.
    pub fn of(run: &RunRecord) -> RunFacts {
        RunFacts {
            state: run.state,
            attempt: run.attempt,
            kill_requested: run.kill_requested,
            trigger_type: run.trigger_type,
            from_fire: run.fire_time_ms.is_some(),
        }
    }
}

/// What the transition needs to know about the run's job (`None` when the job was deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFacts {
    /// How many times a failed run is tried again.
    pub retry_count: i64,
    /// Whether the job has child jobs.
    pub has_children: bool,
    /// For a `FIX_DELAY` job, its delay in ms.
    pub fix_delay_ms: Option<i64>,
}

/// The changes one event makes to a run, and their consequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The state the run must be in for the transition to apply (the compare of the CAS).
    pub from: RunState,
    /// The state it moves to.
    pub to: RunState,
    /// Whether a kill was requested when the transition was computed: part of the compare, so
    /// that a kill request arriving meanwhile is not lost.
    pub kill_requested_before: bool,
    /// XXL-JOB's trigger code to record: 200 sent, 500 not sent.
    pub trigger_code: Option<i32>,
    /// The trigger message to record.
    pub trigger_msg: Option<String>,
    /// The executor to record.
    pub executor_address: Option<String>,
    /// When an executor accepted it, and the admin's deadline for its result (0 = none).
    pub dispatched: Option<(i64, i64)>,
    /// The result to record: XXL-JOB's handle code and the message (terminal states only).
    pub handle: Option<(i32, String)>,
    /// When the executor started the handler (ms).
    pub started_at: Option<i64>,
    /// Set the kill request.
    pub request_kill: bool,
    /// Consequence: create the retry run (attempt + 1).
    pub retry: bool,
    /// Consequence: trigger the job's children.
    pub children: bool,
    /// Consequence: ask the executor to stop the run (for a lost run, at best and only where
    /// the kill stops that run alone).
    pub send_kill: bool,
    /// Consequence, for a `FIX_DELAY` job: set the job's next fire this many ms after now (the
    /// run's end), unless another run of the same fire is unfinished.
    pub next_fire_delay_ms: Option<i64>,
    /// Consequence: raise a failure alarm. Set on a final failure: the run ended `failed`,
    /// `timed_out` or `lost` and no retry follows. A killed run raises none (an operator asked
    /// for it), nor does a skipped one.
    pub alarm: bool,
}

/// Why an event does not apply to a run in its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event} does not apply to a {state} run")]
pub struct IllegalTransition {
    /// The run's state.
    pub state: RunState,
    /// The event's name.
    pub event: &'static str,
}

impl Event {
    /// The event's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Claim => "claim",
            Event::Sent { .. } => "sent",
            Event::NotSent { .. } => "not sent",
            Event::Result { .. } => "result",
            Event::Kill => "kill",
            Event::Skip { .. } => "skip",
            Event::Discard { .. } => "discard",
            Event::Lost { .. } => "lost",
            Event::DeadlinePassed => "deadline passed",
        }
    }
}

/// A run that no executor confirmed within this long after its first claim is not sent again:
/// executors remember the runs they accepted for (at least) this long.
pub const RESEND_WINDOW_MS: i64 = 3_600_000;

/// What a dispatcher that holds a run's lease knows before it sends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendFacts {
    /// The run's job.
    pub job_id: i64,
    /// Whether the run is a schedule fire's (cron or misfire), not a manual, API, parent or
    /// retry trigger.
    pub scheduled: bool,
    /// The run's job now, `None` once it was deleted.
    pub job: Option<JobNow>,
    /// The lease's fence: 1 for the run's first claim, more when a dispatcher took it over.
    pub fence: i64,
    /// How long ago (ms) the run was first claimed.
    pub since_first_claim_ms: i64,
}

/// What [`SendFacts`] says of the run's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobNow {
    /// Whether its schedule is on.
    pub running: bool,
    /// Whether its schedule fires again after this run's fire (read only for a scheduled run of
    /// a stopped job).
    pub fires_again: bool,
}

/// Whether a claimed run is sent, or which event ends it instead (before any executor hears of
/// it): the job was stopped before this fire was sent (skip), the job is gone (not sent), or an
/// earlier holder's lease ran out so long ago that no executor would still answer for the run
/// (lost).
///
/// A stopped job whose schedule has no fire after this one (a `ONCE` job, a cron whose years
/// ran out) was stopped by this very fire, in the transaction that created the run: it is sent.
pub fn before_send(facts: &SendFacts) -> Option<Event> {
    match facts.job {
        Some(job) if facts.scheduled && !job.running && job.fires_again => Some(Event::Skip {
            reason: "skipped: the job was stopped before this fire was sent".to_owned(),
        }),
        None => Some(Event::NotSent { reason: format!("job {} no longer exists", facts.job_id) }),
        Some(_) if facts.fence > 1 && facts.since_first_claim_ms > RESEND_WINDOW_MS => {
            Some(Event::Lost { reason: "lost: no executor confirmed it within an hour".to_owned() })
        }
        Some(_) => None,
    }
}

/// The transition `event` makes for `run` of `job`, or why it does not apply.
pub fn transition(
    run: &RunFacts,
    job: Option<&JobFacts>,
    event: &Event,
) -> Result<Transition, IllegalTransition> {
    use RunState::{Dispatching, Pending, Running};
    let illegal = Err(IllegalTransition { state: run.state, event: event.name() });
    let base = Transition {
        from: run.state,
        to: run.state,
        kill_requested_before: run.kill_requested,
        trigger_code: None,
        trigger_msg: None,
        executor_address: None,
        dispatched: None,
        handle: None,
        started_at: None,
        request_kill: false,
        retry: false,
        children: false,
        send_kill: false,
        next_fire_delay_ms: None,
        alarm: false,
    };
    let transition = match (run.state, event) {
        (Pending, Event::Claim) => Transition { to: Dispatching, ..base },
        // A lease that ran out is taken over; storage checks that it did run out.
        (Dispatching, Event::Claim) => base,
        (Dispatching, Event::Sent { address, at_ms, timeout_secs, grace_ms }) => {
            let deadline =
                if *timeout_secs > 0 { at_ms + timeout_secs * 1000 + grace_ms } else { 0 };
            Transition {
                to: Running,
                trigger_code: Some(code::SUCCESS),
                trigger_msg: Some(format!("sent to {address}")),
                executor_address: Some(address.clone()),
                dispatched: Some((*at_ms, deadline)),
                // A kill asked for while the run was being sent is delivered now.
                send_kill: run.kill_requested,
                ..base
            }
        }
        (Dispatching, Event::NotSent { reason }) => {
            let message = format!("trigger failed: {reason}");
            let to = if run.kill_requested { RunState::Killed } else { RunState::Failed };
            Transition {
                trigger_code: Some(code::FAILURE),
                trigger_msg: Some(clean_message(reason)),
                ..ended(base, run, job, to, code::FAILURE, &message)
            }
        }
        (
            Dispatching | Running,
            Event::Result { handle_code, message, started_at_ms, accepted },
        ) => {
            let (to, handle_code) = match *handle_code {
                code::SUCCESS => (RunState::Success, code::SUCCESS),
                code::TIMEOUT => (RunState::TimedOut, code::TIMEOUT),
                _ if run.kill_requested => (RunState::Killed, code::FAILURE),
                other => {
                    (RunState::Failed, if other == code::PENDING { code::FAILURE } else { other })
                }
            };
            let sent = (run.state == Dispatching).then_some(code::SUCCESS);
            // The result overtook the record of the send. The dispatcher says when the
            // executor took the run if it saw that; else the executor had taken it by the time
            // it started it, the latest instant the send can have been confirmed.
            let (dispatched, trigger_msg) = match (sent, accepted) {
                (Some(_), Some((address, at_ms))) => {
                    (Some((*at_ms, 0)), Some(format!("sent to {address}")))
                }
                (Some(_), None) => (started_at_ms.map(|at_ms| (at_ms, 0)), None),
                (None, _) => (None, None),
            };
            Transition {
                trigger_code: sent,
                trigger_msg,
                dispatched,
                started_at: *started_at_ms,
                ..ended(base, run, job, to, handle_code, message)
            }
        }
        (Pending, Event::Kill) => {
            ended(base, run, job, RunState::Killed, code::FAILURE, "killed before it was sent")
        }
        (Dispatching, Event::Kill) if !run.kill_requested => {
            Transition { request_kill: true, ..base }
        }
        (Running, Event::Kill) => Transition { request_kill: true, send_kill: true, ..base },
        (Pending | Dispatching, Event::Skip { reason })
            if matches!(run.trigger_type, TriggerType::Cron | TriggerType::Misfire) =>
        {
            // Skipped is no failure: nothing raises an alarm or counts it as failed. XXL-JOB
            // has no such state; its handle code says "success" with the reason.
            ended(base, run, job, RunState::Skipped, code::SUCCESS, reason)
        }
        // Discarded at a cap: never sent, so no failure either.
        (Pending, Event::Discard { reason }) => {
            ended(base, run, job, RunState::Skipped, code::SUCCESS, reason)
        }
        // A lost run may still be held where it went (its send was never confirmed, the
        // executor was cut off): it is asked to stop it, at best, before its retry runs.
        (Dispatching | Running, Event::Lost { reason }) => Transition {
            send_kill: true,
            ..ended(base, run, job, RunState::Lost, code::FAILURE, reason)
        },
        (Running, Event::DeadlinePassed) => Transition {
            send_kill: true,
            ..ended(
                base,
                run,
                job,
                RunState::TimedOut,
                code::TIMEOUT,
                "timed out: no result within the job's timeout and the grace period",
            )
        },
        _ => return illegal,
    };
    Ok(transition)
}

/// A transition to the terminal state `to`, with its consequences.
fn ended(
    base: Transition,
    run: &RunFacts,
    job: Option<&JobFacts>,
    to: RunState,
    handle_code: i32,
    message: &str,
) -> Transition {
    let retries_left = job.is_some_and(|job| run.attempt < job.retry_count);
    let failure = matches!(to, RunState::Failed | RunState::TimedOut | RunState::Lost);
    let retry = failure && retries_left;
    Transition {
        to,
        handle: Some((handle_code, clean_message(message))),
        retry,
        children: to == RunState::Success && job.is_some_and(|job| job.has_children),
        // A retry continues the fire: the delay counts from the end of the last attempt.
        next_fire_delay_ms: job
            .and_then(|job| job.fix_delay_ms)
            .filter(|_| run.from_fire && !retry),
        alarm: failure && !retry,
        ..base
    }
}

/// A message made safe to store anywhere: NUL bytes (which PostgreSQL refuses in text) become
/// U+FFFD, and the text is cut at [`MAX_MESSAGE_BYTES`] on a character boundary.
pub fn clean_message(message: &str) -> String {
    let mut clean: String = message.replace('\0', "\u{fffd}");
    if clean.len() > MAX_MESSAGE_BYTES {
        let mut cut = MAX_MESSAGE_BYTES;
        while !clean.is_char_boundary(cut) {
            cut -= 1;
        }
        clean.truncate(cut);
    }
    clean
}

#[cfg(test)]
mod tests;
