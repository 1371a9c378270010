//! Quartz cron expressions: the parsed field sets and the search for the next matching wall time.
//!
//! An expression has six or seven fields, `sec min hour day-of-month month day-of-week [year]`,
//! read the way Quartz's `CronExpression` reads them (`cron/parse.rs`; the `schedule` module doc
//! lists the constructs). Everything here works on naive wall times: which instant a wall time
//! is, and what happens when a daylight-saving change skips or repeats it, is `zone.rs`'s
//! business.
//!
//! The search never steps second by second: it jumps to the next year, month, day, hour, minute
//! and second in the field sets, computing each month's matching days at once. It stops after the
//! last year its caller allows (Quartz's "current year plus 100", see the `schedule` module doc),
//! so an expression that never matches (`0 0 0 30 2 ?`) is answered after at most about a
//! thousand month checks. The engine reads no clock: the caller says which year is the last.
#![warn(missing_docs)]

use std::fmt;

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Timelike};

mod parse;

/// The first year a fire can fall in (Quartz's lower bound).
pub const FIRST_YEAR: i32 = 1970;

/// The last year a fire can ever fall in, whatever the caller allows: Quartz gives up a search
/// that passes 2999.
pub const LAST_YEAR: i32 = 2999;

/// The number of words of the year set, one bit per year from [`FIRST_YEAR`] to [`LAST_YEAR`].
const YEAR_WORDS: usize = (LAST_YEAR - FIRST_YEAR) as usize / 64 + 1;

/// One of the seven fields of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Seconds, 0–59.
    Second,
    /// Minutes, 0–59.
    Minute,
    /// Hours, 0–23.
    Hour,
    /// Day of the month, 1–31, `L`, `W`.
    DayOfMonth,
    /// Month, 1–12 or `JAN`–`DEC`.
    Month,
    /// Day of the week, 1–7 (1 = Sunday) or `SUN`–`SAT`, `L`, `#`.
    DayOfWeek,
    /// Year, optional.
    Year,
}

/// Why an expression was refused: the field (when one is to blame), the character offset in
/// the expression where the problem was found, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct CronError {
    /// The field at fault, or `None` for the shape of the whole expression.
    pub field: Option<Field>,
    /// The character offset (from 0) in the expression as given.
    pub position: usize,
    /// What is wrong, as a sentence fragment.
    pub reason: String,
}

/// A parsed expression: the set of wall times it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: DayRule,
    /// Bits 1–12.
    months: u64,
    /// Bit `y - FIRST_YEAR` for each year from [`FIRST_YEAR`] to [`LAST_YEAR`].
    years: [u64; YEAR_WORDS],
    repeats_hourly: bool,
}

/// The day rule: Quartz takes exactly one of day-of-month and day-of-week, the other is `?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DayRule {
    /// Days of the month, bits 1–31; those past the month's end do not match.
    MonthDays(u64),
    /// `L`, `L-n`, `LW`, `L-nW`: `offset` days before the last day, moved to the nearest
    /// weekday of the month when `weekday` is set.
    Last { offset: u32, weekday: bool },
    /// `nW`: the weekday nearest to day `n`, within the month.
    NearestWeekday(u32),
    /// Days of the week, bits 1–7 (1 = Sunday).
    WeekDays(u64),
    /// `nL`: the last such day of the week in the month.
    LastWeekDay(u32),
    /// `n#k`: the `k`-th such day of the week in the month.
    NthWeekDay(u32, u32),
}

impl CronExpr {
    /// Parses a Quartz expression (any case; fields separated by spaces or tabs).
    pub fn parse(expr: &str) -> Result<CronExpr, CronError> {
        parse::parse(expr)
    }

    /// Whether the hour field is `*` or a step, so the expression fires again and again across
    /// hours rather than at fixed times of day (this decides its daylight-saving treatment).
    pub fn repeats_hourly(&self) -> bool {
        self.repeats_hourly
    }

