//! The durable callback outbox: results are written to disk first, then delivered to the admin
//! in batches, and deleted only once an admin acknowledged them.
//!
//! One small JSON file per result (`outbox/<logId>.json`): written to a temporary file, synced,
//! renamed into place, and the directory synced, so a crash or a power cut between a run's end
//! and its delivery loses nothing: the next start delivers it. An in-memory index (loaded at
//! start) says what is pending, so a batch does not list the directory. A file that cannot be
//! read or parsed is moved to `outbox/quarantine/` with an error log, never deleted.
//!
//! A result that cannot be stored (disk full, permissions) is logged as an error and kept in
//! memory, delivered like the others; it does not survive a restart.
//!
//! When an admin refuses a batch, its entries are sent one by one, and an entry refused alone
//! waits behind the others with its own backoff, so one result the admin cannot apply does not
//! hold back the rest. An admin that cannot be reached backs the whole outbox off.
//! The admin applies a result at most once, so delivering one twice is harmless.
//! This module does not decide what a result says; the workers do.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, HandleCallbackParam, ProtocolError};

/// The most results sent in one `/api/callback`.
const BATCH: usize = 100;
/// The first wait of an entry an admin refused alone; it doubles up to [`MAX_ENTRY_BACKOFF`].
const ENTRY_BACKOFF: Duration = Duration::from_secs(1);
const MAX_ENTRY_BACKOFF: Duration = Duration::from_secs(300);

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
    quarantine: PathBuf,
    pending: Mutex<VecDeque<Entry>>,
    notify: Notify,
}

