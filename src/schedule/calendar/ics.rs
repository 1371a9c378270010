//! Reads the dates of an iCalendar file (RFC 5545), the format holiday calendars are published
//! in: each `VEVENT`'s `DTSTART` to `DTEND` (or `DURATION`) becomes a date or a range of dates,
//! in the calendar's entry syntax (`2026-10-01`, `2026-10-01/2026-10-07`).
//!
//! It reads folded lines, `DATE` and `DATE-TIME` values (UTC, floating, or with a `TZID` that
//! `chrono-tz` knows), and multi-day events; a timed event covers each date it touches on the
//! calendar's wall clock. It deliberately does not expand recurrences: an event with an
//! `RRULE` or `RDATE` is refused rather than read as its first occurrence alone. Everything
//! else in the file (alarms, time zone definitions, summaries) is ignored.

use chrono::{DateTime, Days, NaiveDate, NaiveDateTime, TimeZone};
use chrono_tz::Tz;

/// The most events one file may hold.
pub const MAX_EVENTS: usize = 10_000;

/// Why an iCalendar file was refused: the line (from 1, of the unfolded property) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct IcsError {
    /// The line the property or event starts on, from 1 (0 for the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// The dates of each event of `text`, read on the wall clock of `zone`, in the order of the
/// file: `2026-10-01` for one day, `2026-10-01/2026-10-07` for several.
pub fn parse_ics_dates(text: &str, zone: Tz) -> Result<Vec<String>, IcsError> {
    let mut entries = Vec::new();
    let mut event: Option<Event> = None;
    let mut seen_calendar = false;
    for (line, property) in unfold(text) {
        let fail = |reason: String| IcsError { line, reason };
        let (name, params, value) = split_property(&property)
            .ok_or_else(|| fail(format!("`{property}` is not a property (NAME:value)")))?;
        match (name.as_str(), value) {
            ("BEGIN", "VCALENDAR") => seen_calendar = true,
            ("BEGIN", "VEVENT") => event = Some(Event { line, ..Event::default() }),
            ("END", "VEVENT") => {
                let done = event.take().ok_or_else(|| fail("END:VEVENT without BEGIN".into()))?;
                if entries.len() == MAX_EVENTS {
                    return Err(fail(format!("more than {MAX_EVENTS} events")));
                }
                entries.push(done.dates()?);
            }
            ("DTSTART" | "DTEND" | "DURATION" | "RRULE" | "RDATE", _) if event.is_some() => {
                let Some(current) = event.as_mut() else { continue };
                match name.as_str() {
                    "DTSTART" => {
                        current.start = Some(read_time(&params, value, zone).map_err(fail)?)
                    }
                    "DTEND" => current.end = Some(read_time(&params, value, zone).map_err(fail)?),
                    "DURATION" => current.days = Some(read_days(value).map_err(fail)?),
                    _ => return Err(fail("recurring events (RRULE, RDATE) are not read".into())),
                }
            }
            _ => {}
        }
    }
    if !seen_calendar {
        return Err(IcsError {
            line: 0,
            reason: "no BEGIN:VCALENDAR: not an iCalendar file".into(),
        });
    }
    if let Some(open) = event {
        return Err(IcsError { line: open.line, reason: "BEGIN:VEVENT without END".into() });
    }
    Ok(entries)
}

/// A property's parameters, `(NAME, value)` with the name in upper case.
type Params = Vec<(String, String)>;

/// An event's times as read: each a date, or the date of an instant with whether it was
/// exactly midnight (an exclusive end then does not cover its date).
#[derive(Debug, Default)]
struct Event {
    line: usize,
    start: Option<(NaiveDate, bool)>,
    end: Option<(NaiveDate, bool)>,
    days: Option<u64>,
}

