//! Backfills: which past instants of a job's schedule a backfill covers, and how many of their
//! runs it may release now.
//!
//! A backfill (Airflow's `dags backfill`, DolphinScheduler's complement data) creates one run
//! for every instant the job's schedule would have fired in a window `[from, to]`, each run
//! seeing that instant as its trigger time. The admin's driver (`admin::backfill`) walks the
//! window from a cursor, the last instant released, and asks [`release_count`] how many
//! instants to release at each step; storage keeps the cursor and the runs.
//!
//! Everything here is pure: instants are milliseconds since the Unix epoch, and the counts of
//! unfinished runs come in as parameters. It does not create runs, hold leases or read clocks.
#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

use crate::model::ScheduleType;
use crate::schedule::calendar::Calendar;
use crate::schedule::{Schedule, ScheduleError};

/// The most instants one backfill covers.
pub const MAX_INSTANTS: u64 = 100_000;
/// The most runs a backfill may have unfinished at once, whatever it asks for.
pub const MAX_CONCURRENT: i64 = 1_000;
/// The most instants one release step creates, so that one transaction stays short.
pub const MAX_RELEASE: u64 = 256;

/// Why a backfill was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackfillError {
    /// The schedule has no instants of its own to go back over: `NONE` never fires, and a
    /// `FIX_DELAY` job's fires depend on when its runs ended.
    #[error(
        "a {0} job has no past fire instants to backfill: only CRON, FIX_RATE and ONCE jobs can be backfilled"
    )]
    NotBackfillable(ScheduleType),
    /// `from` is after `to`.
    #[error("the window is empty: `from` is after `to`")]
    Reversed,
    /// The window holds more than [`MAX_INSTANTS`] instants.
    #[error(
        "the window holds more than {MAX_INSTANTS} fire instants: split it into several backfills"
    )]
    TooManyInstants,
    /// The stored schedule no longer parses.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// Where a backfill is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackfillState {
    /// Releasing its instants' runs.
    Running,
    /// Releasing nothing until resumed; runs released before still finish.
    Paused,
    /// Stopped for good by an operator (or because its job is gone); runs released before
    /// still finish.
    Cancelled,
    /// Every instant was released and every released run ended.
    Done,
}

impl BackfillState {
    /// Every value, in declaration order.
    pub const ALL: &'static [BackfillState] = &[
        BackfillState::Running,
        BackfillState::Paused,
        BackfillState::Cancelled,
        BackfillState::Done,
    ];

    /// The spelling stored and shown: `running`, `paused`, `cancelled`, `done`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillState::Running => "running",
            BackfillState::Paused => "paused",
            BackfillState::Cancelled => "cancelled",
            BackfillState::Done => "done",
        }
    }

    /// Whether the backfill can change no more.
    pub fn is_final(self) -> bool {
        matches!(self, BackfillState::Cancelled | BackfillState::Done)
    }
}

impl FromStr for BackfillState {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        BackfillState::ALL
            .iter()
            .copied()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| format!("unknown backfill state `{text}`"))
    }
}

impl fmt::Display for BackfillState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backfill as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backfill {
    /// Its id.
    pub id: i64,
    /// The job it runs.
    pub job_id: i64,
    /// The window's first instant (ms), inclusive.
    pub from_ms: i64,
    /// The window's last instant (ms), inclusive.
    pub to_ms: i64,
    /// The most of its runs unfinished at once.
    pub max_concurrent: i64,
    /// Whether instants that already have a run get another.
    pub rerun: bool,
    /// The schedule it walks, as the job had it when the backfill was created.
    pub window: WindowSchedule,
    /// How many instants the window holds.
    pub total: i64,
    /// How many instants were released (their runs created, or found to exist).
    pub released: i64,
    /// The last instant released, or `from_ms - 1` before the first.
    pub cursor_ms: i64,
    /// Where it is in its life.
    pub state: BackfillState,
    /// Why it was cancelled by the admin rather than an operator (its job was deleted), or
    /// empty.
    pub reason: String,
    /// Who created it.
    pub created_by: String,
    /// When it was created (ms).
    pub created_at_ms: i64,
    /// When it last changed (ms).
    pub updated_at_ms: i64,
    /// When it was cancelled or done (ms), or 0.
    pub finished_at_ms: i64,
}

/// The schedule a backfill walks: the job's at the backfill's creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSchedule {
    /// `CRON`, `FIX_RATE` or `ONCE`.
    pub schedule_type: ScheduleType,
    /// The schedule's configuration.
    pub schedule_conf: String,
    /// The IANA time zone of a cron expression, `None` for UTC.
    pub time_zone: Option<String>,
    /// A `FIX_RATE` schedule's fires are this instant plus whole multiples of the rate: the
    /// job's next fire when it had one, else the window's start.
    pub anchor_ms: i64,
}

/// How far a backfill got, counted in instants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Instants whose runs all succeeded.
    pub done: i64,
    /// Instants with a run that failed, timed out, was killed, lost or skipped.
    pub failed: i64,
    /// Instants that already had a run, so this backfill (without rerun) made none.
    pub skipped: i64,
    /// Instants with a run not ended yet.
    pub running: i64,
    /// Instants not released yet.
    pub pending: i64,
}

impl Progress {
    /// Instants not finished: released and running, or not released yet.
    pub fn remaining(&self) -> i64 {
        self.running + self.pending
    }
}

/// The fire instants of a window's schedule, one after another, less those its job's business
/// calendar excludes.
#[derive(Debug, Clone)]
pub struct Instants {
    rule: Rule,
    calendar: Option<std::sync::Arc<Calendar>>,
}

