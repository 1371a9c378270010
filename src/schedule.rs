//! Fire times: parses a job's schedule (`CRON`, `FIX_RATE`, `NONE`) and answers "when does it
//! fire next?" and "what happens to the fire that is due now?".
//!
//! The scheduler loop owns the clock and the database; it hands this module a job's schedule
//! configuration and instants in milliseconds since the Unix epoch (UTC), and gets instants back.
//! Everything here is pure: no IO, no async, no clock reads (`now` is always a parameter). It
//! deliberately does not store next fire times, lock jobs or create runs, and it never catches up
//! on a backlog: a late fire yields at most one run (see [`decide`]).
//!
//! Cron expressions are Quartz's, with seconds: `sec min hour dom mon dow [year]`. The `croner`
//! crate matches them against the wall clock of the job's time zone (UTC by default); this module
//! turns the matching wall times into instants, with this daylight-saving policy:
//!
//! - Spring forward: wall times in the gap do not exist, so every matching wall time in the gap
//!   collapses into one fire at the first instant after the gap. A daily `0 30 2 * * ?` in
//!   Europe/Berlin fires at 03:00 CEST on the transition day.
//! - Fall back: a wall time fires at most once, at its first occurrence, so the second pass of
//!   the repeated hour fires nothing, for fixed times and intervals alike: `0 0/10 * * * ?` is
//!   silent for that hour rather than fire twice per wall time.
//!
//! Not supported by the underlying cron library (croner 3), and what this module does about it:
//! - Its day-of-week numbering is Unix's (0 = SUN, 1 = MON); this module turns on its Quartz
//!   mode (1 = SUN .. 7 = SAT, as in XXL-JOB), where `0` is rejected.
//! - `LW`, `L-3` and a bare `W` in day-of-month are rejected.
//! - Wrap-around ranges (`FRI-MON`, `22-2`, even `MON-SUN`) are rejected.
//! - It ORs a restricted day-of-month with a restricted day-of-week; Quartz refuses the
//!   combination, and so does this module. `*` is accepted where Quartz insists on `?`.
//! - A bare `L` in day-of-week never matches; it is rewritten to `7` (Saturday), its Quartz
//!   meaning.
//! - Searches stop at the year 5000 (Quartz's year field stops at 2099), so an expression that
//!   never matches (`0 0 0 30 2 ?`) has no next fire, found after a search of tens of
//!   milliseconds.
#![warn(missing_docs)]

use std::str::FromStr;

use chrono::{DateTime, MappedLocalTime, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

use crate::model::{MisfireStrategy, ScheduleType, TriggerType};

/// A fire more than this late is a misfire (XXL-JOB uses 5 s).
pub const MISFIRE_THRESHOLD_MS: i64 = 5_000;

/// The longest accepted `FIX_RATE`, in seconds: one year of 365 days.
pub const MAX_FIX_RATE_SECS: i64 = 31_536_000;

/// The first second croner can search from: 0001-01-01T00:00:00Z.
const FIRST_SEARCHABLE_SEC: i64 = -62_135_596_800;

/// The second at which croner gives up searching: 5000-01-01T00:00:00Z.
const LAST_SEARCHABLE_SEC: i64 = 95_617_584_000;

/// An upper bound on the length of a DST gap or overlap; Samoa's 2011 gap of a whole day is the
/// longest on record.
const MAX_TRANSITION_SECS: i64 = 3 * 86_400;

/// Why a schedule configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The `CRON` configuration is not a Quartz expression this module can evaluate.
    #[error("invalid cron expression `{expr}`: {reason}")]
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `FIX_RATE` configuration is not a whole number of seconds in range.
    #[error(
        "invalid fix rate `{conf}`: expected a whole number of seconds from 1 to {MAX_FIX_RATE_SECS}"
    )]
    InvalidFixRate {
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
    Cron { cron: Box<Cron>, zone: Tz },
    /// The previous fire plus `rate_ms`.
    FixRate { rate_ms: i64 },
    /// No fires of its own.
    None,
}