/// One pending result.
struct Entry {
    log_id: i64,
    handle_code: i32,
    /// The result itself when it could not be stored on disk.
    in_memory: Option<HandleCallbackParam>,
    /// Set after an admin refused this entry alone: not sent again before then.
    retry_at: Option<Instant>,
    refusals: u32,
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
    /// The outbox in `dir`: loads the index of stored results, quarantining unreadable ones.
    pub fn open(dir: PathBuf) -> std::io::Result<Outbox> {
        let quarantine = dir.join("quarantine");
        std::fs::create_dir_all(&quarantine)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else { continue };
            if name.ends_with(".json.tmp") {
                // A write cut short: its result never counted as stored. Keep it for a human.
                tracing::warn!("outbox: moving the unfinished write {} aside", path.display());
                move_aside(&path, &quarantine);
                continue;
            }
            let Some(log_id) = name.strip_suffix(".json").and_then(|id| id.parse::<i64>().ok())
            else {
                continue;
            };
            match read_entry(&path) {
                Ok(result) => found.push((log_id, result.handle_code)),
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
        found.sort_unstable();
        let pending = found
            .into_iter()
            .map(|(log_id, handle_code)| Entry {
                log_id,
                handle_code,
                in_memory: None,
                retry_at: None,
                refusals: 0,
            })
            .collect();
        let inner = Inner { dir, quarantine, pending: Mutex::new(pending), notify: Notify::new() };
        Ok(Outbox { inner: Arc::new(inner) })
    }

    /// Stores one result durably and wakes the sender. On error the result is still queued for
    /// delivery, in memory only.
    pub fn push(&self, result: &HandleCallbackParam) -> Result<(), OutboxError> {
        let stored = self.store(result);
        let entry = Entry {
            log_id: result.log_id,
            handle_code: result.handle_code,
            in_memory: stored.is_err().then(|| result.clone()),
            retry_at: None,
            refusals: 0,
        };
        if let Ok(mut pending) = self.inner.pending.lock() {
            pending.retain(|queued| queued.log_id != result.log_id);
            pending.push_back(entry);
        }
        self.inner.notify.notify_one();
        stored
    }

    /// The handle code of the stored result of run `log_id`, if one waits here.
    pub fn stored_code(&self, log_id: i64) -> Option<i32> {
        let pending = self.inner.pending.lock().ok()?;
        pending.iter().find(|entry| entry.log_id == log_id).map(|entry| entry.handle_code)
    }

    /// The runs whose results wait for an admin's acknowledgement.
    pub fn pending_ids(&self) -> Vec<i64> {
        self.inner
            .pending
            .lock()
            .map(|pending| pending.iter().map(|entry| entry.log_id).collect())
            .unwrap_or_default()
    }

    /// Delivers results until `shutdown`, then makes one last attempt.
    pub async fn deliver(
        self,
        client: protocol::Client,
        admin_urls: Vec<String>,
        shutdown: CancellationToken,
    ) {
        let mut backoff = Duration::from_millis(500);
        loop {
            let round = self.deliver_once(&client, &admin_urls).await;
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match round {
                Ok(Round::More) => continue,
                Ok(Round::Idle(next_due)) => {
                    backoff = Duration::from_millis(500);
                    let until_due =
                        next_due.map(|due| due.saturating_duration_since(Instant::now()));
                    until_due.unwrap_or(Duration::from_secs(5)).min(Duration::from_secs(5))
                }
                Err(error) => {
                    tracing::warn!(%error, "could not deliver results, retrying in {} ms", backoff.as_millis());
                    let wait = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    wait
                }
            };
            tokio::select! {
                () = self.inner.notify.notified() => {}
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => {
                    let _ = self.deliver_once(&client, &admin_urls).await;
                    return;
                }
            }
        }
    }

    /// Sends one batch of the entries due now; an admin's refusal sends them one by one.
    /// `Err` when no admin could be reached.
    async fn deliver_once(
        &self,
        client: &protocol::Client,
        admin_urls: &[String],
    ) -> anyhow::Result<Round> {
        let due = self.due(BATCH);
        if due.is_empty() {
            return Ok(Round::Idle(self.next_due()));
        }
        let outbox = self.clone();
        let batch = tokio::task::spawn_blocking(move || outbox.load(due)).await?;
        if batch.is_empty() {
            // Everything due was unreadable and went to quarantine.
            return Ok(Round::More);
        }
        let results: Vec<&HandleCallbackParam> = batch.iter().collect();
        match send(client, admin_urls, &results).await {
            Sent::Acknowledged => {
                self.acknowledged(&batch);
                tracing::debug!(count = batch.len(), "delivered {} results", batch.len());
                return Ok(if batch.len() == BATCH {
                    Round::More
                } else {
                    Round::Idle(self.next_due())
                });
            }
            Sent::Unreachable(error) => return Err(error),
            Sent::Refused(error) if batch.len() == 1 => self.refused_alone(&batch[0], &error),
            Sent::Refused(error) => {
                tracing::warn!(
                    %error,
                    "an admin refused a batch of {} results: sending them one by one",
                    batch.len()
                );
                for result in &batch {
                    match send(client, admin_urls, &[result]).await {
                        Sent::Acknowledged => self.acknowledged(std::slice::from_ref(result)),
                        Sent::Refused(error) => self.refused_alone(result, &error),
                        Sent::Unreachable(error) => return Err(error),
                    }
                }
            }
        }
        Ok(Round::More)
    }

    /// Up to `limit` pending entries not waiting for their own backoff, oldest first: the run
    /// id, and the result itself if only memory holds it.
    fn due(&self, limit: usize) -> Vec<(i64, Option<HandleCallbackParam>)> {
        let now = Instant::now();
        let Ok(pending) = self.inner.pending.lock() else { return Vec::new() };
        pending
            .iter()
            .filter(|entry| entry.retry_at.is_none_or(|at| at <= now))
            .take(limit)
            .map(|entry| (entry.log_id, entry.in_memory.clone()))
            .collect()
    }

    fn next_due(&self) -> Option<Instant> {
        let pending = self.inner.pending.lock().ok()?;
        pending.iter().filter_map(|entry| entry.retry_at).min()
    }

    /// The results of `due` entries, from memory or disk; unreadable files go to quarantine.
    fn load(&self, due: Vec<(i64, Option<HandleCallbackParam>)>) -> Vec<HandleCallbackParam> {
        let mut results = Vec::with_capacity(due.len());
        for (log_id, in_memory) in due {
            if let Some(result) = in_memory {
                results.push(result);
                continue;
            }
            let path = self.path(log_id);
            match read_entry(&path) {
                Ok(result) => results.push(result),
                Err(error) => {
                    tracing::error!(
                        run.id = log_id,
                        "outbox: entry {} cannot be read ({error}); moved to {}",
                        path.display(),
                        self.inner.quarantine.display()
                    );
                    move_aside(&path, &self.inner.quarantine);
                    self.forget(&[log_id]);
                }
            }
        }
        results
    }

    fn acknowledged(&self, results: &[HandleCallbackParam]) {
        let log_ids: Vec<i64> = results.iter().map(|result| result.log_id).collect();
        self.forget(&log_ids);
        for result in results {
            let path = self.path(result.log_id);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                // It will be delivered again after a restart, which the admin ignores.
                Err(error) => tracing::warn!(%error, "outbox: cannot delete {}", path.display()),
            }
        }
    }

