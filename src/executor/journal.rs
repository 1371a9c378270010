//! The run journal: a durable, append-only record of every run this executor accepted, so that
//! a `logId` is accepted once even across restarts, and a restart knows which runs it cut short.
//!
//! The journal lives in `<data_dir>/journal/` as text files of one event per line:
//!
//! ```text
//! accepted <logId> <jobId> <unix_ms> <fire_ms>  written and synced before `/run` answers success
//! started <logId> <unix_ms>               the run is next for its worker, about to run
//! finished <logId> <handleCode> <unix_ms> the run's result is stored in the outbox
//! ```
//!
//! (`fire_ms` is the trigger's `logDateTime`, the run's fire time; lines written before it was
//! recorded have four fields.)
//!
//! Files rotate every hour (`runs-<unix_hour>.log`). The files that may hold an acceptance from
//! the last [`RESEND_WINDOW`] are kept; older ones are deleted at start and at rotation, and the
//! in-memory index (`index.rs`, 12 bytes a run) forgets ended runs accepted before the window,
//! so memory is bounded by the runs accepted in about one window plus the runs still live. An
//! admin never sends a run again more than that window after its first send; that is the
//! contract that makes forgetting safe.
//!
//! A `logId` is one run only while the admin's ids are never reused; an admin whose database
//! lost its last commits (a power cut) hands out the lost ids again, for other runs. So the
//! index keeps a fingerprint of the job and fire time each run was accepted for, and a trigger
//! of a known `logId` for another job or fire time is a [`Admission::Conflict`], refused instead
//! of answered as a duplicate.
//!
//! Syncs are shared: concurrent acceptances append under one lock and the first of them to
//! reach [`Journal::sync`] makes all appended lines durable with one `sync_data` (group commit,
//! paced by `group_sync.rs`: under load, at most one sync every few milliseconds).
//! A failed sync breaks the journal for the life of the process: after an IO error the kernel
//! may have dropped the dirty pages and a later sync can succeed without them, so this executor
//! refuses new runs until it is restarted rather than promise what it cannot keep.
//!
//! It does not run, queue or report anything: the workers do, and tell it what happened.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::index::{Index, fingerprint};
use super::group_sync::GroupSync;
use crate::protocol::run_reply;

/// How long an accepted `logId` is remembered (on disk, and in memory after its run ended).
/// Admins do not send a run again more than this long after they first sent it.
pub const RESEND_WINDOW: Duration = Duration::from_secs(3600);

const HOUR_MS: i64 = 3_600_000;

/// Why the journal could not record or load something.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading, writing or syncing a journal file failed.
    #[error("run journal {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// An earlier sync failed, so nothing written since can be promised durable.
    #[error("run journal: an earlier sync failed; restart the executor")]
    Broken,
    /// A thread panicked while holding the journal's lock.
    #[error("run journal: lock poisoned")]
    Poisoned,
}

/// Where an accepted run is, as far as this executor knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Accepted, waiting in its job's queue.
    Queued,
    /// Taken by its worker: running.
    Running,
    /// Ended; its result is in the outbox or was delivered.
    Reported,
    /// Accepted before a restart and never finished: it will not run here.
    Lost,
}

impl RunState {
    /// The `/run` reply `content` for a duplicate trigger of a run in this state.
    pub fn reply(self) -> &'static str {
        match self {
            RunState::Queued => run_reply::QUEUED,
            RunState::Running => run_reply::RUNNING,
            RunState::Reported => run_reply::REPORTED,
            RunState::Lost => run_reply::LOST,
        }
    }

    fn is_live(self) -> bool {
        matches!(self, RunState::Queued | RunState::Running)
    }
}

/// The answer to [`Journal::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Newly accepted; durable once [`Journal::sync`] of this ticket returns.
    New(Ticket),
    /// Accepted before, for the same job and fire time; where it is now.
    Duplicate(RunState),
    /// This `logId` was accepted before for another job or fire time: the admin reused a run
    /// id (its database lost commits). Not accepted; the run it names here is in this state.
    Conflict(RunState),
}

