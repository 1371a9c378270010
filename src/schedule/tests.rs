//! Table tests of fire times, parsing, daylight saving and misfire decisions.

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