    /// Puts an entry an admin refused alone behind the others, with its own backoff.
    fn refused_alone(&self, result: &HandleCallbackParam, error: &ProtocolError) {
        let Ok(mut pending) = self.inner.pending.lock() else { return };
        let Some(index) = pending.iter().position(|entry| entry.log_id == result.log_id) else {
            return;
        };
        let Some(mut entry) = pending.remove(index) else { return };
        entry.refusals += 1;
        let wait = ENTRY_BACKOFF
            .saturating_mul(1 << entry.refusals.min(16).saturating_sub(1))
            .min(MAX_ENTRY_BACKOFF);
        entry.retry_at = Some(Instant::now() + wait);
        if entry.refusals == 1 {
            tracing::error!(
                run.id = result.log_id,
                %error,
                "the admin refused the result of run {}; retrying it alone in {} ms",
                result.log_id,
                wait.as_millis()
            );
        } else {
            tracing::warn!(
                run.id = result.log_id,
                %error,
                "the admin refused the result of run {} again ({} times)",
                result.log_id,
                entry.refusals
            );
        }
        pending.push_back(entry);
    }

    fn forget(&self, log_ids: &[i64]) {
        let log_ids: std::collections::HashSet<i64> = log_ids.iter().copied().collect();
        if let Ok(mut pending) = self.inner.pending.lock() {
            pending.retain(|entry| !log_ids.contains(&entry.log_id));
        }
    }

    /// Writes the result whole: temporary file, synced, renamed, directory synced.
    fn store(&self, result: &HandleCallbackParam) -> Result<(), OutboxError> {
        let path = self.path(result.log_id);
        let tmp = self.inner.dir.join(format!("{}.json.tmp", result.log_id));
        let error = |path: &Path, source| OutboxError {
            log_id: result.log_id,
            path: path.to_owned(),
            source,
        };
        let bytes = serde_json::to_vec(result).map_err(|source| error(&tmp, source.into()))?;
        let written = File::create(&tmp).and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        });
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(error(&tmp, source));
        }
        std::fs::rename(&tmp, &path).map_err(|source| error(&path, source))?;
        File::open(&self.inner.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| error(&self.inner.dir, source))
    }

    fn path(&self, log_id: i64) -> PathBuf {
        self.inner.dir.join(format!("{log_id}.json"))
    }
}

/// Sends `results` to the first admin that acknowledges them.
async fn send(
    client: &protocol::Client,
    admin_urls: &[String],
    results: &[&HandleCallbackParam],
) -> Sent {
    let mut refused = None;
    let mut unreachable = None;
    for admin in admin_urls {
        match client.call::<_, String>(admin, "api/callback", results).await {
            Ok(_) => return Sent::Acknowledged,
            Err(error @ ProtocolError::Transport { .. }) => unreachable = Some(error),
            Err(error) => refused = Some(error),
        }
    }
    match (refused, unreachable) {
        (Some(error), _) => Sent::Refused(error),
        (None, Some(error)) => Sent::Unreachable(error.into()),
        (None, None) => Sent::Unreachable(anyhow::anyhow!("no admin URL configured")),
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

#[cfg(test)]
mod tests;
