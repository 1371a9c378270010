//! The durable callback outbox: results are written to disk first, then delivered to the admin
//! in batches, and forgotten only once an admin acknowledged them.
//!
//! Results are appended as JSON lines to segment files (`outbox/results-<n>.log`), and a push
//! returns once its lines are synced (the workers push the results of many runs at once).
//! Syncs are shared: concurrent pushes append under one lock
//! and the first of them to sync makes every line appended so far durable with one
//! `sync_data` (group commit, paced by `group_sync.rs`), so a burst of results costs a few
//! syncs, not two per result.
//! A process killed between a run's end and its delivery loses nothing: the next start delivers
//! it (a power cut too, as far as the disk honours `sync_data`). An acknowledgement appends an `ack <logId>` line (not synced: a result
//! delivered twice is harmless, the admin applies a result at most once). A segment rotates
//! after [`SEGMENT_LINES`] lines and is deleted once every result in it was acknowledged.
//! Results also stay in memory until acknowledged, so delivering never reads the disk.
//! A line that cannot be parsed at start is copied to `outbox/quarantine/` with an error log,
//! never dropped silently. Single-file entries (`<logId>.json`) of earlier versions are
//! delivered like the others, and unreadable ones quarantined.
//!
//! A result that cannot be stored (disk full, permissions, a failed sync) is logged as an
//! error and kept in memory, delivered like the others; it does not survive a restart. After
//! a failed sync nothing written since can be promised durable, so every later result is
//! kept in memory too, until the executor restarts.
//!
//! When an admin refuses a batch, its entries are sent one by one, and an entry refused alone
//! waits behind the others with its own backoff, so one result the admin cannot apply does not
//! hold back the rest. An admin that cannot be reached backs the whole outbox off.
//! A stopping executor delivers until nothing is left or its deadline (the shutdown grace)
//! passed; what is left then waits on disk for the next start.
//! This module does not decide what a result says; the workers do.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::AdminLink;
use super::group_sync::GroupSync;
use crate::protocol::{self, CallbackList, Generation, HandleCallbackParam, ProtocolError};

/// The most results sent in one `/api/callback` (the admin's body limit fits the largest).
const BATCH: usize = protocol::MAX_CALLBACK_BATCH;
/// Lines in a segment before the next one starts.
const SEGMENT_LINES: usize = 4096;
/// The first wait of an entry an admin refused alone; it doubles up to [`MAX_ENTRY_BACKOFF`].
const ENTRY_BACKOFF: Duration = Duration::from_secs(1);
const MAX_ENTRY_BACKOFF: Duration = Duration::from_secs(300);
/// A stopping executor's first wait after a round no admin answered; it doubles up to
/// [`MAX_DRAIN_BACKOFF`].
const DRAIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_DRAIN_BACKOFF: Duration = Duration::from_secs(2);
/// How long the results of runs an unreachable admin sent go to the others first, so that a
/// paused admin does not hold every delivery round for a timeout.
const PASS_OVER: Duration = Duration::from_secs(30);

/// Why a result could not be stored on disk (it is then kept in memory).
#[derive(Debug, thiserror::Error)]
#[error("storing the result of run {log_id} in {}: {source}", path.display())]
pub struct OutboxError {
    log_id: i64,
    path: PathBuf,
    source: std::io::Error,
}

/// Where results wait for delivery.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    /// How far the lines are durable.
    synced: GroupSync,
    notify: Notify,
    /// Admins (by index in the URL list) that could not be reached when their results went to
    /// them first, and until when their results go in the list's order instead (an entry is
    /// overwritten at the next failure; there is one at most per URL).
    passed_over: Mutex<HashMap<usize, Instant>>,
}

struct State {
    /// The pending results by run id.
    entries: HashMap<i64, Entry>,
    /// Delivery order: run ids with the stamp of the entry they were queued for (an id whose
    /// entry has another stamp, or none, is a stale place in the line and is skipped).
    order: VecDeque<(i64, u64)>,
    stamps: u64,
    /// The segment being appended to; `None` once a write or a sync failed.
    writer: Option<Writer>,
    /// Pending results per segment, closed or current.
    live: BTreeMap<u64, usize>,
    /// Lines appended so far.
    written: u64,
}

