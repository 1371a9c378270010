//! Fire times: parses a job's schedule (`CRON`, `FIX_RATE`, `FIX_DELAY`, `ONCE`, `NONE`) and
//! answers "when does it fire next?" and "what happens to the fire that is due now?".
//!
//! The scheduler loop owns the clock and the database; it hands this module a job's schedule
//! configuration and instants in milliseconds since the Unix epoch (UTC), and gets instants back.
//! Everything here is pure: no IO, no async, no clock reads (`now` is always a parameter). It
//! deliberately does not store next fire times, lock jobs or create runs, and it never catches up
//! on a backlog: a late fire yields at most one run (see [`decide`]).
//!
//! # Cron expressions
//!
//! Cron expressions are Quartz's, with seconds: `sec min hour dom mon dow [year]`, evaluated by
//! our own engine (`cron.rs`) so that a job fires when it fired under XXL-JOB, which uses
//! Quartz's `CronExpression`. `src/schedule/quartz_vectors.tsv` holds answers recorded from
//! Quartz 2.3.2 and a test replays them all. The engine reads:
//!
//! - Values, names in any case (`JAN`–`DEC`, `SUN`–`SAT`; day-of-week 1 is Sunday), lists,
//!   ranges, ranges that wrap around (`FRI-MON`, `22-2`, `NOV-FEB`, `50-10`), and steps on all
//!   of them and on `*` (`0/15`, `*/2`, `8-18/3`, `2025/2` in the year).
//! - `?` in exactly one of day-of-month and day-of-week (Quartz refuses both or neither).
//! - Day-of-month: `L` (last day), `L-n` (n days before it, n ≤ 30), `LW` and `L-nW` (the
//!   nearest weekday to those), `nW` (the weekday nearest to day n, never leaving the month).
//!   `L` takes no other values in the list.
//! - Day-of-week: `L` alone (Saturday, 7), `nL` (the last such day of the month), `n#k` (the
//!   k-th, k from 1 to 5). `L` takes no other values in the list and `#` appears at most once.
//! - Years from 1970, and fires up to 100 years ahead ([`HORIZON_YEARS`]). Quartz stops at its
//!   current year plus 100, read from the clock; this module reads no clock and counts from the
//!   year of the instant it is asked about ([`Schedule::next_n`]: the first), which for a
//!   scheduler asking about the present is the same. So in 2026 `0 0 12 1 1 ? 2126` fires and
//!   `? 2 2#5` has fires after 2099, and an expression that never matches (`0 0 0 30 2 ?`) has
//!   no next fire, found after about 1,200 month checks.
//!
//! Quartz's leniencies are kept, since expressions that work under XXL-JOB must keep working:
//! what follows a complete value is ignored (`MONDAY` reads as `MON`, `5X` as `5`, and a step
//! after a name too, so `JAN/3` is January and `MON-FRI/2` is every weekday), `W` after a range
//! is ignored, a step of 0 means the start alone, fields after the seventh are ignored, and in
//! day-of-month `W` and in day-of-week `#` and `nL` apply to the smallest value of the list
//! (`1,15W` is `1W`, `6#1,2` is the first Monday). So is a quirk of `nW` for a day one past the
//! end of a month, described at `CronExpr::overflow_weekday` and `CronExpr::skipped_month`.
//! XXL-JOB 2.1 to 3.0 carry this parser of Quartz 2.3; from 3.1, XXL-JOB carries Quartz 2.5's,
//! which accepts `L` among other days of the month, reads `1,15W` as two days, and refuses an
//! eighth field. This engine follows Quartz 2.3.2 (`schedule/quartz_vectors.md` says why).
//!
//! Where Quartz itself breaks, this engine does not follow: `L-30W` (Quartz loops forever in
//! short months) fires on the nearest weekday of day 1 in 31-day months; an empty list (`,`)
//! is refused; the year 99 is the year 99, not Quartz's internal marker for `*`. `L` fires on
//! the last day of every month, including those shorter than 31 days: copies of the Quartz code
//! bundled with XXL-JOB have been reported to skip them, and Quartz 2.3.2 does not.
//! A refused expression gets an error naming the field and the character offset.
//!
//! # Daylight saving
//!
//! Expressions match the wall clock of the job's time zone (UTC by default). When that clock
//! jumps, a job neither loses nor doubles a fixed-time fire, and a repeating job keeps its pace
//! in real time (as cronie does):
//!
//! - A fixed-time schedule (its hour field is neither `*` nor a step) whose wall time falls in a
//!   spring-forward gap fires once, at the first instant after the gap: a daily `0 30 2 * * ?`
//!   in Europe/Berlin fires at 03:00 CEST on the transition day. Several matches in one gap
//!   collapse into that one fire.
//! - In a repeated hour (fall back), a fixed-time schedule fires once, on the first pass.
//! - A schedule whose hour field is `*` or a step repeats across hours: it fires at each
//!   matching wall time that exists, so wall times in a gap are skipped, and the repeated hour
//!   fires on both passes. `0 0/10 * * * ?` fires every 10 real minutes through a fall-back
//!   hour, 12 fires in that wall hour pair.
//!
//! Quartz instead skips fixed times that fall in a gap and fires a repeated hour's wall times on
//! its second pass only; the recorded vectors mark those cases as deliberate differences.
//!
//! # Fixed delay and one-shot schedules
//!
//! `FIX_DELAY` (Spring's `fixedDelay`, PowerJob's fixed delay) fires N seconds after the previous
//! fire's runs ended, so it never overlaps itself. Its next fire is not a function of the
//! previous fire: [`decide`] answers [`NextFire::WhenRunsEnd`], and the run lifecycle sets the
//! next fire (the end plus the delay) in the transaction that ends the fire's last run, after
//! its retries (`lifecycle`). [`Schedule::next_after`] therefore answers only the first fire of a
//! job started at that instant, and [`Schedule::next_n`] gives at most that one.
//!
//! `ONCE` fires at one RFC 3339 instant (`2026-05-01T09:00:00+02:00`) and then has no next fire:
//! the scheduler stops the job, which stays defined, as XXL-JOB stops a job without a next fire.
//!
//! # Misfires
//!
//! A fire later than the job's misfire threshold ([`DEFAULT_MISFIRE_THRESHOLD_MS`], 5 s as in
//! XXL-JOB, unless the job sets its own) follows its misfire strategy; see [`decide`].
#![warn(missing_docs)]