impl Schedule {
    /// Parses `conf` for `kind`.
    ///
    /// `CRON` takes a Quartz expression of 6 or 7 fields (see the module doc for what is not
    /// supported); `FIX_RATE` a whole number of seconds from 1 to [`MAX_FIX_RATE_SECS`];
    /// `NONE` an empty or blank `conf` (anything else is [`ScheduleError::UnexpectedConf`]).
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
            ScheduleType::FixRate => Rule::FixRate { rate_ms: parse_rate(conf)? * 1000 },
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
            Rule::None => ScheduleType::None,
        }
    }

    /// The first fire time strictly after `after_ms` (ms since the Unix epoch, UTC), or `None`
    /// for a `NONE` schedule, a cron expression with no match before the year 5000, or an
    /// overflow.
    ///
    /// A cron fire is always on a whole second; `FIX_RATE` returns `after_ms` plus the rate,
    /// keeping its milliseconds (XXL-JOB: the next fire is the previous fire plus the rate).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match &self.rule {
            Rule::Cron { cron, zone } => next_cron(cron, *zone, after_ms),
            Rule::FixRate { rate_ms } => after_ms.checked_add(*rate_ms),
            Rule::None => None,
        }
    }

    /// Up to `count` successive fire times after `after_ms`, in increasing order.
    pub fn next_n(&self, after_ms: i64, count: usize) -> Vec<i64> {
        // A plain loop rather than `iter::successors`, which would search for one fire more.
        let mut fires = Vec::new();
        let mut cursor = after_ms;
        while fires.len() < count
            && let Some(next) = self.next_after(cursor)
        {
            fires.push(next);
            cursor = next;
        }
        fires
    }
}

/// Checks the Quartz rules croner does not enforce, then parses with croner in Quartz mode.
fn parse_quartz(expr: &str) -> Result<Cron, ScheduleError> {
    let invalid = |reason: String| ScheduleError::InvalidCron { expr: expr.to_owned(), reason };
    let mut fields: Vec<&str> = expr.split_whitespace().collect();
    if !(6..=7).contains(&fields.len()) {
        return Err(invalid(format!(
            "expected 6 or 7 fields (sec min hour dom mon dow [year]), found {}",
            fields.len()
        )));
    }
    let restricted = |field: &str| field != "*" && field != "?";
    if restricted(fields[3]) && restricted(fields[5]) {
        return Err(invalid(
            "day-of-month and day-of-week are both set; one of them must be `?`".to_owned(),
        ));
    }
    if fields[5].eq_ignore_ascii_case("L") {
        fields[5] = "7";
    }
    CronParser::builder()
        .seconds(Seconds::Required)
        .alternative_weekdays(true)
        .build()
        .parse(&fields.join(" "))
        .map_err(|error| invalid(error.to_string()))
}

/// Reads a rate in whole seconds; signs, fractions and out-of-range values are refused.
fn parse_rate(conf: &str) -> Result<i64, ScheduleError> {
    let text = conf.trim();
    let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    digits
        .then(|| text.parse::<i64>().ok())
        .flatten()
        .filter(|secs| (1..=MAX_FIX_RATE_SECS).contains(secs))
        .ok_or_else(|| ScheduleError::InvalidFixRate { conf: conf.to_owned() })
}