/// The most excluded spans one step over the instants passes before it gives up (a calendar
/// that excludes everything ends the walk, it does not loop).
const MAX_EXCLUDED_SPANS: u32 = 100_000;

#[derive(Debug, Clone)]
enum Rule {
    /// Cron and one-shot schedules: their own next fire.
    Schedule(Schedule),
    /// A fixed rate from an anchor.
    Rate { anchor_ms: i64, rate_ms: i64 },
}

impl Instants {
    /// The instants of `window`, or why it cannot be backfilled.
    pub fn new(window: &WindowSchedule) -> Result<Instants, BackfillError> {
        let kind = window.schedule_type;
        if matches!(kind, ScheduleType::None | ScheduleType::FixDelay) {
            return Err(BackfillError::NotBackfillable(kind));
        }
        let schedule = Schedule::parse(kind, &window.schedule_conf, window.time_zone.as_deref())?;
        let rule = match kind {
            // A fixed rate's next fire is the previous one plus the rate.
            ScheduleType::FixRate => Rule::Rate {
                anchor_ms: window.anchor_ms,
                rate_ms: schedule.next_after(0).unwrap_or(1000).max(1),
            },
            _ => Rule::Schedule(schedule),
        };
        Ok(Instants { rule, calendar: None })
    }

    /// These instants less those `calendar` excludes.
    pub fn except(self, calendar: Option<std::sync::Arc<Calendar>>) -> Instants {
        Instants { calendar, ..self }
    }

    /// The first instant strictly after `cursor_ms` that the calendar does not exclude.
    pub fn next_after(&self, cursor_ms: i64) -> Option<i64> {
        let mut cursor = cursor_ms;
        for _ in 0..MAX_EXCLUDED_SPANS {
            let next = self.next_fire_after(cursor)?;
            match self.calendar.as_ref().and_then(|calendar| calendar.excluded(next)) {
                None => return Some(next),
                // Past the excluded span at once: the next fire at or after its end.
                Some(exclusion) => cursor = exclusion.until_ms.max(next + 1) - 1,
            }
        }
        None
    }

    /// The schedule's first fire strictly after `cursor_ms`, calendar aside.
    fn next_fire_after(&self, cursor_ms: i64) -> Option<i64> {
        match &self.rule {
            Rule::Schedule(schedule) => schedule.next_after(cursor_ms),
            Rule::Rate { anchor_ms, rate_ms } => {
                let steps = cursor_ms.checked_sub(*anchor_ms)?.div_euclid(*rate_ms);
                steps.checked_add(1)?.checked_mul(*rate_ms)?.checked_add(*anchor_ms)
            }
        }
    }

    /// Up to `count` instants after `cursor_ms`, none past `to_ms`, in time order.
    pub fn next_n(&self, cursor_ms: i64, to_ms: i64, count: u64) -> Vec<i64> {
        let mut instants = Vec::new();
        let mut cursor = cursor_ms;
        while (instants.len() as u64) < count
            && let Some(next) = self.next_after(cursor).filter(|next| *next <= to_ms)
        {
            instants.push(next);
            cursor = next;
        }
        instants
    }

    /// How many instants `[from_ms, to_ms]` holds, or [`BackfillError::TooManyInstants`] past
    /// [`MAX_INSTANTS`].
    pub fn count(&self, from_ms: i64, to_ms: i64) -> Result<i64, BackfillError> {
        if from_ms > to_ms {
            return Err(BackfillError::Reversed);
        }
        let mut count = 0_u64;
        let mut cursor = from_ms - 1;
        while let Some(next) = self.next_after(cursor).filter(|next| *next <= to_ms) {
            count += 1;
            if count > MAX_INSTANTS {
                return Err(BackfillError::TooManyInstants);
            }
            cursor = next;
        }
        Ok(count as i64)
    }
}

/// What the driver knows when it considers releasing more of a backfill's instants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseFacts {
    /// The backfill's bound on its unfinished runs.
    pub max_concurrent: i64,
    /// The backfill's runs not ended.
    pub unfinished: i64,
    /// Runs per instant (shards), at least 1.
    pub runs_per_instant: i64,
    /// How many more runs the admin's bound on unfinished runs leaves to backfills
    /// ([`room_for_backfills`]).
    pub room: u64,
}

/// How many instants to release now: as many as keep the backfill's unfinished runs within its
/// `max_concurrent` and the admin's within the room left to backfills, at most [`MAX_RELEASE`].
/// A sharded job's instant is released whole or not at all, so an instant of more shards than
/// `max_concurrent` is released alone once nothing else of the backfill runs.
pub fn release_count(facts: &ReleaseFacts) -> u64 {
    let per_instant = facts.runs_per_instant.max(1);
    let free = facts.max_concurrent.saturating_sub(facts.unfinished);
    let by_concurrency = if facts.unfinished == 0 && free < per_instant {
        1
    } else {
        u64::try_from(free / per_instant).unwrap_or(0)
    };
    let by_room = facts.room / u64::try_from(per_instant).unwrap_or(1);
    by_concurrency.min(by_room).min(MAX_RELEASE)
}

/// How many more runs backfills may add while `unfinished` runs are unfinished under a bound of
/// `limit` (`--max-unfinished-runs`, `None` for none): backfills keep out of the last quarter
/// of the bound, which stays for scheduled fires, manual triggers, retries and child runs.
pub fn room_for_backfills(limit: Option<u64>, unfinished: u64) -> u64 {
    match limit {
        None => u64::MAX,
        Some(limit) => (limit - limit / 4).saturating_sub(unfinished),
    }
}

#[cfg(test)]
mod tests;
