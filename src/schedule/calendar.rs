//! Business calendars, as Quartz has them: instants a job's schedule must not fire at, and the
//! dates that override them (the make-up workdays, 调休, of Chinese workday calendars).
//!
//! A [`Calendar`] is parsed once from a [`CalendarSpec`] and read on the wall clock of its IANA
//! time zone. Its exclusions are dates and date ranges, annual dates, weekdays, daily windows
//! and Quartz cron expressions (an instant is excluded when its wall second matches); an
//! included date overrides every exclusion for the whole day. [`Calendar::excluded`] answers
//! for one instant, naming the rule and how long the exclusion lasts; [`Calendar::next_fire`]
//! and [`decide`] skip a schedule's excluded fires by whole spans, never second by second.
//!
//! Every search is bounded: it gives up a year ([`SEARCH_HORIZON_MS`]) after the instant it
//! started from, or after [`SEARCH_BUDGET`] probes, and then answers
//! [`CalendarNext::GaveUp`] with an excluded instant to look again from, so a calendar that
//! excludes everything costs the scheduler one bounded search per wake-up, not a loop.
//!
//! Daylight saving: rules match the wall clock, so a daily window of 00:00–06:00 lasts seven
//! real hours on a fall-back day and five on a spring-forward day, and a window wholly inside a
//! spring-forward gap excludes nothing that day. A date's exclusion runs from its first instant
//! to the next day's first instant, whatever the day's length.
//!
//! Pure, like the rest of `schedule`: no IO, no clock. Storing calendars, and reading `.ics`
//! files off the network, is someone else's business; `ics.rs` only parses the text.
#![warn(missing_docs)]

mod ics;

use std::fmt;
use std::str::FromStr;

use chrono::{
    DateTime, Datelike, Days, MappedLocalTime, NaiveDate, NaiveDateTime, NaiveTime, TimeZone,
    Timelike, Weekday,
};
use chrono_tz::Tz;

pub use self::ics::{IcsError, parse_ics_dates};
use super::cron::CronExpr;
use super::{FireDecision, NextFire, Schedule, decide as decide_plain};
use crate::model::{CalendarSpec, MisfireStrategy, ScheduleType};

/// How far past the instant it started from a search for an allowed fire looks: one year.
pub const SEARCH_HORIZON_MS: i64 = 366 * 86_400_000;

/// The most probes one search makes: each fire candidate is one, and each second a cron
/// exclusion is followed one more (about a microsecond each).
pub const SEARCH_BUDGET: u32 = 100_000;

/// The longest one cron exclusion is followed second by second before the search moves on.
const MAX_CRON_SPAN_SECS: u32 = 3_600;

/// Why a calendar was refused; each variant names the rule as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// The time zone is not an IANA name known to `chrono-tz`.
    #[error("unknown time zone `{0}`")]
    UnknownTimeZone(String),
    /// A date or a range of dates is not `YYYY-MM-DD` or `YYYY-MM-DD/YYYY-MM-DD` (first ≤ last).
    #[error(
        "{field}: `{value}` is not a date (YYYY-MM-DD) or a range of dates (YYYY-MM-DD/YYYY-MM-DD, first not after last)"
    )]
    InvalidDate {
        /// The field it was found in.
        field: &'static str,
        /// The entry as given.
        value: String,
    },
    /// An annual date is not `MM-DD` of a day that exists in some year.
    #[error("annual_dates: `{0}` is not a day of the year (MM-DD, such as 05-01)")]
    InvalidAnnualDate(String),
    /// A weekday is not `MON`–`SUN` (or its full English name).
    #[error("weekdays: `{0}` is not a weekday (MON, TUE, WED, THU, FRI, SAT, SUN)")]
    InvalidWeekday(String),
    /// A daily window is not `HH:MM-HH:MM` with different ends.
    #[error(
        "daily_windows: `{0}` is not a window of the day (HH:MM-HH:MM with different ends, such as 00:00-06:00, 22:00-06:00 or 00:00-24:00)"
    )]
    InvalidWindow(String),
    /// A cron exclusion is not a Quartz expression.
    #[error("cron: invalid cron expression `{expr}`: {reason}")]
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A parsed, validated calendar.
#[derive(Debug, Clone)]
pub struct Calendar {
    zone: Tz,
    rules: Vec<(Rule, String)>,
    included: Vec<(NaiveDate, NaiveDate)>,
}

