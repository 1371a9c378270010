//! Reading an expression the way Quartz's `CronExpression` reads it, into the field sets of a
//! [`CronExpr`].
//!
//! Quartz's parser is lenient in ways that expressions in the wild rely on, and this one keeps
//! those leniencies (see the `schedule` module doc): it reads each comma-separated item from its
//! first character, and ignores what follows a complete value. It refuses what Quartz refuses,
//! with the field and the character offset, and also the few inputs Quartz accepts and then
//! cannot evaluate (an empty list, `L` outside the day fields). It does not search for fire
//! times; `cron.rs` does.

use super::{CronError, CronExpr, DayRule, FIRST_YEAR, Field, LAST_YEAR, YEAR_WORDS};

const FIELDS: [Field; 7] = [
    Field::Second,
    Field::Minute,
    Field::Hour,
    Field::DayOfMonth,
    Field::Month,
    Field::DayOfWeek,
    Field::Year,
];

const MONTH_NAMES: [&str; 12] =
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];

const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Field {
    /// The smallest and largest value, and the largest step Quartz allows after `*` or a start.
    fn limits(self) -> (u32, u32, u32) {
        match self {
            Field::Second | Field::Minute => (0, 59, 59),
            Field::Hour => (0, 23, 23),
            Field::DayOfMonth => (1, 31, 31),
            Field::Month => (1, 12, 12),
            Field::DayOfWeek => (1, 7, 7),
            Field::Year => (FIRST_YEAR as u32, LAST_YEAR as u32, u32::MAX),
        }
    }
}

/// What the parser has gathered for one field.
#[derive(Default)]
struct FieldSet {
    bits: u64,
    years: [u64; YEAR_WORDS],
    /// `?` was given.
    no_spec: bool,
}

/// The day-of-month and day-of-week modifiers, which apply to the whole field as in Quartz.
#[derive(Default)]
struct Modifiers {
    last_day: Option<(u32, bool)>,
    nearest_weekday: bool,
    last_weekday: bool,
    nth_weekday: Option<u32>,
}

/// Parses `expr`; see the file doc.
pub(super) fn parse(expr: &str) -> Result<CronExpr, CronError> {
    let upper = expr.to_ascii_uppercase();
    let char_at = |byte: usize| expr.char_indices().take_while(|&(at, _)| at < byte).count();
    let mut tokens = Vec::new();
    let mut start = None;
    for (index, byte) in upper.bytes().enumerate().chain([(upper.len(), b' ')]) {
        match (byte == b' ' || byte == b'\t', start) {
            (true, Some(from)) => {
                tokens.push((from, &upper[from..index]));
                start = None;
            }
            (false, None) => start = Some(index),
            _ => {}
        }
    }
    if tokens.len() < 6 {
        return Err(CronError {
            field: None,
            position: char_at(expr.len()),
            reason: format!(
                "expected 6 or 7 fields (second minute hour day-of-month month day-of-week \
                 [year]), found {}",
                tokens.len()
            ),
        });
    }
    // Quartz reads the first seven fields and ignores any after them.
    let mut sets: [FieldSet; 7] = Default::default();
    let mut modifiers = Modifiers::default();
    for (index, &field) in FIELDS.iter().enumerate() {
        let Some(&(offset, token)) = tokens.get(index) else {
            sets[index] = FieldSet { years: [u64::MAX; YEAR_WORDS], ..FieldSet::default() };
            continue;
        };
        let error = |at: usize, reason: &str| CronError {
            field: Some(field),
            position: char_at(offset + at),
            reason: reason.to_owned(),
        };
        if field == Field::DayOfMonth && token.contains('L') && token.contains(',') {
            return Err(error(0, "`L` cannot be listed with other days of the month"));
        }
        if field == Field::DayOfWeek && token.contains('L') && token.contains(',') {
            return Err(error(0, "`L` cannot be listed with other days of the week"));
        }
        if field == Field::DayOfWeek && token.matches('#').count() > 1 {
            return Err(error(0, "only one `#` is allowed"));
        }
        let mut item_start = 0;
        for item in token.split(',') {
            if !item.is_empty() {
                let dom_no_spec = field == Field::DayOfWeek && sets[3].no_spec;
                ItemParser {
                    field,
                    text: item.as_bytes(),
                    at: 0,
                    base: item_start,
                    set: &mut sets[index],
                    modifiers: &mut modifiers,
                    dom_no_spec,
                }
                .item()
                .map_err(|(at, reason)| error(at, &reason))?;
            }
            item_start += item.len() + 1;
        }
        let set = &sets[index];
        let empty = set.bits == 0 && set.years == [0; YEAR_WORDS] && !set.no_spec;
        let last_day = field == Field::DayOfMonth && modifiers.last_day.is_some();
        if empty && !last_day && field != Field::Year {
            return Err(error(0, "the field has no value"));
        }
    }
    let (dom, dow) = (&sets[3], &sets[5]);
    if dom.no_spec == dow.no_spec {
        return Err(CronError {
            field: Some(Field::DayOfWeek),
            position: char_at(tokens[5].0),
            reason: "exactly one of day-of-month and day-of-week must be `?`".to_owned(),
        });
    }
    let days = if !dom.no_spec {
        match (modifiers.last_day, modifiers.nearest_weekday) {
            (Some((offset, weekday)), _) => DayRule::Last { offset, weekday },
            (None, true) => DayRule::NearestWeekday(dom.bits.trailing_zeros()),
            (None, false) => DayRule::MonthDays(dom.bits),
        }
    } else {
        let first = dow.bits.trailing_zeros();
        match (modifiers.last_weekday, modifiers.nth_weekday) {
            (true, _) => DayRule::LastWeekDay(first),
            (false, Some(nth)) => DayRule::NthWeekDay(first, nth),
            (false, None) => DayRule::WeekDays(dow.bits),
        }
    };
    let hour_token = tokens[2].1;
    Ok(CronExpr {
        seconds: sets[0].bits,
        minutes: sets[1].bits,
        hours: sets[2].bits,
        days,
        months: sets[4].bits,
        years: sets[6].years,
        repeats_hourly: hour_token.starts_with('*') || hour_token.contains('/'),
    })
}

