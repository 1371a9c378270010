//! Dispatch: turning a job trigger into runs, sending each run to an executor under a lease,
//! and moving runs through their lifecycle (`crate::lifecycle`) as events arrive.
//!
//! A run is sent by whoever claims it (`Db::claim_run`): the timer set when it was created, or
//! the sweep that picks up runs left pending by a crash or a restart, or whose dispatcher's
//! lease ran out. The holder renews its lease while it routes and sends, so a slow send (probing
//! hung executors under `FAILOVER`) is never taken over while its holder lives, and every record
//! it makes is fenced: once its lease moved on, it can record nothing. The executor is chosen
//! and recorded before `/run` is posted, so a dispatcher that takes over after a crash sends the
//! run to the same executor, which answers a re-send with the run's state instead of running it
//! twice. Routing happens at send time among the group's online executors, except for broadcast
//! shards, ElasticJob-sharded runs and runs aimed at an address by the operator, which carry
//! their executor from creation.
//!
//! A job with ElasticJob sharding items (`sharding_total_count` > 0) gets one run per online
//! executor that the job's sharding strategy gives items to (`routing::sharding`). Each run
//! carries its items with their parameters, to our executors in the trigger's `shardingItems`;
//! its `shard_index`/`shard_total` (XXL-JOB's `broadcastIndex`/`broadcastTotal`) number the
//! fire's runs, as `SHARDING_BROADCAST` would number those executors, so an XXL-JOB handler that
//! splits its work by index and total still covers it exactly once.
//!
//! `events.rs` applies lifecycle events with their consequences (retries, child jobs, kills);
//! `sweep.rs` is the periodic pass that finds work whose owner died or whose executor went away.

mod events;
mod peers;
mod sender;
mod sweep;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::now_ms;
use crate::failpoint;
use crate::lifecycle::Event;
use crate::model::{
    AddressType, GlueType, Group, Job, RouteStrategy, RunRecord, ShardingItem, TriggerType,
};
use crate::protocol::{
    self, GLUE_WASM, JobIdParam, REGISTRY_GROUP_EXECUTOR, ShardingItemParam, TriggerParam,
    run_reply,
};
use crate::routing::{Probe, Route, RouterState, sharding};
use crate::schedule::Schedule;
use crate::storage::{AuditEntry, Claim, Db, Fired, NewRun};

pub use self::peers::{Peer, PeerKind};
use self::sender::{PostError, Senders};
pub use self::sweep::sweep;

/// How long a dispatcher's claim on a run lasts without renewal.
const LEASE_MS: i64 = 15_000;
/// How often a dispatcher renews the lease of a run it is sending.
const LEASE_RENEWAL: Duration = Duration::from_millis(5_000);
/// A run that no executor confirmed within this long after its first claim is not sent again:
/// executors remember the runs they accepted for (at least) this long.
const RESEND_WINDOW_MS: i64 = 3_600_000;
/// How long a `FAILOVER` or `BUSYOVER` probe of one executor may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long before its instant a scheduled run is sent to an executor that holds early triggers
/// (within the scheduler's lookahead, which creates the run before this).
const SEND_AHEAD_MS: i64 = 500;
/// How long past a job's timeout the admin waits for a run's result before it ends the run.
pub const RESULT_GRACE_MS: i64 = 60_000;
/// How long the record of a send an executor accepted waits for the run's result: a run that
/// ends within it gets one write saying both (its result, with the acceptance), not two.
const SENT_RECORD_WAIT: Duration = Duration::from_millis(1_000);

/// Why a trigger was refused before any run was created.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    /// A `GLUE_WASM` job without an uploaded version.
    #[error("job {0} has no module version: upload one first")]
    NoVersion(i64),
    /// An address that is neither online in the job's group nor configured for it.
    #[error("address `{0}` is not an executor of the job's group")]
    AddressNotAllowed(String),
    /// The job's group is gone.
    #[error("group {0} of the job does not exist")]
    NoGroup(i64),
    /// The database failed.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// Sends runs and applies results. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    client: protocol::Client,
    router: Mutex<RouterState>,
    online_window_ms: i64,
    run_retention_ms: Option<i64>,
    /// This admin process's id: the owner of the leases it takes.
    owner: String,
    timers: CancellationToken,
    /// Module digests by (job, version): versions are immutable, so entries never go stale.
    versions: Mutex<HashMap<(i64, i64), String>>,
    /// Online addresses by application name, with when they were read.
    online: Mutex<HashMap<String, (i64, Vec<String>)>>,
    /// The executors' send queues.
    senders: Arc<Senders>,
    /// What each registered executor speaks.
    peers: Arc<peers::Peers>,
    /// Jobs as read on the hot path, with when they were read.
    jobs: Mutex<HashMap<i64, Cached<Option<Arc<Job>>>>>,
    /// Jobs in use whose copy is older than [`REFRESH_AFTER_MS`], to be read again together.
    refresh: Mutex<HashSet<i64>>,
    /// Whether a task is about to read `refresh`.
    refreshing: AtomicBool,
    /// Groups as read on the hot path, with when they were read.
    groups: Mutex<HashMap<i64, (i64, Option<Group>)>>,
    /// Sends being posted, or accepted by their executors, that this admin has not recorded
    /// yet, by run.
    unrecorded: Mutex<HashMap<i64, Unrecorded>>,
}

/// A cached copy and when it was read (ms).
type Cached<T> = (i64, T);

