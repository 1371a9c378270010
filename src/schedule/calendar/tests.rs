//! Table tests of calendars: which instants each rule excludes and why, included dates over
//! exclusions, the next allowed fire through daylight-saving changes, the scheduler's decision,
//! the bound on searches, refusals, and `.ics` files.

use chrono::DateTime;
use expect_test::{Expect, expect};

use super::*;
use crate::model::{CalendarSpec, MisfireStrategy, ScheduleType};

/// An RFC 3339 instant in ms.
fn ms(text: &str) -> i64 {
    DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
}

/// An instant on the wall clock of `zone`, with its abbreviation.
fn show(ms: i64, zone: Tz) -> String {
    let at = DateTime::from_timestamp_millis(ms).unwrap().with_timezone(&zone);
    at.format("%a %Y-%m-%d %H:%M:%S %Z").to_string()
}

/// A calendar in `zone` from `rule: entry` lines.
fn calendar(zone: &str, rules: &[&str]) -> Calendar {
    let mut spec = CalendarSpec { time_zone: Some(zone.to_owned()), ..CalendarSpec::default() };
    for rule in rules {
        let (field, entry) = rule.split_once(": ").unwrap();
        let list = match field {
            "excluded_dates" => &mut spec.excluded_dates,
            "annual_dates" => &mut spec.annual_dates,
            "weekdays" => &mut spec.weekdays,
            "daily_windows" => &mut spec.daily_windows,
            "cron" => &mut spec.cron,
            "included_dates" => &mut spec.included_dates,
            other => panic!("no field {other}"),
        };
        list.push(entry.to_owned());
    }
    Calendar::parse(&spec).unwrap()
}

/// Renders whether each instant is excluded, by which rule and until when.
fn check_excluded(calendar: &Calendar, instants: &[&str], expect: Expect) {
    let zone = calendar.zone();
    let text: String = instants
        .iter()
        .map(|at| {
            let verdict = match calendar.excluded(ms(at)) {
                None => "allowed".to_owned(),
                Some(exclusion) => {
                    format!(
                        "excluded by {} until {}",
                        exclusion.rule,
                        show(exclusion.until_ms, zone)
                    )
                }
            };
            format!("{}: {verdict}\n", show(ms(at), zone))
        })
        .collect();
    expect.assert_eq(&text);
}

/// Renders the walk of `schedule` under `calendar` from `after`.
fn check_walk(
    calendar: &Calendar,
    schedule: (ScheduleType, &str),
    after: &str,
    count: usize,
    expect: Expect,
) {
    let zone = calendar.zone();
    let schedule = Schedule::parse(schedule.0, schedule.1, Some(&zone.to_string())).unwrap();
    let text: String = calendar
        .walk(&schedule, ms(after), count)
        .iter()
        .map(|step| match step {
            Step::Fire(at) => format!("fire {}\n", show(*at, zone)),
            Step::Excluded { at_ms, exclusion } => {
                format!("skip {} ({})\n", show(*at_ms, zone), exclusion.rule)
            }
            Step::GaveUp(at) => format!("gave up at {}\n", show(*at, zone)),
        })
        .collect();
    expect.assert_eq(&text);
}

