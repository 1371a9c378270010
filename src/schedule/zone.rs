//! From matching wall times to instants: the daylight-saving policy of cron schedules.
//!
//! `cron.rs` answers "which wall time matches next"; this file answers "which instant fires
//! next" in a time zone whose wall clock jumps forward (a gap of wall times that do not exist)
//! or falls back (an overlap of wall times that happen twice). The policy, documented in the
//! `schedule` module doc, depends on whether the expression repeats across hours
//! ([`CronExpr::repeats_hourly`]): repeating schedules keep their cadence in real time, fixed
//! times of day fire exactly once a day. It deliberately knows nothing of fix-rate schedules or
//! misfires.

use chrono::{DateTime, MappedLocalTime, NaiveDateTime, Offset, TimeDelta, TimeZone};
use chrono_tz::Tz;

use super::cron::CronExpr;

/// An upper bound on the length of a gap or an overlap; Samoa's 2011 gap of a whole day is the
/// longest on record.
const MAX_TRANSITION_SECS: i64 = 3 * 86_400;

/// The first fire strictly after `after_sec` (seconds since the Unix epoch), or `None` when the
/// expression has no further match up to the end of `last_year`.
pub fn next_fire(cron: &CronExpr, zone: Tz, after_sec: i64, last_year: i32) -> Option<i64> {
    let after = DateTime::from_timestamp(after_sec, 0)?;
    let wall = after.with_timezone(&zone).naive_local();
    let repeats = cron.repeats_hourly();
    let next_after = |wall: NaiveDateTime| cron.next_after(wall, last_year);
    let MappedLocalTime::Ambiguous(first, second) = zone.from_local_datetime(&wall) else {
        return resolve(next_after, zone, next_after(wall)?, repeats);
    };
    // `after` lies in an overlap: the wall times from `start` to `end` (exclusive) happen once
    // with the earlier offset (the first pass) and again with the later one (the second pass).
    let end = first_wall_where(wall, |probe| {
        !matches!(zone.from_local_datetime(&probe), MappedLocalTime::Ambiguous(..))
    })?;
    let length = first.offset().fix().local_minus_utc() - second.offset().fix().local_minus_utc();
    let start = end.checked_sub_signed(TimeDelta::seconds(i64::from(length)))?;
    let before = |wall: NaiveDateTime| wall.checked_sub_signed(TimeDelta::seconds(1));
    let in_overlap = |candidate: &NaiveDateTime| *candidate < end;
    if first.timestamp() == after_sec {
        if let Some(candidate) = next_after(wall).filter(in_overlap) {
            return zone.from_local_datetime(&candidate).earliest().map(|fire| fire.timestamp());
        }
        if repeats && let Some(candidate) = next_after(before(start)?).filter(in_overlap) {
            return zone.from_local_datetime(&candidate).latest().map(|fire| fire.timestamp());
        }
    } else if repeats && let Some(candidate) = next_after(wall).filter(in_overlap) {
        return zone.from_local_datetime(&candidate).latest().map(|fire| fire.timestamp());
    }
    // Fixed times fire on the first pass only, so the search resumes where the overlap ends.
    let resume = next_after(before(end)?.max(wall))?;
    resolve(next_after, zone, resume, repeats)
}

/// The instant of the matching wall time `candidate`, which lies after the wall time of the
/// instant searched from: the first pass of an overlap, and for a gap either the instant the
/// gap ends (fixed times) or the next match after the gap (repeating schedules).
fn resolve(
    next_after: impl Fn(NaiveDateTime) -> Option<NaiveDateTime>,
    zone: Tz,
    mut candidate: NaiveDateTime,
    repeats: bool,
) -> Option<i64> {
    loop {
        if let Some(fire) = zone.from_local_datetime(&candidate).earliest() {
            return Some(fire.timestamp());
        }
        let end = first_wall_where(candidate, |probe| {
            zone.from_local_datetime(&probe).earliest().is_some()
        })?;
        if !repeats {
            return zone.from_local_datetime(&end).earliest().map(|fire| fire.timestamp());
        }
        candidate = next_after(end.checked_sub_signed(TimeDelta::seconds(1))?)?;
    }
}

/// The first whole-second wall time after `from` at which `found` holds, given that it does not
/// hold at `from`: steps double until one lands, then bisection narrows it down. A transition
/// lasts hours and they are months apart, so `found` flips once in the span searched.
pub(super) fn first_wall_where(
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