/// A send posted to an executor, or accepted by it, that its dispatcher has not recorded yet.
struct Unrecorded {
    /// The executor.
    address: String,
    /// When it accepted the run (ms); `None` while the post waits for its answer.
    at_ms: Option<i64>,
    /// Wakes the dispatcher to record it now.
    wake: Option<tokio::sync::oneshot::Sender<()>>,
    /// A kill asked for it to be recorded without waiting.
    record_now: bool,
}

/// How long a read of a group's online executors is reused. Heartbeats come every few seconds
/// and an executor is offline only after three missed ones, so routing on a view this old
/// changes nothing an operator can tell; it saves a registry query per run.
const ONLINE_TTL_MS: i64 = 1_000;
/// The most cached version digests before the cache starts over.
const MAX_CACHED_VERSIONS: usize = 100_000;
/// How long a job or a group read on the hot path (sending a run, applying its result) is
/// reused. This admin forgets its copy the moment it changes one through its API; a change
/// made through another admin of the same database is seen within this long.
const CACHE_TTL_MS: i64 = 1_000;
/// A job whose copy is this old when it is used is read again in the background, together with
/// the other jobs in use, while its copy is still served: a job in use is read once per interval
/// with the others, instead of each alone, and by the many callers that find its copy expired at
/// once (a thousand jobs triggered every second were a thousand reads a second, a twentieth of
/// the admin's time).
const REFRESH_AFTER_MS: i64 = CACHE_TTL_MS * 3 / 4;
/// How long the background read waits for more jobs to read with the first.
const REFRESH_GATHER: Duration = Duration::from_millis(50);
/// The most cached jobs or groups before a cache starts over.
const MAX_CACHED: usize = 200_000;

impl Dispatcher {
    /// A dispatcher over `db`; an executor is online if it beat within `online_window_ms`;
    /// ended runs are deleted after `run_retention_days` (`None`: kept).
    pub fn new(
        db: Db,
        client: protocol::Client,
        online_window_ms: i64,
        run_retention_days: Option<u32>,
    ) -> Dispatcher {
        let peers = Arc::new(peers::Peers::default());
        let inner = Inner {
            db,
            senders: Senders::new(client.clone(), peers.clone()),
            peers,
            client,
            router: Mutex::new(RouterState::new()),
            online_window_ms,
            run_retention_ms: run_retention_days.map(|days| i64::from(days) * 86_400_000),
            owner: hex::encode(rand::random::<[u8; 8]>()),
            timers: CancellationToken::new(),
            versions: Mutex::default(),
            online: Mutex::default(),
            jobs: Mutex::default(),
            refresh: Mutex::default(),
            refreshing: AtomicBool::new(false),
            groups: Mutex::default(),
            unrecorded: Mutex::default(),
        };
        Dispatcher { inner: Arc::new(inner) }
    }

    /// This admin's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The protocol client (reading executor logs goes through it too).
    pub fn client(&self) -> &protocol::Client {
        &self.inner.client
    }

    /// Cancels the pending send timers (their runs stay pending for the next start).
    pub fn stop(&self) {
        self.inner.timers.cancel();
    }

    /// The addresses runs of `group` may go to now: heartbeats for `AUTO`, configuration for `MANUAL`.
    pub async fn online_addresses(
        &self,
        group: &Group,
        now_ms: i64,
    ) -> anyhow::Result<Vec<String>> {
        if group.address_type == AddressType::Manual {
            return Ok(group.addresses.clone());
        }
        let cached = self.inner.online.lock().ok().and_then(|online| {
            let (read_at, addresses) = online.get(&group.app_name)?;
            (now_ms - read_at < ONLINE_TTL_MS && *read_at <= now_ms).then(|| addresses.clone())
        });
        if let Some(addresses) = cached {
            return Ok(addresses);
        }
        let since = now_ms - self.inner.online_window_ms;
        let addresses =
            self.inner.db.online_addresses(REGISTRY_GROUP_EXECUTOR, &group.app_name, since).await?;
        if let Ok(mut online) = self.inner.online.lock() {
            online.insert(group.app_name.clone(), (now_ms, addresses.clone()));
        }
        Ok(addresses)
    }

    /// Forgets the cached online executors of `app_name` (one registered or left).
    pub fn forget_online(&self, app_name: &str) {
        if let Ok(mut online) = self.inner.online.lock() {
            online.remove(app_name);
        }
    }

    /// Job `id` as read at most [`CACHE_TTL_MS`] ago (`None`: it does not exist), shared with
    /// the cache.
    pub async fn job(&self, id: i64) -> anyhow::Result<Option<Arc<Job>>> {
        let now = now_ms();
        if let Some((read_at, job)) = cached_at(&self.inner.jobs, id, now) {
            if now - read_at >= REFRESH_AFTER_MS {
                self.refresh_job(id);
            }
            return Ok(job);
        }
        let job = self.inner.db.get_job(id).await?.map(Arc::new);
        remember(&self.inner.jobs, id, now, job.clone());
        Ok(job)
    }