pub mod calendar;
mod cron;
mod zone;

use std::str::FromStr;

use chrono::Datelike;
use chrono_tz::Tz;

use self::cron::CronExpr;
pub use self::cron::{CronError, Field as CronField};
pub use crate::model::DEFAULT_MISFIRE_THRESHOLD_MS;
use crate::model::{MisfireStrategy, ScheduleType, TriggerType};

/// The longest accepted `FIX_RATE`, in seconds: one year of 365 days.
pub const MAX_FIX_RATE_SECS: i64 = 31_536_000;

/// How many years past the year asked about a cron expression may fire: Quartz's limit is its
/// current year plus 100.
pub const HORIZON_YEARS: i32 = 100;

/// Why a schedule configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The `CRON` configuration is not a Quartz expression (Quartz would refuse it too).
    #[error("invalid cron expression `{expr}`: {reason}")]
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// What is wrong with it, naming the field and the position.
        reason: String,
        /// The field at fault, or `None` when the expression has too few fields.
        field: Option<CronField>,
        /// The character offset (from 0) in the expression where the problem was found.
        position: usize,
    },
    /// The `FIX_RATE` configuration is not a whole number of seconds in range.
    #[error(
        "invalid fix rate `{conf}`: expected a whole number of seconds from 1 to {MAX_FIX_RATE_SECS}"
    )]
    InvalidFixRate {
        /// The configuration as given.
        conf: String,
    },
    /// The `FIX_DELAY` configuration is not a whole number of seconds in range.
    #[error(
        "invalid fix delay `{conf}`: expected a whole number of seconds from 1 to {MAX_FIX_RATE_SECS}"
    )]
    InvalidFixDelay {
        /// The configuration as given.
        conf: String,
    },
    /// The `ONCE` configuration is not an RFC 3339 instant.
    #[error(
        "invalid instant `{conf}`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00"
    )]
    InvalidInstant {
        /// The configuration as given.
        conf: String,
    },
    /// A `NONE` schedule came with a configuration, which would never be used; refusing it
    /// catches a job that was meant to be scheduled.
    #[error("schedule type NONE takes no configuration, got `{conf}`")]
    UnexpectedConf {
        /// The configuration as given.
        conf: String,
    },
    /// The time zone is not an IANA name known to `chrono-tz`.
    #[error("unknown time zone `{name}`")]
    UnknownTimeZone {
        /// The name as given.
        name: String,
    },
}

/// A parsed, validated schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    rule: Rule,
}

/// How fire times are computed; one variant per [`ScheduleType`].
#[derive(Debug, Clone)]
enum Rule {
    /// A cron expression read on the wall clock of `zone`.
    Cron { cron: Box<CronExpr>, zone: Tz },
    /// The previous fire plus `rate_ms`.
    FixRate { rate_ms: i64 },
    /// The end of the previous fire's runs plus `delay_ms`.
    FixDelay { delay_ms: i64 },
    /// Only at `at_ms`.
    Once { at_ms: i64 },
    /// No fires of its own.
    None,
}

