//! Run logs on the executor: one file per run under `logs/YYYY-MM-DD/<logId>.log`.
//!
//! Lines come from the guest's `log` import and its stdout/stderr, each prefixed with a time and
//! a level. A run's log is capped: past the cap one marker line is written and the rest dropped;
//! a very long line is cut. Reads return bounded pages and never load a whole file.
//! Paths are built only from numbers (the run id and its date), never from request text.
//!
//! A [`LogFollower`] reads a run's log as it grows: each write wakes the followers of that run
//! (a [`Notify`] per run that may still write), and a follower reads on from the byte offset
//! where it stopped, so following costs nothing while the run is quiet and never rereads.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::protocol::LogResult;
use crate::runtime::{Level, LogSink};

/// The longest line kept, in bytes; longer ones are cut with a marker.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// The most lines one page holds.
pub const PAGE_LINES: usize = 1000;
/// The most bytes one page holds.
pub const PAGE_BYTES: usize = 256 * 1024;

/// The log directory and the runs whose logs may still grow, each with the [`Notify`] its
/// writes wake followers with.
#[derive(Clone)]
pub struct LogStore {
    root: PathBuf,
    max_bytes: u64,
    active: Arc<Mutex<HashMap<i64, Arc<Notify>>>>,
}

impl LogStore {
    /// Logs under `root`, each capped at `max_bytes`.
    pub fn new(root: PathBuf, max_bytes: u64) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(&root)?;
        Ok(LogStore { root, max_bytes, active: Arc::default() })
    }

    /// Marks run `log_id` as accepted: its log is not at its end until `finished`.
    pub fn started(&self, log_id: i64) {
        if let Ok(mut active) = self.active.lock() {
            active.entry(log_id).or_default();
        }
    }

    /// Marks run `log_id` as over.
    pub fn finished(&self, log_id: i64) {
        let notify = self.active.lock().ok().and_then(|mut active| active.remove(&log_id));
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    fn is_active(&self, log_id: i64) -> bool {
        self.active.lock().map(|active| active.contains_key(&log_id)).unwrap_or(false)
    }

    /// The [`Notify`] of run `log_id` while its log may still grow.
    fn notify_of(&self, log_id: i64) -> Option<Arc<Notify>> {
        self.active.lock().ok().and_then(|active| active.get(&log_id).cloned())
    }

    /// Follows run `log_id`'s log from line `from_line` (1-based).
    pub fn follow(&self, log_id: i64, trigger_time_ms: i64, from_line: i64) -> LogFollower {
        LogFollower {
            store: self.clone(),
            log_id,
            path: self.path(log_id, trigger_time_ms),
            offset: 0,
            next_line: 1,
            from_line: from_line.max(1),
        }
    }

    /// Opens (appending) the log of run `log_id` triggered at `trigger_time_ms`.
    pub fn open(&self, log_id: i64, trigger_time_ms: i64) -> std::io::Result<RunLog> {
        let path = self.path(log_id, trigger_time_ms);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let written = file.metadata()?.len();
        let notify = self.notify_of(log_id);
        let inner =
            RunLogInner { file, written, max_bytes: self.max_bytes, truncated: false, notify };
        Ok(RunLog(Arc::new(Mutex::new(inner))))
    }

    /// Appends `message` to the log of run `log_id` when its trigger time is not known (a run
    /// found in the journal after a restart): to the existing file, whatever its date, or else
    /// to a new one dated `fallback_ms`. Does nothing if the log already ends with `message`,
    /// so a process that restarts again and again does not repeat itself.
    pub fn append_once(
        &self,
        log_id: i64,
        fallback_ms: i64,
        level: Level,
        message: &str,
    ) -> std::io::Result<()> {
        let name = format!("{log_id}.log");
        let mut days: Vec<PathBuf> = std::fs::read_dir(&self.root)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.join(&name).is_file())
            .collect();
        days.sort();
        let Some(day) = days.pop() else {
            self.open(log_id, fallback_ms)?.line(level, message);
            return Ok(());
        };
        let path = day.join(name);
        let mut file = std::fs::OpenOptions::new().read(true).append(true).open(&path)?;
        let written = file.metadata()?.len();
        let tail_len = written.min(MAX_LINE_BYTES as u64);
        let mut tail = Vec::new();
        file.seek(SeekFrom::Start(written - tail_len))?;
        file.read_to_end(&mut tail)?;
        let last_line = String::from_utf8_lossy(&tail);
        let last_line = last_line.trim_end().rsplit('\n').next().unwrap_or_default();
        if last_line.ends_with(message) {
            return Ok(());
        }
        let notify = self.notify_of(log_id);
        let inner =
            RunLogInner { file, written, max_bytes: self.max_bytes, truncated: false, notify };
        RunLog(Arc::new(Mutex::new(inner))).line(level, message);
        Ok(())
    }

    /// A page of run `log_id`'s log from line `from_line` (1-based).
    pub fn read(
        &self,
        log_id: i64,
        trigger_time_ms: i64,
        from_line: i64,
    ) -> std::io::Result<LogResult> {
        let from_line = from_line.max(1);
        let active = self.is_active(log_id);
        let path = self.path(log_id, trigger_time_ms);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(LogResult {
                    from_line_num: from_line,
                    to_line_num: from_line - 1,
                    log_content: String::new(),
                    is_end: !active,
                });
            }
            Err(error) => return Err(error),
        };
        read_page(BufReader::new(file), from_line, active)
    }

    /// Deletes the date directories older than `keep_days` days before `now`.
    pub fn remove_older_than(&self, now: DateTime<Utc>, keep_days: u32) -> std::io::Result<usize> {
        let oldest_kept =
            (now - chrono::Duration::days(i64::from(keep_days))).format("%Y-%m-%d").to_string();
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_date =
                name.len() == 10 && chrono::NaiveDate::parse_from_str(&name, "%Y-%m-%d").is_ok();
            if is_date && name < oldest_kept {
                std::fs::remove_dir_all(entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn path(&self, log_id: i64, trigger_time_ms: i64) -> PathBuf {
        let day = DateTime::<Utc>::from_timestamp_millis(trigger_time_ms)
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
            .format("%Y-%m-%d")
            .to_string();
        self.root.join(day).join(format!("{log_id}.log"))
    }
}

fn read_page(reader: impl BufRead, from_line: i64, active: bool) -> std::io::Result<LogResult> {
    let mut content = String::new();
    let mut line_no = 0i64;
    let mut to_line = from_line - 1;
    let mut at_end = true;
    for line in reader.lines() {
        let line = line?;
        line_no += 1;
        if line_no < from_line {
            continue;
        }
        if (to_line - from_line + 1) as usize >= PAGE_LINES
            || content.len() + line.len() > PAGE_BYTES
        {
            at_end = false;
            break;
        }
        content.push_str(&line);
        content.push('\n');
        to_line = line_no;
    }
    Ok(LogResult {
        from_line_num: from_line,
        to_line_num: to_line,
        log_content: content,
        is_end: at_end && !active,
    })
}

/// The open log of one run; implements the runtime's [`LogSink`]. Clones share the file and
/// the cap, so the host's own lines and the guest's count together.
#[derive(Clone)]
pub struct RunLog(Arc<Mutex<RunLogInner>>);

struct RunLogInner {
    file: File,
    written: u64,
    max_bytes: u64,
    truncated: bool,
    notify: Option<Arc<Notify>>,
}

impl LogSink for RunLog {
    fn line(&mut self, level: Level, message: &str) {
        if let Ok(mut inner) = self.0.lock() {
            inner.line(level, message);
        }
    }
}

impl RunLogInner {
    fn line(&mut self, level: Level, message: &str) {
        if self.truncated {
            return;
        }
        let level = match level {
            Level::Trace => "TRACE",
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        };
        let time = Utc::now().format("%Y-%m-%d %H:%M:%S%.3f");
        let mut text = String::new();
        for part in message.split('\n') {
            let part = part.trim_end_matches('\r');
            let (part, cut) = cut_line(part);
            text.push_str(&format!(
                "{time} [{level}] {part}{}\n",
                if cut { " …[line cut]" } else { "" }
            ));
        }
        if self.written + text.len() as u64 > self.max_bytes {
            self.truncated = true;
            text = format!(
                "{time} [WARN] log truncated: the run's log reached its cap of {} bytes\n",
                self.max_bytes
            );
        }
        // A failing log write must not fail the run: the guest's work matters more than its log.
        if self.file.write_all(text.as_bytes()).is_ok() {
            self.written += text.len() as u64;
        }
        if let Some(notify) = &self.notify {
            notify.notify_waiters();
        }
    }
}

/// How long a followed log may stay quiet before its stream sends a page without lines, which
/// tells the reader the connection is alive.
pub const FOLLOW_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The pages of `follower` as JSON lines (each a [`LogResult`]), the last one with `isEnd`.
/// A page is read only when the previous one was taken, so a slow reader holds one page.
pub fn follow_json_lines(
    follower: LogFollower,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    futures_util::stream::unfold(Some(follower), |follower| async move {
        let mut follower = follower?;
        let page = match follower.next_page(FOLLOW_IDLE).await {
            Ok(page) => page,
            Err(error) => return Some((Err(error), None)),
        };
        let mut line = serde_json::to_vec(&page).unwrap_or_default();
        line.push(b'\n');
        let next = (!page.is_end).then_some(follower);
        Some((Ok(bytes::Bytes::from(line)), next))
    })
}

/// Reads one run's log as it grows; see [`LogStore::follow`].
pub struct LogFollower {
    store: LogStore,
    log_id: i64,
    path: PathBuf,
    /// The byte offset of line `next_line`.
    offset: u64,
    next_line: i64,
    from_line: i64,
}

impl LogFollower {
    /// The lines written since the last page (at most a page), waiting up to `idle` for one
    /// when there is none yet. A page without lines and not at the end means the run was quiet
    /// for `idle`; `is_end` comes once the run is over and every line was returned.
    pub async fn next_page(&mut self, idle: std::time::Duration) -> std::io::Result<LogResult> {
        let mut waited = false;
        loop {
            // Registered before reading, so a write between the read and the wait still wakes.
            let notify = self.store.notify_of(self.log_id);
            let notified = notify.as_ref().map(|notify| notify.notified());
            tokio::pin!(notified);
            if let Some(notified) = notified.as_mut().as_pin_mut() {
                notified.enable();
            }
            let active = notify.is_some();
            let (path, offset, next_line, from_line) =
                (self.path.clone(), self.offset, self.next_line, self.from_line);
            let read =
                tokio::task::spawn_blocking(move || read_on(&path, offset, next_line, from_line))
                    .await
                    .map_err(std::io::Error::other)??;
            let first_line = from_line.max(next_line);
            (self.offset, self.next_line) = (read.offset, read.next_line);
            let has_lines = !read.content.is_empty();
            // Not active before the read: every line was written before it, so it saw them all.
            let is_end = !active && !read.more;
            if has_lines || is_end || waited {
                return Ok(LogResult {
                    from_line_num: first_line,
                    to_line_num: read.next_line.max(from_line) - 1,
                    log_content: read.content,
                    is_end,
                });
            }
            if let Some(notified) = notified.as_pin_mut() {
                let _ = tokio::time::timeout(idle, notified).await;
            }
            waited = true;
        }
    }
}

/// What [`read_on`] found.
struct ReadOn {
    content: String,
    offset: u64,
    next_line: i64,
    /// Whether the page filled up before the end of the file.
    more: bool,
}

/// Reads whole lines of `path` from byte `offset` (where line `next_line` starts), skipping
/// those before `from_line`, up to a page. A last line without its newline is being written
/// and is left for the next read.
fn read_on(path: &PathBuf, offset: u64, next_line: i64, from_line: i64) -> std::io::Result<ReadOn> {
    let mut read = ReadOn { content: String::new(), offset, next_line, more: false };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(read),
        Err(error) => return Err(error),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = BufReader::new(file);
    let mut lines = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok(read);
        }
        if read.next_line >= from_line {
            if lines >= PAGE_LINES || read.content.len() + line.len() > PAGE_BYTES {
                read.more = true;
                return Ok(read);
            }
            read.content.push_str(&String::from_utf8_lossy(&line));
            lines += 1;
        }
        read.offset += n as u64;
        read.next_line += 1;
    }
}