    /// The first wall time strictly after `after` (taken to the whole second) that matches, or
    /// `None` when there is none up to the end of `last_year` (or of [`LAST_YEAR`], if earlier).
    pub fn next_after(&self, after: NaiveDateTime, last_year: i32) -> Option<NaiveDateTime> {
        let start = after.with_nanosecond(0)?.checked_add_signed(TimeDelta::seconds(1))?;
        self.next_from(start, last_year.min(LAST_YEAR))
    }

    /// The first matching wall time at or after `start` (a whole second), up to `last_year`.
    fn next_from(&self, start: NaiveDateTime, last_year: i32) -> Option<NaiveDateTime> {
        let (mut year, mut month, mut day) = (start.year(), start.month(), start.day());
        let mut floor = Some((start.hour(), start.minute(), start.second()));
        if year < FIRST_YEAR {
            (year, month, day, floor) = (FIRST_YEAR, 1, 1, None);
        }
        let skipped = match floor {
            // The first day with a matching time of day left.
            Some((hour, minute, second)) if self.first_time(hour, minute, second).is_none() => {
                let next = NaiveDate::from_ymd_opt(year, month, day)?.succ_opt()?;
                self.skipped_month(next)
            }
            _ => self.skipped_month(NaiveDate::from_ymd_opt(year, month, day)?),
        };
        while year <= last_year {
            if !self.has_year(year) {
                (year, month, day, floor) = (year + 1, 1, 1, None);
                continue;
            }
            let Some(next_month) = next_bit(self.months, month, 12) else {
                (year, month, day, floor) = (year + 1, 1, 1, None);
                continue;
            };
            if next_month != month {
                (month, day, floor) = (next_month, 1, None);
            }
            let mut mask = self.day_mask(year, month);
            if Some((year, month)) != skipped {
                mask |= self.overflow_weekday(year, month);
            }
            let Some(next_day) = next_bit(mask, day, 31) else {
                (month, day, floor) = (month + 1, 1, None);
                if month > 12 {
                    (year, month) = (year + 1, 1);
                }
                continue;
            };
            if next_day != day {
                (day, floor) = (next_day, None);
            }
            let time = match floor {
                None => self.first_time(0, 0, 0),
                Some((hour, minute, second)) => self.first_time(hour, minute, second),
            };
            match time {
                Some(time) => {
                    return NaiveDate::from_ymd_opt(year, month, day)?.and_time(time).into();
                }
                None => (day, floor) = (day + 1, None),
            }
        }
        None
    }

    fn has_year(&self, year: i32) -> bool {
        let index = year - FIRST_YEAR;
        (0..=LAST_YEAR - FIRST_YEAR).contains(&index)
            && self.years[index as usize / 64] & (1 << (index % 64)) != 0
    }

    /// The first time of day at or after `hour:minute:second` in the time fields.
    fn first_time(&self, hour: u32, minute: u32, second: u32) -> Option<NaiveTime> {
        let mut at_hour = next_bit(self.hours, hour, 23)?;
        loop {
            let min_floor = if at_hour == hour { minute } else { 0 };
            let mut at_minute = next_bit(self.minutes, min_floor, 59);
            while let Some(candidate) = at_minute {
                let sec_floor = if at_hour == hour && candidate == minute { second } else { 0 };
                if let Some(at_second) = next_bit(self.seconds, sec_floor, 59) {
                    return NaiveTime::from_hms_opt(at_hour, candidate, at_second);
                }
                at_minute = next_bit(self.minutes, candidate + 1, 59);
            }
            at_hour = next_bit(self.hours, at_hour + 1, 23)?;
        }
    }

    /// Quartz's `nW` for a day one past the end of the month: "day 31 of April" is May 1st to
    /// Quartz, and when that is a Saturday, `31W` fires on the Friday before, April 30th (and
    /// likewise `29W` in a February of 28 days, `30W` in one of 29).
    ///
    /// See [`CronExpr::skipped_month`] for when Quartz skips it.
    fn overflow_weekday(&self, year: i32, month: u32) -> u64 {
        let last = days_in_month(year, month);
        let friday = NaiveDate::from_ymd_opt(year, month, last)
            .is_some_and(|date| date.weekday() == chrono::Weekday::Fri);
        match self.days {
            DayRule::NearestWeekday(day) if day == last + 1 && friday => 1 << last,
            _ => 0,
        }
    }