/// The position of an appended line, to wait for its durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// A run accepted before a restart that never finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRun {
    /// The run's id.
    pub log_id: i64,
    /// Its job's id.
    pub job_id: i64,
    /// When it was accepted (ms since the epoch).
    pub accepted_ms: i64,
}

/// The journal of one executor.
pub struct Journal {
    dir: PathBuf,
    state: Mutex<State>,
    /// How far the lines are durable (tickets are line numbers).
    synced: GroupSync,
}

struct State {
    segment: Segment,
    /// Lines appended so far (the last ticket handed out).
    written: u64,
    broken: bool,
    runs: Index,
    live: HashSet<i64>,
}

struct Segment {
    hour: i64,
    file: Arc<File>,
}

/// One line of the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Accepted { log_id: i64, job_id: i64, at_ms: i64, fire_ms: Option<i64> },
    Started { log_id: i64, at_ms: i64 },
    Finished { log_id: i64, handle_code: i32, at_ms: i64 },
}

impl Journal {
    /// Opens the journal in `dir` at `now_ms`: deletes files older than the window, replays the
    /// rest, and returns the runs cut short by the last stop. A run that did not finish but
    /// whose result `stored_result` finds (it reached the outbox just before the stop) is
    /// recorded as finished with that code instead.
    pub fn open(
        dir: PathBuf,
        now_ms: i64,
        stored_result: impl Fn(i64) -> Option<i32>,
    ) -> Result<(Journal, Vec<LostRun>), JournalError> {
        std::fs::create_dir_all(&dir).map_err(|source| io(&dir, source))?;
        let mut runs = Index::default();
        // The runs not finished so far in the replay, with their job and acceptance time.
        let mut unfinished: HashMap<i64, (i64, i64)> = HashMap::new();
        for (_, path) in segments(&dir, now_ms)? {
            let file = File::open(&path).map_err(|source| io(&path, source))?;
            let mut malformed = 0;
            for line in BufReader::new(file).split(b'\n') {
                let line = line.map_err(|source| io(&path, source))?;
                if line.is_empty() {
                    continue;
                }
                let Some(event) = std::str::from_utf8(&line).ok().and_then(parse_line) else {
                    malformed += 1;
                    continue;
                };
                replay(&mut runs, &mut unfinished, event);
            }
            if malformed > 0 {
                // A line cut by a crash in the middle of an append is expected; it was never
                // synced, so its trigger was never confirmed.
                tracing::warn!(
                    "run journal {}: skipped {malformed} malformed lines",
                    path.display()
                );
            }
        }
        let segment = open_segment(&dir, now_ms.div_euclid(HOUR_MS))?;
        let mut state = State { segment, written: 0, broken: false, runs, live: HashSet::new() };
        let mut lost = Vec::new();
        let mut interrupted: Vec<(i64, (i64, i64))> = unfinished.into_iter().collect();
        interrupted.sort_unstable();
        for (log_id, (job_id, accepted_ms)) in interrupted {
            if let Some(handle_code) = stored_result(log_id) {
                state.append(&dir, Event::Finished { log_id, handle_code, at_ms: now_ms })?;
                state.runs.set(log_id, RunState::Reported);
                continue;
            }
            if state.runs.set(log_id, RunState::Lost) {
                lost.push(LostRun { log_id, job_id, accepted_ms });
            }
        }
        state.forget_before(now_ms);
        let journal = Journal { dir, state: Mutex::new(state), synced: GroupSync::default() };
        Ok((journal, lost))
    }

    /// Where run `log_id` is, if it was accepted within the window.
    pub fn state(&self, log_id: i64) -> Option<RunState> {
        let state = self.state.lock().ok()?;
        state.runs.get(log_id).map(|known| known.state)
    }

    /// How a trigger of run `log_id` for job `job_id` at fire time `fire_ms` compares with what
    /// was accepted: `None` if the id is not known, else [`Admission::Duplicate`] or
    /// [`Admission::Conflict`].
    pub fn seen(&self, log_id: i64, job_id: i64, fire_ms: i64) -> Option<Admission> {
        let state = self.state.lock().ok()?;
        state.seen(log_id, job_id, fire_ms)
    }

