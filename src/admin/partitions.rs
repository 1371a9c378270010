//! This admin's share of the schedule: the beat that keeps its leases on partitions.
//!
//! Every [`BEAT`] (and when a lease it waits for runs out), the admin records itself as live,
//! renews its leases for [`LEASE_MS`], and does what `partition::plan` says: it gives back
//! what is above its fair share (first dropping it from what it fires, then in the database)
//! and takes free partitions up to it, its part of a dead admin's, and expired ones whatever
//! its share (`partition::plan` says why). What it holds is published in [`Partitions`], which
//! the scheduler, the workflow scheduler and the sweep read; the scheduler is woken when it
//! changes.
//!
//! An admin is known dead, before its lease runs out, in two ways: it is this admin's
//! predecessor (the same host and listen address), or its database session ended. Each admin
//! on PostgreSQL or MySQL holds a lock named after it on a connection of its own
//! (`Db::open_admin_session`), which the database lets go when the connection ends: at once
//! when the admin's process is killed, as its sockets close with it. A beat reads which
//! sessions are open, and an admin that saw another's session open and now sees it ended takes
//! its part of that admin's partitions at once (their fences bumped, so it could fire none of
//! them even were it alive). A paused admin keeps its session, and its partitions wait for its
//! lease.
//!
//! A held set is trusted only for [`LEASE_MS`] after the renewal that returned it: an admin
//! whose beats fail (its database unreachable, the process paused) stops firing when its lease
//! runs out, which is when another admin may take its partitions. The fire's own transaction
//! checks the lease again (`Db::fire_jobs`), so a paused admin that lost its partitions cannot
//! fire them even in the moment it wakes. At a graceful stop it gives every partition back.
//!
//! It does not decide shares (`partition`), and it does not fire anything (`scheduler`).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{AppState, now_ms};
use crate::partition::{self, Held};
use crate::storage::AdminSession;

/// How long a lease on a partition lasts without renewal: the longest a paused admin, or one cut
/// off from the database, delays its jobs' fires (a killed admin's session ends with it, and
/// its partitions are taken at the next beat). It is below the default misfire threshold
/// (5 s), so a takeover loses no fire.
pub const LEASE_MS: i64 = 4_000;
/// How often an admin beats: renews its leases and rebalances.
const BEAT: Duration = Duration::from_secs(1);

/// The partitions this admin holds now. Cheap to clone.
#[derive(Clone)]
pub struct Partitions {
    inner: Arc<Inner>,
}

struct Inner {
    held: RwLock<Arc<Held>>,
    /// Until when the held set may be trusted: the last renewal's start plus the lease.
    valid_until_ms: AtomicI64,
    /// An empty set, for when the lease may have run out.
    none: Arc<Held>,
    /// Whether a beat completed since the start.
    beaten: AtomicBool,
    beat: Notify,
}

impl Partitions {
    /// Holding nothing yet, for the admin with lease owner id `owner`.
    pub fn new(owner: &str) -> Partitions {
        let none = Arc::new(Held::none(owner));
        Partitions {
            inner: Arc::new(Inner {
                held: RwLock::new(none.clone()),
                valid_until_ms: AtomicI64::new(0),
                none,
                beaten: AtomicBool::new(false),
                beat: Notify::new(),
            }),
        }
    }

    /// The partitions held, with their fences; none once the last renewal is older than the
    /// lease.
    pub fn held(&self) -> Arc<Held> {
        if now_ms() > self.inner.valid_until_ms.load(Ordering::Acquire) {
            return self.inner.none.clone();
        }
        self.inner.held.read().map_or_else(|_| self.inner.none.clone(), |held| held.clone())
    }

    /// Whether the partition 0 is held: its holder does the duties one admin does for all
    /// (folding the report, forgetting silent executors and departed admins, alarming on
    /// lost executors).
    pub fn leads(&self) -> bool {
        self.held().fences.contains_key(&0)
    }

