//! Tests of `logs`.

use super::*;

const DAY: i64 = 86_400_000;

/// The names of the files in the day directory of `day`.
fn files_of_day(root: &Path, day: i64) -> Vec<String> {
    let dir = root
        .join(DateTime::<Utc>::from_timestamp_millis(day).unwrap().format("%Y-%m-%d").to_string());
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn lines_carry_the_time_in_utc_and_the_level() {
    let at = DateTime::<Utc>::from_timestamp_millis(1_700_000_000_007).unwrap();
    assert_eq!(time_prefix(at), "2023-11-14 22:13:20.007");
    // The epoch, a year's last millisecond, a leap day, and the far future.
    for ms in [0, 1_704_067_199_999, 1_709_210_096_450, 253_402_300_799_999] {
        let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
        assert_eq!(time_prefix(at), at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(), "{ms}");
    }
    let lines = format_lines(Level::Warn, "one\r\ntwo");
    let lines: Vec<&str> = lines.lines().map(|line| &line[24..]).collect();
    assert_eq!(lines, ["[WARN] one", "[WARN] two"]);
}

#[test]
fn pages_and_caps() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 300).unwrap();
    store.started(7, DAY);
    let mut log = store.open(7, DAY).unwrap();
    for i in 1..=3 {
        log.line(Level::Info, &format!("line {i}"));
    }
    let page = store.read(7, DAY, 2).unwrap();
    assert_eq!((page.from_line_num, page.to_line_num, page.is_end), (2, 3, false));
    assert!(page.log_content.contains("[INFO] line 2\n"));
    for _ in 0..10 {
        log.line(Level::Info, "filler filler filler");
    }
    store.finished(7);
    assert!(store.read(7, DAY, 40).unwrap().is_end);
    let all = store.read(7, DAY, 1).unwrap();
    assert_eq!(all.log_content.matches("log truncated").count(), 1, "{}", all.log_content);
    // Lines after the end are dropped.
    log.line(Level::Info, "late");
    assert_eq!(store.read(7, DAY, 1).unwrap().log_content, all.log_content);
    let missing = store.read(8, DAY, 1).unwrap();
    assert_eq!((missing.to_line_num, missing.is_end), (0, true));
}

#[test]
fn short_logs_share_a_pack_per_range_of_run_ids() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1_000_000).unwrap();
    for log_id in (PACK_RUNS - 50)..(PACK_RUNS + 50) {
        store.started(log_id, DAY);
        store.running(log_id);
        let mut log = store.open(log_id, DAY).unwrap();
        log.line(Level::Info, &format!("run {log_id} says hello\nand bye"));
        // The first ones end alone, the rest together (one write per pack), with a run
        // this store never had.
        if log_id < PACK_RUNS - 30 {
            store.finished(log_id);
        }
    }
    let together: Vec<i64> = (PACK_RUNS - 30..PACK_RUNS + 50).chain([PACK_RUNS * 5]).collect();
    store.finished_all(&together);
    assert_eq!(files_of_day(dir.path(), DAY), ["p0.pack", "p1.pack"]);
    for log_id in (PACK_RUNS - 50)..(PACK_RUNS + 50) {
        let page = store.read(log_id, DAY, 1).unwrap();
        assert_eq!((page.to_line_num, page.is_end), (2, true), "{}", page.log_content);
        assert!(page.log_content.contains(&format!("[INFO] run {log_id} says hello\n")));
        assert_eq!(page.log_content.matches("says hello").count(), 1);
    }
    assert_eq!(store.read(PACK_RUNS + 51, DAY, 1).unwrap().to_line_num, 0);
}

#[test]
fn long_and_big_logs_move_to_their_own_file_and_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 10_000_000).unwrap();
    // Big: past SPILL_BYTES.
    store.started(1, DAY);
    let mut big = store.open(1, DAY).unwrap();
    let line = "x".repeat(1000);
    let lines = SPILL_BYTES / 1000 + 10;
    for _ in 0..lines {
        big.line(Level::Info, &line);
    }
    assert_eq!(files_of_day(dir.path(), DAY), ["1.log"]);
    // Long: running for SPILL_AFTER (here: any time at all); a queued run stays in memory.
    store.started(2, DAY);
    store.started(3, DAY);
    store.running(2);
    let mut long = store.open(2, DAY).unwrap();
    long.line(Level::Info, "before");
    store.spill_running(Duration::ZERO);
    long.line(Level::Info, "after");
    assert_eq!(files_of_day(dir.path(), DAY), ["1.log", "2.log"]);
    store.finished_all(&[1, 2, 3]);
    assert_eq!(files_of_day(dir.path(), DAY), ["1.log", "2.log"], "nothing left to pack");
    let two = store.read(2, DAY, 1).unwrap();
    assert_eq!((two.to_line_num, two.is_end), (2, true));
    assert!(two.log_content.contains("before") && two.log_content.contains("after"));
    let one = store.read(1, DAY, 1).unwrap();
    assert_eq!(one.to_line_num, i64::try_from(lines).unwrap());
}