/// Why an instant is excluded: the rule, as written in the calendar, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exclusion {
    /// The rule that excludes it: its field and entry, `weekdays SAT`.
    pub rule: String,
    /// The first instant (ms) after which the rule no longer excludes, or an included date
    /// begins; the exclusion may continue under another rule.
    pub until_ms: i64,
}

/// The next fire of a schedule that a calendar allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarNext {
    /// This instant (ms).
    At(i64),
    /// The schedule has no further fire that the calendar allows.
    Never,
    /// The search gave up, at its horizon or its budget, at this excluded fire; look again
    /// from it.
    GaveUp(i64),
}

/// What happens to a fire due at `scheduled_ms` under a calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalendarDecision {
    /// The calendar excludes the scheduled instant: nothing fires, and it is not a misfire.
    Excluded {
        /// Why.
        exclusion: Exclusion,
        /// The next fire the calendar allows.
        next: NextFire,
    },
    /// The calendar allows the scheduled instant: [`super::decide`]'s answer, with the next
    /// fire moved past excluded instants and no fire at an excluded "now" for a misfire.
    Decided(FireDecision),
}

/// One step of [`Calendar::walk`]: a fire, or an excluded fire and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The schedule fires at this instant (ms).
    Fire(i64),
    /// The schedule would fire at `at_ms`, but the calendar excludes it.
    Excluded {
        /// The instant (ms).
        at_ms: i64,
        /// Why, and until when.
        exclusion: Exclusion,
    },
    /// The search gave up at this excluded fire (ms): no allowed fire within the horizon.
    GaveUp(i64),
}

#[derive(Debug, Clone)]
enum Rule {
    Dates(NaiveDate, NaiveDate),
    Annual(u32, u32),
    Weekday(Weekday),
    /// Seconds of the day: from inclusive, to exclusive; wraps past midnight when `to <= from`.
    Window(u32, u32),
    Cron(Box<CronExpr>),
}