struct Writer {
    seq: u64,
    file: Arc<File>,
    lines: usize,
}

/// One pending result.
struct Entry {
    result: HandleCallbackParam,
    stamp: u64,
    home: Home,
    /// Set after an admin refused this entry alone: not sent again before then.
    retry_at: Option<Instant>,
    refusals: u32,
}

/// Where a pending result is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    /// A line of segment `n`.
    Segment(u64),
    /// A `<logId>.json` file of an earlier version.
    File,
    /// Nowhere but memory.
    Memory,
}

/// What one delivery round did.
enum Round {
    /// A full batch went: there may be more right away.
    More,
    /// Nothing more is due now; the earliest entry waiting for its own backoff is due then.
    Idle(Option<Instant>),
}

/// How the admins answered one call.
enum Sent {
    Acknowledged,
    /// An admin answered and refused (a failure envelope or not the protocol at all).
    Refused(ProtocolError),
    /// No admin could be reached.
    Unreachable(anyhow::Error),
}

impl Outbox {
    /// The outbox in `dir`: loads the stored results, quarantining unreadable ones, and starts
    /// a new segment.
    pub fn open(dir: PathBuf) -> std::io::Result<Outbox> {
        let quarantine = dir.join("quarantine");
        std::fs::create_dir_all(&quarantine)?;
        let mut loaded: Vec<(HandleCallbackParam, Home)> = Vec::new();
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else { continue };
            if let Some(seq) = segment_seq(name) {
                segments.push((seq, path));
                continue;
            }
            if name.ends_with(".json.tmp") {
                // A write cut short: its result never counted as stored. Keep it for a human.
                tracing::warn!("outbox: moving the unfinished write {} aside", path.display());
                move_aside(&path, &quarantine);
                continue;
            }
            if name.strip_suffix(".json").and_then(|id| id.parse::<i64>().ok()).is_none() {
                continue;
            }
            match read_entry(&path) {
                Ok(result) => loaded.push((result, Home::File)),
                Err(error) => {
                    tracing::error!(
                        "outbox: entry {} cannot be read ({error}); moved to {}",
                        path.display(),
                        quarantine.display()
                    );
                    move_aside(&path, &quarantine);
                }
            }
        }
        segments.sort_unstable();
        let mut by_id: HashMap<i64, (HandleCallbackParam, Home)> =
            loaded.into_iter().map(|(result, home)| (result.log_id, (result, home))).collect();
        for (seq, path) in &segments {
            replay(*seq, path, &quarantine, &mut by_id)?;
        }
        let holding: std::collections::HashSet<u64> = by_id
            .values()
            .filter_map(|(_, home)| match home {
                Home::Segment(seq) => Some(*seq),
                _ => None,
            })
            .collect();
        for (seq, path) in &segments {
            if !holding.contains(seq) {
                remove(path);
            }
        }
        let next_seq = segments.last().map_or(1, |(seq, _)| seq + 1);
        let writer = open_segment(&dir, next_seq)?;
        // `insert` counts the loaded results into their segments.
        let live = BTreeMap::from([(next_seq, 0)]);
        let mut results: Vec<(HandleCallbackParam, Home)> = by_id.into_values().collect();
        results.sort_unstable_by_key(|(result, _)| result.log_id);
        let mut state = State {
            entries: HashMap::with_capacity(results.len()),
            order: VecDeque::with_capacity(results.len()),
            stamps: 0,
            writer: Some(writer),
            live,
            written: 0,
        };
        for (result, home) in results {
            state.insert(result, home);
        }
        let inner = Inner {
            dir,
            state: Mutex::new(state),
            synced: GroupSync::default(),
            notify: Notify::new(),
            passed_over: Mutex::default(),
        };
        Ok(Outbox { inner: Arc::new(inner) })
    }

    /// Stores one result durably and wakes the sender. On error the result is still queued for
    /// delivery, in memory only. Blocks on a disk sync (shared with concurrent pushes).
    #[cfg(test)]
    pub fn push(&self, result: &HandleCallbackParam) -> Result<(), OutboxError> {
        self.push_all(std::slice::from_ref(result)).pop().unwrap_or(Ok(()))
    }

    /// Stores results durably with one sync and wakes the sender: what [`Outbox::push`] does
    /// for each, in order, answering each.
    pub fn push_all(&self, results: &[HandleCallbackParam]) -> Vec<Result<(), OutboxError>> {
        let error = |result: &HandleCallbackParam, path: &Path, source| OutboxError {
            log_id: result.log_id,
            path: path.to_owned(),
            source,
        };
        let appended: Vec<_> = match self.inner.state.lock() {
            Ok(mut state) => {
                // The lines of a segment go in one write; each result is counted into its
                // segment before the next rotation, which deletes a segment holding none.
                let mut appended = Vec::with_capacity(results.len());
                while appended.len() < results.len() {
                    let rest = &results[appended.len()..];
                    let written = state.append_some(&self.inner.dir, rest);
                    for (result, written) in rest.iter().zip(written) {
                        let home = match &written {
                            Ok((seq, _)) => Home::Segment(*seq),
                            Err(_) => Home::Memory,
                        };
                        if let Some(replaced) = state.insert(result.clone(), home) {
                            state.release(&self.inner.dir, result.log_id, replaced);
                        }
                        appended.push(written);
                    }
                }
                appended
            }
            Err(_) => {
                let poisoned = || std::io::Error::other("outbox lock poisoned");
                return results
                    .iter()
                    .map(|result| Err(error(result, &self.inner.dir, poisoned())))
                    .collect();
            }
        };
        let last = appended.iter().filter_map(|appended| appended.as_ref().ok()).map(|a| a.1).max();
        let synced = last.map_or(Ok(()), |line| self.sync(line));
        let stored: Vec<_> = results
            .iter()
            .zip(appended)
            .map(|(result, appended)| match (appended, &synced) {
                (Ok(_), Ok(())) => Ok(()),
                (Ok(_), Err((path, source))) => {
                    let source = std::io::Error::new(source.kind(), source.to_string());
                    Err(error(result, path, source))
                }
                (Err((path, source)), _) => Err(error(result, &path, source)),
            })
            .collect();
        if stored.iter().any(Result::is_err)
            && let Ok(mut state) = self.inner.state.lock()
        {
            for (result, _) in results.iter().zip(&stored).filter(|(_, stored)| stored.is_err()) {
                if let Some(entry) = state.entries.get_mut(&result.log_id)
                    && let Home::Segment(seq) = std::mem::replace(&mut entry.home, Home::Memory)
                {
                    state.unlive(&self.inner.dir, seq);
                }
            }
        }
        self.inner.notify.notify_one();
        stored
    }

    /// Returns once line `line` (and every line before it) is on disk.
    fn sync(&self, line: u64) -> Result<(), (PathBuf, std::io::Error)> {
        let poisoned = || (self.inner.dir.clone(), std::io::Error::other("outbox lock poisoned"));
        self.inner.synced.sync_through(line, poisoned, || {
            let (target, file, seq) = {
                let state = self.inner.state.lock().map_err(|_| poisoned())?;
                let Some(writer) = &state.writer else {
                    let broken = std::io::Error::other("an earlier write or sync failed");
                    return Err((self.inner.dir.clone(), broken));
                };
                (state.written, writer.file.clone(), writer.seq)
            };
            // Lines of earlier segments were synced when their segment was closed.
            if let Err(source) = file.sync_data() {
                if let Ok(mut state) = self.inner.state.lock() {
                    state.writer = None;
                }
                return Err((segment_path(&self.inner.dir, seq), source));
            }
            Ok(target)
        })
    }

    /// The handle code of the stored result of run `log_id`, if one waits here.
    pub fn stored_code(&self, log_id: i64) -> Option<i32> {
        let state = self.inner.state.lock().ok()?;
        state.entries.get(&log_id).map(|entry| entry.result.handle_code)
    }

    /// The runs whose results wait for an admin's acknowledgement, sorted.
    pub fn pending_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .inner
            .state
            .lock()
            .map(|state| state.entries.keys().copied().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// How many results wait for an admin's acknowledgement, and the time (ms since the epoch)
    /// of the oldest of them.
    pub fn backlog(&self) -> (usize, Option<i64>) {
        let Ok(state) = self.inner.state.lock() else { return (0, None) };
        let oldest = state.entries.values().map(|entry| entry.result.log_date_tim).min();
        (state.entries.len(), oldest)
    }

    fn forget(&self, log_ids: &[i64]) {
        let Ok(mut state) = self.inner.state.lock() else { return };
        let mut acks = String::new();
        for log_id in log_ids {
            let Some(entry) = state.entries.remove(log_id) else { continue };
            if matches!(entry.home, Home::Segment(_)) {
                acks.push_str(&format!("ack {log_id}\n"));
            }
            state.release(&self.inner.dir, *log_id, entry.home);
        }
        // Not synced: an acknowledgement lost in a crash only means a harmless re-delivery.
        if !acks.is_empty()
            && let Some(writer) = &state.writer
            && let Err(error) = (&*writer.file).write_all(acks.as_bytes())
        {
            tracing::warn!(%error, "outbox: cannot record acknowledgements");
        }
    }
}