    /// Has job `id` read again, with the other jobs asked for meanwhile, by a task that waits
    /// [`REFRESH_GATHER`] for them.
    fn refresh_job(&self, id: i64) {
        let Ok(mut refresh) = self.inner.refresh.lock() else { return };
        refresh.insert(id);
        if self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFRESH_GATHER).await;
            let ids = match this.inner.refresh.lock() {
                Ok(mut refresh) => {
                    this.inner.refreshing.store(false, Ordering::Release);
                    refresh.drain().collect::<Vec<_>>()
                }
                Err(_) => return,
            };
            if let Err(error) = this.refresh_jobs(&ids).await {
                tracing::warn!(error = format!("{error:#}"), "reading cached jobs again failed");
            }
        });
    }

    /// Reads jobs `ids` again, with one query, into the copies still cached. A copy forgotten
    /// meanwhile (this admin changed the job) or read since the query began stays as it is.
    async fn refresh_jobs(&self, ids: &[i64]) -> anyhow::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let started = now_ms();
        let read = self.inner.db.get_jobs(ids).await?;
        let mut read: HashMap<i64, Arc<Job>> =
            read.into_iter().map(|job| (job.id, Arc::new(job))).collect();
        let Ok(mut jobs) = self.inner.jobs.lock() else { return Ok(()) };
        for id in ids {
            if let Some(entry) = jobs.get_mut(id).filter(|(read_at, _)| *read_at < started) {
                *entry = (started, read.remove(id));
            }
        }
        Ok(())
    }

    /// Group `id` as read at most [`CACHE_TTL_MS`] ago (`None`: it does not exist).
    pub async fn group(&self, id: i64) -> anyhow::Result<Option<Group>> {
        let now = now_ms();
        if let Some(group) = cached(&self.inner.groups, id, now) {
            return Ok(group);
        }
        let group = self.inner.db.get_group(id).await?;
        remember(&self.inner.groups, id, now, group.clone());
        Ok(group)
    }

    /// Forgets the cached copy of job `id`: call it after changing the job.
    pub fn forget_job(&self, id: i64) {
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            jobs.remove(&id);
        }
    }

    /// Forgets the cached copy of group `id`: call it after changing the group.
    pub fn forget_group(&self, id: i64) {
        if let Ok(mut groups) = self.inner.groups.lock() {
            groups.remove(&id);
        }
    }

    /// The digest of version `version` of job `job_id`.
    async fn version_digest(&self, job_id: i64, version: i64) -> anyhow::Result<Option<String>> {
        let cached = self
            .inner
            .versions
            .lock()
            .ok()
            .and_then(|versions| versions.get(&(job_id, version)).cloned());
        if cached.is_some() {
            return Ok(cached);
        }
        let Some(found) = self.inner.db.get_job_version(job_id, version).await? else {
            return Ok(None);
        };
        if let Ok(mut versions) = self.inner.versions.lock() {
            if versions.len() >= MAX_CACHED_VERSIONS {
                versions.clear();
            }
            versions.insert((job_id, version), found.sha256.clone());
        }
        Ok(Some(found.sha256))
    }

    /// The runs one trigger of `job` creates: one, one per executor for broadcast jobs, or one
    /// per executor that gets items for sharded jobs. `addresses`, if given, restricts the
    /// executors (they must belong to the job's group).
    pub async fn plan_runs(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
    ) -> Result<Vec<NewRun>, TriggerError> {
        let version = match (job.spec.glue_type.runs_a_version(), job.active_version) {
            (true, Some(version)) => {
                self.version_digest(job.id, version).await?.map(|sha256| (version, sha256))
            }
            _ => None,
        };
        // A schedule fire without a version still creates its run, which then fails visibly;
        // an explicit trigger is refused at once.
        let scheduled = matches!(trigger.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        if job.spec.glue_type.runs_a_version() && version.is_none() && !scheduled {
            return Err(TriggerError::NoVersion(job.id));
        }
        let run = |executor_address: Option<String>, shard_index: i64, shard_total: i64| NewRun {
            job_id: job.id,
            trigger_type: trigger.trigger_type,
            trigger_time_ms: trigger.at_ms,
            fire_time_ms: trigger.fire_time_ms,
            param: trigger.param.clone(),
            executor_address,
            shard_index,
            shard_total,
            sharding_items: Vec::new(),
            attempt: 0,
            version: version.clone(),
            parent_run_id: None,
        };
        let sharded = job.spec.sharding_total_count > 0;
        let broadcast = job.spec.route_strategy == RouteStrategy::ShardingBroadcast;
        if addresses.is_none() && !broadcast && !sharded {
            return Ok(vec![run(None, 0, 1)]);
        }
        let group = self.group(job.spec.group_id).await?;
        let group = group.ok_or(TriggerError::NoGroup(job.spec.group_id))?;
        let online = self.online_addresses(&group, trigger.at_ms.max(now_ms())).await?;
        let targets = match addresses {
            Some(given) => {
                if let Some(stranger) = given
                    .iter()
                    .find(|address| !online.contains(address) && !group.addresses.contains(address))
                {
                    return Err(TriggerError::AddressNotAllowed(stranger.clone()));
                }
                given.to_vec()
            }
            None => online,
        };
        if sharded {
            let assigned = sharded_targets(job, &targets);
            if assigned.is_empty() {
                // No executor to give the items to: one run that fails visibly at dispatch.
                return Ok(vec![run(None, 0, 1)]);
            }
            let total = assigned.len() as i64;
            return Ok(assigned
                .into_iter()
                .enumerate()
                .map(|(index, (address, items))| NewRun {
                    sharding_items: items,
                    ..run(Some(address), index as i64, total)
                })
                .collect());
        }
        if broadcast {
            let total = targets.len().max(1) as i64;
            if targets.is_empty() {
                // No executor to shard over: one run that fails visibly at dispatch.
                return Ok(vec![run(None, 0, 1)]);
            }
            return Ok(targets
                .into_iter()
                .enumerate()
                .map(|(index, address)| run(Some(address), index as i64, total))
                .collect());
        }
        let picked = self.route(job, &targets, now_ms()).await;
        Ok(vec![run(picked, 0, 1)])
    }

    /// Creates the runs of a manual, API or parent trigger and sends them now; `audit`, the
    /// operator's request, is recorded in the runs' transaction with their ids.
    pub async fn trigger(
        &self,
        job: &Job,
        trigger: PlannedTrigger,
        addresses: Option<&[String]>,
        audit: Option<&AuditEntry>,
    ) -> Result<Vec<i64>, TriggerError> {
        let mut runs = self.plan_runs(job, trigger, addresses).await?;
        let now = now_ms();
        let due_now = runs.iter().all(|run| run.trigger_time_ms <= now);
        let claim = if due_now { self.preroute(job, &mut runs, now).await } else { None };
        if let Some((owner, lease_until_ms)) = claim {
            let claims = self
                .inner
                .db
                .create_claimed_runs(&runs, &owner, now, lease_until_ms, audit)
                .await
                .map_err(anyhow::Error::from)?;
            let mut ids = Vec::with_capacity(claims.len());
            for claim in claims.into_iter().flatten() {
                ids.push(claim.run.id);
                self.send_created_at(Fired::Claimed(Box::new(claim)), now);
            }
            return Ok(ids);
        }
        let created = self.inner.db.create_audited_runs(&runs, now, audit).await;
        let created = created.map_err(anyhow::Error::from)?;
        let mut ids = Vec::with_capacity(runs.len());
        for (run, id) in runs.iter().zip(created) {
            if let Some(id) = id {
                ids.push(id);
                self.send_at(id, run.trigger_time_ms);
            }
        }
        Ok(ids)
    }

    /// Routes `runs` of `job`, due at `due_ms`, so they can be created already claimed by this
    /// admin: the owner and lease to create them with, or `None` (they are created pending and
    /// claimed at their instant) when the job's route probes executors (`FAILOVER`,
    /// `BUSYOVER`) or no executor is online. Claimed creation is one write instead of a
    /// creation, a claim and the record of the executor. A crash before the send leaves the
    /// runs `dispatching` under a lease that runs out, and the sweep then sends each to its
    /// recorded executor, as after a crash between that record and the send.
    pub async fn preroute(
        &self,
        job: &Job,
        runs: &mut [NewRun],
        due_ms: i64,
    ) -> Option<(String, i64)> {
        if matches!(job.spec.route_strategy, RouteStrategy::Failover | RouteStrategy::Busyover) {
            return None;
        }
        for run in runs.iter_mut().filter(|run| run.executor_address.is_none()) {
            run.executor_address = Some(self.route_run(job).await.ok()?);
        }
        Some((self.inner.owner.clone(), due_ms.max(now_ms()) + LEASE_MS))
    }

    /// Sends run `run_id` at `due_ms` (now if that has passed).
    pub fn send_at(&self, run_id: i64, due_ms: i64) {
        self.send_created_at(Fired::Pending(run_id), due_ms);
    }

    /// Sends a newly created run at `due_ms` (now if that has passed): a pending one is claimed
    /// first. A run routed at its creation to an executor that holds early triggers is sent
    /// [`SEND_AHEAD_MS`] before its instant with `notBefore`, so that the send is over when the
    /// instant comes and the executor starts it on time. A claimed run whose timer a stop
    /// cancels stays claimed until its lease runs out; the sweep sends it then.
    pub fn send_created_at(&self, run: Fired, due_ms: i64) {
        let this = self.clone();
        let run_id = run.id();
        // The job and the executor are recorded once known (`send_claimed`), so that every
        // line of the run's dispatch names them.
        let span = tracing::info_span!(
            "dispatch",
            run.id = run_id,
            job.id = tracing::field::Empty,
            executor = tracing::field::Empty
        );
        tokio::spawn(
            async move {
                let ahead = match &run {
                    Fired::Claimed(claim) if due_ms > now_ms() => {
                        match claim.run.executor_address.as_deref() {
                            Some(address) => {
                                this.peer(address).await.is_some_and(|peer| peer.holds_triggers)
                            }
                            None => false,
                        }
                    }
                    _ => false,
                };
                let send_at = if ahead { due_ms - SEND_AHEAD_MS } else { due_ms };
                let wait = u64::try_from(send_at - now_ms()).unwrap_or(0);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    () = this.inner.timers.cancelled() => return,
                }
                let sent = match run {
                    Fired::Pending(run_id) => this.send(run_id).await,
                    Fired::Claimed(claim) => this.send_claimed(*claim).await,
                };
                if let Err(error) = sent {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "dispatching run {run_id} failed"
                    );
                }
            }
            .instrument(span),
        );
    }

    /// Claims run `run_id` and sends it to an executor, recording what came of it.
    pub async fn send(&self, run_id: i64) -> anyhow::Result<()> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        let claim = self.inner.db.claim_run(run_id, owner, now, now + LEASE_MS).await?;
        match claim {
            Some(claim) => self.send_claimed(claim).await,
            None => Ok(()),
        }
    }

    /// Sends a run this admin holds the lease of, recording what came of it.
    async fn send_claimed(&self, Claim { run, fence }: Claim) -> anyhow::Result<()> {
        let now = now_ms();
        let owner = self.inner.owner.as_str();
        let lease = (owner, fence);
        tracing::Span::current().record("job.id", run.job_id);
        let job = self.job(run.job_id).await?;
        let scheduled = matches!(run.trigger_type, TriggerType::Cron | TriggerType::Misfire);
        let event = match &job {
            // The fire was committed just before the job was stopped: an operator who stopped
            // a job expects no further scheduled run. A job whose schedule has no fire after
            // this one (a `ONCE` job, a cron whose years ran out) was stopped by this very
            // fire, in the transaction that created the run, which is sent.
            Some(job) if scheduled && !job.running && has_fire_after(job, &run) => Event::Skip {
                reason: "skipped: the job was stopped before this fire was sent".to_owned(),
            },
            None => Event::NotSent { reason: format!("job {} no longer exists", run.job_id) },
            // An earlier holder's lease ran out long ago: whatever it did, no executor has
            // confirmed the run, and executors forget accepted runs after the window.
            Some(_) if fence > 1 && now - run.first_claimed_at_ms > RESEND_WINDOW_MS => {
                Event::Lost { reason: "lost: no executor confirmed it within an hour".to_owned() }
            }
            Some(job) => {
                let sent = tokio::select! {
                    sent = self.send_to_executor(job, &run, lease) => sent,
                    () = self.keep_lease(run.id, lease) => {
                        tracing::warn!(job.id = run.job_id, "run {}: lease lost while sending", run.id);
                        self.forget_send(run.id);
                        return Ok(());
                    }
                };
                if !matches!(&sent, Sent::Accepted { reply, .. } if reply.as_deref() != Some(run_reply::LOST))
                {
                    self.forget_send(run.id);
                }
                match sent {
                    Sent::Accepted { address, reply }
                        if reply.as_deref() == Some(run_reply::LOST) =>
                    {
                        Event::Lost {
                            reason: format!("lost: {address} accepted it before a restart"),
                        }
                    }
                    Sent::Accepted { address, .. } => {
                        tracing::Span::current().record("executor", address.as_str());
                        tracing::info!(job.id = run.job_id, "run {} sent to {address}", run.id);
                        let at_ms = now_ms();
                        if !self.await_result(run.id, at_ms).await {
                            // Its result came first and was recorded with the acceptance.
                            return Ok(());
                        }
                        Event::Sent {
                            address,
                            at_ms,
                            timeout_secs: job.spec.timeout_secs,
                            grace_ms: RESULT_GRACE_MS,
                        }
                    }
                    Sent::Refused(reason) => {
                        crate::metrics::admin().dispatch_failures.inc();
                        tracing::warn!(job.id = run.job_id, "run {} not sent: {reason}", run.id);
                        Event::NotSent { reason }
                    }
                    Sent::Unconfirmed(reason) => {
                        crate::metrics::admin().dispatch_failures.inc();
                        tracing::warn!(job.id = run.job_id, "run {} unconfirmed: {reason}", run.id);
                        Event::Lost { reason: format!("lost: {reason}") }
                    }
                    Sent::LeaseLost => return Ok(()),
                }
            }
        };
        let run_id = run.id;
        self.apply_to(run_id, Some(run), Some(job), event, Some(lease), None).await?;
        Ok(())
    }

    /// Notes that run `run_id` is being posted to `address`, so that a result that arrives
    /// before the executor's answer is read records the send with itself.
    fn hold_send(&self, run_id: i64, address: &str) {
        let posting =
            Unrecorded { address: address.to_owned(), at_ms: None, wake: None, record_now: false };
        if let Ok(mut sends) = self.inner.unrecorded.lock() {
            sends.insert(run_id, posting);
        }
    }

    /// Forgets the send of run `run_id` (not accepted: its outcome is recorded as it is).
    fn forget_send(&self, run_id: i64) {
        if let Ok(mut sends) = self.inner.unrecorded.lock() {
            sends.remove(&run_id);
        }
    }

    /// Holds back the record of run `run_id`'s acceptance at `at_ms` until the run's result
    /// arrives, a kill or this admin's stop wants it recorded, or [`SENT_RECORD_WAIT`] passes.
    /// Whether it is still to be recorded: not when the result took it
    /// ([`Dispatcher::take_unrecorded_send`]) to record both in one write, before or after the
    /// executor's answer.
    ///
    /// Meanwhile the run stays `dispatching` under this admin's lease, as between a send and
    /// its record; a crash then leaves it to the sweep, which sends it again to the same
    /// executor, and the executor answers with where the run is.
    async fn await_result(&self, run_id: i64, at_ms: i64) -> bool {
        let (wake, woken) = tokio::sync::oneshot::channel();
        {
            let Ok(mut sends) = self.inner.unrecorded.lock() else { return true };
            let Some(send) = sends.get_mut(&run_id) else { return false };
            if send.record_now {
                sends.remove(&run_id);
                return true;
            }
            send.at_ms = Some(at_ms);
            send.wake = Some(wake);
        }
        tokio::select! {
            _ = woken => {}
            () = tokio::time::sleep(SENT_RECORD_WAIT) => {}
            () = self.inner.timers.cancelled() => {}
        }
        self.inner.unrecorded.lock().ok().and_then(|mut sends| sends.remove(&run_id)).is_some()
    }

    /// Takes the send of run `run_id` that its sender has not recorded: the executor and when
    /// it accepted the run (when the result came before the executor's answer was read, the
    /// run's start `started_at_ms`, by which it had taken it, else now). The sender then records
    /// nothing, and the caller records the acceptance with the run's result.
    pub(super) fn take_unrecorded_send(
        &self,
        run_id: i64,
        started_at_ms: Option<i64>,
    ) -> Option<(String, i64)> {
        let taken = self.inner.unrecorded.lock().ok()?.remove(&run_id)?;
        Some((taken.address, taken.at_ms.or(started_at_ms).unwrap_or_else(now_ms)))
    }

    /// Has the sender of run `run_id` record its acceptance without waiting (a kill is
    /// delivered with that record).
    pub(super) fn record_send_now(&self, run_id: i64) {
        let wake = self.inner.unrecorded.lock().ok().and_then(|mut sends| {
            let send = sends.get_mut(&run_id)?;
            send.record_now = true;
            send.wake.take()
        });
        if let Some(wake) = wake {
            let _ = wake.send(());
        }
    }

    /// Renews the lease on run `run_id` until it cannot (the lease moved on, or the run left
    /// `dispatching`); a database error is logged and retried at the next renewal.
    async fn keep_lease(&self, run_id: i64, (owner, fence): (&str, i64)) {
        loop {
            tokio::time::sleep(LEASE_RENEWAL).await;
            match self.inner.db.renew_lease(run_id, owner, fence, now_ms() + LEASE_MS).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, "renewing the lease of run {run_id} failed"),
            }
        }
    }

    /// Routes run `run` (unless it carries its executor), records the choice under the lease,
    /// and posts `/run`.
    async fn send_to_executor(&self, job: &Job, run: &RunRecord, lease: (&str, i64)) -> Sent {
        let resent = lease.1 > 1;
        let address = match &run.executor_address {
            Some(address) => address.clone(),
            None => {
                let routed = match self.route_run(job).await {
                    Ok(address) => address,
                    Err(reason) => return Sent::Refused(reason),
                };
                match self.inner.db.set_run_target(run.id, lease.0, lease.1, &routed).await {
                    Ok(true) => routed,
                    Ok(false) => return Sent::LeaseLost,
                    Err(error) => return Sent::Refused(format!("recording the executor: {error}")),
                }
            }
        };
        let param = match trigger_param(job, run) {
            Ok(param) => param,
            Err(error) => return Sent::Refused(format!("{error:#}")),
        };
        // The sender speaks to the executor as its stored registration says (`peers.rs`).
        self.peer(&address).await;
        failpoint::hit("dispatch.before_send");
        self.hold_send(run.id, &address);
        match self.inner.senders.post(&address, param).await {
            Ok(reply) => {
                failpoint::hit("dispatch.after_send");
                Sent::Accepted { address, reply }
            }
            // The executor answered and did not take it.
            Err(PostError::Refused(reason)) => Sent::Refused(reason),
            // Nothing reached the executor, and no earlier holder may have sent it either.
            Err(PostError::Unreachable(reason)) if !resent => {
                Sent::Refused(format!("{address} is unreachable: {reason}"))
            }
            Err(PostError::Unreachable(reason) | PostError::NoAnswer(reason)) => {
                Sent::Unconfirmed(format!("no answer from {address} to /run: {reason}"))
            }
        }
    }

    /// Picks the executor of a run routed at send time.
    async fn route_run(&self, job: &Job) -> Result<String, String> {
        let group = self.group(job.spec.group_id).await.map_err(|e| format!("{e:#}"))?;
        let group = group.ok_or_else(|| format!("group {} does not exist", job.spec.group_id))?;
        let online = self.online_addresses(&group, now_ms()).await.map_err(|e| format!("{e:#}"))?;
        if online.is_empty() {
            return Err(format!("no executor online in group `{}`", group.app_name));
        }
        self.route(job, &online, now_ms())
            .await
            .ok_or_else(|| "no executor passed the route's probe".to_owned())
    }

    /// Picks one executor among `addresses` with the job's strategy, probing if it asks for it.
    async fn route(&self, job: &Job, addresses: &[String], now_ms: i64) -> Option<String> {
        let route = {
            let mut router = self.inner.router.lock().ok()?;
            router.route(job.spec.route_strategy, job.id, addresses, now_ms, &mut rand::rng())?
        };
        match route {
            Route::One(address) => Some(address),
            Route::Broadcast(targets) => targets.into_iter().next().map(|(address, _, _)| address),
            Route::FirstPassing { probe, candidates } => {
                for candidate in candidates {
                    // XXL-JOB 3.5 executors answer only calls that name their application.
                    let peer = self.peer(&candidate).await;
                    let app_name = peer.as_ref().and_then(Peer::app_name_header);
                    let client = &self.inner.client;
                    let probed = async {
                        match probe {
                            Probe::Beat => {
                                client.call_as::<_, String>(&candidate, "beat", &(), app_name).await
                            }
                            Probe::IdleBeat => {
                                let param = JobIdParam { job_id: job.id, log_id: None };
                                client
                                    .call_as::<_, String>(&candidate, "idleBeat", &param, app_name)
                                    .await
                            }
                        }
                    };
                    // A probe is a liveness question: an executor that does not answer within
                    // XXL-JOB's 3 s is passed over, as one that refuses would be.
                    let passed = tokio::time::timeout(PROBE_TIMEOUT, probed).await;
                    if matches!(passed, Ok(Ok(_))) {
                        return Some(candidate);
                    }
                }
                None
            }
        }
    }
}