impl Calendar {
    /// Parses and checks `spec`; the first refused entry is the error.
    pub fn parse(spec: &CalendarSpec) -> Result<Calendar, CalendarError> {
        let zone = match spec.time_zone.as_deref() {
            None => Tz::UTC,
            Some(name) => {
                Tz::from_str(name).map_err(|_| CalendarError::UnknownTimeZone(name.to_owned()))?
            }
        };
        let mut rules = Vec::new();
        for entry in &spec.excluded_dates {
            let (first, last) = parse_dates("excluded_dates", entry)?;
            rules.push((Rule::Dates(first, last), format!("excluded_dates {}", entry.trim())));
        }
        for entry in &spec.annual_dates {
            let invalid = || CalendarError::InvalidAnnualDate(entry.clone());
            let (month, day) = entry.trim().split_once('-').ok_or_else(invalid)?;
            let (month, day) = (parse_number(month, 2), parse_number(day, 2));
            // 2024 is a leap year, so 02-29 is a day of the year too.
            let (month, day) = month
                .zip(day)
                .filter(|&(month, day)| NaiveDate::from_ymd_opt(2024, month, day).is_some())
                .ok_or_else(invalid)?;
            rules.push((Rule::Annual(month, day), format!("annual_dates {}", entry.trim())));
        }
        for entry in &spec.weekdays {
            let weekday =
                parse_weekday(entry).ok_or_else(|| CalendarError::InvalidWeekday(entry.clone()))?;
            rules.push((Rule::Weekday(weekday), format!("weekdays {}", entry.trim())));
        }
        for entry in &spec.daily_windows {
            let invalid = || CalendarError::InvalidWindow(entry.clone());
            let (from, to) = entry.trim().split_once('-').ok_or_else(invalid)?;
            let (from, to) = parse_clock(from).zip(parse_clock(to)).ok_or_else(invalid)?;
            if from == to || from == 86_400 {
                return Err(invalid());
            }
            rules.push((Rule::Window(from, to), format!("daily_windows {}", entry.trim())));
        }
        for entry in &spec.cron {
            let cron = CronExpr::parse(entry).map_err(|error| CalendarError::InvalidCron {
                expr: entry.clone(),
                reason: error.to_string(),
            })?;
            rules.push((Rule::Cron(Box::new(cron)), format!("cron `{}`", entry.trim())));
        }
        let included = spec
            .included_dates
            .iter()
            .map(|entry| parse_dates("included_dates", entry))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Calendar { zone, rules, included })
    }

    /// The calendar's time zone.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// Whether the calendar excludes instant `at_ms`, and if so by which rule (the first that
    /// matches, in the order of [`CalendarSpec`]'s fields) and until when. An instant on an
    /// included date is never excluded.
    pub fn excluded(&self, at_ms: i64) -> Option<Exclusion> {
        self.excluded_within(at_ms, &mut MAX_CRON_SPAN_SECS.min(SEARCH_BUDGET))
    }

    /// [`Calendar::excluded`], following a cron exclusion for at most `budget` seconds, less
    /// those it took.
    fn excluded_within(&self, at_ms: i64, budget: &mut u32) -> Option<Exclusion> {
        let wall = DateTime::from_timestamp_millis(at_ms)?.with_timezone(&self.zone).naive_local();
        let date = wall.date();
        if self.included.iter().any(|&(first, last)| (first..=last).contains(&date)) {
            return None;
        }
        let (until_ms, rule) = self.rules.iter().find_map(|(rule, text)| {
            let until = self.rule_until(rule, wall, at_ms, budget)?;
            Some((until, text))
        })?;
        // An included date ends the exclusion at its first instant. The date of `at_ms` is not
        // included, so every included range lies wholly before it or wholly after it.
        let next_included = self
            .included
            .iter()
            .map(|&(first, _)| first)
            .filter(|&first| first > date)
            .min()
            .and_then(|first| self.day_start(first, at_ms));
        let until_ms = next_included.map_or(until_ms, |included| until_ms.min(included));
        Some(Exclusion { rule: rule.clone(), until_ms })
    }

    /// The first fire of `schedule` strictly after `after_ms` that the calendar allows.
    pub fn next_fire(&self, schedule: &Schedule, after_ms: i64) -> CalendarNext {
        match schedule.next_after(after_ms) {
            None => CalendarNext::Never,
            Some(candidate) => {
                let mut budget = SEARCH_BUDGET;
                self.allowed_from(schedule, candidate, &mut budget, |_, _| {})
            }
        }
    }

    /// The fires of `schedule` after `after_ms`, with the excluded ones and why, until `count`
    /// fires are found, the schedule ends, or the search gives up.
    pub fn walk(&self, schedule: &Schedule, after_ms: i64, count: usize) -> Vec<Step> {
        let mut steps = Vec::new();
        // One budget for the whole walk, so that a preview of many fires costs no more than
        // one search.
        let mut budget = SEARCH_BUDGET;
        let mut cursor = after_ms;
        let mut fires = 0;
        while fires < count {
            let Some(candidate) = schedule.next_after(cursor) else { break };
            let mut excluded = Vec::new();
            let next = self.allowed_from(schedule, candidate, &mut budget, |at_ms, exclusion| {
                excluded.push(Step::Excluded { at_ms, exclusion: exclusion.clone() });
            });
            steps.append(&mut excluded);
            match next {
                CalendarNext::At(at_ms) => {
                    steps.push(Step::Fire(at_ms));
                    fires += 1;
                    cursor = at_ms;
                }
                CalendarNext::Never => break,
                CalendarNext::GaveUp(at_ms) => {
                    steps.push(Step::GaveUp(at_ms));
                    break;
                }
            }
        }
        steps
    }

    /// The first fire from `candidate` (a fire of `schedule`) on that the calendar allows,
    /// spending at most `budget` probes; `on_excluded` hears of each excluded fire the search
    /// steps over.
    fn allowed_from(
        &self,
        schedule: &Schedule,
        mut candidate: i64,
        budget: &mut u32,
        mut on_excluded: impl FnMut(i64, &Exclusion),
    ) -> CalendarNext {
        let horizon = candidate.saturating_add(SEARCH_HORIZON_MS);
        loop {
            let mut span = MAX_CRON_SPAN_SECS.min(*budget);
            let followed = span;
            let Some(exclusion) = self.excluded_within(candidate, &mut span) else {
                return CalendarNext::At(candidate);
            };
            on_excluded(candidate, &exclusion);
            *budget = budget.saturating_sub(1 + followed - span);
            if *budget == 0 || candidate > horizon {
                return CalendarNext::GaveUp(candidate);
            }
            let next = match schedule.kind() {
                // Keep a rate's phase: the first multiple of the rate at or after the end.
                ScheduleType::FixRate | ScheduleType::FixDelay => {
                    schedule.next_after(candidate).and_then(|step| {
                        let rate = step - candidate;
                        let steps = (exclusion.until_ms - candidate + rate - 1) / rate;
                        candidate.checked_add(rate.checked_mul(steps.max(1))?)
                    })
                }
                _ => schedule.next_after(exclusion.until_ms - 1),
            };
            match next {
                Some(next) => candidate = next.max(candidate + 1),
                None => return CalendarNext::Never,
            }
        }
    }

    /// Until when `rule` excludes the instant `at_ms`, whose wall time is `wall`, or `None`.
    fn rule_until(
        &self,
        rule: &Rule,
        wall: NaiveDateTime,
        at_ms: i64,
        budget: &mut u32,
    ) -> Option<i64> {
        let date = wall.date();
        let day_after =
            |date: NaiveDate| self.day_start(date.checked_add_days(Days::new(1))?, at_ms);
        match *rule {
            Rule::Dates(first, last) => {
                (first..=last).contains(&date).then(|| day_after(last)).flatten()
            }
            Rule::Annual(month, day) => {
                (date.month() == month && date.day() == day).then(|| day_after(date)).flatten()
            }
            Rule::Weekday(weekday) => {
                (date.weekday() == weekday).then(|| day_after(date)).flatten()
            }
            Rule::Window(from, to) => {
                let second = wall.num_seconds_from_midnight();
                let end_day = if from < to {
                    (from..to).contains(&second).then_some(date)?
                } else if second >= from {
                    date.succ_opt()?
                } else if second < to {
                    date
                } else {
                    return None;
                };
                let end =
                    end_day.and_time(NaiveTime::MIN) + chrono::TimeDelta::seconds(i64::from(to));
                self.first_instant(end, at_ms)
            }
            Rule::Cron(ref cron) => {
                let second = wall.with_nanosecond(0)?;
                let before = second - chrono::TimeDelta::seconds(1);
                if cron.next_after(before, super::cron::LAST_YEAR)? != second {
                    return None;
                }
                // Follow the matching seconds, within the budget.
                let mut end = second;
                while *budget > 0
                    && cron.next_after(end, super::cron::LAST_YEAR)
                        == Some(end + chrono::TimeDelta::seconds(1))
                {
                    end += chrono::TimeDelta::seconds(1);
                    *budget -= 1;
                }
                let whole_second = at_ms.div_euclid(1000) * 1000;
                Some(whole_second + (end - second).num_milliseconds() + 1000)
            }
        }
    }

    /// The first instant of `date` in the calendar's zone.
    fn day_start(&self, date: NaiveDate, after_ms: i64) -> Option<i64> {
        self.first_instant(date.and_time(NaiveTime::MIN), after_ms)
    }

    /// The first instant after `after_ms` whose wall time is `wall` or, when `wall` falls in a
    /// spring-forward gap, the first instant after the gap.
    fn first_instant(&self, wall: NaiveDateTime, after_ms: i64) -> Option<i64> {
        let instant = match self.zone.from_local_datetime(&wall) {
            MappedLocalTime::Single(at) => at.timestamp_millis(),
            MappedLocalTime::Ambiguous(first, second) => {
                let first = first.timestamp_millis();
                if first > after_ms { first } else { second.timestamp_millis() }
            }
            MappedLocalTime::None => {
                let end = super::zone::first_wall_where(wall, |probe| {
                    self.zone.from_local_datetime(&probe).earliest().is_some()
                })?;
                self.zone.from_local_datetime(&end).earliest()?.timestamp_millis()
            }
        };
        Some(instant.max(after_ms + 1))
    }
}