/// The first cron fire strictly after `after_ms`, following the module's DST policy.
fn next_cron(cron: &Cron, zone: Tz, after_ms: i64) -> Option<i64> {
    // Fires fall on whole seconds, so "after the second containing `after_ms`" is the same as
    // "strictly after `after_ms`".
    let after_sec = after_ms.div_euclid(1000);
    if !(FIRST_SEARCHABLE_SEC..LAST_SEARCHABLE_SEC).contains(&after_sec) {
        return None;
    }
    let after = DateTime::from_timestamp(after_sec, 0)?;
    let mut wall = after.with_timezone(&zone).naive_local();
    // In the second pass of a fall-back overlap, every wall time up to the end of the overlap
    // already had its first occurrence, so the search resumes where the overlap ends.
    if let MappedLocalTime::Ambiguous(_, second_pass) = zone.from_local_datetime(&wall)
        && second_pass == after
    {
        let end = first_wall_where(wall, |w| {
            !matches!(zone.from_local_datetime(&w), MappedLocalTime::Ambiguous(..))
        })?;
        wall = end.checked_sub_signed(TimeDelta::seconds(1))?;
    }
    // Croner runs on naive wall times dressed as UTC, which has no DST: its own zone handling can
    // answer an instant before the start during a repeated hour.
    let candidate =
        cron.find_next_occurrence(&Utc.from_utc_datetime(&wall), false).ok()?.naive_utc();
    let fire = match zone.from_local_datetime(&candidate) {
        MappedLocalTime::Single(fire) | MappedLocalTime::Ambiguous(fire, _) => fire,
        MappedLocalTime::None => {
            let end =
                first_wall_where(candidate, |w| zone.from_local_datetime(&w).earliest().is_some())?;
            zone.from_local_datetime(&end).earliest()?
        }
    };
    Some(fire.timestamp_millis())
}

/// The first whole-second wall time after `from` at which `found` holds, given that it does not
/// hold at `from`: steps double until one lands, then bisection narrows it down. A transition
/// lasts hours and they are months apart, so `found` flips once in the span searched.
fn first_wall_where(
    from: NaiveDateTime,
    found: impl Fn(NaiveDateTime) -> bool,
) -> Option<NaiveDateTime> {
    let (mut before, mut step) = (from, 1);
    let mut at = loop {
        let probe = from.checked_add_signed(TimeDelta::seconds(step))?;
        if found(probe) {
            break probe;
        }
        if step > MAX_TRANSITION_SECS {
            return None;
        }
        (before, step) = (probe, step * 2);
    };
    while (at - before).num_seconds() > 1 {
        let mid = before + TimeDelta::seconds((at - before).num_seconds() / 2);
        if found(mid) {
            at = mid;
        } else {
            before = mid;
        }
    }
    Some(at)
}

/// What the scheduler does when it reaches a job whose next fire time is `scheduled_ms` at
/// `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireDecision {
    /// The run to create now, if any: (its scheduled instant in ms, its trigger type). On time:
    /// (scheduled_ms, TriggerType::Cron). Misfired + FIRE_ONCE_NOW: (now_ms,
    /// TriggerType::Misfire). Misfired + DO_NOTHING: None.
    pub fire: Option<(i64, TriggerType)>,
    /// The job's new next fire time: for an on-time fire, next_after(scheduled_ms); for a
    /// misfire, next_after(now_ms) — never a burst of catch-up fires. None when the schedule has
    /// no further fire.
    pub next_ms: Option<i64>,
}

/// Decides what to do with the fire due at `scheduled_ms`, given `now_ms >= scheduled_ms -
/// lookahead` (a fire slightly in the future, up to a few seconds, counts as on time and keeps
/// its scheduled instant).
///
/// A fire up to [`MISFIRE_THRESHOLD_MS`] late is on time; the next fire of an on-time fire may
/// itself already be due (an every-second cron at 4 s late), which the scheduler's next pass
/// handles. A `NONE` schedule never fires on its own, so a stale next fire time yields nothing.
pub fn decide(
    schedule: &Schedule,
    misfire: MisfireStrategy,
    scheduled_ms: i64,
    now_ms: i64,
) -> FireDecision {
    if schedule.kind() == ScheduleType::None {
        return FireDecision { fire: None, next_ms: None };
    }
    if now_ms.saturating_sub(scheduled_ms) <= MISFIRE_THRESHOLD_MS {
        return FireDecision {
            fire: Some((scheduled_ms, TriggerType::Cron)),
            next_ms: schedule.next_after(scheduled_ms),
        };
    }
    let fire = match misfire {
        MisfireStrategy::FireOnceNow => Some((now_ms, TriggerType::Misfire)),
        MisfireStrategy::DoNothing => None,
    };
    FireDecision { fire, next_ms: schedule.next_after(now_ms) }
}

#[cfg(test)]
mod tests;