    /// Records run `log_id` of job `job_id`, fired at `fire_ms`, as accepted (queued), unless it
    /// was accepted before. The line is written but not yet synced: [`Journal::sync`] the
    /// ticket before confirming the run to anyone.
    pub fn accept(
        &self,
        log_id: i64,
        job_id: i64,
        fire_ms: i64,
        now_ms: i64,
    ) -> Result<Admission, JournalError> {
        let mut state = self.state.lock().map_err(|_| JournalError::Poisoned)?;
        if let Some(seen) = state.seen(log_id, job_id, fire_ms) {
            return Ok(seen);
        }
        if state.broken {
            return Err(JournalError::Broken);
        }
        let event = Event::Accepted { log_id, job_id, at_ms: now_ms, fire_ms: Some(fire_ms) };
        let ticket = state.append(&self.dir, event)?;
        let print = fingerprint(job_id, Some(fire_ms));
        state.runs.insert(log_id, print, RunState::Queued, now_ms);
        state.live.insert(log_id);
        state.forget_before(now_ms);
        Ok(Admission::New(ticket))
    }

    /// Returns once the line of `ticket` (and every line before it) is on disk.
    pub fn sync(&self, ticket: Ticket) -> Result<(), JournalError> {
        self.synced.sync_through(
            ticket.0,
            || JournalError::Poisoned,
            || {
                let (target, file) = {
                    let state = self.state.lock().map_err(|_| JournalError::Poisoned)?;
                    if state.broken {
                        return Err(JournalError::Broken);
                    }
                    (state.written, state.segment.file.clone())
                };
                // Lines of earlier segments were synced when their segment was closed.
                if let Err(source) = file.sync_data() {
                    if let Ok(mut state) = self.state.lock() {
                        state.broken = true;
                    }
                    return Err(io(&self.dir, source));
                }
                Ok(target)
            },
        )
    }

    /// Records that the runs `log_ids` are about to run, with one write.
    pub fn started_all(&self, log_ids: &[i64], now_ms: i64) -> Result<(), JournalError> {
        let mut state = self.state.lock().map_err(|_| JournalError::Poisoned)?;
        for &log_id in log_ids {
            state.set(log_id, RunState::Running);
        }
        let events = log_ids.iter().map(|&log_id| Event::Started { log_id, at_ms: now_ms });
        state.append_all(&self.dir, now_ms, events).map(drop)
    }

    /// Records that the results of the runs `ended` (ids and handle codes) are stored in the
    /// outbox, with one write.
    pub fn finished_all(&self, ended: &[(i64, i32)], now_ms: i64) -> Result<(), JournalError> {
        let mut state = self.state.lock().map_err(|_| JournalError::Poisoned)?;
        for &(log_id, _) in ended {
            state.set(log_id, RunState::Reported);
            state.forget_ended(log_id);
        }
        let events = ended.iter().map(|&(log_id, handle_code)| Event::Finished {
            log_id,
            handle_code,
            at_ms: now_ms,
        });
        state.append_all(&self.dir, now_ms, events).map(drop)
    }

    /// Records that run `log_id` ended with a result that only memory holds (the outbox could
    /// not store it): no `finished` line, so a restart before its delivery counts it lost.
    pub fn reported_in_memory(&self, log_id: i64) {
        if let Ok(mut state) = self.state.lock() {
            state.set(log_id, RunState::Reported);
            state.forget_ended(log_id);
        }
    }

    /// The runs accepted in this process that have not ended (queued or running).
    pub fn live(&self) -> Vec<i64> {
        let mut ids: Vec<i64> =
            self.state.lock().map(|state| state.live.iter().copied().collect()).unwrap_or_default();
        ids.sort_unstable();
        ids
    }
}

