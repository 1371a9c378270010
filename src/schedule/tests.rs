//! Table tests of fire times, parsing, daylight saving and misfire decisions.

use super::*;
use chrono::{DateTime, NaiveDate, TimeDelta, TimeZone};
use expect_test::{Expect, expect};

use MisfireStrategy::{DoNothing, FireOnceNow};
use ScheduleType::{Cron, FixDelay, FixRate, None as Never, Once};

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

/// (kind, conf, misfire, threshold ms, scheduled, now) → the decision.
type DecisionRow = (ScheduleType, &'static str, MisfireStrategy, i64, &'static str, &'static str);

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
        (Cron, "0 0 12 * * 2", None, at, 1),
        (Cron, "0 0 12 ? * ?", None, at, 1),
        (Cron, "0 0 12 W * ?", None, at, 1),
        (Cron, "0 0 12 L-31 * ?", None, at, 1),
        (Cron, "0 0 12 1,L * ?", None, at, 1),
        (Cron, "0 0 12 ? * 2L,3", None, at, 1),
        (Cron, "0 0 12 ? * 2#1,3#2", None, at, 1),
        (Cron, "0 0 12 ? * 2#6", None, at, 1),
        (Cron, "0 0 12 ? * 8", None, at, 1),
        (Cron, "0 0 12 32W * ?", None, at, 1),
        (Cron, "0 0 12 5L * ?", None, at, 1),
        (Cron, "0 0/60 * * * ?", None, at, 1),
        (Cron, "0 0 12 ? * MON-FOO", None, at, 1),
        (Cron, "0 0 12 ? JAN- *", None, at, 1),
        (Cron, "5- * * * * ?", None, at, 1),
        (Cron, "0/x * * * * ?", None, at, 1),
        (Cron, "0 0 12 ?xy * ?", None, at, 1),
        (Cron, "0 0 12 1 1 ? 2031-2027", None, at, 1),
        (Cron, "0 0 12 ? * ,", None, at, 1),
        (Cron, "L * * * * ?", None, at, 1),
        (Cron, "0 0 12 ? * MÖN", None, at, 1),
        (Cron, "0 0 12 ? * 5-é", None, at, 1),
        (Cron, "@daily", None, at, 1),
        (Cron, "0 0 12 * * ?", Some("Mars/Olympus"), at, 1),
        (Cron, "0 0 12 * * ?", Some(""), at, 1),
        (FixRate, "0", None, at, 1),
        (FixRate, "+5", None, at, 1),
        (FixRate, "1.5", None, at, 1),
        (FixRate, "31536001", None, at, 1),
        (FixRate, "", None, at, 1),
        (FixDelay, "0", None, at, 1),
        (FixDelay, "-3", None, at, 1),
        (FixDelay, "ten", None, at, 1),
        (Once, "", None, at, 1),
        (Once, "2026-05-01 09:00:00", None, at, 1),
        (Once, "2026-05-01T09:00:00", None, at, 1),
        (Once, "1777618800000", None, at, 1),
        (Never, "30", None, at, 1),
    ];
    check(
        rows,
        fires,
        expect![[r#"
            CRON `* * *` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `* * *`: at character 5: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 3
            CRON `0 0 12 * *` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 * *`: at character 10: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 5
            CRON `0 0 12 ? * 2 2026 2027` after Wed 2025-01-01 00:00:00 UTC: [Mon 2026-01-05 12:00:00 UTC]
            CRON `0 0 12 1 * MON` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 1 * MON`: day-of-week field, at character 11: exactly one of day-of-month and day-of-week must be `?`
            CRON `0 0 12 ? * 0` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 0`: day-of-week field, at character 11: day-of-week values must be from 1 to 7
            CRON `0 0 12 * * 2` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 * * 2`: day-of-week field, at character 11: exactly one of day-of-month and day-of-week must be `?`
            CRON `0 0 12 ? * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * ?`: day-of-week field, at character 11: `?` is allowed for day-of-month or day-of-week, not both
            CRON `0 0 12 W * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 W * ?`: day-of-month field, at character 7: unexpected character `W`
            CRON `0 0 12 L-31 * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 L-31 * ?`: day-of-month field, at character 9: the offset from the last day must be at most 30
            CRON `0 0 12 1,L * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 1,L * ?`: day-of-month field, at character 7: `L` cannot be listed with other days of the month
            CRON `0 0 12 ? * 2L,3` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 2L,3`: day-of-week field, at character 11: `L` cannot be listed with other days of the week
            CRON `0 0 12 ? * 2#1,3#2` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 2#1,3#2`: day-of-week field, at character 11: only one `#` is allowed
            CRON `0 0 12 ? * 2#6` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 2#6`: day-of-week field, at character 13: `#` must be followed by a number from 1 to 5
            CRON `0 0 12 ? * 8` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 8`: day-of-week field, at character 11: day-of-week values must be from 1 to 7
            CRON `0 0 12 32W * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 32W * ?`: day-of-month field, at character 9: `W` needs a day of at most 31
            CRON `0 0 12 5L * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 5L * ?`: day-of-month field, at character 8: `L` after a number is not allowed in the day-of-month field
            CRON `0 0/60 * * * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0/60 * * * ?`: minute field, at character 4: the step must be at most 59
            CRON `0 0 12 ? * MON-FOO` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * MON-FOO`: day-of-week field, at character 15: unknown day-of-week name
            CRON `0 0 12 ? JAN- *` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? JAN- *`: month field, at character 13: unknown month name
            CRON `5- * * * * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `5- * * * * ?`: second field, at character 2: a range must end with a number
            CRON `0/x * * * * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0/x * * * * ?`: second field, at character 2: `/` must be followed by a number
            CRON `0 0 12 ?xy * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ?xy * ?`: day-of-month field, at character 8: unexpected character after `?`
            CRON `0 0 12 1 1 ? 2031-2027` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 1 1 ? 2031-2027`: year field, at character 18: a year range must not end before it starts
            CRON `0 0 12 ? * ,` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * ,`: day-of-week field, at character 11: the field has no value
            CRON `L * * * * ?` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `L * * * * ?`: second field, at character 0: `L` is only allowed for day-of-month or day-of-week
            CRON `0 0 12 ? * MÖN` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * MÖN`: day-of-week field, at character 11: unknown day-of-week name
            CRON `0 0 12 ? * 5-é` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `0 0 12 ? * 5-é`: day-of-week field, at character 13: a range must end with a number
            CRON `@daily` after Wed 2025-01-01 00:00:00 UTC: invalid cron expression `@daily`: at character 6: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 1
            CRON `0 0 12 * * ?` after Wed 2025-01-01 00:00:00 UTC: unknown time zone `Mars/Olympus`
            CRON `0 0 12 * * ?` after Wed 2025-01-01 00:00:00 UTC: unknown time zone ``
            FIX_RATE `0` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `0`: expected a whole number of seconds from 1 to 31536000
            FIX_RATE `+5` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `+5`: expected a whole number of seconds from 1 to 31536000
            FIX_RATE `1.5` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `1.5`: expected a whole number of seconds from 1 to 31536000
            FIX_RATE `31536001` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate `31536001`: expected a whole number of seconds from 1 to 31536000
            FIX_RATE `` after Wed 2025-01-01 00:00:00 UTC: invalid fix rate ``: expected a whole number of seconds from 1 to 31536000
            FIX_DELAY `0` after Wed 2025-01-01 00:00:00 UTC: invalid fix delay `0`: expected a whole number of seconds from 1 to 31536000
            FIX_DELAY `-3` after Wed 2025-01-01 00:00:00 UTC: invalid fix delay `-3`: expected a whole number of seconds from 1 to 31536000
            FIX_DELAY `ten` after Wed 2025-01-01 00:00:00 UTC: invalid fix delay `ten`: expected a whole number of seconds from 1 to 31536000
            ONCE `` after Wed 2025-01-01 00:00:00 UTC: invalid instant ``: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00
            ONCE `2026-05-01 09:00:00` after Wed 2025-01-01 00:00:00 UTC: invalid instant `2026-05-01 09:00:00`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00
            ONCE `2026-05-01T09:00:00` after Wed 2025-01-01 00:00:00 UTC: invalid instant `2026-05-01T09:00:00`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00
            ONCE `1777618800000` after Wed 2025-01-01 00:00:00 UTC: invalid instant `1777618800000`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00
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
        (FixDelay, " 30 ", None, "2025-01-01T00:00:00.250Z", 3),
        (FixDelay, "31536000", None, at, 1),
        (Once, "2026-05-01T09:00:00+02:00", Some("Asia/Tokyo"), at, 3),
        (Once, " 2025-01-01T00:00:00.001Z ", None, at, 1),
        (Once, "2025-01-01T00:00:00Z", None, at, 1),
        (Once, "2024-12-31T23:59:59Z", None, at, 1),
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
        (Cron, "0 0 12 ? * 2", None, at, 2),
        (Cron, "0 0 12 L * ?", None, at, 2),
        (Cron, "0 0 12 1W * ?", None, "2025-02-01T00:00:00Z", 1),
        (Cron, "0 0 12 29 2 ?", None, at, 1),
        (Cron, "0 0 0 1 1 ? 2030", None, at, 2),
        (Cron, "0 0 0 1 1 ? 2020", None, at, 1),
        (Cron, "0 0 0 30 2 ?", None, at, 1),
        (Cron, "0 0 9 ? * MON", Some("Asia/Tokyo"), at, 1),
        (Cron, "0 0 12 ? * 2 2026 2027", None, at, 1),
    ];
    check(
        rows,
        fires,
        expect![[r#"
            FIX_RATE ` 30 ` after Wed 2025-01-01 00:00:00.250 UTC: [Wed 2025-01-01 00:00:30.250 UTC, Wed 2025-01-01 00:01:00.250 UTC, Wed 2025-01-01 00:01:30.250 UTC]
            FIX_RATE `31536000` after Wed 2025-01-01 01:00:00 CET: [Thu 2026-01-01 01:00:00 CET]
            FIX_DELAY ` 30 ` after Wed 2025-01-01 00:00:00.250 UTC: [Wed 2025-01-01 00:00:30.250 UTC]
            FIX_DELAY `31536000` after Wed 2025-01-01 00:00:00 UTC: [Thu 2026-01-01 00:00:00 UTC]
            ONCE `2026-05-01T09:00:00+02:00` after Wed 2025-01-01 09:00:00 JST: [Fri 2026-05-01 16:00:00 JST]
            ONCE ` 2025-01-01T00:00:00.001Z ` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 00:00:00.001 UTC]
            ONCE `2025-01-01T00:00:00Z` after Wed 2025-01-01 00:00:00 UTC: []
            ONCE `2024-12-31T23:59:59Z` after Wed 2025-01-01 00:00:00 UTC: []
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
            CRON `0 0 12 ? * 2` after Wed 2025-01-01 00:00:00 UTC: [Mon 2025-01-06 12:00:00 UTC, Mon 2025-01-13 12:00:00 UTC]
            CRON `0 0 12 L * ?` after Wed 2025-01-01 00:00:00 UTC: [Fri 2025-01-31 12:00:00 UTC, Fri 2025-02-28 12:00:00 UTC]
            CRON `0 0 12 1W * ?` after Sat 2025-02-01 00:00:00 UTC: [Mon 2025-02-03 12:00:00 UTC]
            CRON `0 0 12 29 2 ?` after Wed 2025-01-01 00:00:00 UTC: [Tue 2028-02-29 12:00:00 UTC]
            CRON `0 0 0 1 1 ? 2030` after Wed 2025-01-01 00:00:00 UTC: [Tue 2030-01-01 00:00:00 UTC]
            CRON `0 0 0 1 1 ? 2020` after Wed 2025-01-01 00:00:00 UTC: []
            CRON `0 0 0 30 2 ?` after Wed 2025-01-01 00:00:00 UTC: []
            CRON `0 0 9 ? * MON` after Wed 2025-01-01 09:00:00 JST: [Mon 2025-01-06 09:00:00 JST]
            CRON `0 0 12 ? * 2 2026 2027` after Wed 2025-01-01 00:00:00 UTC: [Mon 2026-01-05 12:00:00 UTC]
        "#]],
    );
}

#[test]
fn quartz_constructs() {
    // 2025-01-01 is a Wednesday; 2027-05-01 a Saturday.
    let at = "2025-01-01T00:00:00Z";
    let rows: &[FireRow] = &[
        (Cron, "0 0 12 ? * FRI-MON", None, at, 4),
        (Cron, "0 0 22-2 * * ?", None, at, 4),
        (Cron, "0 0 12 1 NOV-FEB ?", None, at, 4),
        (Cron, "0 50-10/10 * * * ?", None, at, 4),
        (Cron, "0 0 12 L-3 * ?", None, at, 3),
        (Cron, "0 0 12 LW * ?", None, "2026-01-01T00:00:00Z", 3),
        (Cron, "0 0 12 L-1W * ?", None, at, 3),
        (Cron, "0 0 12 1W * ?", None, "2025-02-01T00:00:00Z", 2),
        (Cron, "0 0 12 31W * ?", None, "2027-04-01T00:00:00Z", 3),
        (Cron, "0 0 12 1-5W * ?", None, at, 3),
        (Cron, "0 0 12 1,15W * ?", None, at, 3),
        (Cron, "0 0 12 ? * */2", None, at, 4),
        (Cron, "0 0 12 ? * MON-FRI/2", None, at, 3),
        (Cron, "0 0 12 1 JAN/3 ?", None, at, 2),
        (Cron, "0 0 12 ? * 6#1,2", None, at, 2),
        (Cron, "0 0 12 ? * 2L", None, at, 2),
        (Cron, "0 0 12 ? * L", None, at, 2),
        (Cron, "0 0 12 1 1 ? 2025/3", None, at, 3),
        (Cron, "0 0 12 ? * MONDAY", None, at, 1),
        (Cron, "0 0 12 1-10/4294967295 * ?", None, at, 2),
        (Cron, "0 0 12 ? * 2 2026 2027", None, at, 1),
        // Fires run to 100 years after the year asked about, as Quartz's to its year plus 100.
        (Cron, "0 0 12 1 1 ? 2126", None, "2026-11-26T00:00:00Z", 1),
        (Cron, "0 0 12 1 1 ? 2127", None, "2026-11-26T00:00:00Z", 1),
        (Cron, "0 0 12 1 1 ? 2127", None, "2027-01-01T00:00:00Z", 1),
        (Cron, "0 0 12 ? 2 2#5", None, "2026-11-26T00:00:00Z", 4),
    ];
    check(
        rows,
        fires,
        expect![[r#"
            CRON `0 0 12 ? * FRI-MON` after Wed 2025-01-01 00:00:00 UTC: [Fri 2025-01-03 12:00:00 UTC, Sat 2025-01-04 12:00:00 UTC, Sun 2025-01-05 12:00:00 UTC, Mon 2025-01-06 12:00:00 UTC]
            CRON `0 0 22-2 * * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 01:00:00 UTC, Wed 2025-01-01 02:00:00 UTC, Wed 2025-01-01 22:00:00 UTC, Wed 2025-01-01 23:00:00 UTC]
            CRON `0 0 12 1 NOV-FEB ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Sat 2025-02-01 12:00:00 UTC, Sat 2025-11-01 12:00:00 UTC, Mon 2025-12-01 12:00:00 UTC]
            CRON `0 50-10/10 * * * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 00:10:00 UTC, Wed 2025-01-01 00:50:00 UTC, Wed 2025-01-01 01:00:00 UTC, Wed 2025-01-01 01:10:00 UTC]
            CRON `0 0 12 L-3 * ?` after Wed 2025-01-01 00:00:00 UTC: [Tue 2025-01-28 12:00:00 UTC, Tue 2025-02-25 12:00:00 UTC, Fri 2025-03-28 12:00:00 UTC]
            CRON `0 0 12 LW * ?` after Thu 2026-01-01 00:00:00 UTC: [Fri 2026-01-30 12:00:00 UTC, Fri 2026-02-27 12:00:00 UTC, Tue 2026-03-31 12:00:00 UTC]
            CRON `0 0 12 L-1W * ?` after Wed 2025-01-01 00:00:00 UTC: [Thu 2025-01-30 12:00:00 UTC, Thu 2025-02-27 12:00:00 UTC, Mon 2025-03-31 12:00:00 UTC]
            CRON `0 0 12 1W * ?` after Sat 2025-02-01 00:00:00 UTC: [Mon 2025-02-03 12:00:00 UTC, Mon 2025-03-03 12:00:00 UTC]
            CRON `0 0 12 31W * ?` after Thu 2027-04-01 00:00:00 UTC: [Fri 2027-04-30 12:00:00 UTC, Mon 2027-05-31 12:00:00 UTC, Fri 2027-07-30 12:00:00 UTC]
            CRON `0 0 12 1-5W * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Thu 2025-01-02 12:00:00 UTC, Fri 2025-01-03 12:00:00 UTC]
            CRON `0 0 12 1,15W * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Mon 2025-02-03 12:00:00 UTC, Mon 2025-03-03 12:00:00 UTC]
            CRON `0 0 12 ? * */2` after Wed 2025-01-01 00:00:00 UTC: [Thu 2025-01-02 12:00:00 UTC, Sat 2025-01-04 12:00:00 UTC, Sun 2025-01-05 12:00:00 UTC, Tue 2025-01-07 12:00:00 UTC]
            CRON `0 0 12 ? * MON-FRI/2` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Thu 2025-01-02 12:00:00 UTC, Fri 2025-01-03 12:00:00 UTC]
            CRON `0 0 12 1 JAN/3 ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Thu 2026-01-01 12:00:00 UTC]
            CRON `0 0 12 ? * 6#1,2` after Wed 2025-01-01 00:00:00 UTC: [Mon 2025-01-06 12:00:00 UTC, Mon 2025-02-03 12:00:00 UTC]
            CRON `0 0 12 ? * 2L` after Wed 2025-01-01 00:00:00 UTC: [Mon 2025-01-27 12:00:00 UTC, Mon 2025-02-24 12:00:00 UTC]
            CRON `0 0 12 ? * L` after Wed 2025-01-01 00:00:00 UTC: [Sat 2025-01-04 12:00:00 UTC, Sat 2025-01-11 12:00:00 UTC]
            CRON `0 0 12 1 1 ? 2025/3` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Sat 2028-01-01 12:00:00 UTC, Wed 2031-01-01 12:00:00 UTC]
            CRON `0 0 12 ? * MONDAY` after Wed 2025-01-01 00:00:00 UTC: [Mon 2025-01-06 12:00:00 UTC]
            CRON `0 0 12 1-10/4294967295 * ?` after Wed 2025-01-01 00:00:00 UTC: [Wed 2025-01-01 12:00:00 UTC, Sat 2025-02-01 12:00:00 UTC]
            CRON `0 0 12 ? * 2 2026 2027` after Wed 2025-01-01 00:00:00 UTC: [Mon 2026-01-05 12:00:00 UTC]
            CRON `0 0 12 1 1 ? 2126` after Thu 2026-11-26 00:00:00 UTC: [Tue 2126-01-01 12:00:00 UTC]
            CRON `0 0 12 1 1 ? 2127` after Thu 2026-11-26 00:00:00 UTC: []
            CRON `0 0 12 1 1 ? 2127` after Fri 2027-01-01 00:00:00 UTC: [Wed 2127-01-01 12:00:00 UTC]
            CRON `0 0 12 ? 2 2#5` after Thu 2026-11-26 00:00:00 UTC: [Mon 2044-02-29 12:00:00 UTC, Mon 2072-02-29 12:00:00 UTC, Mon 2112-02-29 12:00:00 UTC]
        "#]],
    );
}