impl Schedule {
    /// Parses `conf` for `kind`.
    ///
    /// `CRON` takes a Quartz expression of 6 or 7 fields (see the module doc); `FIX_RATE` and
    /// `FIX_DELAY` a whole number of seconds from 1 to [`MAX_FIX_RATE_SECS`]; `ONCE` an RFC 3339
    /// instant with its offset; `NONE` an empty or blank `conf` (anything else is
    /// [`ScheduleError::UnexpectedConf`]).
    /// Surrounding whitespace is allowed. `time_zone` is an IANA name, `None` meaning UTC; it is
    /// checked whatever the kind, though only cron expressions use it.
    pub fn parse(
        kind: ScheduleType,
        conf: &str,
        time_zone: Option<&str>,
    ) -> Result<Schedule, ScheduleError> {
        let zone = match time_zone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name)
                .map_err(|_| ScheduleError::UnknownTimeZone { name: name.to_owned() })?,
        };
        let rule = match kind {
            ScheduleType::Cron => Rule::Cron { cron: Box::new(parse_quartz(conf)?), zone },
            ScheduleType::FixRate => Rule::FixRate {
                rate_ms: parse_rate(conf)
                    .ok_or_else(|| ScheduleError::InvalidFixRate { conf: conf.to_owned() })?
                    * 1000,
            },
            ScheduleType::FixDelay => Rule::FixDelay {
                delay_ms: parse_rate(conf)
                    .ok_or_else(|| ScheduleError::InvalidFixDelay { conf: conf.to_owned() })?
                    * 1000,
            },
            ScheduleType::Once => Rule::Once {
                at_ms: chrono::DateTime::parse_from_rfc3339(conf.trim())
                    .map_err(|_| ScheduleError::InvalidInstant { conf: conf.to_owned() })?
                    .timestamp_millis(),
            },
            ScheduleType::None if conf.trim().is_empty() => Rule::None,
            ScheduleType::None => {
                return Err(ScheduleError::UnexpectedConf { conf: conf.to_owned() });
            }
        };
        Ok(Schedule { rule })
    }

    /// The kind of schedule this is.
    pub fn kind(&self) -> ScheduleType {
        match self.rule {
            Rule::Cron { .. } => ScheduleType::Cron,
            Rule::FixRate { .. } => ScheduleType::FixRate,
            Rule::FixDelay { .. } => ScheduleType::FixDelay,
            Rule::Once { .. } => ScheduleType::Once,
            Rule::None => ScheduleType::None,
        }
    }

    /// The delay of a `FIX_DELAY` schedule, in ms.
    pub fn fix_delay_ms(&self) -> Option<i64> {
        match self.rule {
            Rule::FixDelay { delay_ms } => Some(delay_ms),
            _ => None,
        }
    }

    /// The first fire time strictly after `after_ms` (ms since the Unix epoch, UTC), or `None`
    /// for a `NONE` schedule, a cron expression with no match up to the end of the year
    /// [`HORIZON_YEARS`] after that of `after_ms`, or an overflow.
    ///
    /// A cron fire is always on a whole second; `FIX_RATE` returns `after_ms` plus the rate,
    /// keeping its milliseconds (XXL-JOB: the next fire is the previous fire plus the rate).
    /// `FIX_DELAY` returns `after_ms` plus the delay: the first fire of a job started, or whose
    /// last run ended, at `after_ms`. `ONCE` returns its instant if it is after `after_ms`.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.next_within(after_ms, last_year(after_ms))
    }

    /// Up to `count` successive fire times after `after_ms`, in increasing order.
    ///
    /// A `FIX_DELAY` schedule gives at most its first fire: the fires after it depend on how
    /// long its runs take. Cron fires stop 100 years after the year of `after_ms`, the first
    /// instant asked about, as Quartz's fires stop at its current year plus 100.
    pub fn next_n(&self, after_ms: i64, count: usize) -> Vec<i64> {
        let count = if matches!(self.rule, Rule::FixDelay { .. }) { count.min(1) } else { count };
        let last_year = last_year(after_ms);
        // A plain loop rather than `iter::successors`, which would search for one fire more.
        let mut fires = Vec::new();
        let mut cursor = after_ms;
        while fires.len() < count
            && let Some(next) = self.next_within(cursor, last_year)
        {
            fires.push(next);
            cursor = next;
        }
        fires
    }

    /// [`Schedule::next_after`], with cron fires up to the end of `last_year`.
    fn next_within(&self, after_ms: i64, last_year: i32) -> Option<i64> {
        match &self.rule {
            Rule::Cron { cron, zone } => next_cron(cron, *zone, after_ms, last_year),
            Rule::FixRate { rate_ms } => after_ms.checked_add(*rate_ms),
            Rule::FixDelay { delay_ms } => after_ms.checked_add(*delay_ms),
            Rule::Once { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
            Rule::None => None,
        }
    }
}

