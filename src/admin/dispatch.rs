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
//! The module follows a run's phases:
//! - `cache.rs`: the read-through copies of jobs, groups, online executors and version
//!   digests, one [`Cache`] shared with the HTTP handlers;
//! - `plan.rs`: the runs a trigger creates, created claimed when they route without probing;
//! - `route.rs`: the executor a run goes to, probing for `FAILOVER` and `BUSYOVER`;
//! - `send.rs`: the send under a lease, from the timer to the executor's answer and its record;
//! - `sender.rs` and `peers.rs`: the per-executor send queues, and what each executor speaks;
//! - `events.rs`: lifecycle events applied with their consequences (retries, child jobs, kills);
//! - `results.rs`: an executor callback's results, applied a chunk at a time within a budget;
//! - `sweep.rs`: the periodic pass that finds work whose owner died or whose executor went away;
//! - `workflows.rs`: workflow runs: the runs of the nodes storage decided to start, kills and
//!   retries by hand.

mod cache;
mod caps;
mod events;
mod inbox;
mod peers;
mod plan;
mod results;
mod route;
mod send;
mod sender;
mod sweep;
mod workflows;

use foldhash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::now_ms;
use super::partitions::Partitions;
use crate::protocol;
use crate::routing::RouterState;
use crate::storage::Db;

pub use self::cache::Cache;

pub use self::inbox::APPLY_WITHIN;
pub use self::peers::{Peer, PeerKind};
pub use self::plan::{PlannedTrigger, TriggerError};
pub use self::results::{ANSWER_WITHIN, Applied};
pub use self::send::RESULT_GRACE_MS;
use self::send::Unrecorded;
use self::sender::Senders;
pub use self::sweep::sweep;

/// How long a dispatcher's claim on a run lasts without renewal.
const LEASE_MS: i64 = 15_000;

/// Sends runs and applies results. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    client: protocol::Client,
    /// Jobs, groups, online executors and version digests as read recently.
    cache: Cache,
    router: Mutex<RouterState>,
    online_window_ms: i64,
    run_retention_ms: Option<i64>,
    /// This admin process's id: the owner of the leases it takes.
    owner: String,
    timers: CancellationToken,
    /// The executors' send queues.
    senders: Arc<Senders>,
    /// What each registered executor speaks.
    peers: Arc<peers::Peers>,
    /// The partitions of the schedule this admin holds (`admin::partitions`).
    partitions: Partitions,
    /// Sends being posted, or accepted by their executors, that this admin has not recorded
    /// yet, by run.
    unrecorded: Mutex<HashMap<i64, Unrecorded>>,
    /// How long a callback's results are applied before the rest is recorded, in µs
    /// ([`APPLY_WITHIN`] unless set).
    apply_within_us: AtomicU64,
    /// How long a callback whose rest cannot be recorded is applied before it is answered, in
    /// µs ([`ANSWER_WITHIN`] unless set).
    answer_within_us: AtomicU64,
    /// The callbacks recorded and not applied yet.
    inbox: inbox::Inbox,
    /// This admin's URL, sent with each run (`replyTo`) so that an executor that knows it
    /// delivers the result here, where the send waits to be recorded with it.
    reply_to: OnceLock<String>,
}

impl Dispatcher {
    /// A dispatcher over `db`, reading through `cache`; an executor is online if it beat within
    /// `online_window_ms`; ended runs are deleted after `run_retention_days` (`None`: kept).
    pub fn new(
        db: Db,
        cache: Cache,
        client: protocol::Client,
        online_window_ms: i64,
        run_retention_days: Option<u32>,
    ) -> Dispatcher {
        let peers = Arc::new(peers::Peers::default());
        let owner = hex::encode(rand::random::<[u8; 8]>());
        let inner = Inner {
            partitions: Partitions::new(&owner),
            db,
            cache,
            senders: Senders::new(client.clone(), peers.clone()),
            peers,
            client,
            router: Mutex::new(RouterState::new()),
            online_window_ms,
            run_retention_ms: run_retention_days.map(|days| i64::from(days) * 86_400_000),
            owner,
            timers: CancellationToken::new(),
            unrecorded: Mutex::default(),
            apply_within_us: AtomicU64::new(APPLY_WITHIN.as_micros() as u64),
            answer_within_us: AtomicU64::new(ANSWER_WITHIN.as_micros() as u64),
            inbox: inbox::Inbox::default(),
            reply_to: OnceLock::new(),
        };
        Dispatcher { inner: Arc::new(inner) }
    }

    /// Names `url` as this admin's in the runs it sends (once; later calls change nothing).
    pub fn set_reply_to(&self, url: String) {
        let _ = self.inner.reply_to.set(url);
    }

    /// This admin's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The partitions of the schedule this admin holds.
    pub fn partitions(&self) -> &Partitions {
        &self.inner.partitions
    }

    /// The protocol client (reading executor logs goes through it too).
    pub fn client(&self) -> &protocol::Client {
        &self.inner.client
    }

    /// How long a callback's results are applied before the rest is recorded in the inbox and
    /// the callback answered (`--callback-apply-ms`, [`APPLY_WITHIN`] by default).
    pub fn set_apply_within(&self, within: Duration) {
        let micros = u64::try_from(within.as_micros()).unwrap_or(u64::MAX);
        self.inner.apply_within_us.store(micros, Ordering::Relaxed);
    }

    /// How long a callback whose rest the inbox cannot take is applied before it is answered,
    /// the rest left for the executor to send again ([`ANSWER_WITHIN`] by default; a test sets
    /// 0 to see the answer).
    pub fn set_answer_within(&self, within: Duration) {
        let micros = u64::try_from(within.as_micros()).unwrap_or(u64::MAX);
        self.inner.answer_within_us.store(micros, Ordering::Relaxed);
    }

    fn answer_within(&self) -> Duration {
        Duration::from_micros(self.inner.answer_within_us.load(Ordering::Relaxed))
    }

    /// Cancels the pending send timers (their runs stay pending for the next start).
    pub fn stop(&self) {
        self.inner.timers.cancel();
    }
}