/// What came of posting `/run`.
enum Sent {
    /// The executor took it (now, or before: `reply` says which, for wasmjob executors).
    Accepted { address: String, reply: Option<String> },
    /// No executor took it.
    Refused(String),
    /// The request may have reached the executor, but no answer came: nobody knows whether it
    /// runs, so it must not be sent anywhere else.
    Unconfirmed(String),
    /// Another dispatcher holds the run now.
    LeaseLost,
}

/// Whether the schedule of `job` fires again after the fire of `run`.
fn has_fire_after(job: &Job, run: &RunRecord) -> bool {
    let spec = &job.spec;
    let fire_ms = run.fire_time_ms.unwrap_or(run.trigger_time_ms);
    Schedule::parse(spec.schedule_type, &spec.schedule_conf, spec.time_zone.as_deref())
        .map_or(true, |schedule| schedule.next_after(fire_ms).is_some())
}

/// The executors among `targets` that `job`'s sharding strategy gives items to, each with its
/// items and their parameters, in the order of the executors' addresses.
fn sharded_targets(job: &Job, targets: &[String]) -> Vec<(String, Vec<ShardingItem>)> {
    let total = u32::try_from(job.spec.sharding_total_count).unwrap_or(0);
    // Item parameters are validated when the job is saved; should stored ones not read, the
    // items still run, without parameters.
    let parameters = sharding::parse_item_parameters(&job.spec.sharding_item_parameters, total)
        .unwrap_or_default();
    sharding::assign(job.spec.sharding_strategy, &job.spec.name, total, targets)
        .into_iter()
        .filter(|(_, items)| !items.is_empty())
        .map(|(address, items)| (address, sharding::items_with_parameters(&items, &parameters)))
        .collect()
}