impl State {
    fn seen(&self, log_id: i64, job_id: i64, fire_ms: i64) -> Option<Admission> {
        let known = self.runs.get(log_id)?;
        // A run journaled before fire times were recorded matches any fire of its job.
        let same = known.fingerprint == fingerprint(job_id, Some(fire_ms))
            || known.fingerprint == fingerprint(job_id, None);
        Some(if same {
            Admission::Duplicate(known.state)
        } else {
            Admission::Conflict(known.state)
        })
    }

    fn set(&mut self, log_id: i64, run_state: RunState) {
        self.runs.set(log_id, run_state);
        if !run_state.is_live() {
            self.live.remove(&log_id);
        }
    }

    /// Appends one line to the current hour's segment, rotating first if the hour changed.
    fn append(&mut self, dir: &Path, event: Event) -> Result<Ticket, JournalError> {
        self.append_all(dir, event_time(event), [event])
    }

    /// Appends the lines of `events`, all of `at_ms`'s hour, with one write to the current
    /// hour's segment, rotating first if the hour changed; the ticket of the last line.
    fn append_all(
        &mut self,
        dir: &Path,
        at_ms: i64,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Ticket, JournalError> {
        let hour = at_ms.div_euclid(HOUR_MS);
        if hour > self.segment.hour {
            self.rotate(dir, hour)?;
        }
        let mut lines = String::new();
        let mut count = 0;
        for event in events {
            lines.push_str(&format_line(event));
            count += 1;
        }
        if count == 0 {
            return Ok(Ticket(self.written));
        }
        let mut file: &File = &self.segment.file;
        file.write_all(lines.as_bytes())
            .map_err(|source| io(&segment_path(dir, self.segment.hour), source))?;
        self.written += count;
        Ok(Ticket(self.written))
    }

    /// Closes the current segment (synced, so tickets in it stay durable) and opens `hour`'s.
    fn rotate(&mut self, dir: &Path, hour: i64) -> Result<(), JournalError> {
        if let Err(source) = self.segment.file.sync_data() {
            self.broken = true;
            return Err(io(&segment_path(dir, self.segment.hour), source));
        }
        self.segment = open_segment(dir, hour)?;
        for (old, path) in all_segments(dir)? {
            if old < first_kept_hour(hour * HOUR_MS)
                && let Err(error) = std::fs::remove_file(&path)
            {
                tracing::warn!(%error, "cannot delete old run journal {}", path.display());
            }
        }
        Ok(())
    }

    /// Forgets ended runs accepted before the window (a run still live stays known, and
    /// `forget_ended` drops it when it ends).
    fn forget_before(&mut self, now_ms: i64) {
        self.runs.forget_before(now_ms.saturating_sub(window_ms()));
    }

    /// Forgets `log_id` right away if it ended after the window has passed over it.
    fn forget_ended(&mut self, log_id: i64) {
        self.runs.forget_lingering(log_id);
    }
}

fn replay(runs: &mut Index, unfinished: &mut HashMap<i64, (i64, i64)>, event: Event) {
    match event {
        Event::Accepted { log_id, job_id, at_ms, fire_ms } => {
            if runs.get(log_id).is_none() {
                runs.insert(log_id, fingerprint(job_id, fire_ms), RunState::Queued, at_ms);
                unfinished.insert(log_id, (job_id, at_ms));
            }
        }
        // Events of a run whose acceptance is in a deleted segment are older than the window.
        Event::Started { log_id, .. } => {
            if runs.get(log_id).is_some_and(|known| known.state == RunState::Queued) {
                runs.set(log_id, RunState::Running);
            }
        }
        Event::Finished { log_id, .. } => {
            if runs.set(log_id, RunState::Reported) {
                unfinished.remove(&log_id);
            }
        }
    }
}

fn parse_line(line: &str) -> Option<Event> {
    let fields: Vec<&str> = line.split(' ').collect();
    let event = match fields.as_slice() {
        ["accepted", log_id, job_id, at_ms] => Event::Accepted {
            log_id: log_id.parse().ok()?,
            job_id: job_id.parse().ok()?,
            at_ms: at_ms.parse().ok()?,
            fire_ms: None,
        },
        ["accepted", log_id, job_id, at_ms, fire_ms] => Event::Accepted {
            log_id: log_id.parse().ok()?,
            job_id: job_id.parse().ok()?,
            at_ms: at_ms.parse().ok()?,
            fire_ms: Some(fire_ms.parse().ok()?),
        },
        ["started", log_id, at_ms] => {
            Event::Started { log_id: log_id.parse().ok()?, at_ms: at_ms.parse().ok()? }
        }
        ["finished", log_id, handle_code, at_ms] => Event::Finished {
            log_id: log_id.parse().ok()?,
            handle_code: handle_code.parse().ok()?,
            at_ms: at_ms.parse().ok()?,
        },
        _ => return None,
    };
    Some(event)
}

fn format_line(event: Event) -> String {
    match event {
        Event::Accepted { log_id, job_id, at_ms, fire_ms: None } => {
            format!("accepted {log_id} {job_id} {at_ms}\n")
        }
        Event::Accepted { log_id, job_id, at_ms, fire_ms: Some(fire_ms) } => {
            format!("accepted {log_id} {job_id} {at_ms} {fire_ms}\n")
        }
        Event::Started { log_id, at_ms } => format!("started {log_id} {at_ms}\n"),
        Event::Finished { log_id, handle_code, at_ms } => {
            format!("finished {log_id} {handle_code} {at_ms}\n")
        }
    }
}

fn event_time(event: Event) -> i64 {
    match event {
        Event::Accepted { at_ms, .. }
        | Event::Started { at_ms, .. }
        | Event::Finished { at_ms, .. } => at_ms,
    }
}

fn window_ms() -> i64 {
    i64::try_from(RESEND_WINDOW.as_millis()).unwrap_or(i64::MAX)
}

/// The oldest segment that may hold an acceptance from the window before `now_ms`.
fn first_kept_hour(now_ms: i64) -> i64 {
    now_ms.saturating_sub(window_ms()).div_euclid(HOUR_MS)
}

fn segment_path(dir: &Path, hour: i64) -> PathBuf {
    dir.join(format!("runs-{hour}.log"))
}

/// Every segment file in `dir`, oldest first.
fn all_segments(dir: &Path) -> Result<Vec<(i64, PathBuf)>, JournalError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|source| io(dir, source))? {
        let path = entry.map_err(|source| io(dir, source))?.path();
        let hour = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix("runs-"))
            .and_then(|rest| rest.strip_suffix(".log"))
            .and_then(|hour| hour.parse::<i64>().ok());
        if let Some(hour) = hour {
            found.push((hour, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The segments to replay at `now_ms`, after deleting the older ones.
fn segments(dir: &Path, now_ms: i64) -> Result<Vec<(i64, PathBuf)>, JournalError> {
    let (old, kept): (Vec<_>, Vec<_>) =
        all_segments(dir)?.into_iter().partition(|(hour, _)| *hour < first_kept_hour(now_ms));
    for (_, path) in old {
        std::fs::remove_file(&path).map_err(|source| io(&path, source))?;
    }
    Ok(kept)
}

/// Opens (appending) the segment of `hour`, making sure a line cut by a crash is closed so the
/// next line starts on its own, and that the file's name is durable in the directory.
fn open_segment(dir: &Path, hour: i64) -> Result<Segment, JournalError> {
    let path = segment_path(dir, hour);
    let existed = path.exists();
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)
        .map_err(|source| io(&path, source))?;
    if existed && !ends_with_newline(&mut file).map_err(|source| io(&path, source))? {
        file.write_all(b"\n").map_err(|source| io(&path, source))?;
    }
    if !existed {
        File::open(dir).and_then(|dir| dir.sync_all()).map_err(|source| io(dir, source))?;
    }
    Ok(Segment { hour, file: Arc::new(file) })
}

fn ends_with_newline(file: &mut File) -> std::io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

fn io(path: &Path, source: std::io::Error) -> JournalError {
    JournalError::Io { path: path.to_owned(), source }
}

/// Milliseconds since the epoch, by the wall clock.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

mod index;

#[cfg(test)]
mod tests;