impl State {
    /// Queues `result` for delivery, replacing a pending result of the same run: returns where
    /// that one was stored.
    fn insert(&mut self, result: HandleCallbackParam, home: Home) -> Option<Home> {
        self.stamps += 1;
        let (log_id, stamp) = (result.log_id, self.stamps);
        if let Home::Segment(seq) = home {
            *self.live.entry(seq).or_default() += 1;
        }
        self.order.push_back((log_id, stamp));
        let entry = Entry { result, stamp, home, retry_at: None, refusals: 0 };
        self.entries.insert(log_id, entry).map(|old| old.home)
    }

    /// Appends the first of `results` that fit in the current segment (rotating first if it is
    /// full; at least one), with one write: for each, the segment and the line's number, to sync,
    /// or why it is not stored.
    fn append_some(
        &mut self,
        dir: &Path,
        results: &[HandleCallbackParam],
    ) -> Vec<Result<(u64, u64), (PathBuf, std::io::Error)>> {
        let broken = || (dir.to_owned(), std::io::Error::other("an earlier write or sync failed"));
        match &self.writer {
            None => return vec![Err(broken())],
            Some(writer) if writer.lines >= SEGMENT_LINES => {
                if let Err(error) = self.rotate(dir) {
                    return vec![Err(error)];
                }
            }
            Some(_) => {}
        }
        let Some(writer) = self.writer.as_mut() else { return vec![Err(broken())] };
        let results = &results[..results.len().min(SEGMENT_LINES - writer.lines)];
        let mut lines = Vec::with_capacity(results.len() * 256);
        let serialized: Vec<Result<(), std::io::Error>> = results
            .iter()
            .map(|result| {
                let start = lines.len();
                match serde_json::to_writer(&mut lines, result) {
                    Ok(()) => {
                        lines.push(b'\n');
                        Ok(())
                    }
                    Err(source) => {
                        lines.truncate(start);
                        Err(std::io::Error::other(source))
                    }
                }
            })
            .collect();
        if let Err(source) = (&*writer.file).write_all(&lines) {
            let path = segment_path(dir, writer.seq);
            self.writer = None;
            return serialized
                .into_iter()
                .map(|serialized| match serialized {
                    Ok(()) => {
                        Err((path.clone(), std::io::Error::new(source.kind(), source.to_string())))
                    }
                    Err(error) => Err((dir.to_owned(), error)),
                })
                .collect();
        }
        let seq = writer.seq;
        let mut written = self.written;
        let appended = serialized
            .into_iter()
            .map(|serialized| match serialized {
                Ok(()) => {
                    writer.lines += 1;
                    written += 1;
                    Ok((seq, written))
                }
                Err(error) => Err((dir.to_owned(), error)),
            })
            .collect();
        self.written = written;
        appended
    }