    /// Waits for the admin's first beat, at most [`LEASE_MS`]: until then it holds nothing,
    /// and a loop that starts with the admin would skip its first pass.
    pub async fn first_beat(&self) {
        let wait = async {
            loop {
                let beat = self.inner.beat.notified();
                if self.inner.beaten.load(Ordering::Acquire) {
                    return;
                }
                beat.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(LEASE_MS as u64), wait).await;
    }

    fn publish(&self, fences: BTreeMap<u16, i64>, valid_until_ms: i64) -> bool {
        let owner = self.inner.none.owner.clone();
        let next = Arc::new(Held { owner, fences });
        let changed = match self.inner.held.write() {
            Ok(mut held) => {
                let changed = **held != *next;
                *held = next;
                changed
            }
            Err(_) => false,
        };
        self.inner.valid_until_ms.store(valid_until_ms, Ordering::Release);
        self.inner.beaten.store(true, Ordering::Release);
        self.inner.beat.notify_waiters();
        changed
    }

    fn drop_all(&self) {
        self.inner.valid_until_ms.store(0, Ordering::Release);
        if let Ok(mut held) = self.inner.held.write() {
            *held = self.inner.none.clone();
        }
    }
}

/// Beats until `shutdown`, then gives every partition back. `address` is the admin's API
/// address as reported; `listen` the address its socket is bound to.
pub(super) async fn run(
    state: AppState,
    address: String,
    listen: std::net::SocketAddr,
    shutdown: CancellationToken,
) {
    let started_at = now_ms();
    let member = member(listen);
    let mut sessions = Sessions::default();
    loop {
        sessions.open(&state).await;
        let look_again_at = match beat(&state, &address, &member, started_at, &mut sessions).await {
            Ok(at) => at,
            Err(error) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "renewing the partitions' leases failed: trying again"
                );
                None
            }
        };
        let sleep = look_again_at.map_or(BEAT, |at| {
            Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)).min(BEAT)
        });
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = shutdown.cancelled() => break,
        }
    }
    let partitions = state.dispatcher.partitions();
    partitions.drop_all();
    match state.db.leave_partitions(state.dispatcher.owner()).await {
        Ok(released) => tracing::info!("gave back {released} partitions"),
        Err(error) => tracing::warn!(
            %error,
            "giving back the partitions failed: other admins take them when their lease runs out"
        ),
    }
    crate::metrics::admin().partitions_held.set(0);
    // The callbacks it recorded and may not have applied: the next sweep of any admin (this
    // one's next incarnation too) takes them, not only once their time runs out.
    match state.db.release_callbacks(state.dispatcher.owner()).await {
        Ok(0) => {}
        Ok(released) => tracing::info!("gave back {released} recorded callbacks"),
        Err(error) => tracing::warn!(
            %error,
            "giving back the recorded callbacks failed: they are taken when their time runs out"
        ),
    }
    // Only now, its partitions given back: the others see the session end.
    drop(sessions);
}

/// This admin's session ([`Db::open_admin_session`](crate::storage::Db::open_admin_session)),
/// and the other admins it saw holding theirs.
#[derive(Default)]
struct Sessions {
    mine: Option<AdminSession>,
    /// When this admin last tried to open its session and could not.
    failed_at_ms: Option<i64>,
    /// The other admins whose session a beat saw open: one whose session ended since is dead.
    seen: HashSet<String>,
    /// The admins whose session ended, while they are live or hold leases.
    dead: HashSet<String>,
}

impl Sessions {
    /// Opens this admin's session if it has none, trying at most once a lease.
    async fn open(&mut self, state: &AppState) {
        if self.mine.is_some() || self.failed_at_ms.is_some_and(|at| now_ms() - at < LEASE_MS) {
            return;
        }
        match state.db.open_admin_session(state.dispatcher.owner()).await {
            Ok(Some(session)) => self.mine = Some(session),
            Ok(None) => self.failed_at_ms = Some(now_ms()),
            Err(error) => {
                self.failed_at_ms = Some(now_ms());
                tracing::warn!(
                    %error,
                    "opening this admin's database session failed: other admins will see its \
                     death only when its leases run out"
                );
            }
        }
    }

    /// Reads a beat's `open` sessions among the `admins` (live or holding leases): returns
    /// those (not `me`) whose session this admin saw open and that ended since, for as long as
    /// they are among the `admins`. Forgets its own session if it ended (a connection lost): it
    /// opens another before the next beat.
    fn ended(&mut self, me: &str, open: &HashSet<String>, admins: &HashSet<&str>) -> Vec<String> {
        if self.mine.is_some() && !open.contains(me) {
            tracing::warn!("this admin's database session ended: opening another");
            self.mine = None;
            self.failed_at_ms = None;
        }
        self.dead.extend(self.seen.iter().filter(|admin| !open.contains(*admin)).cloned());
        self.dead.retain(|admin| admins.contains(admin.as_str()) && !open.contains(admin));
        self.seen = open
            .iter()
            .filter(|admin| *admin != me && admins.contains(admin.as_str()))
            .cloned()
            .collect();
        let mut ended: Vec<String> = self.dead.iter().cloned().collect();
        ended.sort_unstable();
        ended
    }
}