fn cut_line(line: &str) -> (&str, bool) {
    if line.len() <= MAX_LINE_BYTES {
        return (line, false);
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    (&line[..end], true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_owned(), 300).unwrap();
        store.started(7);
        let mut log = store.open(7, 1_700_000_000_000).unwrap();
        for i in 1..=3 {
            log.line(Level::Info, &format!("line {i}"));
        }
        let page = store.read(7, 1_700_000_000_000, 2).unwrap();
        assert_eq!((page.from_line_num, page.to_line_num, page.is_end), (2, 3, false));
        assert!(page.log_content.contains("[INFO] line 2\n"));
        store.finished(7);
        assert!(store.read(7, 1_700_000_000_000, 4).unwrap().is_end);

        for _ in 0..10 {
            log.line(Level::Info, "filler filler filler");
        }
        let all = store.read(7, 1_700_000_000_000, 1).unwrap();
        assert_eq!(all.log_content.matches("log truncated").count(), 1, "{}", all.log_content);
        let missing = store.read(8, 1_700_000_000_000, 1).unwrap();
        assert_eq!((missing.to_line_num, missing.is_end), (0, true));
    }

    #[test]
    fn a_note_for_a_run_of_unknown_date_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_owned(), 1000).unwrap();
        let day = 86_400_000;
        store.open(5, 10 * day).unwrap().line(Level::Info, "started");
        for _ in 0..2 {
            store.append_once(5, 20 * day, Level::Warn, "lost: gone").unwrap();
            store.append_once(6, 20 * day, Level::Warn, "lost: gone").unwrap();
        }
        let five = store.read(5, 10 * day, 1).unwrap().log_content;
        assert_eq!((five.matches("[INFO] started").count(), five.matches("lost").count()), (1, 1));
        let six = store.read(6, 20 * day, 1).unwrap().log_content;
        assert_eq!(six.matches("[WARN] lost: gone").count(), 1, "{six}");
    }

    #[tokio::test]
    async fn a_follower_reads_lines_as_they_are_written_then_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_owned(), 1_000_000).unwrap();
        let day = 86_400_000;
        store.started(3);
        let mut log = store.open(3, day).unwrap();
        for i in 1..=3 {
            log.line(Level::Info, &format!("line {i}"));
        }
        let mut follower = store.follow(3, day, 2);
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
        store.finished(3);
        let end = follower.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
        assert_eq!((end.from_line_num, end.to_line_num, end.is_end), (6, 5, true));

        // A follower of a finished run, or of a run this executor never had, ends at once.
        let mut again = store.follow(3, day, 1);
        let all = again.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
        assert_eq!((all.to_line_num, all.is_end), (5, true));
        let mut unknown = store.follow(4, day, 1);
        let none = unknown.next_page(std::time::Duration::from_secs(3600)).await.unwrap();
        assert_eq!((none.to_line_num, none.is_end), (0, true));
    }

    #[test]
    fn old_days_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::new(dir.path().to_owned(), 1000).unwrap();
        let day = 86_400_000;
        store.open(1, 10 * day).unwrap().line(Level::Info, "old");
        store.open(2, 40 * day).unwrap().line(Level::Info, "new");
        let now = DateTime::<Utc>::from_timestamp_millis(41 * day).unwrap();
        assert_eq!(store.remove_older_than(now, 30).unwrap(), 1);
        assert!(store.read(2, 40 * day, 1).unwrap().log_content.contains("new"));
    }
}