/// When and why runs are created.
#[derive(Debug, Clone)]
pub struct PlannedTrigger {
    /// Why.
    pub trigger_type: TriggerType,
    /// The instant the runs are for (ms).
    pub at_ms: i64,
    /// For schedule fires, the fire's key.
    pub fire_time_ms: Option<i64>,
    /// The parameter.
    pub param: String,
}

impl PlannedTrigger {
    /// A trigger for now.
    pub fn now(trigger_type: TriggerType, param: String) -> PlannedTrigger {
        PlannedTrigger { trigger_type, at_ms: now_ms(), fire_time_ms: None, param }
    }
}

/// The entry `id` of `cache` if it was read within [`CACHE_TTL_MS`] of `now_ms`.
fn cached<T: Clone>(cache: &Mutex<HashMap<i64, (i64, T)>>, id: i64, now_ms: i64) -> Option<T> {
    cached_at(cache, id, now_ms).map(|(_, value)| value)
}

/// [`cached`] with when the entry was read.
fn cached_at<T: Clone>(
    cache: &Mutex<HashMap<i64, (i64, T)>>,
    id: i64,
    now_ms: i64,
) -> Option<(i64, T)> {
    let cache = cache.lock().ok()?;
    let (read_at, value) = cache.get(&id)?;
    (now_ms - read_at < CACHE_TTL_MS && *read_at <= now_ms).then(|| (*read_at, value.clone()))
}