/// Reads one comma-separated item of a field, the way Quartz does: a value may be followed by
/// characters Quartz ignores (`MONDAY` is `MON`, `5X` is `5`), which this parser ignores too.
struct ItemParser<'a> {
    field: Field,
    text: &'a [u8],
    at: usize,
    base: usize,
    set: &'a mut FieldSet,
    modifiers: &'a mut Modifiers,
    /// Day-of-month was `?` (then day-of-week may not be).
    dom_no_spec: bool,
}

/// An error at a byte offset in the field.
type ItemError = (usize, String);

impl ItemParser<'_> {
    fn fail<T>(&self, at: usize, reason: impl Into<String>) -> Result<T, ItemError> {
        Err((self.base + at, reason.into()))
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn item(&mut self) -> Result<(), ItemError> {
        let first = self.text[0];
        let is_last_form = self.text == b"L" || self.text == b"LW" || is_last_offset(self.text);
        match first {
            b'A'..=b'Z' if !is_last_form => self.name(),
            b'?' => self.no_spec(),
            b'*' | b'/' => self.every(),
            b'L' => self.last(),
            b'0'..=b'9' => self.number(),
            _ => self.fail(0, format!("unexpected character `{}`", char::from(first))),
        }
    }

    /// `JAN`, `MON-FRI`, `FRI#2`, `FRIL`: three-letter names; what follows a complete name is
    /// ignored, steps included (Quartz reads `JAN/3` as `JAN`).
    fn name(&mut self) -> Result<(), ItemError> {
        let names: &[&str] = match self.field {
            Field::Month => &MONTH_NAMES,
            Field::DayOfWeek => &DAY_NAMES,
            _ => {
                let first = char::from(self.text[0]);
                return self.fail(0, format!("unexpected character `{first}`"));
            }
        };
        let lookup = |parser: &Self, at: usize| -> Result<u32, ItemError> {
            let name = parser.text.get(at..at + 3).and_then(|name| std::str::from_utf8(name).ok());
            match name.and_then(|name| names.iter().position(|known| *known == name)) {
                Some(index) => Ok(index as u32 + 1),
                None => parser.fail(at, format!("unknown {} name", parser.field)),
            }
        };
        let start = lookup(self, 0)?;
        match self.text.get(3) {
            Some(b'-') => {
                let end = lookup(self, 4)?;
                self.range(start, end, 1, 0)
            }
            Some(b'#') if self.field == Field::DayOfWeek => {
                self.nth(4)?;
                self.single(start, 0)
            }
            Some(b'L') if self.field == Field::DayOfWeek => {
                self.modifiers.last_weekday = true;
                self.single(start, 0)
            }
            _ => self.single(start, 0),
        }
    }

    fn no_spec(&mut self) -> Result<(), ItemError> {
        if self.text.len() > 2 {
            return self.fail(1, "unexpected character after `?`");
        }
        if !matches!(self.field, Field::DayOfMonth | Field::DayOfWeek) {
            return self.fail(0, "`?` is only allowed for day-of-month or day-of-week");
        }
        if self.field == Field::DayOfWeek && self.dom_no_spec {
            return self.fail(0, "`?` is allowed for day-of-month or day-of-week, not both");
        }
        self.set.no_spec = true;
        Ok(())
    }

    /// `*`, `*/n`, `/n`: every value, or every `n`-th from the smallest.
    fn every(&mut self) -> Result<(), ItemError> {
        let (min, max, _) = self.field.limits();
        let step = match (self.text[0], self.text.get(1)) {
            (b'*', None) => 1,
            (b'/', None) => return self.fail(0, "`/` must be followed by a number"),
            (b'*', Some(b'/')) if self.text.len() == 2 => {
                return self.fail(2, "`/` must be followed by a number");
            }
            (b'*', Some(b'/')) => self.whole_step(2)?,
            (b'/', Some(_)) => self.whole_step(1)?,
            // Quartz ignores what follows a `*` other than a step.
            _ => 1,
        };
        let start = if self.field == Field::Year { FIRST_YEAR as u32 } else { min };
        self.add(start, max, step.max(1))
    }

    /// The rest of the item from `at` as a step, checked against the field's largest step.
    /// Quartz reads it as a signed integer, and a step of 0 or less as 1.
    fn whole_step(&mut self, at: usize) -> Result<u32, ItemError> {
        let text = std::str::from_utf8(&self.text[at..]).unwrap_or_default();
        let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
        let step = Some(text)
            .filter(|_| !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()))
            .and_then(|text| text.parse::<i32>().ok());
        match step {
            Some(step) => self.check_step(u32::try_from(step).unwrap_or(0), self.text.len()),
            None => self.fail(at, "the step must be a number"),
        }
    }

    fn check_step(&self, step: u32, at: usize) -> Result<u32, ItemError> {
        let (_, _, largest) = self.field.limits();
        if step > largest {
            return self.fail(at, format!("the step must be at most {largest}"));
        }
        Ok(step)
    }

    /// `L` forms: `L` in day-of-week is Saturday (7); in day-of-month `L`, `L-n`, `LW`, `L-nW`.
    fn last(&mut self) -> Result<(), ItemError> {
        self.at = 1;
        match self.field {
            Field::DayOfWeek => self.single(7, 0),
            Field::DayOfMonth => {
                let mut offset = 0;
                if self.peek() == Some(b'-') {
                    self.at += 1;
                    if self.peek().is_none() {
                        return self.fail(self.at, "`L-` must be followed by a number");
                    }
                    offset = self.digits().unwrap_or(0);
                    if offset > 30 {
                        return self.fail(2, "the offset from the last day must be at most 30");
                    }
                }
                let weekday = self.peek() == Some(b'W');
                self.modifiers.last_day = Some((offset, weekday));
                Ok(())
            }
            _ => self.fail(0, "`L` is only allowed for day-of-month or day-of-week"),
        }
    }

    /// A number, then nothing, `L`, `W`, `#k`, `-end[/step]` or `/step`.
    fn number(&mut self) -> Result<(), ItemError> {
        let Some(value) = self.digits() else {
            return self.fail(0, "number too large");
        };
        let at = self.at;
        match self.peek() {
            None => self.single(value, 0),
            Some(b'L') if self.field == Field::DayOfWeek => {
                self.modifiers.last_weekday = true;
                self.single(value, 0)
            }
            Some(b'L') => self
                .fail(at, format!("`L` after a number is not allowed in the {} field", self.field)),
            Some(b'W') if self.field == Field::DayOfMonth => {
                if value > 31 {
                    return self.fail(at, "`W` needs a day of at most 31");
                }
                self.modifiers.nearest_weekday = true;
                self.single(value, 0)
            }
            Some(b'W') => self.fail(at, format!("`W` is not allowed in the {} field", self.field)),
            Some(b'#') if self.field == Field::DayOfWeek => {
                self.nth(at + 1)?;
                self.single(value, 0)
            }
            Some(b'#') => self.fail(at, format!("`#` is not allowed in the {} field", self.field)),
            Some(b'-') => {
                self.at += 1;
                if !self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
                    return self.fail(self.at, "a range must end with a number");
                }
                let Some(end) = self.digits() else {
                    return self.fail(at + 1, "number too large");
                };
                // A step after a range is not checked against the field's largest step.
                let step = if self.peek() == Some(b'/') {
                    self.at += 1;
                    if !self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
                        return self.fail(self.at, "`/` must be followed by a number");
                    }
                    let Some(step) = self.digits() else {
                        return self.fail(self.at, "number too large");
                    };
                    step
                } else {
                    1
                };
                self.range(value, end, step, at + 1)
            }
            Some(b'/') => {
                self.at += 1;
                if self.peek().is_none() {
                    return self.fail(at, "`/` must be followed by a number");
                }
                if !self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
                    return self.fail(self.at, "`/` must be followed by a number");
                }
                let step_at = self.at;
                let Some(step) = self.digits() else {
                    return self.fail(self.at, "number too large");
                };
                // As in Quartz, a one-digit step must end the item; after a longer one, the rest
                // is ignored.
                if self.at == step_at + 1 && self.peek().is_some() {
                    return self.fail(self.at, "unexpected character after the step");
                }
                let step = self.check_step(step, at + 1)?;
                let (_, max, _) = self.field.limits();
                if step == 0 {
                    return self.single(value, 0);
                }
                self.check(value, 0)?;
                self.add(value, max.max(value), step)
            }
            // Quartz ignores anything else after a number.
            Some(_) => self.single(value, 0),
        }
    }

    /// `#k` at `at`: the rest of the item must be a number from 1 to 5.
    fn nth(&mut self, at: usize) -> Result<(), ItemError> {
        let rest = self.text.get(at..).unwrap_or_default();
        let nth = std::str::from_utf8(rest)
            .ok()
            .filter(|text| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()))
            .and_then(|text| text.parse::<u32>().ok());
        match nth {
            Some(nth @ 1..=5) => {
                self.modifiers.nth_weekday = Some(nth);
                Ok(())
            }
            _ => self.fail(at, "`#` must be followed by a number from 1 to 5"),
        }
    }

    /// Reads decimal digits at the cursor; `None` on overflow (or when there are none).
    fn digits(&mut self) -> Option<u32> {
        let start = self.at;
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.at += 1;
        }
        std::str::from_utf8(&self.text[start..self.at]).ok()?.parse().ok()
    }

    fn check(&self, value: u32, at: usize) -> Result<(), ItemError> {
        let (min, max, _) = self.field.limits();
        if self.field != Field::Year && !(min..=max).contains(&value) {
            return self.fail(at, format!("{} values must be from {min} to {max}", self.field));
        }
        Ok(())
    }

    fn single(&mut self, value: u32, at: usize) -> Result<(), ItemError> {
        self.check(value, at)?;
        self.add(value, value, 1)
    }

    /// `start-end/step`; an end before the start wraps around the field (`FRI-MON`, `22-2`),
    /// except for years. A step of 0 means the start alone.
    fn range(&mut self, start: u32, end: u32, step: u32, end_at: usize) -> Result<(), ItemError> {
        self.check(start, 0)?;
        self.check(end, end_at)?;
        if step == 0 {
            return self.add(start, start, 1);
        }
        if end < start {
            if self.field == Field::Year {
                return self.fail(end_at, "a year range must not end before it starts");
            }
            let (min, max, _) = self.field.limits();
            let span = max - min + 1;
            let mut value = start;
            while value <= end + span {
                let wrapped = if value > max { value - span } else { value };
                self.add(wrapped, wrapped, 1)?;
                value = value.saturating_add(step);
            }
            return Ok(());
        }
        self.add(start, end, step)
    }

    /// Adds `start, start + step, ..` up to `end`; years outside the searched span are dropped.
    fn add(&mut self, start: u32, end: u32, step: u32) -> Result<(), ItemError> {
        if self.field == Field::Year {
            let mut year = u64::from(start);
            while year <= u64::from(end).min(LAST_YEAR as u64) {
                if year >= FIRST_YEAR as u64 {
                    let index = (year - FIRST_YEAR as u64) as usize;
                    self.set.years[index / 64] |= 1 << (index % 64);
                }
                year = year.saturating_add(u64::from(step));
            }
            return Ok(());
        }
        let mut value = start;
        while value <= end {
            self.set.bits |= 1 << value;
            value = value.saturating_add(step);
        }
        Ok(())
    }
}

/// `L-` followed by digits and an optional `W`: Quartz's day-of-month offset form.
fn is_last_offset(text: &[u8]) -> bool {
    let Some(rest) = text.strip_prefix(b"L-") else {
        return false;
    };
    let digits = rest.strip_suffix(b"W").unwrap_or(rest);
    digits.iter().all(u8::is_ascii_digit)
}