/// What tells this admin's incarnations apart from other admins: its host's name and the
/// address its socket is bound to. An earlier admin of the same member is dead, as this one
/// could bind the address; without a host name (no `/proc`) there is no member, and a restarted
/// admin waits for its predecessor's leases to run out.
fn member(listen: std::net::SocketAddr) -> String {
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(host) if !host.trim().is_empty() => format!("{}/{listen}", host.trim()),
        _ => String::new(),
    }
}

/// One beat: renew, give back, take; returns when to look again before the next beat.
async fn beat(
    state: &AppState,
    address: &str,
    member: &str,
    started_at: i64,
    sessions: &mut Sessions,
) -> anyhow::Result<Option<i64>> {
    let owner = state.dispatcher.owner();
    let partitions = state.dispatcher.partitions();
    let before = partitions.held();
    let now = now_ms();
    let beat = state.db.beat_partitions(owner, address, member, started_at, now, LEASE_MS).await?;
    let admins: HashSet<&str> = beat
        .live
        .iter()
        .map(String::as_str)
        .chain(beat.leases.iter().filter_map(|lease| lease.owner.as_deref()))
        .collect();
    // An admin whose session ended is dead (or cut off from the database, and then unable to
    // fire): its partitions are taken now, as a predecessor's are, not when its lease runs out.
    let ended = sessions.ended(owner, &beat.sessions, &admins);
    let ended_leases = |dead: &String| {
        beat.leases.iter().filter(|lease| lease.owner.as_ref() == Some(dead)).count()
    };
    let ended_holding: Vec<&String> = ended
        .iter()
        .filter(|admin| !beat.predecessors.contains(admin) && ended_leases(admin) > 0)
        .collect();
    for dead in &ended_holding {
        tracing::info!(
            "admin {dead}'s database session ended: its {} partitions are shared out without \
             waiting for their leases to run out",
            ended_leases(dead)
        );
    }
    let mut dead = beat.predecessors.clone();
    dead.extend(ended_holding.iter().map(|admin| (*admin).clone()));
    let plan = partition::plan(owner, now, &beat.live, &dead, &beat.leases);
    let metrics = crate::metrics::admin();
    let mut fences: BTreeMap<u16, i64> = beat.renewed.into_iter().collect();
    let lost = before.fences.keys().filter(|held| !fences.contains_key(held)).count();
    if lost > 0 {
        tracing::warn!(
            "{lost} partitions were taken over by another admin: their lease ran out, or this \
             admin's database session ended"
        );
        metrics.partition_handovers("lost", lost);
    }
    if !plan.release.is_empty() {
        // Not fired from here on, before another admin may take them.
        for released in &plan.release {
            fences.remove(released);
        }
        partitions.publish(fences.clone(), now + LEASE_MS);
        let released = state.db.release_partitions(owner, &plan.release).await?;
        tracing::info!("gave back {released} partitions to share them with the other admins");
        metrics.partition_handovers("released", plan.release.len());
    }
    let mut taken_from = Vec::new();
    if !plan.take.is_empty() {
        let taken = state.db.take_partitions(owner, &plan.take, &dead, now, now + LEASE_MS).await?;
        if !taken.is_empty() {
            tracing::info!("took {} partitions (share {})", taken.len(), plan.share);
            metrics.partition_handovers("taken", taken.len());
            let from_ended = beat
                .leases
                .iter()
                .filter(|lease| taken.contains_key(&lease.partition))
                .filter(|lease| lease.owner.as_ref().is_some_and(|o| ended_holding.contains(&o)))
                .count();
            if from_ended > 0 {
                metrics.partition_handovers("taken_at_session_end", from_ended);
            }
        }
        // The admins whose partitions were taken from them are not firing: their claimed runs
        // need not wait for their dispatch leases.
        taken_from = beat
            .leases
            .iter()
            .filter(|lease| taken.contains_key(&lease.partition))
            .filter_map(|lease| lease.owner.clone())
            .filter(|previous| previous != owner)
            .collect();
        taken_from.sort_unstable();
        taken_from.dedup();
        fences.extend(taken);
    }
    let held = fences.len();
    if partitions.publish(fences, now + LEASE_MS) {
        state.scheduler_wake.notify_one();
    }
    if !taken_from.is_empty() {
        tokio::spawn(state.dispatcher.clone().take_over_sends(taken_from));
    }
    metrics.partitions_held.set(i64::try_from(held).unwrap_or(0));
    Ok(plan.look_again_at)
}
