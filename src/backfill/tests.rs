//! Tables of a backfill's instants (per schedule kind, time zone and DST) and release decisions.

use expect_test::{Expect, expect};

use super::*;

fn window(kind: ScheduleType, conf: &str, zone: Option<&str>, anchor: &str) -> WindowSchedule {
    WindowSchedule {
        schedule_type: kind,
        schedule_conf: conf.to_owned(),
        time_zone: zone.map(str::to_owned),
        anchor_ms: ms(anchor),
    }
}

fn ms(rfc3339: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis()
}

fn text(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms).unwrap().to_rfc3339()
}

/// The window's instants (at most 10 shown) and its count, or the refusal.
fn check(window: WindowSchedule, from: &str, to: &str, expect: Expect) {
    let out = match Instants::new(&window) {
        Err(error) => format!("refused: {error}"),
        Ok(instants) => {
            let shown = instants.next_n(ms(from) - 1, ms(to), 10);
            let count = match instants.count(ms(from), ms(to)) {
                Ok(count) => count.to_string(),
                Err(error) => format!("refused: {error}"),
            };
            let lines: Vec<String> = shown.into_iter().map(text).collect();
            format!("{}\ncount {count}", lines.join("\n"))
        }
    };
    expect.assert_eq(&out);
}

#[test]
fn a_daily_cron_covers_each_day_of_the_window_both_ends_included() {
    check(
        window(ScheduleType::Cron, "0 0 2 * * ?", None, "2026-01-01T00:00:00Z"),
        "2026-01-01T02:00:00Z",
        "2026-01-04T02:00:00Z",
        expect![[r#"
            2026-01-01T02:00:00+00:00
            2026-01-02T02:00:00+00:00
            2026-01-03T02:00:00+00:00
            2026-01-04T02:00:00+00:00
            count 4"#]],
    );
}

#[test]
fn a_cron_in_a_time_zone_follows_its_dst_policy() {
    // Berlin springs forward on 2026-03-29 at 02:00: the 02:30 fire falls at 03:00 CEST.
    check(
        window(ScheduleType::Cron, "0 30 2 * * ?", Some("Europe/Berlin"), "2026-01-01T00:00:00Z"),
        "2026-03-27T00:00:00Z",
        "2026-03-31T00:00:00Z",
        expect![[r#"
            2026-03-27T01:30:00+00:00
            2026-03-28T01:30:00+00:00
            2026-03-29T01:00:00+00:00
            2026-03-30T00:30:00+00:00
            count 4"#]],
    );
}

#[test]
fn a_fixed_rate_keeps_the_phase_of_its_anchor() {
    check(
        window(ScheduleType::FixRate, "3600", None, "2026-01-10T00:15:00Z"),
        "2026-01-01T00:00:00Z",
        "2026-01-01T03:15:00Z",
        expect![[r#"
            2026-01-01T00:15:00+00:00
            2026-01-01T01:15:00+00:00
            2026-01-01T02:15:00+00:00
            2026-01-01T03:15:00+00:00
            count 4"#]],
    );
}

#[test]
fn a_once_job_has_its_one_instant_if_the_window_holds_it() {
    check(
        window(ScheduleType::Once, "2026-01-02T09:00:00Z", None, "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
        "2026-01-03T00:00:00Z",
        expect![[r#"
            2026-01-02T09:00:00+00:00
            count 1"#]],
    );
}

#[test]
fn refusals() {
    check(
        window(ScheduleType::FixDelay, "60", None, "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
        "2026-01-02T00:00:00Z",
        expect![
            "refused: a FIX_DELAY job has no past fire instants to backfill: only CRON, FIX_RATE and ONCE jobs can be backfilled"
        ],
    );
    check(
        window(ScheduleType::None, "", None, "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
        "2026-01-02T00:00:00Z",
        expect![
            "refused: a NONE job has no past fire instants to backfill: only CRON, FIX_RATE and ONCE jobs can be backfilled"
        ],
    );
    // Every second for two days: 172,801 instants.
    check(
        window(ScheduleType::Cron, "* * * * * ?", None, "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
        "2026-01-03T00:00:00Z",
        expect![[r#"
            2026-01-01T00:00:00+00:00
            2026-01-01T00:00:01+00:00
            2026-01-01T00:00:02+00:00
            2026-01-01T00:00:03+00:00
            2026-01-01T00:00:04+00:00
            2026-01-01T00:00:05+00:00
            2026-01-01T00:00:06+00:00
            2026-01-01T00:00:07+00:00
            2026-01-01T00:00:08+00:00
            2026-01-01T00:00:09+00:00
            count refused: the window holds more than 100000 fire instants: split it into several backfills"#]],
    );
    check(
        window(ScheduleType::Cron, "0 0 * * * ?", None, "2026-01-01T00:00:00Z"),
        "2026-01-02T00:00:00Z",
        "2026-01-01T00:00:00Z",
        expect![[r#"

            count refused: the window is empty: `from` is after `to`"#]],
    );
}

#[test]
fn releases() {
    let rows = [
        // max_concurrent, unfinished, runs per instant, room
        (10, 0, 1, u64::MAX),
        (10, 7, 1, u64::MAX),
        (10, 10, 1, u64::MAX),
        (10, 12, 1, u64::MAX),
        (10, 0, 1, 4),
        (10, 0, 3, u64::MAX),
        (2, 0, 3, u64::MAX),
        (2, 1, 3, u64::MAX),
        (2, 0, 3, 2),
        (1000, 0, 1, u64::MAX),
    ];
    let out: String = rows
        .iter()
        .map(|&(max_concurrent, unfinished, runs_per_instant, room)| {
            let facts = ReleaseFacts { max_concurrent, unfinished, runs_per_instant, room };
            let room = if room == u64::MAX { "-".to_owned() } else { room.to_string() };
            format!(
                "max {max_concurrent} unfinished {unfinished} shards {runs_per_instant} room {room} => {}\n",
                release_count(&facts)
            )
        })
        .collect();
    expect![[r#"
        max 10 unfinished 0 shards 1 room - => 10
        max 10 unfinished 7 shards 1 room - => 3
        max 10 unfinished 10 shards 1 room - => 0
        max 10 unfinished 12 shards 1 room - => 0
        max 10 unfinished 0 shards 1 room 4 => 4
        max 10 unfinished 0 shards 3 room - => 3
        max 2 unfinished 0 shards 3 room - => 1
        max 2 unfinished 1 shards 3 room - => 0
        max 2 unfinished 0 shards 3 room 2 => 0
        max 1000 unfinished 0 shards 1 room - => 256
    "#]]
    .assert_eq(&out);
}

#[test]
fn backfills_keep_out_of_the_last_quarter_of_the_bound() {
    let rows =
        [(None, 500), (Some(1000), 0), (Some(1000), 700), (Some(1000), 750), (Some(1000), 990)];
    let out: String = rows
        .iter()
        .map(|&(limit, unfinished)| {
            format!("{limit:?} {unfinished} => {}\n", room_for_backfills(limit, unfinished))
        })
        .collect();
    expect![[r#"
        None 500 => 18446744073709551615
        Some(1000) 0 => 750
        Some(1000) 700 => 50
        Some(1000) 750 => 0
        Some(1000) 990 => 0
    "#]]
    .assert_eq(&out);
}

#[test]
fn instants_a_calendar_excludes_are_passed_over() {
    // Weekdays only, with a make-up Saturday and a holiday; hourly fires during office hours
    // are cut to the calendar's allowed hours.
    let spec = crate::model::CalendarSpec {
        time_zone: Some("Asia/Shanghai".to_owned()),
        weekdays: vec!["SAT".to_owned(), "SUN".to_owned()],
        excluded_dates: vec!["2026-10-01/2026-10-02".to_owned()],
        included_dates: vec!["2026-10-10".to_owned()],
        daily_windows: vec!["00:00-09:00".to_owned()],
        ..crate::model::CalendarSpec::default()
    };
    let calendar = std::sync::Arc::new(Calendar::parse(&spec).unwrap());
    let window =
        window(ScheduleType::Cron, "0 0 9,18 * * ?", Some("Asia/Shanghai"), "2026-09-01T00:00:00Z");
    let instants = Instants::new(&window).unwrap().except(Some(calendar.clone()));
    let (from, to) = (ms("2026-09-30T00:00:00+08:00"), ms("2026-10-12T23:59:59+08:00"));
    let shown: Vec<String> = instants.next_n(from - 1, to, 20).into_iter().map(text).collect();
    expect![[r#"
        2026-09-30T01:00:00+00:00
        2026-09-30T10:00:00+00:00
        2026-10-05T01:00:00+00:00
        2026-10-05T10:00:00+00:00
        2026-10-06T01:00:00+00:00
        2026-10-06T10:00:00+00:00
        2026-10-07T01:00:00+00:00
        2026-10-07T10:00:00+00:00
        2026-10-08T01:00:00+00:00
        2026-10-08T10:00:00+00:00
        2026-10-09T01:00:00+00:00
        2026-10-09T10:00:00+00:00
        2026-10-10T01:00:00+00:00
        2026-10-10T10:00:00+00:00
        2026-10-12T01:00:00+00:00
        2026-10-12T10:00:00+00:00
        count 16"#]]
    .assert_eq(&format!("{}\ncount {}", shown.join("\n"), instants.count(from, to).unwrap()));
    // A calendar that excludes everything ends the walk: no instant, no loop.
    let everything = crate::model::CalendarSpec {
        daily_windows: vec!["00:00-23:59".to_owned(), "23:59-00:00".to_owned()],
        ..crate::model::CalendarSpec::default()
    };
    let everything = Calendar::parse(&everything).unwrap();
    let all = Instants::new(&window).unwrap().except(Some(std::sync::Arc::new(everything)));
    assert_eq!(all.count(from, to).unwrap(), 0);
}