#[test]
fn daylight_saving() {
    // New York: 2025-03-09 02:00 EST jumps to 03:00 EDT; 2025-11-02 02:00 EDT falls back to 01:00
    // EST. Berlin: 2025-03-30 02:00 CET jumps to 03:00 CEST; 2025-10-26 03:00 CEST falls back to
    // 02:00 CET. Lord Howe: 2025-04-06 02:00 +11 falls back to 01:30 +1030; 2025-10-05 02:00
    // +1030 jumps to 02:30 +11. Santiago: 2025-04-06 00:00 -03 falls back to 2025-04-05 23:00
    // -04; 2025-09-07 00:00 -04 jumps to 01:00 -03.
    let new_york = Some("America/New_York");
    let berlin = Some("Europe/Berlin");
    let lord_howe = Some("Australia/Lord_Howe");
    let santiago = Some("America/Santiago");
    let rows: &[FireRow] = &[
        (Cron, "0 30 2 * * ?", new_york, "2025-03-08T12:00:00Z", 3),
        (Cron, "0 30 1 * * ?", new_york, "2025-11-01T12:00:00Z", 2),
        (Cron, "0 0/20 * * * ?", new_york, "2025-03-09T06:30:00Z", 4),
        (Cron, "0 0/30 * * * ?", new_york, "2025-11-02T04:40:00Z", 6),
        (Cron, "0 0 * * * ?", new_york, "2025-11-02T04:30:00Z", 3),
        (Cron, "0 30 2 * * ?", berlin, "2025-03-29T12:00:00Z", 3),
        (Cron, "0 0 2,3 * * ?", berlin, "2025-03-30T00:30:00Z", 2),
        (Cron, "0 0/20 2 * * ?", berlin, "2025-03-30T00:30:00Z", 2),
        (Cron, "0 0/20 * * * ?", berlin, "2025-03-30T00:30:00Z", 4),
        (Cron, "0 30 2 * * ?", berlin, "2025-10-25T12:00:00Z", 2),
        (Cron, "0 30 2 * * ?", berlin, "2025-10-26T01:10:00Z", 1),
        (Cron, "0 0/30 * * * ?", berlin, "2025-10-25T23:10:00Z", 6),
        (Cron, "0 0/30 * * * ?", berlin, "2025-10-26T01:10:00Z", 3),
        (Cron, "0 0 */2 * * ?", berlin, "2025-10-25T21:30:00Z", 3),
        (Cron, "0 15 2 * * ?", lord_howe, "2025-10-04T12:00:00Z", 2),
        (Cron, "0 0/10 * * * ?", lord_howe, "2025-10-04T15:15:00Z", 3),
        (Cron, "0 45 1 * * ?", lord_howe, "2025-04-05T12:00:00Z", 2),
        (Cron, "0 0/10 * * * ?", lord_howe, "2025-04-05T14:25:00Z", 8),
        (Cron, "0 30 0 * * ?", santiago, "2025-09-06T12:00:00Z", 2),
        (Cron, "0 0 0 ? * SUN", santiago, "2025-09-06T12:00:00Z", 2),
        (Cron, "0 30 23 * * ?", santiago, "2025-04-05T12:00:00Z", 2),
        (Cron, "0 0/30 * * * ?", santiago, "2025-04-06T01:40:00Z", 5),
    ];
    check(
        rows,
        fires,
        expect![[r#"
            CRON `0 30 2 * * ?` after Sat 2025-03-08 07:00:00 EST: [Sun 2025-03-09 03:00:00 EDT, Mon 2025-03-10 02:30:00 EDT, Tue 2025-03-11 02:30:00 EDT]
            CRON `0 30 1 * * ?` after Sat 2025-11-01 08:00:00 EDT: [Sun 2025-11-02 01:30:00 EDT, Mon 2025-11-03 01:30:00 EST]
            CRON `0 0/20 * * * ?` after Sun 2025-03-09 01:30:00 EST: [Sun 2025-03-09 01:40:00 EST, Sun 2025-03-09 03:00:00 EDT, Sun 2025-03-09 03:20:00 EDT, Sun 2025-03-09 03:40:00 EDT]
            CRON `0 0/30 * * * ?` after Sun 2025-11-02 00:40:00 EDT: [Sun 2025-11-02 01:00:00 EDT, Sun 2025-11-02 01:30:00 EDT, Sun 2025-11-02 01:00:00 EST, Sun 2025-11-02 01:30:00 EST, Sun 2025-11-02 02:00:00 EST, Sun 2025-11-02 02:30:00 EST]
            CRON `0 0 * * * ?` after Sun 2025-11-02 00:30:00 EDT: [Sun 2025-11-02 01:00:00 EDT, Sun 2025-11-02 01:00:00 EST, Sun 2025-11-02 02:00:00 EST]
            CRON `0 30 2 * * ?` after Sat 2025-03-29 13:00:00 CET: [Sun 2025-03-30 03:00:00 CEST, Mon 2025-03-31 02:30:00 CEST, Tue 2025-04-01 02:30:00 CEST]
            CRON `0 0 2,3 * * ?` after Sun 2025-03-30 01:30:00 CET: [Sun 2025-03-30 03:00:00 CEST, Mon 2025-03-31 02:00:00 CEST]
            CRON `0 0/20 2 * * ?` after Sun 2025-03-30 01:30:00 CET: [Sun 2025-03-30 03:00:00 CEST, Mon 2025-03-31 02:00:00 CEST]
            CRON `0 0/20 * * * ?` after Sun 2025-03-30 01:30:00 CET: [Sun 2025-03-30 01:40:00 CET, Sun 2025-03-30 03:00:00 CEST, Sun 2025-03-30 03:20:00 CEST, Sun 2025-03-30 03:40:00 CEST]
            CRON `0 30 2 * * ?` after Sat 2025-10-25 14:00:00 CEST: [Sun 2025-10-26 02:30:00 CEST, Mon 2025-10-27 02:30:00 CET]
            CRON `0 30 2 * * ?` after Sun 2025-10-26 02:10:00 CET: [Mon 2025-10-27 02:30:00 CET]
            CRON `0 0/30 * * * ?` after Sun 2025-10-26 01:10:00 CEST: [Sun 2025-10-26 01:30:00 CEST, Sun 2025-10-26 02:00:00 CEST, Sun 2025-10-26 02:30:00 CEST, Sun 2025-10-26 02:00:00 CET, Sun 2025-10-26 02:30:00 CET, Sun 2025-10-26 03:00:00 CET]
            CRON `0 0/30 * * * ?` after Sun 2025-10-26 02:10:00 CET: [Sun 2025-10-26 02:30:00 CET, Sun 2025-10-26 03:00:00 CET, Sun 2025-10-26 03:30:00 CET]
            CRON `0 0 */2 * * ?` after Sat 2025-10-25 23:30:00 CEST: [Sun 2025-10-26 00:00:00 CEST, Sun 2025-10-26 02:00:00 CEST, Sun 2025-10-26 02:00:00 CET]
            CRON `0 15 2 * * ?` after Sat 2025-10-04 22:30:00 +1030: [Sun 2025-10-05 02:30:00 +11, Mon 2025-10-06 02:15:00 +11]
            CRON `0 0/10 * * * ?` after Sun 2025-10-05 01:45:00 +1030: [Sun 2025-10-05 01:50:00 +1030, Sun 2025-10-05 02:30:00 +11, Sun 2025-10-05 02:40:00 +11]
            CRON `0 45 1 * * ?` after Sat 2025-04-05 23:00:00 +11: [Sun 2025-04-06 01:45:00 +11, Mon 2025-04-07 01:45:00 +1030]
            CRON `0 0/10 * * * ?` after Sun 2025-04-06 01:25:00 +11: [Sun 2025-04-06 01:30:00 +11, Sun 2025-04-06 01:40:00 +11, Sun 2025-04-06 01:50:00 +11, Sun 2025-04-06 01:30:00 +1030, Sun 2025-04-06 01:40:00 +1030, Sun 2025-04-06 01:50:00 +1030, Sun 2025-04-06 02:00:00 +1030, Sun 2025-04-06 02:10:00 +1030]
            CRON `0 30 0 * * ?` after Sat 2025-09-06 08:00:00 -04: [Sun 2025-09-07 01:00:00 -03, Mon 2025-09-08 00:30:00 -03]
            CRON `0 0 0 ? * SUN` after Sat 2025-09-06 08:00:00 -04: [Sun 2025-09-07 01:00:00 -03, Sun 2025-09-14 00:00:00 -03]
            CRON `0 30 23 * * ?` after Sat 2025-04-05 09:00:00 -03: [Sat 2025-04-05 23:30:00 -03, Sun 2025-04-06 23:30:00 -04]
            CRON `0 0/30 * * * ?` after Sat 2025-04-05 22:40:00 -03: [Sat 2025-04-05 23:00:00 -03, Sat 2025-04-05 23:30:00 -03, Sat 2025-04-05 23:00:00 -04, Sat 2025-04-05 23:30:00 -04, Sun 2025-04-06 00:00:00 -04]
        "#]],
    );
}

#[test]
fn daylight_saving_never_loses_or_doubles() {
    // Every fixed time of day on a quarter-hour grid fires exactly once on each transition day,
    // and every-10-minutes fires every 10 real minutes through the whole day: 144 fires on a
    // day of 24 hours, 6 fewer or more on a day an hour shorter or longer.
    let days: &[(&str, &str)] = &[
        ("America/New_York", "2025-03-09"),
        ("America/New_York", "2025-11-02"),
        ("Europe/Berlin", "2025-03-30"),
        ("Europe/Berlin", "2025-10-26"),
        ("Australia/Lord_Howe", "2025-04-06"),
        ("Australia/Lord_Howe", "2025-10-05"),
        ("America/Santiago", "2025-04-05"),
        ("America/Santiago", "2025-09-07"),
    ];
    let render = |&(zone_name, day): &(&str, &str)| {
        let zone: Tz = zone_name.parse().unwrap();
        let date = NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap();
        // The first instant of a wall date (Santiago's midnight may not exist), in ms.
        let day_start = |date: NaiveDate| {
            let hours = (0..3).map(|hour| date.and_hms_opt(hour, 0, 0).unwrap());
            let first = hours.filter_map(|wall| zone.from_local_datetime(&wall).earliest()).next();
            first.unwrap().timestamp_millis()
        };
        let three_hours = TimeDelta::hours(3).num_milliseconds();
        let from = day_start(date) - three_hours;
        let until = day_start(date.succ_opt().unwrap()) + three_hours;
        let on_day = |fire: &i64| {
            let wall = DateTime::from_timestamp_millis(*fire).unwrap().with_timezone(&zone);
            wall.date_naive() == date
        };
        let mut counts = std::collections::BTreeMap::new();
        for minute in (0..24 * 60).step_by(15) {
            let conf = format!("0 {} {} * * ?", minute % 60, minute / 60);
            let schedule = Schedule::parse(Cron, &conf, Some(zone_name)).unwrap();
            let fired = schedule.next_n(from, 4).into_iter().filter(on_day).count();
            *counts.entry(fired).or_insert(0) += 1;
        }
        let every_ten = Schedule::parse(Cron, "0 0/10 * * * ?", Some(zone_name)).unwrap();
        let fires: Vec<i64> =
            every_ten.next_n(from, 400).into_iter().filter(|fire| *fire < until).collect();
        let gaps: std::collections::BTreeSet<i64> =
            fires.windows(2).map(|pair| (pair[1] - pair[0]) / 60_000).collect();
        format!(
            "{zone_name} {day}: fixed times by number of fires {counts:?}; \
             every 10 min: {} fires, gaps {gaps:?} min",
            fires.iter().filter(|fire| on_day(fire)).count()
        )
    };
    check(
        days,
        render,
        expect![[r#"
        America/New_York 2025-03-09: fixed times by number of fires {1: 96}; every 10 min: 138 fires, gaps {10} min
        America/New_York 2025-11-02: fixed times by number of fires {1: 96}; every 10 min: 150 fires, gaps {10} min
        Europe/Berlin 2025-03-30: fixed times by number of fires {1: 96}; every 10 min: 138 fires, gaps {10} min
        Europe/Berlin 2025-10-26: fixed times by number of fires {1: 96}; every 10 min: 150 fires, gaps {10} min
        Australia/Lord_Howe 2025-04-06: fixed times by number of fires {1: 96}; every 10 min: 147 fires, gaps {10} min
        Australia/Lord_Howe 2025-10-05: fixed times by number of fires {1: 96}; every 10 min: 141 fires, gaps {10} min
        America/Santiago 2025-04-05: fixed times by number of fires {1: 96}; every 10 min: 150 fires, gaps {10} min
        America/Santiago 2025-09-07: fixed times by number of fires {1: 96}; every 10 min: 138 fires, gaps {10} min
    "#]],
    );
}

/// One recorded case: what Quartz 2.3.2 answered, and whether this module agrees.
struct Vector<'a> {
    kind: &'a str,
    expr: &'a str,
    zone: &'a str,
    from: &'a str,
    quartz: &'a str,
    ours: &'a str,
}

/// Our answer in the vectors' notation: `error` or `ok` and up to 10 fires.
fn answer(expr: &str, zone: &str, from: &str) -> String {
    let schedule = match Schedule::parse(Cron, expr, Some(zone)) {
        Err(_) => return "error".to_owned(),
        Ok(schedule) => schedule,
    };
    let zone: Tz = zone.parse().unwrap();
    let mut text = "ok".to_owned();
    for fire in schedule.next_n(ms(from), 10) {
        let at = DateTime::from_timestamp_millis(fire).unwrap().with_timezone(&zone);
        text += " ";
        text += &at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    }
    text
}

#[test]
fn quartz_vectors() {
    let vectors: Vec<Vector<'_>> = include_str!("quartz_vectors.tsv")
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let columns: Vec<&str> = line.split('\t').collect();
            assert_eq!(columns.len(), 6, "{line}");
            let [kind, expr, zone, from, quartz, ours] = columns[..] else { unreachable!() };
            Vector { kind, expr, zone, from, quartz, ours }
        })
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    let mut wrong = Vec::new();
    for vector in &vectors {
        let ours = answer(vector.expr, vector.zone, vector.from);
        // Refusals are compared as refusals: the messages are Quartz's and ours.
        let refusal = |text: &'static str| if text.starts_with("error") { "error" } else { text };
        let expected = match vector.kind {
            "agree" => refusal(vector.quartz),
            _ => {
                assert_ne!(ours, refusal(vector.quartz), "now agrees with Quartz: {}", vector.expr);
                refusal(vector.ours)
            }
        };
        if ours != expected {
            wrong.push(format!(
                "`{}` {} {}\n  want {expected}\n  got  {ours}",
                vector.expr, vector.zone, vector.from
            ));
        }
        *counts.entry(vector.kind).or_insert(0) += 1;
    }
    assert!(wrong.is_empty(), "{} vectors disagree:\n{}", wrong.len(), wrong.join("\n"));
    expect![[r#"{"agree": 1182, "dst": 65, "horizon": 2, "quartz_defect": 3}"#]]
        .assert_eq(&format!("{counts:?}"));
}

#[test]
fn decisions() {
    // (kind, conf, misfire, scheduled, now), on 2025-01-01 UTC.
    let (every_ten, last_fire) = ("0 0/10 * * * ?", "0 0 12 1 1 ? 2025");
    let (once, default) = ("2025-01-01T12:00:00Z", DEFAULT_MISFIRE_THRESHOLD_MS);
    let rows: &[DecisionRow] = &[
        (Cron, every_ten, DoNothing, default, "12:00:00", "12:00:00"),
        (Cron, every_ten, DoNothing, default, "12:00:00", "11:59:57"),
        (Cron, every_ten, DoNothing, default, "12:00:00", "12:00:05"),
        (Cron, every_ten, DoNothing, default, "12:00:00", "12:00:05.001"),
        (Cron, every_ten, FireOnceNow, default, "12:00:00", "12:00:05.001"),
        (Cron, every_ten, FireOnceNow, default, "12:00:00", "12:35:00"),
        (Cron, every_ten, DoNothing, default, "12:00:00", "12:35:00"),
        (Cron, every_ten, DoNothing, 60_000, "12:00:00", "12:00:59"),
        (Cron, every_ten, DoNothing, 60_000, "12:00:00", "12:01:00.001"),
        (Cron, every_ten, FireOnceNow, 1_000, "12:00:00", "12:00:01.001"),
        (Cron, last_fire, FireOnceNow, default, "12:00:00", "12:00:01"),
        (FixRate, "60", DoNothing, default, "12:00:00", "12:00:02"),
        (FixRate, "60", FireOnceNow, default, "12:00:00", "12:35:00.500"),
        (FixDelay, "60", DoNothing, default, "12:00:00", "12:00:02"),
        (FixDelay, "60", FireOnceNow, default, "12:00:00", "12:35:00.500"),
        (FixDelay, "60", DoNothing, default, "12:00:00", "12:35:00.500"),
        (Once, once, DoNothing, default, "12:00:00", "12:00:01"),
        (Once, once, FireOnceNow, default, "12:00:00", "13:00:00"),
        (Once, once, DoNothing, default, "12:00:00", "13:00:00"),
        (Never, "", FireOnceNow, default, "12:00:00", "12:00:00"),
    ];
    let render = |&(kind, conf, misfire, threshold, scheduled, now): &DecisionRow| {
        let schedule = Schedule::parse(kind, conf, None).unwrap();
        let at = |time: &str| ms(&format!("2025-01-01T{time}Z"));
        let decision = decide(&schedule, misfire, threshold, at(scheduled), at(now));
        let fire = match decision.fire {
            Some((at, trigger)) => format!("fire {trigger} at {}", show(at, None)),
            None => "no fire".to_owned(),
        };
        let next = match decision.next {
            NextFire::At(next) => show(next, None),
            NextFire::WhenRunsEnd => "when its runs end".to_owned(),
            NextFire::Never => "none".to_owned(),
        };
        format!(
            "{kind} `{conf}` {misfire} threshold {threshold} ms due {scheduled} now {now}: {fire}; next {next}"
        )
    };
    check(
        rows,
        render,
        expect![[r#"
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:00: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 5000 ms due 12:00:00 now 11:59:57: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:05: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:05.001: no fire; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:00:05.001: fire MISFIRE at Wed 2025-01-01 12:00:05.001 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:35:00: fire MISFIRE at Wed 2025-01-01 12:35:00 UTC; next Wed 2025-01-01 12:40:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:35:00: no fire; next Wed 2025-01-01 12:40:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 60000 ms due 12:00:00 now 12:00:59: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` DO_NOTHING threshold 60000 ms due 12:00:00 now 12:01:00.001: no fire; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0/10 * * * ?` FIRE_ONCE_NOW threshold 1000 ms due 12:00:00 now 12:00:01.001: fire MISFIRE at Wed 2025-01-01 12:00:01.001 UTC; next Wed 2025-01-01 12:10:00 UTC
            CRON `0 0 12 1 1 ? 2025` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:00:01: fire CRON at Wed 2025-01-01 12:00:00 UTC; next none
            FIX_RATE `60` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:02: fire CRON at Wed 2025-01-01 12:00:00 UTC; next Wed 2025-01-01 12:01:00 UTC
            FIX_RATE `60` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:35:00.500: fire MISFIRE at Wed 2025-01-01 12:35:00.500 UTC; next Wed 2025-01-01 12:36:00.500 UTC
            FIX_DELAY `60` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:02: fire CRON at Wed 2025-01-01 12:00:00 UTC; next when its runs end
            FIX_DELAY `60` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:35:00.500: fire MISFIRE at Wed 2025-01-01 12:35:00.500 UTC; next when its runs end
            FIX_DELAY `60` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:35:00.500: no fire; next Wed 2025-01-01 12:36:00.500 UTC
            ONCE `2025-01-01T12:00:00Z` DO_NOTHING threshold 5000 ms due 12:00:00 now 12:00:01: fire CRON at Wed 2025-01-01 12:00:00 UTC; next none
            ONCE `2025-01-01T12:00:00Z` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 13:00:00: fire MISFIRE at Wed 2025-01-01 13:00:00 UTC; next none
            ONCE `2025-01-01T12:00:00Z` DO_NOTHING threshold 5000 ms due 12:00:00 now 13:00:00: no fire; next none
            NONE `` FIRE_ONCE_NOW threshold 5000 ms due 12:00:00 now 12:00:00: no fire; next none
        "#]],
    );
}