fn remember<T>(cache: &Mutex<HashMap<i64, (i64, T)>>, id: i64, now_ms: i64, value: T) {
    if let Ok(mut cache) = cache.lock() {
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(id, (now_ms, value));
    }
}

fn trigger_param(job: &Job, run: &RunRecord) -> anyhow::Result<TriggerParam> {
    // A GLUE_PYTHON or GLUE_JAVASCRIPT job runs the component its source was built into, sent
    // exactly as a GLUE_WASM one: the source text never travels to an executor.
    let (glue_source, handler) = match job.spec.glue_type {
        GlueType::GlueWasm | GlueType::GluePython | GlueType::GlueJavascript => {
            let sha256 = run
                .sha256
                .clone()
                .with_context(|| format!("job {} has no module version: upload one", job.id))?;
            (sha256, String::new())
        }
        GlueType::Bean => (String::new(), job.spec.handler.clone().unwrap_or_default()),
    };
    Ok(TriggerParam {
        job_id: job.id,
        executor_handler: handler,
        executor_params: run.param.clone(),
        executor_block_strategy: job.spec.block_strategy.as_str().to_owned(),
        executor_timeout: job.spec.timeout_secs,
        log_id: run.id,
        log_date_time: run.trigger_time_ms,
        glue_type: if job.spec.glue_type.runs_a_version() {
            GLUE_WASM.to_owned()
        } else {
            "BEAN".to_owned()
        },
        glue_source,
        glue_updatetime: 0,
        broadcast_index: run.shard_index,
        broadcast_total: run.shard_total,
        sharding_items: (!run.sharding_items.is_empty()).then(|| {
            run.sharding_items
                .iter()
                .map(|item| ShardingItemParam {
                    item: item.item,
                    parameter: item.parameter.clone(),
                })
                .collect()
        }),
        attempt: Some(run.attempt),
        fuel_limit: job.spec.fuel_limit,
        memory_limit_mb: job.spec.memory_limit_mb,
        // Sent ahead of its instant (`send_created_at`): it must not start before it.
        not_before: (run.trigger_time_ms > now_ms()).then_some(run.trigger_time_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dispatcher over a fresh SQLite database (kept while the directory lives).
    async fn dispatcher() -> (Dispatcher, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("dispatch.db").display());
        let db = Db::connect(&url).await.unwrap();
        let client = protocol::Client::new("dispatch-test-token-5c1e9a", Duration::from_secs(1));
        (Dispatcher::new(db, client.unwrap(), 90_000, None), dir)
    }

    /// The name of job `id` in the dispatcher's cache, or `None` when it holds no copy.
    fn cached_name(dispatcher: &Dispatcher, id: i64) -> Option<Option<String>> {
        let jobs = dispatcher.inner.jobs.lock().unwrap();
        jobs.get(&id).map(|(_, job)| job.as_ref().map(|job| job.spec.name.clone()))
    }

    #[tokio::test]
    async fn jobs_in_use_are_read_again_together_before_their_copies_expire() {
        let (dispatcher, _dir) = dispatcher().await;
        let db = dispatcher.inner.db.clone();
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        use crate::model::{
            BlockStrategy, JobSpec, MisfireStrategy, ScheduleType, ShardingStrategy,
        };
        let spec = JobSpec {
            group_id: group.id,
            name: "first".to_owned(),
            schedule_type: ScheduleType::None,
            schedule_conf: String::new(),
            time_zone: None,
            misfire_strategy: MisfireStrategy::DoNothing,
            misfire_threshold_ms: 5_000,
            route_strategy: RouteStrategy::First,
            block_strategy: BlockStrategy::SerialExecution,
            timeout_secs: 0,
            retry_count: 0,
            glue_type: GlueType::GlueWasm,
            handler: None,
            param: String::new(),
            child_job_ids: Vec::new(),
            alarm_email: None,
            fuel_limit: None,
            memory_limit_mb: None,
            sharding_total_count: 0,
            sharding_item_parameters: String::new(),
            sharding_strategy: ShardingStrategy::AverageAllocation,
            alarm_silence_secs: 0,
        };
        let (one, two) =
            (db.create_job(&spec, 1).await.unwrap(), db.create_job(&spec, 1).await.unwrap());
        for job in [&one, &two] {
            assert_eq!(dispatcher.job(job.id).await.unwrap().unwrap().spec.name, "first");
        }
        // Another admin renames one and deletes the other.
        let renamed = JobSpec { name: "renamed".to_owned(), ..spec.clone() };
        db.update_job(one.id, &renamed, 0, 2).await.unwrap().unwrap();
        assert!(db.delete_job(two.id).await.unwrap());
        // Copies half as old as they may get are still served, and both are read again together.
        let half_old = now_ms() - REFRESH_AFTER_MS;
        for (read_at, _) in dispatcher.inner.jobs.lock().unwrap().values_mut() {
            *read_at = half_old;
        }
        assert_eq!(dispatcher.job(one.id).await.unwrap().unwrap().spec.name, "first");
        assert_eq!(dispatcher.job(two.id).await.unwrap().unwrap().spec.name, "first");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cached_name(&dispatcher, two.id) != Some(None) {
            assert!(std::time::Instant::now() < deadline, "the copies were not read again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cached_name(&dispatcher, one.id), Some(Some("renamed".to_owned())));
        // A copy this admin forgot (it changed the job) is not brought back by a read that
        // began before the change.
        dispatcher.forget_job(one.id);
        dispatcher.refresh_jobs(&[one.id]).await.unwrap();
        assert_eq!(cached_name(&dispatcher, one.id), None);
    }

    /// Posts `run_id` and, once its executor accepted it at 500, holds back the record; returns
    /// once it is held.
    async fn held(dispatcher: &Dispatcher, run_id: i64) -> tokio::task::JoinHandle<bool> {
        dispatcher.hold_send(run_id, "http://e:1");
        let sender = dispatcher.clone();
        let waiting = tokio::spawn(async move { sender.await_result(run_id, 500).await });
        let accepted = |sends: &HashMap<i64, Unrecorded>| sends[&run_id].at_ms.is_some();
        while !accepted(&dispatcher.inner.unrecorded.lock().unwrap()) {
            tokio::task::yield_now().await;
        }
        waiting
    }

    #[tokio::test]
    async fn an_accepted_send_is_recorded_unless_its_result_takes_it() {
        let (dispatcher, _dir) = dispatcher().await;
        // The result comes first: it takes the acceptance, and the sender records nothing.
        let waiting = held(&dispatcher, 1).await;
        let taken = dispatcher.take_unrecorded_send(1, Some(700));
        assert_eq!(taken, Some(("http://e:1".to_owned(), 500)));
        assert!(!waiting.await.unwrap());
        // The result comes before the executor's answer is read: it records the send, as of
        // the run's start, and the sender, once it reads the answer, records nothing.
        dispatcher.hold_send(5, "http://e:1");
        let taken = dispatcher.take_unrecorded_send(5, Some(700));
        assert_eq!(taken, Some(("http://e:1".to_owned(), 700)));
        assert!(!dispatcher.await_result(5, 800).await);
        // A kill during the post has the acceptance recorded as soon as it is read.
        dispatcher.hold_send(6, "http://e:1");
        dispatcher.record_send_now(6);
        assert!(dispatcher.await_result(6, 800).await);
        // A kill has it recorded now; a result after that finds nothing to take.
        let waiting = held(&dispatcher, 2).await;
        dispatcher.record_send_now(2);
        assert!(waiting.await.unwrap());
        assert_eq!(dispatcher.take_unrecorded_send(2, None), None);
        // No result within the wait: the sender records it.
        let waiting = held(&dispatcher, 3).await;
        assert!(waiting.await.unwrap());
        assert_eq!(dispatcher.take_unrecorded_send(3, None), None);
        // A stopping admin records what it holds.
        let waiting = held(&dispatcher, 4).await;
        dispatcher.stop();
        assert!(waiting.await.unwrap());
        assert!(dispatcher.inner.unrecorded.lock().unwrap().is_empty());
    }
}
