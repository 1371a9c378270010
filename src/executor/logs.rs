//! Run logs on the executor.
//!
//! Lines come from the guest's `log` import and its stdout/stderr, each prefixed with a time and
//! a level. A run's log is capped: past the cap one marker line is written and the rest dropped;
//! a very long line is cut. Reads return bounded pages and never load a whole file.
//! Paths are built only from numbers (the run id and its date), never from request text.
//!
//! Where a log is kept: a run's log starts in memory, and most runs end within a second with a
//! few lines. Such a log is then appended, as one record, to the pack its run id falls in, shared
//! by the ids of [`PACK_RUNS`] runs of the same day (`logs/YYYY-MM-DD/p<logId / PACK_RUNS>.pack`,
//! records `<logId> <bytes>\n` followed by the lines), so a short run costs the file system one
//! write and no new file. A log that grows past [`SPILL_BYTES`], or whose run has been running for
//! [`SPILL_AFTER`] (see [`LogStore::spill_running`]), moves to a file of its own,
//! `logs/YYYY-MM-DD/<logId>.log`, and is written through from then on. A process that dies
//! therefore loses the lines of its queued runs and of runs younger than [`SPILL_AFTER`]; the
//! journal marks those runs lost on restart and their log says so.
//!
//! A [`LogFollower`] reads a run's log as it grows: each write wakes the followers of that run
//! (a [`Notify`] per run that may still write), and a follower reads on from the byte offset
//! where it stopped (the same in memory, in the run's file and in its pack record), so following
//! costs nothing while the run is quiet and never rereads.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::protocol::LogResult;
use crate::runtime::{Level, LogSink};

mod follow;
mod pack;

pub use self::follow::{LogFollower, follow_json_lines};
use self::pack::{pack_name, pack_record, read_pack};

/// The longest line kept, in bytes; longer ones are cut with a marker.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// The most lines one page holds.
pub const PAGE_LINES: usize = 1000;
/// The most bytes one page holds.
pub const PAGE_BYTES: usize = 256 * 1024;
/// The most bytes of a run's log kept in memory; a log that grows past it moves to its own file.
pub const SPILL_BYTES: usize = 64 * 1024;
/// How long a run may run with its log in memory before the log moves to its own file.
pub const SPILL_AFTER: Duration = Duration::from_secs(1);
/// How many run ids share a pack.
pub const PACK_RUNS: i64 = 4096;
/// The most packs kept open for appending.
const OPEN_PACKS: usize = 32;

/// The log directory, the logs that may still grow (each with the [`Notify`] its writes wake
/// followers with), and the packs open for appending.
#[derive(Clone)]
pub struct LogStore {
    root: PathBuf,
    max_bytes: u64,
    active: Arc<Mutex<HashMap<i64, RunLog>>>,
    packs: Arc<Mutex<HashMap<PathBuf, File>>>,
}