/// [`super::decide`] under `calendar`: a scheduled instant the calendar excludes does not fire
/// and is not a misfire, the next fire is the next one the calendar allows (a search that gave
/// up yields the excluded instant it stopped at, to look again from), and a misfire's
/// `FIRE_ONCE_NOW` does not fire at an excluded "now" (it stays a misfire).
pub fn decide(
    calendar: &Calendar,
    schedule: &Schedule,
    misfire: MisfireStrategy,
    misfire_threshold_ms: i64,
    scheduled_ms: i64,
    now_ms: i64,
) -> CalendarDecision {
    let mut decision = decide_plain(schedule, misfire, misfire_threshold_ms, scheduled_ms, now_ms);
    if schedule.kind() == ScheduleType::None {
        return CalendarDecision::Decided(decision);
    }
    let search = |candidate: i64| {
        let mut budget = SEARCH_BUDGET;
        calendar.allowed_from(schedule, candidate, &mut budget, |_, _| {})
    };
    let allowed = |candidate: i64| match search(candidate) {
        CalendarNext::At(at_ms) | CalendarNext::GaveUp(at_ms) => NextFire::At(at_ms),
        CalendarNext::Never => NextFire::Never,
    };
    if let Some(exclusion) = calendar.excluded(scheduled_ms) {
        // The search steps over the scheduled instant, which is excluded.
        return CalendarDecision::Excluded { exclusion, next: allowed(scheduled_ms) };
    }
    if let Some((at_ms, _)) = decision.fire
        && at_ms != scheduled_ms
        && calendar.excluded(at_ms).is_some()
    {
        decision.fire = None;
    }
    if let NextFire::At(at_ms) = decision.next {
        decision.next = allowed(at_ms);
    }
    CalendarDecision::Decided(decision)
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Fire(at_ms) => write!(f, "fire {at_ms}"),
            Step::Excluded { at_ms, exclusion } => {
                write!(f, "excluded {at_ms} by {} until {}", exclusion.rule, exclusion.until_ms)
            }
            Step::GaveUp(at_ms) => write!(f, "gave up at {at_ms}"),
        }
    }
}

