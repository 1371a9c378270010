//! The registry heartbeat: `/api/registry` at start and every interval to the first admin that
//! answers, and `/api/registryRemove` on shutdown.
//!
//! Every beat lists the runs this executor holds at that moment (`heldRuns`): queued, running,
//! or ended with a result not yet acknowledged. An admin reconciles against it, so the list is
//! built fresh for each beat from the journal and the outbox, never cached. It does not decide
//! which runs are held; the journal and the outbox know.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::AdminLink;
use super::journal::Journal;
use super::outbox::Outbox;
use crate::protocol::{self, MAX_HELD_RUNS_PER_BEAT, REGISTRY_GROUP_EXECUTOR, RegistryParam};
use crate::readiness::Pulse;

/// Where the held runs are: the journal (queued and running) and the outbox (ended, not yet
/// acknowledged).
#[derive(Clone)]
pub struct Held {
    pub(super) journal: Arc<Journal>,
    pub(super) outbox: Outbox,
}

impl Held {
    /// Every run id held now, sorted, without duplicates.
    pub fn run_ids(&self) -> Vec<i64> {
        let mut ids = self.journal.live();
        ids.extend(self.outbox.pending_ids());
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Beats until `shutdown`, then says goodbye. Each registration that an admin accepted beats
/// `pulse`, each that none accepted clears it (`/readyz`).
pub async fn run(
    client: protocol::Client,
    admin: AdminLink,
    base: RegistryParam,
    held: Held,
    interval: Duration,
    pulse: Arc<Pulse>,
    shutdown: CancellationToken,
) {
    let mut registered = false;
    // The admin that took the last beat is asked first, and each is given at most a beat's
    // interval: an admin that hangs (paused, overloaded) costs one late beat, not every beat,
    // and not the beats the other admins would take.
    let mut preferred = 0;
    let patience = interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
    loop {
        let param = beat_param(&base, &held);
        let sent = send(&client, &admin, "api/registry", &param, preferred, patience).await;
        if let Ok((index, _)) = sent {
            preferred = index;
        }
        let sent = sent.map(|(_, url)| url);
        match &sent {
            Ok(_) => pulse.beat(chrono::Utc::now().timestamp_millis()),
            Err(_) => pulse.clear(),
        }
        match sent {
            Ok(admin) if !registered => {
                tracing::info!(
                    "registered {} as `{}` with {admin}",
                    param.registry_value,
                    param.registry_key
                );
                registered = true;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "heartbeat failed");
                registered = false;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(if registered { interval } else { interval.min(Duration::from_secs(3)) }) => {}
            () = shutdown.cancelled() => break,
        }
    }
    let goodbye = send(&client, &admin, "api/registryRemove", &base, preferred, patience).await;
    if let Err(error) = goodbye {
        tracing::warn!(%error, "could not deregister");
    }
}

/// The registry parameter of an executor, without held runs (as `/api/registryRemove` sends it),
/// with this build's version.
///
/// The address ends in one slash, as XXL-JOB executors register theirs (`http://ip:port/`): an
/// XXL-JOB admin hashes that string for `CONSISTENT_HASH`, and a wasmjob admin drops the slash.
pub fn param(app_name: &str, address: &str) -> RegistryParam {
    RegistryParam {
        registry_group: REGISTRY_GROUP_EXECUTOR.to_owned(),
        registry_key: app_name.to_owned(),
        registry_value: format!("{}/", address.trim_end_matches('/')),
        held_runs: None,
        holds_triggers: None,
        version: Some(env!("CARGO_PKG_VERSION").to_owned()),
    }
}

/// The parameter of one beat: `base` with the runs held now, unless they are more than
/// [`MAX_HELD_RUNS_PER_BEAT`] (the beat must fit the admin's body limit, and a partial list would
/// have the runs left out of it ended as lost).
pub fn beat_param(base: &RegistryParam, held: &Held) -> RegistryParam {
    let ids = held.run_ids();
    if ids.len() > MAX_HELD_RUNS_PER_BEAT {
        tracing::warn!(
            "holding {} runs, more than a beat lists ({MAX_HELD_RUNS_PER_BEAT}): beating without \
             them, so admins do not reconcile this executor until it holds fewer",
            ids.len()
        );
    }
    let held_runs = (ids.len() <= MAX_HELD_RUNS_PER_BEAT).then_some(ids);
    RegistryParam { held_runs, holds_triggers: Some(true), ..base.clone() }
}

/// Sends `param` to the first admin that accepts it within `patience`, the admins tried in
/// order from `first`; returns that admin's index and URL.
async fn send<'a>(
    client: &protocol::Client,
    admin: &'a AdminLink,
    path: &str,
    param: &RegistryParam,
    first: usize,
    patience: Duration,
) -> anyhow::Result<(usize, &'a str)> {
    let mut errors = Vec::new();
    let app_name = Some(admin.app_name.as_str());
    let count = admin.urls.len();
    for index in (0..count).map(|step| (first + step) % count) {
        let url = &admin.urls[index];
        let call = client.call_as::<_, String>(url, path, param, app_name);
        match tokio::time::timeout(patience, call).await {
            Ok(Ok(_)) => return Ok((index, url)),
            Ok(Err(error)) => errors.push(error.to_string()),
            Err(_) => errors.push(format!("{url} did not answer within {patience:?}")),
        }
    }
    anyhow::bail!("no admin accepted {path}: {}", errors.join("; "))
}