    /// The month whose [`CronExpr::overflow_weekday`] Quartz skips in a search from `start`.
    ///
    /// Quartz finds that fire only when its search is already in the month. When the search
    /// starts in a month past that month's own `nW` day, Quartz moves on to day `n` of the next
    /// month, which is past its end, and so lands in the month after. Fire after fire, as a
    /// scheduler asks, this drops `29W` from a February of 28 days when January's fire fell on
    /// the 29th. This module reproduces it so that fire times stay those of Quartz.
    fn skipped_month(&self, start: NaiveDate) -> Option<(i32, u32)> {
        let DayRule::NearestWeekday(day) = self.days else {
            return None;
        };
        let (year, month) = (start.year(), start.month());
        let in_fields = self.has_year(year) && self.months & (1 << month) != 0;
        let target = next_bit(self.day_mask(year, month), 1, 31)?;
        if !in_fields || day > days_in_month(year, month) || target >= start.day() {
            return None;
        }
        let next =
            NaiveDate::from_ymd_opt(year, month, 1)?.checked_add_months(chrono::Months::new(1))?;
        Some((next.year(), next.month()))
    }

    /// The days of `month` in `year` that match, as bits 1–31.
    fn day_mask(&self, year: i32, month: u32) -> u64 {
        let last = days_in_month(year, month);
        let in_month = (1u64 << (last + 1)) - 2;
        // The day of the week of the 1st, 1 = Sunday .. 7 = Saturday.
        let first_weekday = NaiveDate::from_ymd_opt(year, month, 1)
            .map_or(1, |date| date.weekday().num_days_from_sunday() + 1);
        let weekday_of = |day: u32| (first_weekday - 1 + day - 1) % 7 + 1;
        let nearest_weekday = |day: u32| match weekday_of(day) {
            7 if day == 1 => 3,
            7 => day - 1,
            1 if day == last => day - 2,
            1 => day + 1,
            _ => day,
        };
        match self.days {
            DayRule::MonthDays(bits) => bits & in_month,
            DayRule::Last { offset, weekday } => match last.checked_sub(offset) {
                Some(day) if day >= 1 && weekday => 1 << nearest_weekday(day),
                Some(day) if day >= 1 => 1 << day,
                _ => 0,
            },
            DayRule::NearestWeekday(day) if day <= last => 1 << nearest_weekday(day),
            DayRule::NearestWeekday(_) => 0,
            DayRule::WeekDays(bits) => (1..=last)
                .filter(|&day| bits & (1 << weekday_of(day)) != 0)
                .fold(0, |mask, day| mask | 1 << day),
            DayRule::LastWeekDay(weekday) => {
                let shift = (7 + weekday_of(last) - weekday) % 7;
                1 << (last - shift)
            }
            DayRule::NthWeekDay(weekday, nth) => {
                let day = 1 + (7 + weekday - first_weekday) % 7 + 7 * (nth - 1);
                if day <= last { 1 << day } else { 0 }
            }
        }
    }
}

impl CronError {
    fn describe(&self) -> String {
        match self.field {
            Some(field) => {
                format!("{field} field, at character {}: {}", self.position, self.reason)
            }
            None => format!("at character {}: {}", self.position, self.reason),
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
            Field::Year => "year",
        })
    }
}

/// The number of days in `month` of `year` (proleptic Gregorian).
pub fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

/// The lowest set bit of `bits` at or above `from` and at most `max`.
fn next_bit(bits: u64, from: u32, max: u32) -> Option<u32> {
    if from > max {
        return None;
    }
    let rest = bits >> from;
    let next = from + rest.trailing_zeros();
    (rest != 0 && next <= max).then_some(next)
}
