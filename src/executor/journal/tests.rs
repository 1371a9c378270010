//! Tests of the run journal: line parsing, replay after a restart, rotation and forgetting.

use std::path::Path;

use expect_test::{Expect, expect};

use super::*;

const H: i64 = HOUR_MS;
/// An hour far from the epoch, so that "the hour before" exists.
const BASE: i64 = 490_000 * H;

fn write_segments(dir: &Path, segments: &[(i64, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (hour, text) in segments {
        std::fs::write(segment_path(dir, *hour), text).unwrap();
    }
}

/// The journal's files (hour relative to `BASE`, content) and what it knows about `ids`.
fn render(dir: &Path, journal: &Journal, ids: &[i64]) -> String {
    let mut out = String::new();
    for (hour, path) in all_segments(dir).unwrap() {
        let text = std::fs::read_to_string(path).unwrap();
        out.push_str(&format!("file +{}h: {:?}\n", hour - BASE / H, text));
    }
    for id in ids {
        out.push_str(&format!("run {id}: {:?}\n", journal.state(*id)));
    }
    out.push_str(&format!("live: {:?}\n", journal.live()));
    out
}

#[test]
fn lines_parse_or_are_skipped() {
    let cases = [
        (
            "accepted 42 7 1700000000000",
            "Some(Accepted { log_id: 42, job_id: 7, at_ms: 1700000000000, fire_ms: None })",
        ),
        ("started 42 1700000000001", "Some(Started { log_id: 42, at_ms: 1700000000001 })"),
        (
            "finished 42 500 1700000000002",
            "Some(Finished { log_id: 42, handle_code: 500, at_ms: 1700000000002 })",
        ),
        ("finished 42 -1 5", "Some(Finished { log_id: 42, handle_code: -1, at_ms: 5 })"),
        (
            "accepted 42 7 1700000000000 1699999999000",
            "Some(Accepted { log_id: 42, job_id: 7, at_ms: 1700000000000, fire_ms: Some(1699999999000) })",
        ),
        ("accepted 42 7", "None"),
        ("accepted 42 7 1 extra", "None"),
        ("started 4", "None"),
        ("started x 5", "None"),
        ("accepted  42 7 1", "None"),
        ("stopped 42 5", "None"),
        ("", "None"),
    ];
    for (line, expected) in cases {
        assert_eq!(format!("{:?}", parse_line(line)), expected, "{line:?}");
        if let Some(event) = parse_line(line) {
            assert_eq!(format_line(event), format!("{line}\n"), "round trip");
        }
    }
}

/// Writes `segments` (hour offset from `BASE`, lines whose `@m` stand for `BASE` + m minutes),
/// opens the journal at `BASE` + 2 h 1 min with the outbox holding `stored`, and renders it.
fn check_replay(segments: &[(i64, &str)], stored: &[(i64, i32)], expect: Expect) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().join("journal");
    let minutes = |text: &str| {
        text.split(' ')
            .map(|word| match word.strip_prefix('@').and_then(|m| m.parse::<i64>().ok()) {
                Some(m) => (BASE + m * 60_000).to_string(),
                None => word.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let texts: Vec<(i64, String)> = segments
        .iter()
        .map(|(hour, text)| {
            (BASE / H + hour, text.split('\n').map(minutes).collect::<Vec<_>>().join("\n"))
        })
        .collect();
    let segments: Vec<(i64, &str)> =
        texts.iter().map(|(hour, text)| (*hour, text.as_str())).collect();
    write_segments(&dir, &segments);
    let now = BASE + 2 * H + 60_000;
    let stored_code = |log_id| stored.iter().find(|(id, _)| *id == log_id).map(|(_, code)| *code);
    let (journal, lost) = Journal::open(dir.clone(), now, stored_code).unwrap();
    let mut out = render(&dir, &journal, &[1, 2, 3, 4, 5, 6]);
    out.push_str(&format!("lost: {:?}\n", lost.iter().map(|run| run.log_id).collect::<Vec<_>>()));
    expect.assert_eq(&out);
}

#[test]
fn replay_after_a_restart() {
    // At +2h01m the window starts at +1h01m: segment +0h is deleted unread, +1h and +2h are
    // replayed, and run 2 (ended, accepted before the window) is forgotten.
    check_replay(
        &[
            (0, "accepted 1 10 @10\n"),
            (
                1,
                "accepted 2 10 @60\nstarted 2 @60\nfinished 2 200 @61\naccepted 3 10 @90\nstarted 3 @90\n",
            ),
            (2, "accepted 4 11 @120\naccepted 5 11 @120\nstarted 5 @120\nfinished 6 200 @120\n"),
        ],
        &[(5, 502)],
        expect![[r#"
            file +1h: "accepted 2 10 1764003600000\nstarted 2 1764003600000\nfinished 2 200 1764003660000\naccepted 3 10 1764005400000\nstarted 3 1764005400000\n"
            file +2h: "accepted 4 11 1764007200000\naccepted 5 11 1764007200000\nstarted 5 1764007200000\nfinished 6 200 1764007200000\nfinished 5 502 1764007260000\n"
            run 1: None
            run 2: None
            run 3: Some(Lost)
            run 4: Some(Lost)
            run 5: Some(Reported)
            run 6: None
            live: []
            lost: [3, 4]
        "#]],
    );
}

#[test]
fn a_line_cut_by_a_crash_is_skipped_and_closed() {
    check_replay(
        &[(2, "accepted 1 10 @120\nstarted 1 @120\naccepted 2 10 @120\nstar")],
        &[],
        expect![[r#"
            file +2h: "accepted 1 10 1764007200000\nstarted 1 1764007200000\naccepted 2 10 1764007200000\nstar\n"
            run 1: Some(Lost)
            run 2: Some(Lost)
            run 3: None
            run 4: None
            run 5: None
            run 6: None
            live: []
            lost: [1, 2]
        "#]],
    );
}

#[test]
fn accepts_once_and_follows_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, lost) = Journal::open(dir.path().to_owned(), BASE, |_| None).unwrap();
    assert!(lost.is_empty());
    let Admission::New(first) = journal.accept(1, 10, 0, BASE).unwrap() else { panic!() };
    let Admission::New(second) = journal.accept(2, 10, 0, BASE + 1).unwrap() else { panic!() };
    journal.accept(3, 11, 0, BASE + 1).unwrap();
    assert_eq!(journal.accept(1, 10, 0, BASE + 2).unwrap(), Admission::Duplicate(RunState::Queued));
    // One sync covers every line before it.
    journal.sync(second).unwrap();
    journal.sync(first).unwrap();
    // Runs starting or ending together are one write of one line each.
    journal.started_all(&[1, 3], BASE + 3).unwrap();
    assert_eq!(
        journal.accept(1, 10, 0, BASE + 4).unwrap(),
        Admission::Duplicate(RunState::Running)
    );
    assert_eq!(journal.live(), [1, 2, 3]);
    journal.finished_all(&[(1, 200), (3, 500)], BASE + 5).unwrap();
    journal.finished_all(&[], BASE + 5).unwrap();
    journal.reported_in_memory(2);
    assert_eq!(journal.state(1), Some(RunState::Reported));
    expect![[r#"
        file +0h: "accepted 1 10 1764000000000 0\naccepted 2 10 1764000000001 0\naccepted 3 11 1764000000001 0\nstarted 1 1764000000003\nstarted 3 1764000000003\nfinished 1 200 1764000000005\nfinished 3 500 1764000000005\n"
        run 1: Some(Reported)
        run 2: Some(Reported)
        run 3: Some(Reported)
        live: []
    "#]]
    .assert_eq(&render(dir.path(), &journal, &[1, 2, 3]));

    // After a restart, run 2 (its result never stored) is lost; runs 1 and 3 are still reported.
    drop(journal);
    let (journal, lost) = Journal::open(dir.path().to_owned(), BASE + 7, |_| None).unwrap();
    assert_eq!(lost.iter().map(|run| (run.log_id, run.job_id)).collect::<Vec<_>>(), [(2, 10)]);
    assert_eq!(
        journal.accept(1, 10, 0, BASE + 8).unwrap(),
        Admission::Duplicate(RunState::Reported)
    );
    assert_eq!(journal.accept(2, 10, 0, BASE + 8).unwrap(), Admission::Duplicate(RunState::Lost));
    assert_eq!(
        journal.accept(3, 11, 0, BASE + 8).unwrap(),
        Admission::Duplicate(RunState::Reported)
    );
}

#[test]
fn rotates_hourly_and_forgets_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path().to_owned(), BASE, |_| None).unwrap();
    journal.accept(1, 10, 0, BASE).unwrap();
    journal.finished_all(&[(1, 200)], BASE + 1).unwrap();
    journal.accept(2, 10, 0, BASE + 2).unwrap(); // Still running two hours later.
    journal.accept(3, 10, 0, BASE + H + 100).unwrap();
    assert_eq!(journal.live(), [2, 3]);
    // At +2h the window starts at +1h: segment +0h goes, run 1 is forgotten, run 2 is live.
    journal.accept(4, 10, 0, BASE + 2 * H + 20).unwrap();
    expect![[r#"
        file +1h: "accepted 3 10 1764003600100 0\n"
        file +2h: "accepted 4 10 1764007200020 0\n"
        run 1: None
        run 2: Some(Queued)
        run 3: Some(Queued)
        run 4: Some(Queued)
        live: [2, 3, 4]
    "#]]
    .assert_eq(&render(dir.path(), &journal, &[1, 2, 3, 4]));
    // A run that ends after the window passed over it is forgotten as it ends.
    journal.finished_all(&[(2, 200)], BASE + 2 * H + 30).unwrap();
    journal.finished_all(&[(3, 200)], BASE + 2 * H + 40).unwrap();
    assert_eq!((journal.state(2), journal.state(3)), (None, Some(RunState::Reported)));
    assert_eq!(journal.live(), [4]);
}

#[test]
fn concurrent_acceptances_are_each_recorded_once_and_synced() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path().to_owned(), BASE, |_| None).unwrap();
    let journal = Arc::new(journal);
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                for n in 0..25 {
                    // Every thread also tries the ids of the thread before it: one wins each.
                    for log_id in [thread * 100 + n, ((thread + 7) % 8) * 100 + n] {
                        if let Admission::New(ticket) = journal.accept(log_id, 1, 0, BASE).unwrap()
                        {
                            journal.sync(ticket).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let text = std::fs::read_to_string(segment_path(dir.path(), BASE / H)).unwrap();
    let mut ids: Vec<i64> =
        text.lines().map(|line| line.split(' ').nth(1).unwrap().parse().unwrap()).collect();
    ids.sort_unstable();
    let expected: Vec<i64> =
        (0..8).flat_map(|thread| (0..25).map(move |n| thread * 100 + n)).collect();
    assert_eq!(ids, expected);
    assert_eq!(journal.live().len(), 200);
}

/// A `logId` is one run: a trigger that names a known id with another job or fire time (an
/// admin that reused run ids after its database lost commits) is a conflict, not a duplicate,
/// in this process and after a restart; a run journaled before fire times were recorded
/// conflicts only for another job.
#[test]
fn a_known_log_id_for_another_job_or_fire_time_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    write_segments(dir.path(), &[(BASE / H, "accepted 7 10 1764000000000\n")]);
    let (journal, _) = Journal::open(dir.path().to_owned(), BASE + 1, |_| None).unwrap();
    let Admission::New(ticket) = journal.accept(1, 10, 5_000, BASE + 2).unwrap() else { panic!() };
    journal.sync(ticket).unwrap();
    let cases = [
        ((1, 10, 5_000), Admission::Duplicate(RunState::Queued)),
        ((1, 11, 5_000), Admission::Conflict(RunState::Queued)),
        ((1, 10, 6_000), Admission::Conflict(RunState::Queued)),
        ((7, 10, 6_000), Admission::Duplicate(RunState::Lost)),
        ((7, 12, 6_000), Admission::Conflict(RunState::Lost)),
    ];
    let check = |journal: &Journal, when: &str| {
        for ((log_id, job_id, fire_ms), expected) in cases {
            let seen = journal.seen(log_id, job_id, fire_ms);
            assert_eq!(seen, Some(expected), "{when}: seen {log_id} {job_id} {fire_ms}");
            let accepted = journal.accept(log_id, job_id, fire_ms, BASE + 3).unwrap();
            assert_eq!(accepted, expected, "{when}: accept {log_id} {job_id} {fire_ms}");
        }
    };
    check(&journal, "before a restart");
    drop(journal);
    let (journal, _) = Journal::open(dir.path().to_owned(), BASE + 4, |_| None).unwrap();
    let cases_after = cases.map(|(trigger, admission)| match (trigger.0, admission) {
        (1, Admission::Duplicate(_)) => (trigger, Admission::Duplicate(RunState::Lost)),
        (1, Admission::Conflict(_)) => (trigger, Admission::Conflict(RunState::Lost)),
        _ => (trigger, admission),
    });
    for ((log_id, job_id, fire_ms), expected) in cases_after {
        assert_eq!(journal.accept(log_id, job_id, fire_ms, BASE + 5).unwrap(), expected);
    }
    let text = std::fs::read_to_string(segment_path(dir.path(), BASE / H)).unwrap();
    assert_eq!(text.lines().filter(|line| line.starts_with("accepted")).count(), 2, "{text}");
}
