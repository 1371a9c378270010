//! The durable callback outbox: results are written to disk first, then delivered to the admin
//! in batches, and deleted only once an admin acknowledged them.
//!
//! One small JSON file per result (`outbox/<logId>.json`, written whole and renamed into place),
//! so a crash between a run's end and its delivery loses nothing: the next start delivers it.
//! The admin applies a result at most once, so delivering one twice is harmless.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, HandleCallbackParam};

/// The most results sent in one `/api/callback`.
const BATCH: usize = 100;

/// Where results wait for delivery.
#[derive(Clone)]
pub struct Outbox {
    dir: PathBuf,
    notify: Arc<Notify>,
}

impl Outbox {
    /// The outbox in `dir`.
    pub fn new(dir: PathBuf) -> std::io::Result<Outbox> {
        std::fs::create_dir_all(&dir)?;
        Ok(Outbox { dir, notify: Arc::new(Notify::new()) })
    }

    /// Stores one result durably and wakes the sender.
    pub fn push(&self, result: &HandleCallbackParam) -> std::io::Result<()> {
        let path = self.dir.join(format!("{}.json", result.log_id));
        let tmp = self.dir.join(format!("{}.json.tmp", result.log_id));
        std::fs::write(&tmp, serde_json::to_vec(result)?)?;
        std::fs::rename(&tmp, &path)?;
        self.notify.notify_one();
        Ok(())
    }

    /// Results waiting, oldest file order not guaranteed; at most `limit`.
    fn pending(&self, limit: usize) -> std::io::Result<Vec<(PathBuf, HandleCallbackParam)>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let parsed =
                std::fs::read(&path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
            match parsed {
                Some(result) => found.push((path, result)),
                None => {
                    tracing::warn!("dropping unreadable outbox entry {}", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
            if found.len() == limit {
                break;
            }
        }
        Ok(found)
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
            let delivered = self.deliver_once(&client, &admin_urls).await;
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match delivered {
                Ok(true) => continue,
                Ok(false) => {
                    backoff = Duration::from_millis(500);
                    Duration::from_secs(5)
                }
                Err(error) => {
                    tracing::warn!(%error, "could not deliver results, retrying in {} ms", backoff.as_millis());
                    let wait = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    wait
                }
            };
            tokio::select! {
                () = self.notify.notified() => {}
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => {
                    let _ = self.deliver_once(&client, &admin_urls).await;
                    return;
                }
            }
        }
    }

    /// Sends one batch. `Ok(true)` when a full batch went (there may be more).
    async fn deliver_once(
        &self,
        client: &protocol::Client,
        admin_urls: &[String],
    ) -> anyhow::Result<bool> {
        let outbox = self.clone();
        let batch = tokio::task::spawn_blocking(move || outbox.pending(BATCH)).await??;
        if batch.is_empty() {
            return Ok(false);
        }
        let results: Vec<&HandleCallbackParam> = batch.iter().map(|(_, result)| result).collect();
        let mut last_error = None;
        for admin in admin_urls {
            match client.call::<_, String>(admin, "api/callback", &results).await {
                Ok(_) => {
                    for (path, _) in &batch {
                        let _ = std::fs::remove_file(path);
                    }
                    tracing::debug!(
                        count = batch.len(),
                        "delivered {} results to {admin}",
                        batch.len()
                    );
                    return Ok(batch.len() == BATCH);
                }
                Err(error) => last_error = Some(error),
            }
        }
        match last_error {
            Some(error) => Err(error.into()),
            None => anyhow::bail!("no admin URL configured"),
        }
    }
}
