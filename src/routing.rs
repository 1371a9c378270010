//! Executor routing: which online executor(s) one trigger of a job is sent to.
//!
//! This is the admin's half of XXL-JOB's route strategies (`com.xxl.job.admin.core.route.
//! strategy.*`). Given a job's [`RouteStrategy`], its id and its group's online addresses,
//! [`RouterState::route`] answers with a [`Route`]. The trigger code keeps one [`RouterState`]
//! behind a mutex because ROUND, LEAST_FREQUENTLY_USED and LEAST_RECENTLY_USED remember per-job
//! state between triggers, as XXL-JOB's static maps do, and forget all of it every 24 hours.
//! CONSISTENT_HASH places jobs exactly where XXL-JOB would for the same addresses.
//! `sharding` spreads ElasticJob-style sharding items over executors (and, unlike the route
//! strategies, sorts the addresses itself, since ElasticJob's answers depend on that order).
//!
//! What it deliberately does not do: no IO, no clock and no global randomness. The current time
//! and the random source are parameters, so tests replay exactly. FAILOVER and BUSYOVER need
//! `/beat` and `/idleBeat` calls, so they come back as [`Route::FirstPassing`] and the caller
//! probes. It does not sort, deduplicate or filter addresses either: the caller passes the
//! group's online addresses in a stable order, and that order is what FIRST, LAST, ROUND, the
//! LFU tie-break and SHARDING_BROADCAST index into.
#![warn(missing_docs)]

mod consistent_hash;
mod least_used;
pub mod sharding;

use std::collections::HashMap;

use rand::{Rng, RngCore};

use crate::model::RouteStrategy;

/// How long per-job state lives before the whole cache is dropped (XXL-JOB's
/// `CACHE_VALID_TIME` step: 24 hours).
const CACHE_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;

/// A ROUND counter or LFU count above this starts over from a random value, as in XXL-JOB.
const COUNT_RESET_ABOVE: usize = 1_000_000;

/// ROUND's first counter is drawn below this, so that jobs do not all start on the first address.
const ROUND_RANDOM_START: usize = 100;

/// Where a trigger goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Send to this one address.
    One(String),
    /// Probe these addresses in order and send to the first that passes (`Probe::Beat` for
    /// FAILOVER, `Probe::IdleBeat` for BUSYOVER).
    FirstPassing {
        /// Which executor endpoint decides whether a candidate passes.
        probe: Probe,
        /// The addresses to try, in order.
        candidates: Vec<String>,
    },
    /// One run per address: (address, shard_index, shard_total).
    Broadcast(Vec<(String, u32, u32)>),
}

/// The executor endpoint a [`Route::FirstPassing`] candidate must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/beat`: the executor is alive (FAILOVER).
    Beat,
    /// `/idleBeat`: the executor is alive and not running this job (BUSYOVER).
    IdleBeat,
}

/// The per-job state ROUND, LFU and LRU keep between triggers (held by the admin behind a
/// mutex; one per admin process is fine).
#[derive(Debug, Default)]
pub struct RouterState {
    /// ROUND: the counter each job used last.
    round: JobCache<usize>,
    /// LEAST_FREQUENTLY_USED: each job's use count per address.
    lfu: JobCache<least_used::UseCounts>,
    /// LEAST_RECENTLY_USED: each job's addresses, least recently used first.
    lru: JobCache<least_used::UseOrder>,
}

impl RouterState {
    /// An empty state: every job starts fresh.
    pub fn new() -> Self {
        Self::default()
    }

    /// Picks the route for one trigger of `job_id`. `addresses` are the group's online
    /// addresses in a stable order (the caller sorts them); returns None when `addresses` is
    /// empty.
    pub fn route(
        &mut self,
        strategy: RouteStrategy,
        job_id: i64,
        addresses: &[String],
        now_ms: i64,
        rng: &mut dyn RngCore,
    ) -> Option<Route> {
        if addresses.is_empty() {
            return None;
        }
        let one = |address: &String| Route::One(address.clone());
        match strategy {
            RouteStrategy::First => addresses.first().map(one),
            RouteStrategy::Last => addresses.last().map(one),
            RouteStrategy::Round => {
                let count = self.round_count(job_id, now_ms, rng);
                addresses.get(count % addresses.len()).map(one)
            }
            RouteStrategy::Random => addresses.get(rng.random_range(0..addresses.len())).map(one),
            RouteStrategy::ConsistentHash => consistent_hash::pick(job_id, addresses).map(one),
            RouteStrategy::LeastFrequentlyUsed => {
                let counts = self.lfu.jobs(now_ms).entry(job_id).or_default();
                least_used::least_frequently_used(counts, addresses, rng).map(Route::One)
            }
            RouteStrategy::LeastRecentlyUsed => {
                let order = self.lru.jobs(now_ms).entry(job_id).or_default();
                least_used::least_recently_used(order, addresses).map(Route::One)
            }
            RouteStrategy::Failover => {
                Some(Route::FirstPassing { probe: Probe::Beat, candidates: addresses.to_vec() })
            }
            RouteStrategy::Busyover => {
                Some(Route::FirstPassing { probe: Probe::IdleBeat, candidates: addresses.to_vec() })
            }
            RouteStrategy::ShardingBroadcast => {
                // A group never has 2^32 executors; if it somehow did, zipping with `0..total`
                // stops at `total` targets, so the shard total still matches the target count.
                let total = u32::try_from(addresses.len()).unwrap_or(u32::MAX);
                let targets = addresses
                    .iter()
                    .zip(0..total)
                    .map(|(address, index)| (address.clone(), index, total))
                    .collect();
                Some(Route::Broadcast(targets))
            }
        }
    }

    /// ROUND's counter for this trigger: a random start below [`ROUND_RANDOM_START`] the first
    /// time (and after passing [`COUNT_RESET_ABOVE`]), one more than last time otherwise. This
    /// is XXL-JOB's `ExecutorRouteRound.count`.
    fn round_count(&mut self, job_id: i64, now_ms: i64, rng: &mut dyn RngCore) -> usize {
        let counters = self.round.jobs(now_ms);
        let count = match counters.get(&job_id) {
            Some(&last) if last <= COUNT_RESET_ABOVE => last + 1,
            _ => rng.random_range(0..ROUND_RANDOM_START),
        };
        counters.insert(job_id, count);
        count
    }
}

/// Per-job state that is dropped wholesale once it is 24 hours old, like each of XXL-JOB's
/// strategy classes does with its own `CACHE_VALID_TIME`.
#[derive(Debug)]
struct JobCache<T> {
    /// The last instant the entries are good for; None before first use.
    valid_until_ms: Option<i64>,
    /// The state per job id.
    jobs: HashMap<i64, T>,
}

// Written out rather than derived because the derive would demand `T: Default`.
impl<T> Default for JobCache<T> {
    fn default() -> Self {
        Self { valid_until_ms: None, jobs: HashMap::new() }
    }
}

impl<T> JobCache<T> {
    /// The entries, after dropping them all if `now_ms` is past their lifetime.
    fn jobs(&mut self, now_ms: i64) -> &mut HashMap<i64, T> {
        if self.valid_until_ms.is_none_or(|until| now_ms > until) {
            self.jobs.clear();
            self.valid_until_ms = Some(now_ms.saturating_add(CACHE_LIFETIME_MS));
        }
        &mut self.jobs
    }
}

#[cfg(test)]
mod tests;