    /// Closes the current segment (synced, so lines in it stay durable) and starts the next.
    fn rotate(&mut self, dir: &Path) -> Result<(), (PathBuf, std::io::Error)> {
        let Some(writer) = self.writer.take() else {
            return Err((dir.to_owned(), std::io::Error::other("an earlier write or sync failed")));
        };
        writer.file.sync_data().map_err(|source| (segment_path(dir, writer.seq), source))?;
        let next = open_segment(dir, writer.seq + 1)
            .map_err(|source| (segment_path(dir, writer.seq + 1), source))?;
        self.live.insert(next.seq, 0);
        self.writer = Some(next);
        if self.live.get(&writer.seq) == Some(&0) {
            self.live.remove(&writer.seq);
            remove(&segment_path(dir, writer.seq));
        }
        Ok(())
    }

    /// A pending result of run `log_id` stored at `home` is no longer needed there.
    fn release(&mut self, dir: &Path, log_id: i64, home: Home) {
        match home {
            Home::Segment(seq) => self.unlive(dir, seq),
            Home::File => remove(&dir.join(format!("{log_id}.json"))),
            Home::Memory => {}
        }
    }

    /// One result fewer pending in segment `seq`; a closed segment left with none is deleted.
    fn unlive(&mut self, dir: &Path, seq: u64) {
        let Some(live) = self.live.get_mut(&seq) else { return };
        *live = live.saturating_sub(1);
        let current = self.writer.as_ref().is_some_and(|writer| writer.seq == seq);
        if *live == 0 && !current {
            self.live.remove(&seq);
            remove(&segment_path(dir, seq));
        }
    }