impl LogStore {
    /// Logs under `root`, each capped at `max_bytes`.
    pub fn new(root: PathBuf, max_bytes: u64) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(&root)?;
        Ok(LogStore { root, max_bytes, active: Arc::default(), packs: Arc::default() })
    }

    /// Marks run `log_id`, triggered at `trigger_time_ms`, as accepted: its log starts in memory
    /// and is not at its end until [`LogStore::finished`].
    pub fn started(&self, log_id: i64, trigger_time_ms: i64) {
        if let Ok(mut active) = self.active.lock() {
            active.entry(log_id).or_insert_with(|| {
                RunLog::new(RunLogInner {
                    log_id,
                    path: self.path(log_id, trigger_time_ms),
                    memory: Vec::new(),
                    file: None,
                    written: 0,
                    max_bytes: self.max_bytes,
                    truncated: false,
                    notify: Arc::default(),
                    running_since: None,
                    closed: false,
                })
            });
        }
    }

    /// Marks run `log_id` as running: from [`SPILL_AFTER`] on, its log is in a file of its own.
    pub fn running(&self, log_id: i64) {
        if let Some(log) = self.active_log(log_id)
            && let Ok(mut inner) = log.0.lock()
        {
            inner.running_since.get_or_insert_with(Instant::now);
        }
    }

    /// Marks run `log_id` as over and stores its log: a log still in memory becomes a record of
    /// its pack. Lines written after this are dropped.
    pub fn finished(&self, log_id: i64) {
        self.finished_all(&[log_id]);
    }

    /// [`LogStore::finished`] for runs `log_ids`: the records bound for one pack go in one write.
    pub fn finished_all(&self, log_ids: &[i64]) {
        let logs: Vec<(i64, RunLog)> = match self.active.lock() {
            Ok(mut active) => {
                log_ids.iter().filter_map(|id| Some((*id, active.remove(id)?))).collect()
            }
            Err(_) => return,
        };
        // Each pack's records, and the logs they hold.
        let mut packs: HashMap<PathBuf, (Vec<u8>, Vec<&RunLog>)> = HashMap::new();
        for (log_id, log) in &logs {
            let Ok(mut inner) = log.0.lock() else { continue };
            inner.closed = true;
            if inner.file.is_none() && !inner.memory.is_empty() {
                let day = inner.path.parent().map(Path::to_path_buf).unwrap_or_default();
                let (records, held) = packs.entry(day.join(pack_name(*log_id))).or_default();
                records.extend_from_slice(&pack_record(*log_id, &inner.memory));
                held.push(log);
            }
        }
        for (path, (records, held)) in packs {
            if let Err(error) = self.append_to_pack(&path, &records) {
                tracing::warn!(%error, "cannot store {} run logs in their pack", held.len());
                for log in held {
                    if let Ok(mut inner) = log.0.lock() {
                        inner.spill();
                    }
                }
            }
        }
        for (_, log) in &logs {
            if let Ok(inner) = log.0.lock() {
                inner.notify.notify_waiters();
            }
        }
    }

    /// Moves the logs of runs running for `age` or longer from memory to their own files, so a
    /// process that dies keeps them. The executor calls this every few hundred milliseconds.
    pub fn spill_running(&self, age: Duration) {
        let logs: Vec<RunLog> = match self.active.lock() {
            Ok(active) => active.values().cloned().collect(),
            Err(_) => return,
        };
        for log in logs {
            if let Ok(mut inner) = log.0.lock()
                && inner.file.is_none()
                && !inner.closed
                && inner.running_since.is_some_and(|since| since.elapsed() >= age)
            {
                inner.spill();
            }
        }
    }

    fn active_log(&self, log_id: i64) -> Option<RunLog> {
        self.active.lock().ok().and_then(|active| active.get(&log_id).cloned())
    }

    fn is_active(&self, log_id: i64) -> bool {
        self.active.lock().map(|active| active.contains_key(&log_id)).unwrap_or(false)
    }

    /// The [`Notify`] of run `log_id` while its log may still grow.
    fn notify_of(&self, log_id: i64) -> Option<Arc<Notify>> {
        let log = self.active_log(log_id)?;
        log.0.lock().ok().map(|inner| inner.notify.clone())
    }

    /// Follows run `log_id`'s log from line `from_line` (1-based).
    pub fn follow(&self, log_id: i64, trigger_time_ms: i64, from_line: i64) -> LogFollower {
        LogFollower {
            store: self.clone(),
            log_id,
            trigger_time_ms,
            offset: 0,
            next_line: 1,
            from_line: from_line.max(1),
        }
    }

    /// The log of run `log_id`: the accepted run's, or else its file triggered at
    /// `trigger_time_ms`, opened for appending (a log written outside a run's life).
    pub fn open(&self, log_id: i64, trigger_time_ms: i64) -> std::io::Result<RunLog> {
        if let Some(log) = self.active_log(log_id) {
            return Ok(log);
        }
        let path = self.path(log_id, trigger_time_ms);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let written = file.metadata()?.len();
        Ok(RunLog::new(RunLogInner {
            log_id,
            path,
            memory: Vec::new(),
            file: Some(file),
            written,
            max_bytes: self.max_bytes,
            truncated: false,
            notify: Arc::default(),
            running_since: None,
            closed: false,
        }))
    }

    /// Appends `message` to the log of run `log_id` when its trigger time is not known (a run
    /// found in the journal after a restart): to its file or pack records, whatever their date,
    /// or else to a new record dated `fallback_ms`. Does nothing if the log already ends with
    /// `message`, so a process that restarts again and again does not repeat itself.
    pub fn append_once(
        &self,
        log_id: i64,
        fallback_ms: i64,
        level: Level,
        message: &str,
    ) -> std::io::Result<()> {
        let name = format!("{log_id}.log");
        let pack = pack_name(log_id);
        let mut days: Vec<PathBuf> = std::fs::read_dir(&self.root)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.join(&name).is_file() || path.join(&pack).is_file())
            .collect();
        days.sort();
        let lines = format_lines(level, message);
        while let Some(day) = days.pop() {
            let file_path = day.join(&name);
            let existing = if file_path.is_file() {
                let mut file = File::open(&file_path)?;
                let written = file.metadata()?.len();
                let tail_len = written.min(MAX_LINE_BYTES as u64);
                let mut tail = Vec::new();
                file.seek(SeekFrom::Start(written - tail_len))?;
                file.read_to_end(&mut tail)?;
                Some((tail, true))
            } else {
                read_pack(&day.join(&pack), log_id)?.map(|bytes| (bytes, false))
            };
            let Some((bytes, in_file)) = existing else { continue };
            let text = String::from_utf8_lossy(&bytes);
            let last_line = text.trim_end().rsplit('\n').next().unwrap_or_default();
            if last_line.ends_with(message) {
                return Ok(());
            }
            if in_file {
                let mut file = std::fs::OpenOptions::new().append(true).open(&file_path)?;
                return file.write_all(lines.as_bytes());
            }
            return self.append_to_pack(&day.join(&pack), &pack_record(log_id, lines.as_bytes()));
        }
        let day =
            self.path(log_id, fallback_ms).parent().map(Path::to_path_buf).unwrap_or_default();
        self.append_to_pack(&day.join(pack), &pack_record(log_id, lines.as_bytes()))
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
        match self.reader(log_id, trigger_time_ms, 0)? {
            Some(reader) => read_page(reader, from_line, active),
            None => Ok(LogResult {
                from_line_num: from_line,
                to_line_num: from_line - 1,
                log_content: String::new(),
                is_end: !active,
            }),
        }
    }

    /// Run `log_id`'s log from byte `offset`: from memory, its own file or its pack records;
    /// `None` when this executor has no line of it.
    fn reader(
        &self,
        log_id: i64,
        trigger_time_ms: i64,
        offset: u64,
    ) -> std::io::Result<Option<Box<dyn BufRead + Send>>> {
        let from_memory = self.active_log(log_id).and_then(|log| {
            let inner = log.0.lock().ok()?;
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(inner.memory.len());
            inner.file.is_none().then(|| inner.memory[start..].to_vec())
        });
        if let Some(bytes) = from_memory {
            return Ok(Some(Box::new(Cursor::new(bytes))));
        }
        let path = self.path(log_id, trigger_time_ms);
        match File::open(&path) {
            Ok(mut file) => {
                file.seek(SeekFrom::Start(offset))?;
                return Ok(Some(Box::new(BufReader::new(file))));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let day = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let Some(bytes) = read_pack(&day.join(pack_name(log_id)), log_id)? else {
            return Ok(None);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
        Ok(Some(Box::new(Cursor::new(bytes[start..].to_vec()))))
    }

    /// Appends `records` (each `<log id> <length>\n` and that many bytes of log) to the pack at
    /// `path`.
    fn append_to_pack(&self, path: &Path, records: &[u8]) -> std::io::Result<()> {
        let mut packs =
            self.packs.lock().map_err(|_| std::io::Error::other("pack lock poisoned"))?;
        if !packs.contains_key(path) {
            if packs.len() >= OPEN_PACKS {
                packs.clear();
            }
            if let Some(day) = path.parent() {
                std::fs::create_dir_all(day)?;
            }
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            packs.insert(path.to_owned(), file);
        }
        match packs.get_mut(path) {
            Some(file) => file.write_all(records),
            None => Err(std::io::Error::other("pack not open")),
        }
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
                if let Ok(mut packs) = self.packs.lock() {
                    packs.retain(|path, _| !path.starts_with(entry.path()));
                }
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

/// The log of one run; implements the runtime's [`LogSink`]. Clones share the lines and the
/// cap, so the host's own lines and the guest's count together.
#[derive(Clone)]
pub struct RunLog(Arc<Mutex<RunLogInner>>);

impl RunLog {
    fn new(inner: RunLogInner) -> RunLog {
        RunLog(Arc::new(Mutex::new(inner)))
    }
}

struct RunLogInner {
    log_id: i64,
    /// The run's own file, where its log goes once it leaves memory.
    path: PathBuf,
    /// The lines while the log is in memory.
    memory: Vec<u8>,
    /// The run's own file once the log is there.
    file: Option<File>,
    written: u64,
    max_bytes: u64,
    truncated: bool,
    notify: Arc<Notify>,
    running_since: Option<Instant>,
    /// Set when the run is over: the log is stored and takes no more lines.
    closed: bool,
}

impl LogSink for RunLog {
    fn line(&mut self, level: Level, message: &str) {
        if let Ok(mut inner) = self.0.lock() {
            inner.line(level, message);
        }
    }
}

/// `message` as log lines, one per line of it, each cut to [`MAX_LINE_BYTES`]:
/// `YYYY-MM-DD HH:MM:SS.mmm [LEVEL] text`, the time in UTC.
pub fn format_lines(level: Level, message: &str) -> String {
    let level = match level {
        Level::Trace => " [TRACE] ",
        Level::Debug => " [DEBUG] ",
        Level::Info => " [INFO] ",
        Level::Warn => " [WARN] ",
        Level::Error => " [ERROR] ",
    };
    let time = time_prefix(Utc::now());
    let mut text = String::with_capacity(message.len() + 40);
    for part in message.split('\n') {
        let part = part.trim_end_matches('\r');
        let (part, cut) = cut_line(part);
        text.push_str(&time);
        text.push_str(level);
        text.push_str(part);
        if cut {
            text.push_str(" …[line cut]");
        }
        text.push('\n');
    }
    text
}

/// `YYYY-MM-DD HH:MM:SS.mmm` of `at`, its digits written one by one: a run logs a few lines,
/// and formatting the fields through `format!` was a measurable share of a short run.
fn time_prefix(at: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    let mut text = [0u8; 23];
    let fields = [
        (0, 4, u32::try_from(at.year()).unwrap_or(0).min(9999)),
        (5, 2, at.month()),
        (8, 2, at.day()),
        (11, 2, at.hour()),
        (14, 2, at.minute()),
        (17, 2, at.second().min(59)),
        (20, 3, at.timestamp_subsec_millis().min(999)),
    ];
    for (start, width, mut value) in fields {
        for at in (start..start + width).rev() {
            text[at] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    for (at, separator) in [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':'), (19, b'.')] {
        text[at] = separator;
    }
    text.iter().map(|&byte| char::from(byte)).collect()
}

impl RunLogInner {
    fn line(&mut self, level: Level, message: &str) {
        if self.truncated || self.closed {
            return;
        }
        let mut text = format_lines(level, message);
        if self.written + text.len() as u64 > self.max_bytes {
            self.truncated = true;
            let time = time_prefix(Utc::now());
            text = format!(
                "{time} [WARN] log truncated: the run's log reached its cap of {} bytes\n",
                self.max_bytes
            );
        }
        match &mut self.file {
            // A failing log write must not fail the run: the guest's work matters more than
            // its log.
            Some(file) => {
                if file.write_all(text.as_bytes()).is_ok() {
                    self.written += text.len() as u64;
                }
            }
            None => {
                self.memory.extend_from_slice(text.as_bytes());
                self.written += text.len() as u64;
                if self.memory.len() > SPILL_BYTES {
                    self.spill();
                }
            }
        }
        self.notify.notify_waiters();
    }

    /// Moves the log from memory to the run's own file; on failure it stays in memory.
    fn spill(&mut self) {
        if self.file.is_some() {
            return;
        }
        let opened = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(&self.path))
            .and_then(|mut file| file.write_all(&self.memory).map(|()| file));
        match opened {
            Ok(file) => {
                self.file = Some(file);
                self.memory = Vec::new();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot move the log of run {} to its file", self.log_id);
            }
        }
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
mod tests;