/// Reads `YYYY-MM-DD` or `YYYY-MM-DD/YYYY-MM-DD` (first not after last).
fn parse_dates(field: &'static str, entry: &str) -> Result<(NaiveDate, NaiveDate), CalendarError> {
    let invalid = || CalendarError::InvalidDate { field, value: entry.to_owned() };
    let date = |text: &str| NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok();
    let (first, last) = match entry.trim().split_once('/') {
        Some((first, last)) => (date(first), date(last)),
        None => (date(entry), date(entry)),
    };
    first.zip(last).filter(|(first, last)| first <= last).ok_or_else(invalid)
}

/// Reads exactly `width` ASCII digits.
fn parse_number(text: &str, width: usize) -> Option<u32> {
    (text.len() == width && text.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// Reads `HH:MM` (00:00 to 24:00) as seconds of the day.
fn parse_clock(text: &str) -> Option<u32> {
    let (hour, minute) = text.trim().split_once(':')?;
    let (hour, minute) = (parse_number(hour, 2)?, parse_number(minute, 2)?);
    let seconds = hour * 3_600 + minute * 60;
    (minute < 60 && seconds <= 86_400).then_some(seconds)
}

/// Reads `MON`–`SUN` or the full English name, in any case.
fn parse_weekday(text: &str) -> Option<Weekday> {
    let text = text.trim();
    // chrono reads both the three-letter and the full names.
    (text.len() >= 3).then(|| text.parse().ok()).flatten()
}

#[cfg(test)]
mod tests;
