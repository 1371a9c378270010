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
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    use MisfireStrategy::{DoNothing, FireOnceNow};
    use ScheduleType::{Cron, FixRate, None as Never};

    /// Renders every row of a table on its own line and compares the text with the snapshot.
    fn check<Row>(rows: &[Row], render: impl Fn(&Row) -> String, expect: Expect) {
        let text: String = rows.iter().map(|row| render(row) + "\n").collect();
        expect.assert_eq(&text);
    }

    /// An RFC 3339 instant in ms.
    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
    }

    /// An instant on the wall clock of `zone`, with its abbreviation.
    fn show(ms: i64, zone: Option<&str>) -> String {
        // A row with an unknown zone still needs its `after` shown, in UTC then.
        let zone: Tz = zone.and_then(|name| name.parse().ok()).unwrap_or(Tz::UTC);
        let at = DateTime::from_timestamp_millis(ms).unwrap().with_timezone(&zone);
        at.format("%a %Y-%m-%d %H:%M:%S%.f %Z").to_string()
    }

    /// (kind, conf, zone, after, count) → the parse error or the next `count` fires.
    type FireRow = (ScheduleType, &'static str, Option<&'static str>, &'static str, usize);

    /// (kind, conf, misfire, scheduled, now) → the decision.
    type DecisionRow = (ScheduleType, &'static str, MisfireStrategy, &'static str, &'static str);

    fn fires((kind, conf, zone, after, count): &FireRow) -> String {
        let head = format!("{kind} `{conf}` after {}:", show(ms(after), *zone));
        match Schedule::parse(*kind, conf, *zone) {
            Err(error) => format!("{head} {error}"),
            Ok(schedule) => {
                let fires = schedule.next_n(ms(after), *count);
                let mut previous = ms(after);
                for &fire in &fires {
                    assert!(fire > previous, "fires must strictly increase");
                    previous = fire;
                }
                let shown: Vec<String> = fires.iter().map(|&fire| show(fire, *zone)).collect();
                format!("{head} [{}]", shown.join(", "))
            }
        }
    }

    #[test]
    fn parse_errors() {
        let at = "2025-01-01T00:00:00Z";
        let rows: &[FireRow] = &[
            (Cron, "* * *", None, at, 1),
            (Cron, "0 0 12 * *", None, at, 1),
            (Cron, "0 0 12 ? * 2 2026 2027", None, at, 1),
            (Cron, "0 0 12 1 * MON", None, at, 1),
            (Cron, "0 0 12 ? * 0", None, at, 1),
            (Cron, "0 0 12 LW * ?", None, at, 1),
            (Cron, "0 0 12 L-3 * ?", None, at, 1),
            (Cron, "0 0 12 W * ?", None, at, 1),
            (Cron, "0 0 22-2 * * ?", None, at, 1),
            (Cron, "0 0 12 ? * FRI-MON", None, at, 1),
            (Cron, "0 0 12 ? * MON-SUN", None, at, 1),
            (Cron, "@daily", None, at, 1),
            (Cron, "0 0 12 * * ?", Some("Mars/Olympus"), at, 1),
            (Cron, "0 0 12 * * ?", Some(""), at, 1),
            (FixRate, "0", None, at, 1),
            (FixRate, "+5", None, at, 1),
            (FixRate, "1.5", None, at, 1),
            (FixRate, "31536001", None, at, 1),
            (FixRate, "", None, at, 1),
            (Never, "30", None, at, 1),
        ];
        check(
            rows,
            fires,
            expect![[r#"
                CRON `* * *` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `* * *`: expected 6 or 7 fields (sec min hour dom mon dow [year]), found 3
                CRON `0 0 12 * *` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 * *`: expected 6 or 7 fields (sec min hour dom mon dow [year]), found 5
                CRON `0 0 12 ? * 2 2026 2027` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 2 2026 2027`: expected 6 or 7 fields (sec min hour dom mon dow [year]), found 8
                CRON `0 0 12 1 * MON` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 1 * MON`: day-of-month and day-of-week are both set; one of them must be `?`
                CRON `0 0 12 ? * 0` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 0`: Component error: Position 0 is less than the input offset 1.
                CRON `0 0 12 LW * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 LW * ?`: Component error: Invalid day for closest weekday.
                CRON `0 0 12 L-3 * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 L-3 * ?`: Component error: Invalid start of range.
                CRON `0 0 12 W * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 W * ?`: Component error: Invalid day for closest weekday.
                CRON `0 0 22-2 * * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 22-2 * * ?`: Component error: Range out of bounds.
                CRON `0 0 12 ? * FRI-MON` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * FRI-MON`: Component error: Range out of bounds.
                CRON `0 0 12 ? * MON-SUN` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * MON-SUN`: Component error: Range out of bounds.
                CRON `@daily` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `@daily`: expected 6 or 7 fields (sec min hour dom mon dow [year]), found 1
                CRON `0 0 12 * * ?` after Wed 2025-01-01 00:00:00 UTC: unknown time zone `Mars/Olympus`
                CRON `0 0 12 * * ?` after Wed 2025-01-01 00:00:00 UTC: unknown time zone ``
                FIX_RATE `0` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `0`: expected a whole number of seconds from 1 to 31536000
                FIX_RATE `+5` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `+5`: expected a whole number of seconds from 1 to 31536000
                FIX_RATE `1.5` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `1.5`: expected a whole number of seconds from 1 to 31536000
                FIX_RATE `31536001` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `31536001`: expected a whole number of seconds from 1 to 31536000
                FIX_RATE `` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate ``: expected a whole number of seconds from 1 to 31536000
                NONE `30` after Wed 2025-01-01 00:00:00 UTC: schedule type NONE takes no configuration, got `30`
            "#]],
        );
    }

    #[test]
    fn fire_times() {
        // 2025-01-01 is a Wednesday.
        let at = "2025-01-01T00:00:00Z";
        let rows: &[FireRow] = &[
            (FixRate, " 30 ", None, "2025-01-01T00:00:00.250Z", 3),
            (FixRate, "31536000", Some("Europe/Berlin"), at, 1),
            (Never, "", None, at, 3),
            (Never, " \t", None, at, 3),
            (Cron, "* * * * * ?", None, "2025-01-01T00:00:00.999Z", 2),
            (Cron, "* * * * * ?", None, "1969-12-31T23:59:59.999Z", 2),
            (Cron, "0 5/15 * * * ?", None, at, 3),
            (Cron, " 0 0 12 ? * 1 ", None, at, 2),
            (Cron, "0 0 12 ? * sun", None, at, 1),
            (Cron, "0 0 12 ? * 7", None, at, 1),
            (Cron, "0 0 12 ? * L", None, at, 1),
            (Cron, "0 0 12 ? * MON-FRI", None, at, 4),
            (Cron, "0 0 12 ? * 6#3", None, at, 2),
            (Cron, "0 0 12 ? * 6L", None, at, 2),
            (Cron, "0 0 12 * * 2", None, at, 2),
            (Cron, "0 0 12 L * ?", None, at, 2),
            (Cron, "0 0 12 1W * ?", None, "2025-02-01T00:00:00Z", 1),
            (Cron, "0 0 12 29 2 ?", None, at, 1),
            (Cron, "0 0 0 1 1 ? 2030", None, at, 2),
            (Cron, "0 0 0 1 1 ? 2020", None, at, 1),
            (Cron, "0 0 0 30 2 ?", None, at, 1),
            (Cron, "0 0 9 ? * MON", Some("Asia/Tokyo"), at, 1),
        ];
        check(
            rows,
            fires,
            expect![[r#"
                FIX_RATE ` 30 ` after Wed 2025-01-01 00:00:00.250 UTC: [Wed 2025-01-01 00:00:30.250 UTC, Wed 2025-01-01 00:01:00.250 UTC, Wed 2025-01-01 00:01:30.250 UTC]
                FIX_RATE `31536000` after Wed 2025-01-01 01:00:00 CET: [Thu 2026-01-01 01:00:00 CET]
                NONE `` after Wed 2025-01-01 00:00:00 UTC: []
                NONE ` 	` after Wed 2025-01-01 00:00:00 UTC: []
                CRON `* * * * * ?` after Wed 2025-01-01 00:00:00.999 UTC: [Wed 2025-01-01 00:00:01 UTC, Wed 2025-01-01 00:00:02 UTC]
                CRON `* * * * * ?` after Wed 1969-12-31 23:59:59.999 UTC: [Thu 1970-01-01 00:00:00 UTC, Thu 1970-01-01 00:00:01 UTC]
                CRON `0 5/15 * * * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 00:05:00 UTC, Wed 2025-01-01 00:20:00 UTC, Wed 2025-01-01 00:35:00 UTC]
                CRON ` 0 0 12 ? * 1 ` after Wed 2025-01-01 00:00:00 UTC: [Sun 2025-01-05 12:00:00 UTC, Sun 2025-01-12 12:00:00 UTC]
                CRON `0 0 12 ? * sun` after Wed 2025-01-01 00:00:00 UTC: [Sun 2025-01-05 12:00:00 UTC]
                CRON `0 0 12 ? * 7` after Wed 2025-01-01 00:00:00 UTC: [Sat 2025-01-04 12:00:00 UTC]
                CRON `0 0 12 ? * L` after Wed 2025-01-01 00:00:00 UTC: [Sat 2025-01-04 12:00:00 UTC]
                CRON `0 0 12 ? * MON-FRI` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Thu 2025-01-02 12:00:00 UTC, Fri 2025-01-03 12:00:00 UTC, Mon 2025-01-06 12:00:00 UTC]
                CRON `0 0 12 ? * 6#3` after Wed 2025-01-01 00:00:00 UTC: [Fri 2025-01-17 12:00:00 UTC, Fri 2025-02-21 12:00:00 UTC]
                CRON `0 0 12 ? * 6L` after Wed 2025-01-01 00:00:00 UTC: [Fri 2025-01-31 12:00:00 UTC, Fri 2025-02-28 12:00:00 UTC]
                CRON `0 0 12 * * 2` after Wed 2025-01-01 00:00:00 UTC: [Mon 2025-01-06 12:00:00 UTC, Mon 2025-01-13 12:00:00 UTC]
                CRON `0 0 12 L * ?` after Wed 2025-01-01 00:00:00 UTC: [Fri 2025-01-31 12:00:00 UTC, Fri 2025-02-28 12:00:00 UTC]
                CRON `0 0 12 1W * ?` after Sat 2025-02-01 00:00:00 UTC: [Mon 2025-02-03 12:00:00 UTC]
                CRON `0 0 12 29 2 ?` after Wed 2025-01-01 00:00:00 UTC: [Tue 2028-02-29 12:00:00 UTC]
                CRON `0 0 0 1 1 ? 2030` after Wed 2025-01-01 00:00:00 UTC: [Tue 2030-01-01 00:00:00 UTC]
                CRON `0 0 0 1 1 ? 2020` after Wed 2025-01-01 00:00:00 UTC: []
                CRON `0 0 0 30 2 ?` after Wed 2025-01-01 00:00:00 UTC: []
                CRON `0 0 9 ? * MON` after Wed 2025-01-01 09:00:00 JST: [Mon 2025-01-06 09:00:00 JST]
            "#]],
        );
    }

    #[test]
    fn croner_default_weekdays() {
        // Why this module uses croner's Quartz mode: by default croner reads 1 as Monday.
        let render = |expr: &&str| {
            let cron = croner::Cron::from_str(expr).unwrap();
            let start = DateTime::from_timestamp_millis(ms("2025-01-01T00:00:00Z")).unwrap();
            let next = cron.find_next_occurrence(&start, false).unwrap();
            format!("`{expr}` fires on {}", next.format("%a"))
        };
        check(
            &["0 0 12 * * 1", "0 0 12 * * 0", "0 0 12 * * 7"],
            render,
            expect![[r#"
                `0 0 12 * * 1` fires on Mon
                `0 0 12 * * 0` fires on Sun
                `0 0 12 * * 7` fires on Sun
            "#]],
        );
    }

    #[test]
    fn daylight_saving() {
        // Berlin: 2025-03-30 02:00 CET jumps to 03:00 CEST; 2025-10-26 03:00 CEST falls back to
        // 02:00 CET. New York: 2025-11-02 02:00 EDT falls back to 01:00 EST.
        let (berlin, new_york) = (Some("Europe/Berlin"), Some("America/New_York"));
        let rows: &[FireRow] = &[
            (Cron, "0 30 2 * * ?", berlin, "2025-03-29T12:00:00Z", 3),
            (Cron, "0 0/20 * * * ?", berlin, "2025-03-30T00:30:00Z", 4),
            (Cron, "0 0 2,3 * * ?", berlin, "2025-03-30T00:30:00Z", 2),
            (Cron, "0 30 2 * * ?", berlin, "2025-10-25T12:00:00Z", 2),
            (Cron, "0 0/30 * * * ?", berlin, "2025-10-25T23:10:00Z", 4),
            (Cron, "0 30 2 * * ?", berlin, "2025-10-26T01:10:00Z", 1),
            (Cron, "0 0/30 * * * ?", berlin, "2025-10-26T01:10:00Z", 1),
            (Cron, "0 30 1 * * ?", new_york, "2025-11-01T12:00:00Z", 2),
            (Cron, "0 0 * * * ?", new_york, "2025-11-02T04:30:00Z", 3),
        ];
        check(
            rows,
            fires,
            expect![[r#"
            CRON `0 30 2 * * ?` after Sat 2025-03-29 13:00:00 CET: [Sun 2025-03-30 03:00:00 CEST, Mon 2025-03-31 02:30:00 CEST, Tue 2025-04-01 02:30:00 CEST]
            CRON `0 0/20 * * * ?` after Sun 2025-03-30 01:30:00 CET: [Sun 2025-03-30 01:40:00 CET, Sun 2025-03-30 03:00:00 CEST, Sun 2025-03-30 03:20:00 CEST, Sun 2025-03-30 03:40:00 CEST]
            CRON `0 0 2,3 * * ?` after Sun 2025-03-30 01:30:00 CET: [Sun 2025-03-30 03:00:00 CEST, Mon 2025-03-31 02:00:00 CEST]
            CRON `0 30 2 * * ?` after Sat 2025-10-25 14:00:00 CEST: [Sun 2025-10-26 02:30:00 CEST, Mon 2025-10-27 02:30:00 CET]
            CRON `0 0/30 * * * ?` after Sun 2025-10-26 01:10:00 CEST: [Sun 2025-10-26 01:30:00 CEST, Sun 2025-10-26 02:00:00 CEST, Sun 2025-10-26 02:30:00 CEST, Sun 2025-10-26 03:00:00 CET]
            CRON `0 30 2 * * ?` after Sun 2025-10-26 02:10:00 CET: [Mon 2025-10-27 02:30:00 CET]
            CRON `0 0/30 * * * ?` after Sun 2025-10-26 02:10:00 CET: [Sun 2025-10-26 03:00:00 CET]
            CRON `0 30 1 * * ?` after Sat 2025-11-01 08:00:00 EDT: [Sun 2025-11-02 01:30:00 EDT, Mon 2025-11-03 01:30:00 EST]
            CRON `0 0 * * * ?` after Sun 2025-11-02 00:30:00 EDT: [Sun 2025-11-02 01:00:00 EDT, Sun 2025-11-02 02:00:00 EST, Sun 2025-11-02 03:00:00 EST]
        "#]],
        );
    }

    #[test]
    fn decisions() {
        // (kind, conf, misfire, scheduled, now), on 2025-01-01 UTC.
        let (every_ten, last_fire) = ("0 0/10 * * * ?", "0 0 12 1 1 ? 2025");
        let rows: &[DecisionRow] = &[
            (Cron, every_ten, DoNothing, "12:00:00", "12:00:00"),
            (Cron, every_ten, DoNothing, "12:00:00", "11:59:57"),
            (Cron, every_ten, DoNothing, "12:00:00", "12:00:05"),
            (Cron, every_ten, DoNothing, "12:00:00", "12:00:05.001"),
            (Cron, every_ten, FireOnceNow, "12:00:00", "12:00:05.001"),
            (Cron, every_ten, FireOnceNow, "12:00:00", "12:35:00"),
            (Cron, every_ten, DoNothing, "12:00:00", "12:35:00"),
            (Cron, last_fire, FireOnceNow, "12:00:00", "12:00:01"),
            (FixRate, "60", DoNothing, "12:00:00", "12:00:02"),
            (FixRate, "60", FireOnceNow, "12:00:00", "12:35:00.500"),
            (Never, "", FireOnceNow, "12:00:00", "12:00:00"),
        ];
        let render = |&(kind, conf, misfire, scheduled, now): &DecisionRow| {
            let schedule = Schedule::parse(kind, conf, None).unwrap();
            let at = |time: &str| ms(&format!("2025-01-01T{time}Z"));
            let decision = decide(&schedule, misfire, at(scheduled), at(now));
            let fire = match decision.fire {
                Some((at, trigger)) => format!("fire {trigger} at {}", show(at, None)),
                None => "no fire".to_owned(),
            };
            let next = decision.next_ms.map_or("none".into(), |next| show(next, None));
            format!("{kind} `{conf}` {misfire} due {scheduled} now {now}: {fire}; next {next}")
        };
        check(
            rows,
            render,
            expect![[r#"
                CRON `0 0/10 * * * ?` DO_NOTHING due 12:00:00 now 12:00:00: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
                CRON `0 0/10 * * * ?` DO_NOTHING due 12:00:00 now 11:59:57: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
                CRON `0 0/10 * * * ?` DO_NOTHING due 12:00:00 now 12:00:05: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
                CRON `0 0/10 * * * ?` DO_NOTHING due 12:00:00 now 12:00:05.001: no fire; next Wed 2025-01-01 12:10:00 UTC
                CRON `0 0/10 * * * ?` FIRE_ONCE_NOW due 12:00:00 now 12:00:05.001: fire MISFIRE at Wed 2025-01-01 12:00:05.001 UTC; next Wed 2025-01-01 12:10:00 UTC
                CRON `0 0/10 * * * ?` FIRE_ONCE_NOW due 12:00:00 now 12:35:00: fire MISFIRE at Wed 2025-01-01 12:35:00 UTC; next Wed 2025-01-01 12:40:00 UTC
                CRON `0 0/10 * * * ?` DO_NOTHING due 12:00:00 now 12:35:00: no fire; next Wed 2025-01-01 12:40:00 UTC
                CRON `0 0 12 1 1 ? 2025` FIRE_ONCE_NOW due 12:00:00 now 12:00:01: fire CRON at Wed 2025-01-01 12:00:00 UTC; next none
                FIX_RATE `60` DO_NOTHING due 12:00:00 now 12:00:02: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:01:00 UTC
                FIX_RATE `60` FIRE_ONCE_NOW due 12:00:00 now 12:35:00.500: fire MISFIRE at Wed 2025-01-01 12:35:00.500 UTC; next Wed 2025-01-01 12:36:00.500 UTC
                NONE `` FIRE_ONCE_NOW due 12:00:00 now 12:00:00: no fire; next none
            "#]],
        );
    }
}