#[test]
fn a_damaged_pack_keeps_the_records_before_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1_000_000).unwrap();
    for log_id in [5, 6] {
        store.started(log_id, DAY);
        store.open(log_id, DAY).unwrap().line(Level::Info, &format!("run {log_id}"));
        store.finished(log_id);
    }
    let pack = dir.path().join("1970-01-02").join("p0.pack");
    let mut file = std::fs::OpenOptions::new().append(true).open(&pack).unwrap();
    file.write_all(b"5 900\ncut short").unwrap();
    let five = store.read(5, DAY, 1).unwrap();
    assert_eq!((five.to_line_num, five.is_end), (1, true), "{}", five.log_content);
    assert!(five.log_content.contains("[INFO] run 5\n"));
    assert_eq!(store.read(6, DAY, 1).unwrap().to_line_num, 1);
    file.write_all(b"\nnot a header\n").unwrap();
    assert_eq!(store.read(6, DAY, 1).unwrap().to_line_num, 1);
}

#[test]
fn a_note_for_a_run_of_unknown_date_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1000).unwrap();
    store.open(5, 10 * DAY).unwrap().line(Level::Info, "started");
    store.started(7, 10 * DAY);
    store.open(7, 10 * DAY).unwrap().line(Level::Info, "started");
    store.finished(7);
    for _ in 0..2 {
        for log_id in [5, 6, 7] {
            store.append_once(log_id, 20 * DAY, Level::Warn, "lost: gone").unwrap();
        }
    }
    for log_id in [5, 7] {
        let log = store.read(log_id, 10 * DAY, 1).unwrap().log_content;
        assert_eq!(
            (log.matches("[INFO] started").count(), log.matches("lost").count()),
            (1, 1),
            "{log}"
        );
    }
    let six = store.read(6, 20 * DAY, 1).unwrap().log_content;
    assert_eq!(six.matches("[WARN] lost: gone").count(), 1, "{six}");
}

#[tokio::test]
async fn a_follower_reads_lines_as_they_are_written_then_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1_000_000).unwrap();
    store.started(3, DAY);
    let mut log = store.open(3, DAY).unwrap();
    for i in 1..=3 {
        log.line(Level::Info, &format!("line {i}"));
    }
    let mut follower = store.follow(3, DAY, 2);
    let page = follower.next_page(std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!((page.from_line_num, page.to_line_num, page.is_end), (2, 3, false));
    assert!(page.log_content.ends_with("[INFO] line 3\n"), "{}", page.log_content);

    // Quiet: a page without lines once the wait is over.
    let quiet = follower.next_page(std::time::Duration::from_millis(1)).await.unwrap();
    assert_eq!((quiet.from_line_num, quiet.to_line_num, quiet.is_end), (4, 3, false));

    // A write wakes a waiting follower (the wait would otherwise outlast the test).
    let waiting = tokio::spawn(async move {
        let page = follower.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
        (page, follower)
    });
    tokio::task::yield_now().await;
    log.line(Level::Warn, "line 4\nline 5");
    let (page, mut follower) = waiting.await.unwrap();
    assert_eq!((page.from_line_num, page.to_line_num), (4, 5), "{}", page.log_content);
    // The log moves to its file, then the run ends and nothing else is written: the
    // follower reads on from the same place, then the end.
    store.running(3);
    store.spill_running(Duration::ZERO);
    log.line(Level::Info, "line 6");
    let page = follower.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
    assert_eq!((page.from_line_num, page.to_line_num), (6, 6), "{}", page.log_content);
    store.finished(3);
    let end = follower.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
    assert_eq!((end.from_line_num, end.to_line_num, end.is_end), (7, 6, true));

    // A follower of a finished run, or of a run this executor never had, ends at once.
    let mut again = store.follow(3, DAY, 1);
    let all = again.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
    assert_eq!((all.to_line_num, all.is_end), (6, true));
    let mut unknown = store.follow(4, DAY, 1);
    let none = unknown.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
    assert_eq!((none.to_line_num, none.is_end), (0, true));
}

#[tokio::test]
async fn a_follower_reads_on_from_the_pack_once_the_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1_000_000).unwrap();
    store.started(9, DAY);
    let mut log = store.open(9, DAY).unwrap();
    log.line(Level::Info, "one");
    let mut follower = store.follow(9, DAY, 1);
    let page = follower.next_page(std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!(page.to_line_num, 1);
    log.line(Level::Info, "two\nthree");
    store.finished(9);
    assert_eq!(files_of_day(dir.path(), DAY), ["p0.pack"]);
    let page = follower.next_page(std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!((page.from_line_num, page.to_line_num, page.is_end), (2, 3, true));
    assert!(page.log_content.ends_with("[INFO] three\n"), "{}", page.log_content);
}

#[test]
fn old_days_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::new(dir.path().to_owned(), 1000).unwrap();
    store.open(1, 10 * DAY).unwrap().line(Level::Info, "old");
    store.open(2, 40 * DAY).unwrap().line(Level::Info, "new");
    store.started(3, 10 * DAY);
    store.finished(3);
    let now = DateTime::<Utc>::from_timestamp_millis(41 * DAY).unwrap();
    assert_eq!(store.remove_older_than(now, 30).unwrap(), 1);
    assert!(store.read(2, 40 * DAY, 1).unwrap().log_content.contains("new"));
    assert_eq!(store.read(1, 10 * DAY, 1).unwrap().to_line_num, 0);
}