/// Parses a Quartz expression, keeping the field and position of a refusal.
fn parse_quartz(expr: &str) -> Result<CronExpr, ScheduleError> {
    CronExpr::parse(expr).map_err(|error| ScheduleError::InvalidCron {
        expr: expr.to_owned(),
        reason: error.to_string(),
        field: error.field,
        position: error.position,
    })
}

/// Reads a rate or delay in whole seconds; signs, fractions and out-of-range values are refused.
fn parse_rate(conf: &str) -> Option<i64> {
    let text = conf.trim();
    let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    digits
        .then(|| text.parse::<i64>().ok())
        .flatten()
        .filter(|secs| (1..=MAX_FIX_RATE_SECS).contains(secs))
}

/// The last year a cron fire may fall in when asked about `at_ms`: its year (UTC) plus 100.
fn last_year(at_ms: i64) -> i32 {
    chrono::DateTime::from_timestamp_millis(at_ms)
        .map_or(cron::LAST_YEAR, |at| at.year().saturating_add(HORIZON_YEARS))
}

/// The first cron fire strictly after `after_ms` and up to the end of `last_year`, following
/// the module's DST policy.
fn next_cron(cron: &CronExpr, zone: Tz, after_ms: i64, last_year: i32) -> Option<i64> {
    // Fires fall on whole seconds, so "after the second containing `after_ms`" is the same as
    // "strictly after `after_ms`".
    let fire = zone::next_fire(cron, zone, after_ms.div_euclid(1000), last_year)?;
    fire.checked_mul(1000)
}

/// What the scheduler does when it reaches a job whose next fire time is `scheduled_ms` at
/// `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireDecision {
    /// The run to create now, if any: (its scheduled instant in ms, its trigger type). On time:
    /// (scheduled_ms, TriggerType::Cron). Misfired + FIRE_ONCE_NOW: (now_ms,
    /// TriggerType::Misfire). Misfired + DO_NOTHING: None.
    pub fire: Option<(i64, TriggerType)>,
    /// The job's next fire after this one.
    pub next: NextFire,
}

/// A job's next fire, as the scheduler records it with a fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextFire {
    /// At this instant (ms): for an on-time fire, `next_after(scheduled_ms)`; for a misfire,
    /// `next_after(now_ms)`, never a burst of catch-up fires.
    At(i64),
    /// `FIX_DELAY`: once this fire's runs have ended, their end plus the delay. The job keeps
    /// running without a next fire time until then.
    WhenRunsEnd,
    /// The schedule has no further fire: the job stops.
    Never,
}

impl NextFire {
    /// The instant, if there is one.
    pub fn at(self) -> Option<i64> {
        match self {
            NextFire::At(at_ms) => Some(at_ms),
            NextFire::WhenRunsEnd | NextFire::Never => None,
        }
    }
}

/// Decides what to do with the fire due at `scheduled_ms`, given `now_ms >= scheduled_ms -
/// lookahead` (a fire slightly in the future, up to a few seconds, counts as on time and keeps
/// its scheduled instant).
///
/// A fire up to `misfire_threshold_ms` late (the job's, [`DEFAULT_MISFIRE_THRESHOLD_MS`] unless
/// it sets one) is on time; the next fire of an on-time fire may itself already be due (an
/// every-second cron at 4 s late), which the scheduler's next pass handles. A `NONE` schedule
/// never fires on its own, so a stale next fire time yields nothing. A `FIX_DELAY` fire waits
/// for its runs to end ([`NextFire::WhenRunsEnd`]); a skipped `FIX_DELAY` misfire has no runs to
/// wait for, so its next fire is the delay from now.
pub fn decide(
    schedule: &Schedule,
    misfire: MisfireStrategy,
    misfire_threshold_ms: i64,
    scheduled_ms: i64,
    now_ms: i64,
) -> FireDecision {
    let next_after =
        |after_ms: i64| schedule.next_after(after_ms).map_or(NextFire::Never, NextFire::At);
    if schedule.kind() == ScheduleType::None {
        return FireDecision { fire: None, next: NextFire::Never };
    }
    let fire = if now_ms.saturating_sub(scheduled_ms) <= misfire_threshold_ms {
        Some((scheduled_ms, TriggerType::Cron))
    } else {
        match misfire {
            MisfireStrategy::FireOnceNow => Some((now_ms, TriggerType::Misfire)),
            MisfireStrategy::DoNothing => None,
        }
    };
    let next = match fire {
        Some(_) if schedule.kind() == ScheduleType::FixDelay => NextFire::WhenRunsEnd,
        Some((_, TriggerType::Cron)) => next_after(scheduled_ms),
        _ => next_after(now_ms),
    };
    FireDecision { fire, next }
}

#[cfg(test)]
mod tests;