#[test]
fn each_rule_excludes_and_says_until_when() {
    let shanghai = calendar(
        "Asia/Shanghai",
        &[
            "excluded_dates: 2026-10-01/2026-10-07",
            "excluded_dates: 2026-01-01",
            "annual_dates: 05-01",
            "weekdays: SAT",
            "weekdays: sunday",
            "daily_windows: 22:00-06:00",
            "cron: * * 12 ? * MON-FRI",
            "included_dates: 2026-09-27",
            "included_dates: 2026-10-04",
        ],
    );
    check_excluded(
        &shanghai,
        &[
            "2026-10-02T03:00:00Z",
            "2026-10-04T03:00:00Z",
            "2026-10-05T03:00:00Z",
            "2026-01-01T10:00:00+08:00",
            "2027-05-01T10:00:00+08:00",
            "2026-09-26T10:00:00+08:00",
            "2026-09-27T10:00:00+08:00",
            "2026-09-28T10:00:00+08:00",
            "2026-09-28T23:30:00+08:00",
            "2026-09-29T05:59:59+08:00",
            "2026-09-29T06:00:00+08:00",
            "2026-09-29T12:30:15.500+08:00",
            "2026-09-29T13:00:00+08:00",
        ],
        expect![[r#"
            Fri 2026-10-02 11:00:00 CST: excluded by excluded_dates 2026-10-01/2026-10-07 until Sun 2026-10-04 00:00:00 CST
            Sun 2026-10-04 11:00:00 CST: allowed
            Mon 2026-10-05 11:00:00 CST: excluded by excluded_dates 2026-10-01/2026-10-07 until Thu 2026-10-08 00:00:00 CST
            Thu 2026-01-01 10:00:00 CST: excluded by excluded_dates 2026-01-01 until Fri 2026-01-02 00:00:00 CST
            Sat 2027-05-01 10:00:00 CST: excluded by annual_dates 05-01 until Sun 2027-05-02 00:00:00 CST
            Sat 2026-09-26 10:00:00 CST: excluded by weekdays SAT until Sun 2026-09-27 00:00:00 CST
            Sun 2026-09-27 10:00:00 CST: allowed
            Mon 2026-09-28 10:00:00 CST: allowed
            Mon 2026-09-28 23:30:00 CST: excluded by daily_windows 22:00-06:00 until Tue 2026-09-29 06:00:00 CST
            Tue 2026-09-29 05:59:59 CST: excluded by daily_windows 22:00-06:00 until Tue 2026-09-29 06:00:00 CST
            Tue 2026-09-29 06:00:00 CST: allowed
            Tue 2026-09-29 12:30:15 CST: excluded by cron `* * 12 ? * MON-FRI` until Tue 2026-09-29 13:00:00 CST
            Tue 2026-09-29 13:00:00 CST: allowed
        "#]],
    );
}

#[test]
fn daily_windows_and_dates_through_daylight_saving() {
    // Berlin springs forward on 2026-03-29 at 02:00 and falls back on 2026-10-25 at 03:00.
    let berlin =
        calendar("Europe/Berlin", &["daily_windows: 00:00-06:00", "daily_windows: 02:15-02:45"]);
    check_excluded(
        &berlin,
        &[
            "2026-03-28T23:30:00Z",
            "2026-03-29T00:59:59Z",
            "2026-03-29T04:00:00Z",
            "2026-03-30T00:20:00Z",
            "2026-10-24T23:00:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-26T00:30:00Z",
            "2026-10-26T01:30:00Z",
        ],
        expect![[r#"
            Sun 2026-03-29 00:30:00 CET: excluded by daily_windows 00:00-06:00 until Sun 2026-03-29 06:00:00 CEST
            Sun 2026-03-29 01:59:59 CET: excluded by daily_windows 00:00-06:00 until Sun 2026-03-29 06:00:00 CEST
            Sun 2026-03-29 06:00:00 CEST: allowed
            Mon 2026-03-30 02:20:00 CEST: excluded by daily_windows 00:00-06:00 until Mon 2026-03-30 06:00:00 CEST
            Sun 2026-10-25 01:00:00 CEST: excluded by daily_windows 00:00-06:00 until Sun 2026-10-25 06:00:00 CET
            Sun 2026-10-25 02:30:00 CEST: excluded by daily_windows 00:00-06:00 until Sun 2026-10-25 06:00:00 CET
            Sun 2026-10-25 02:30:00 CET: excluded by daily_windows 00:00-06:00 until Sun 2026-10-25 06:00:00 CET
            Mon 2026-10-26 01:30:00 CET: excluded by daily_windows 00:00-06:00 until Mon 2026-10-26 06:00:00 CET
            Mon 2026-10-26 02:30:00 CET: excluded by daily_windows 00:00-06:00 until Mon 2026-10-26 06:00:00 CET
        "#]],
    );
    // A window wholly in the spring gap excludes nothing that day; in the repeated hour it
    // excludes both passes. The date's exclusion lasts the whole 25-hour day.
    let gap = calendar("Europe/Berlin", &["daily_windows: 02:15-02:45"]);
    check_excluded(
        &gap,
        &[
            "2026-03-29T00:59:59Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T01:30:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:30:00Z",
        ],
        expect![[r#"
            Sun 2026-03-29 01:59:59 CET: allowed
            Sun 2026-03-29 03:00:00 CEST: allowed
            Sun 2026-03-29 03:30:00 CEST: allowed
            Sun 2026-10-25 02:30:00 CEST: excluded by daily_windows 02:15-02:45 until Sun 2026-10-25 02:45:00 CEST
            Sun 2026-10-25 02:30:00 CET: excluded by daily_windows 02:15-02:45 until Sun 2026-10-25 02:45:00 CET
        "#]],
    );
    let day = calendar("Europe/Berlin", &["excluded_dates: 2026-10-25"]);
    check_excluded(
        &day,
        &["2026-10-24T22:30:00Z", "2026-10-25T22:59:59Z", "2026-10-25T23:00:00Z"],
        expect![[r#"
            Sun 2026-10-25 00:30:00 CEST: excluded by excluded_dates 2026-10-25 until Mon 2026-10-26 00:00:00 CET
            Sun 2026-10-25 23:59:59 CET: excluded by excluded_dates 2026-10-25 until Mon 2026-10-26 00:00:00 CET
            Mon 2026-10-26 00:00:00 CET: allowed
        "#]],
    );
    // New York: a window ending in the repeated hour ends on each pass.
    let new_york = calendar("America/New_York", &["daily_windows: 00:30-01:30"]);
    check_excluded(
        &new_york,
        &[
            "2026-11-01T05:10:00Z",
            "2026-11-01T05:40:00Z",
            "2026-11-01T06:10:00Z",
            "2026-11-01T06:40:00Z",
        ],
        expect![[r#"
            Sun 2026-11-01 01:10:00 EDT: excluded by daily_windows 00:30-01:30 until Sun 2026-11-01 01:30:00 EDT
            Sun 2026-11-01 01:40:00 EDT: allowed
            Sun 2026-11-01 01:10:00 EST: excluded by daily_windows 00:30-01:30 until Sun 2026-11-01 01:30:00 EST
            Sun 2026-11-01 01:40:00 EST: allowed
        "#]],
    );
}

#[test]
fn fires_skip_excluded_spans() {
    use ScheduleType::{Cron, FixRate};
    let workdays = calendar(
        "Asia/Shanghai",
        &[
            "weekdays: SAT",
            "weekdays: SUN",
            "excluded_dates: 2026-10-01/2026-10-07",
            "included_dates: 2026-10-10",
        ],
    );
    check_walk(
        &workdays,
        (Cron, "0 0 9 * * ?"),
        "2026-09-30T00:00:00Z",
        3,
        expect![[r#"
            fire Wed 2026-09-30 09:00:00 CST
            skip Thu 2026-10-01 09:00:00 CST (excluded_dates 2026-10-01/2026-10-07)
            fire Thu 2026-10-08 09:00:00 CST
            fire Fri 2026-10-09 09:00:00 CST
        "#]],
    );
    // Every second: one skip per excluded span, not one per second.
    check_walk(
        &workdays,
        (Cron, "* * * * * ?"),
        "2026-10-09T15:59:58Z",
        2,
        expect![[r#"
        fire Fri 2026-10-09 23:59:59 CST
        fire Sat 2026-10-10 00:00:00 CST
    "#]],
    );
    check_walk(
        &workdays,
        (Cron, "* * * * * ?"),
        "2026-10-10T15:59:58Z",
        2,
        expect![[r#"
        fire Sat 2026-10-10 23:59:59 CST
        skip Sun 2026-10-11 00:00:00 CST (weekdays SUN)
        fire Mon 2026-10-12 00:00:00 CST
    "#]],
    );
    // A fixed rate keeps its phase across the exclusion.
    let night = calendar("Europe/Berlin", &["daily_windows: 00:00-06:00"]);
    check_walk(
        &night,
        (FixRate, "7"),
        "2026-03-28T22:59:50.250Z",
        2,
        expect![[r#"
            fire Sat 2026-03-28 23:59:57 CET
            skip Sun 2026-03-29 00:00:04 CET (daily_windows 00:00-06:00)
            fire Sun 2026-03-29 06:00:01 CEST
        "#]],
    );
    // Berlin's daily 02:30 fires at 03:00 on the spring-forward day; a 03:00-04:00 window
    // excludes that fire.
    let three = calendar("Europe/Berlin", &["daily_windows: 03:00-04:00"]);
    check_walk(
        &three,
        (Cron, "0 30 2 * * ?"),
        "2026-03-28T12:00:00Z",
        2,
        expect![[r#"
            skip Sun 2026-03-29 03:00:00 CEST (daily_windows 03:00-04:00)
            fire Mon 2026-03-30 02:30:00 CEST
            fire Tue 2026-03-31 02:30:00 CEST
        "#]],
    );
}

#[test]
fn a_calendar_that_excludes_everything_gives_up() {
    use ScheduleType::{Cron, Once};
    // One probe a day, for a year, then an answer: the first and last steps.
    let always = calendar("UTC", &["daily_windows: 00:00-24:00"]);
    let schedule = Schedule::parse(Cron, "* * * * * ?", None).unwrap();
    let steps = always.walk(&schedule, ms("2026-01-01T00:00:00Z"), 1);
    let show_step = |step: &Step| match step {
        Step::Fire(at) => format!("fire {}", show(*at, Tz::UTC)),
        Step::Excluded { at_ms, exclusion } => {
            format!("skip {} ({})", show(*at_ms, Tz::UTC), exclusion.rule)
        }
        Step::GaveUp(at) => format!("gave up at {}", show(*at, Tz::UTC)),
    };
    let ends: Vec<String> =
        [&steps[0], &steps[1], &steps[steps.len() - 2], &steps[steps.len() - 1]]
            .into_iter()
            .map(show_step)
            .collect();
    expect![[r#"
        369 steps
        skip Thu 2026-01-01 00:00:01 UTC (daily_windows 00:00-24:00)
        skip Fri 2026-01-02 00:00:00 UTC (daily_windows 00:00-24:00)
        skip Sun 2027-01-03 00:00:00 UTC (daily_windows 00:00-24:00)
        gave up at Sun 2027-01-03 00:00:00 UTC
    "#]]
    .assert_eq(&format!("{} steps\n{}\n", steps.len(), ends.join("\n")));
    let every_second = calendar("UTC", &["cron: * * * * * ?"]);
    let schedule = Schedule::parse(Cron, "* * * * * ?", None).unwrap();
    let started = std::time::Instant::now();
    let next = every_second.next_fire(&schedule, ms("2026-01-01T00:00:00Z"));
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(next, CalendarNext::GaveUp(_)), "{next:?}");
    let once = Schedule::parse(Once, "2026-01-01T12:00:00Z", None).unwrap();
    assert_eq!(always.next_fire(&once, ms("2026-01-01T00:00:00Z")), CalendarNext::Never);
}

#[test]
fn decisions() {
    use MisfireStrategy::{DoNothing, FireOnceNow};
    let weekend = calendar("UTC", &["weekdays: SAT", "weekdays: SUN"]);
    let daily = Schedule::parse(ScheduleType::Cron, "0 0 9 * * ?", None).unwrap();
    let rows = [
        ("Fri on time", DoNothing, "2026-10-09T09:00:00Z", "2026-10-09T09:00:00Z"),
        ("Sat on time", DoNothing, "2026-10-10T09:00:00Z", "2026-10-10T09:00:00Z"),
        ("Sat an hour late", FireOnceNow, "2026-10-10T09:00:00Z", "2026-10-10T10:00:00Z"),
        ("Fri late into Sat", FireOnceNow, "2026-10-09T09:00:00Z", "2026-10-10T10:00:00Z"),
        ("Fri late", FireOnceNow, "2026-10-09T09:00:00Z", "2026-10-09T10:00:00Z"),
    ];
    let text: String = rows
        .iter()
        .map(|(label, misfire, scheduled, now)| {
            let decision = decide(&weekend, &daily, *misfire, 5_000, ms(scheduled), ms(now));
            let next = |next: NextFire| match next {
                NextFire::At(at) => show(at, Tz::UTC),
                other => format!("{other:?}"),
            };
            let verdict = match decision {
                CalendarDecision::Excluded { exclusion, next: after } => {
                    format!("excluded by {}, next {}", exclusion.rule, next(after))
                }
                CalendarDecision::Decided(decision) => format!(
                    "fire {:?}, next {}",
                    decision.fire.map(|(at, kind)| (show(at, Tz::UTC), kind)),
                    next(decision.next)
                ),
            };
            format!("{label}: {verdict}\n")
        })
        .collect();
    expect![[r#"
        Fri on time: fire Some(("Fri 2026-10-09 09:00:00 UTC", Cron)), next Mon 2026-10-12 09:00:00 UTC
        Sat on time: excluded by weekdays SAT, next Mon 2026-10-12 09:00:00 UTC
        Sat an hour late: excluded by weekdays SAT, next Mon 2026-10-12 09:00:00 UTC
        Fri late into Sat: fire None, next Mon 2026-10-12 09:00:00 UTC
        Fri late: fire Some(("Fri 2026-10-09 10:00:00 UTC", Misfire)), next Mon 2026-10-12 09:00:00 UTC
    "#]]
    .assert_eq(&text);
}

#[test]
fn refusals() {
    let rows: &[(&str, &str)] = &[
        ("time_zone", "Mars/Olympus"),
        ("excluded_dates", "2026-13-01"),
        ("excluded_dates", "2026-10-07/2026-10-01"),
        ("annual_dates", "02-30"),
        ("annual_dates", "5-1"),
        ("weekdays", "SA"),
        ("daily_windows", "06:00-06:00"),
        ("daily_windows", "24:00-06:00"),
        ("daily_windows", "6:00-07:00"),
        ("daily_windows", "06:00-24:01"),
        ("cron", "* * *"),
        ("included_dates", "tomorrow"),
    ];
    let text: String = rows
        .iter()
        .map(|&(field, entry)| {
            let mut spec = CalendarSpec::default();
            match field {
                "time_zone" => spec.time_zone = Some(entry.to_owned()),
                "excluded_dates" => spec.excluded_dates.push(entry.to_owned()),
                "annual_dates" => spec.annual_dates.push(entry.to_owned()),
                "weekdays" => spec.weekdays.push(entry.to_owned()),
                "daily_windows" => spec.daily_windows.push(entry.to_owned()),
                "cron" => spec.cron.push(entry.to_owned()),
                _ => spec.included_dates.push(entry.to_owned()),
            }
            format!("{}\n", Calendar::parse(&spec).unwrap_err())
        })
        .collect();
    expect![[r#"
        unknown time zone `Mars/Olympus`
        excluded_dates: `2026-13-01` is not a date (YYYY-MM-DD) or a range of dates (YYYY-MM-DD/YYYY-MM-DD, first not after last)
        excluded_dates: `2026-10-07/2026-10-01` is not a date (YYYY-MM-DD) or a range of dates (YYYY-MM-DD/YYYY-MM-DD, first not after last)
        annual_dates: `02-30` is not a day of the year (MM-DD, such as 05-01)
        annual_dates: `5-1` is not a day of the year (MM-DD, such as 05-01)
        weekdays: `SA` is not a weekday (MON, TUE, WED, THU, FRI, SAT, SUN)
        daily_windows: `06:00-06:00` is not a window of the day (HH:MM-HH:MM with different ends, such as 00:00-06:00, 22:00-06:00 or 00:00-24:00)
        daily_windows: `24:00-06:00` is not a window of the day (HH:MM-HH:MM with different ends, such as 00:00-06:00, 22:00-06:00 or 00:00-24:00)
        daily_windows: `6:00-07:00` is not a window of the day (HH:MM-HH:MM with different ends, such as 00:00-06:00, 22:00-06:00 or 00:00-24:00)
        daily_windows: `06:00-24:01` is not a window of the day (HH:MM-HH:MM with different ends, such as 00:00-06:00, 22:00-06:00 or 00:00-24:00)
        cron: invalid cron expression `* * *`: at character 5: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 3
        included_dates: `tomorrow` is not a date (YYYY-MM-DD) or a range of dates (YYYY-MM-DD/YYYY-MM-DD, first not after last)
    "#]]
    .assert_eq(&text);
}

#[test]
fn ics_files() {
    let holidays = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nSUMMARY:National Day\r\nDTSTART;VALUE=DATE:20261001\r\nDTEND;VALUE=DATE:20261008\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nSUMMARY:New Year\r\nDTSTART;VALUE=DATE:2026\r\n 0101\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nDTSTART:20260501T160000Z\r\nDTEND:20260501T170000Z\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nDTSTART;TZID=\"America/New_York\":20260601T230000\r\nDURATION:PT1H\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20260210\r\nDURATION:P3D\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";
    let files = [
        holidays,
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART;VALUE=DATE:20260101\nRRULE:FREQ=YEARLY\nEND:VEVENT\nEND:VCALENDAR\n",
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART:2026-01-01\nEND:VEVENT\nEND:VCALENDAR\n",
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nSUMMARY:no start\nEND:VEVENT\nEND:VCALENDAR\n",
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART:20260101\n",
        "just text",
    ];
    let zone: Tz = "Asia/Shanghai".parse().unwrap();
    let text: String = files
        .iter()
        .map(|file| match parse_ics_dates(file, zone) {
            Ok(dates) => format!("{}\n", dates.join(" ")),
            Err(error) => format!("error: {error}\n"),
        })
        .collect();
    expect![[r#"
        2026-10-01/2026-10-07 2026-01-01 2026-05-02 2026-06-02 2026-02-10/2026-02-12
        error: line 4: recurring events (RRULE, RDATE) are not read
        error: line 3: `2026-01-01` is not a DATE (20261001) or DATE-TIME (20261001T090000Z)
        error: line 2: an event without DTSTART
        error: line 2: BEGIN:VEVENT without END
        error: line 1: `just text` is not a property (NAME:value)
    "#]]
    .assert_eq(&text);
}