impl Event {
    fn dates(&self) -> Result<String, IcsError> {
        let fail = |reason: &str| IcsError { line: self.line, reason: reason.to_owned() };
        let (first, _) = self.start.ok_or_else(|| fail("an event without DTSTART"))?;
        let last = match (self.end, self.days) {
            // The end is exclusive when it is a date or a midnight.
            (Some((end, true)), _) => end.pred_opt().unwrap_or(end),
            (Some((end, false)), _) => end,
            (None, Some(days)) if days > 1 => first
                .checked_add_days(Days::new(days - 1))
                .ok_or_else(|| fail("DURATION too long"))?,
            _ => first,
        };
        if last <= first {
            return Ok(first.to_string());
        }
        Ok(format!("{first}/{last}"))
    }
}

/// The file's lines with folded lines joined, each with the number of its first line.
fn unfold(text: &str) -> Vec<(usize, String)> {
    let mut lines: Vec<(usize, String)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        match (line.strip_prefix([' ', '\t']), lines.last_mut()) {
            (Some(rest), Some((_, previous))) => previous.push_str(rest),
            _ if line.trim().is_empty() => {}
            _ => lines.push((index + 1, line.to_owned())),
        }
    }
    lines
}

/// `NAME;PARAM=x;…:value` → (upper-case name, parameters, value); a `:` inside a quoted
/// parameter value does not end the parameters.
fn split_property(line: &str) -> Option<(String, Params, &str)> {
    let mut quoted = false;
    let colon = line.char_indices().find_map(|(at, c)| {
        if c == '"' {
            quoted = !quoted;
        }
        (c == ':' && !quoted).then_some(at)
    })?;
    let (head, value) = (&line[..colon], &line[colon + 1..]);
    let mut parts = head.split(';');
    let name = parts.next()?.trim().to_ascii_uppercase();
    let params = parts
        .filter_map(|param| param.split_once('='))
        .map(|(key, value)| (key.trim().to_ascii_uppercase(), value.trim_matches('"').to_owned()))
        .collect();
    Some((name, params, value.trim()))
}

/// A `DATE` or `DATE-TIME` value as the date of the calendar's wall clock it falls on, and
/// whether it is a date or a midnight there.
fn read_time(
    params: &[(String, String)],
    value: &str,
    zone: Tz,
) -> Result<(NaiveDate, bool), String> {
    let invalid = || format!("`{value}` is not a DATE (20261001) or DATE-TIME (20261001T090000Z)");
    if value.len() == 8 {
        let date = NaiveDate::parse_from_str(value, "%Y%m%d").map_err(|_| invalid())?;
        return Ok((date, true));
    }
    let (text, utc) = match value.strip_suffix('Z') {
        Some(text) => (text, true),
        None => (value, false),
    };
    let wall = NaiveDateTime::parse_from_str(text, "%Y%m%dT%H%M%S").map_err(|_| invalid())?;
    let tzid = params.iter().find(|(key, _)| key == "TZID").map(|(_, value)| value.as_str());
    let instant = match (utc, tzid) {
        (true, _) => DateTime::from_naive_utc_and_offset(wall, chrono::Utc),
        (false, Some(name)) => {
            let source: Tz = name.parse().map_err(|_| format!("unknown TZID `{name}`"))?;
            source.from_local_datetime(&wall).earliest().ok_or_else(invalid)?.to_utc()
        }
        // A floating time is read on the calendar's own wall clock.
        (false, None) => return Ok((wall.date(), wall.time() == chrono::NaiveTime::MIN)),
    };
    let local = instant.with_timezone(&zone).naive_local();
    Ok((local.date(), local.time() == chrono::NaiveTime::MIN))
}

/// A `DURATION` of whole days or weeks (`P1D`, `P2W`), in days; a shorter one is one day.
fn read_days(value: &str) -> Result<u64, String> {
    let invalid = || format!("`{value}` is not a DURATION such as P1D");
    let body = value.strip_prefix('+').unwrap_or(value).strip_prefix('P').ok_or_else(invalid)?;
    if body.starts_with('T') {
        return Ok(1);
    }
    let (days, unit) = body.split_at(body.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?);
    let days: u64 = days.parse().map_err(|_| invalid())?;
    let days = match unit.chars().next() {
        Some('D') => days,
        Some('W') => days.checked_mul(7).ok_or_else(invalid)?,
        _ => return Err(invalid()),
    };
    (days <= 3_660).then_some(days).ok_or_else(invalid).map(|days| days.max(1))
}