    /// Drops stale places at the front of the delivery line.
    fn drop_stale_front(&mut self) {
        while let Some((log_id, stamp)) = self.order.front() {
            if self.entries.get(log_id).is_some_and(|entry| entry.stamp == *stamp) {
                return;
            }
            self.order.pop_front();
        }
    }
}

/// Reads segment `seq` into `by_id`: results replace earlier ones of the same run, `ack` lines
/// drop them; a line that is neither is copied to the quarantine.
fn replay(
    seq: u64,
    path: &Path,
    quarantine: &Path,
    by_id: &mut HashMap<i64, (HandleCallbackParam, Home)>,
) -> std::io::Result<()> {
    let reader = BufReader::new(File::open(path)?);
    let mut bad = Vec::new();
    for line in reader.split(b'\n') {
        let line = line?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some(log_id) = std::str::from_utf8(&line)
            .ok()
            .and_then(|text| text.strip_prefix("ack "))
            .and_then(|id| id.trim().parse::<i64>().ok())
        {
            by_id.remove(&log_id);
            continue;
        }
        match serde_json::from_slice::<HandleCallbackParam>(&line) {
            Ok(result) => {
                by_id.insert(result.log_id, (result, Home::Segment(seq)));
            }
            Err(error) => {
                tracing::error!(
                    "outbox: a line of {} cannot be read ({error}); copied to {}",
                    path.display(),
                    quarantine.display()
                );
                bad.extend_from_slice(&line);
                bad.push(b'\n');
            }
        }
    }
    if !bad.is_empty() {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned());
        let target = quarantine.join(format!("{}.bad", name.unwrap_or_default()));
        OpenOptions::new().create(true).append(true).open(&target)?.write_all(&bad)?;
    }
    Ok(())
}

fn segment_seq(name: &str) -> Option<u64> {
    name.strip_prefix("results-")?.strip_suffix(".log")?.parse().ok()
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("results-{seq}.log"))
}

/// Creates segment `seq` and makes its name durable in the directory.
fn open_segment(dir: &Path, seq: u64) -> std::io::Result<Writer> {
    let file = OpenOptions::new().create(true).append(true).open(segment_path(dir, seq))?;
    File::open(dir)?.sync_all()?;
    Ok(Writer { seq, file: Arc::new(file), lines: 0 })
}

fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        // Its results are delivered again after a restart, which the admin ignores.
        Err(error) => tracing::warn!(%error, "outbox: cannot delete {}", path.display()),
    }
}

fn read_entry(path: &Path) -> Result<HandleCallbackParam, String> {
    let bytes = std::fs::read(path).map_err(|error| error.to_string())?;
    serde_json::from_slice(&bytes).map_err(|error| error.to_string())
}

/// Moves `path` into `quarantine` under a name not taken yet.
fn move_aside(path: &Path, quarantine: &Path) {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let mut target = quarantine.join(&name);
    let mut n = 1;
    while target.exists() {
        target = quarantine.join(format!("{name}.{n}"));
        n += 1;
    }
    if let Err(error) = std::fs::rename(path, &target) {
        tracing::error!(%error, "outbox: cannot move {} to {}", path.display(), target.display());
    }
}

mod delivery;
#[cfg(test)]
mod tests;
