//! The dispatcher's read-through copies of what runs need on the hot path: jobs, groups, the
//! groups' online executors, version digests and business calendars (parsed). One [`Cache`] is shared by the dispatcher and
//! the HTTP handlers (through `AppState`), so that a handler that changes a job forgets the copy
//! the dispatcher would send with.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::admin::now_ms;
use crate::model::{AddressType, Group, Job};
use crate::protocol::REGISTRY_GROUP_EXECUTOR;
use crate::schedule::calendar::Calendar;
use crate::storage::Db;

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
/// How many times the read of missing jobs lets the tasks ready to run ask for theirs too.
const MISS_GATHER_ROUNDS: usize = 4;
/// The most cached jobs or groups before a cache starts over.
const MAX_CACHED: usize = 200_000;

/// A cached copy and when it was read (ms).
type Cached<T> = (i64, T);

/// A job as read for a caller whose copy was missing or expired; an error as its message,
/// which every caller of the read gets.
type MissAnswer = Result<Option<Arc<Job>>, String>;

/// Jobs, groups, online executors and version digests as read recently. Cheap to clone.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    /// An executor is online if it beat within this long (ms).
    online_window_ms: i64,
    /// Module digests by (job, version): versions are immutable, so entries never go stale.
    versions: Mutex<HashMap<(i64, i64), String>>,
    /// Online addresses by application name, with when they were read.
    online: Mutex<HashMap<String, Cached<Vec<String>>>>,
    /// Jobs, with when they were read.
    jobs: Mutex<HashMap<i64, Cached<Option<Arc<Job>>>>>,
    /// Jobs in use whose copy is older than [`REFRESH_AFTER_MS`], to be read again together.
    refresh: Mutex<HashSet<i64>>,
    /// Whether a task is about to read `refresh`.
    refreshing: AtomicBool,
    /// Callers waiting for jobs they found no fresh copy of, by job, to be read together.
    misses: Mutex<HashMap<i64, Vec<oneshot::Sender<MissAnswer>>>>,
    /// Whether a task is about to read `misses`.
    reading_misses: AtomicBool,
    /// Groups, with when they were read.
    groups: Mutex<HashMap<i64, Cached<Option<Group>>>>,
    /// Groups being read again in the background.
    refreshing_groups: Mutex<HashSet<i64>>,
    /// Held by the one caller that reads a group no copy is cached of: the others wait for its
    /// copy instead of each reading it.
    group_miss: tokio::sync::Mutex<()>,
    /// Calendars by name, parsed, with when they were read.
    calendars: Mutex<HashMap<String, Cached<Option<Arc<Calendar>>>>>,
}

impl Cache {
    /// A cache over `db`; an executor is online if it beat within `online_window_ms`.
    pub fn new(db: Db, online_window_ms: i64) -> Cache {
        let inner = Inner {
            db,
            online_window_ms,
            versions: Mutex::default(),
            online: Mutex::default(),
            jobs: Mutex::default(),
            refresh: Mutex::default(),
            refreshing: AtomicBool::new(false),
            misses: Mutex::default(),
            reading_misses: AtomicBool::new(false),
            groups: Mutex::default(),
            refreshing_groups: Mutex::default(),
            group_miss: tokio::sync::Mutex::new(()),
            calendars: Mutex::default(),
        };
        Cache { inner: Arc::new(inner) }
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
        match self.cached_job(id) {
            Some(job) => Ok(job),
            None => self.read_missing(id).await,
        }
    }

    /// Job `id` as read at most [`CACHE_TTL_MS`] ago if this cache has that copy (`Some(None)`:
    /// it did not exist), without reading it: a caller with many jobs to look up reads the
    /// missing ones together. A copy in use is read again in the background, as by
    /// [`Cache::job`].
    pub fn cached_job(&self, id: i64) -> Option<Option<Arc<Job>>> {
        let now = now_ms();
        let (read_at, job) = cached_at(&self.inner.jobs, id, now)?;
        if now - read_at >= REFRESH_AFTER_MS {
            self.refresh_job(id);
        }
        Some(job)
    }

    /// Reads job `id`, which has no fresh copy, with the other jobs missed at the same moment:
    /// one query for them all. A callback's results are applied together, and each needs its
    /// job; the jobs firing every second are used once a second, as long as their copies last,
    /// so a copy often expires just before its next use, and each would be a query of its own.
    async fn read_missing(&self, id: i64) -> anyhow::Result<Option<Arc<Job>>> {
        let (answer, answered) = oneshot::channel();
        lock(&self.inner.misses).entry(id).or_default().push(answer);
        if !self.inner.reading_misses.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            tokio::spawn(async move { this.read_misses().await });
        }
        match answered.await {
            Ok(Ok(job)) => Ok(job),
            Ok(Err(error)) => Err(anyhow::anyhow!(error)),
            Err(_) => anyhow::bail!("the read of job {id} was abandoned"),
        }
    }

    /// Reads the jobs callers are waiting for, once the tasks ready to run have asked for
    /// theirs (no timer is waited for), remembers them and answers each caller.
    async fn read_misses(&self) {
        for _ in 0..MISS_GATHER_ROUNDS {
            tokio::task::yield_now().await;
        }
        let waiting = {
            let mut misses = lock(&self.inner.misses);
            self.inner.reading_misses.store(false, Ordering::Release);
            std::mem::take(&mut *misses)
        };
        let ids: Vec<i64> = waiting.keys().copied().collect();
        let started = now_ms();
        match self.inner.db.get_jobs(&ids).await {
            Ok(read) => {
                let mut read: HashMap<i64, Arc<Job>> =
                    read.into_iter().map(|job| (job.id, Arc::new(job))).collect();
                for (id, callers) in waiting {
                    let job = read.remove(&id);
                    remember(&self.inner.jobs, id, started, job.clone());
                    for caller in callers {
                        let _ = caller.send(Ok(job.clone()));
                    }
                }
            }
            Err(error) => {
                let error = format!("reading jobs: {error}");
                for caller in waiting.into_values().flatten() {
                    let _ = caller.send(Err(error.clone()));
                }
            }
        }
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
    ///
    /// Every run of a group needs it, so a copy in use is read again in the background once it
    /// is [`REFRESH_AFTER_MS`] old, and a group without a copy is read by one caller while the
    /// others wait for it: its expiry found hundreds of sends and results at once, and each
    /// read it (75 reads a second at 2,000 runs a second).
    pub async fn group(&self, id: i64) -> anyhow::Result<Option<Group>> {
        let now = now_ms();
        if let Some((read_at, group)) = cached_at(&self.inner.groups, id, now) {
            if now - read_at >= REFRESH_AFTER_MS {
                self.refresh_group(id);
            }
            return Ok(group);
        }
        let _reading = self.inner.group_miss.lock().await;
        let now = now_ms();
        if let Some((_, group)) = cached_at(&self.inner.groups, id, now) {
            return Ok(group);
        }
        let group = self.inner.db.get_group(id).await?;
        remember(&self.inner.groups, id, now, group.clone());
        Ok(group)
    }

    /// Has group `id` read again by a task of its own, unless one already is. A copy forgotten
    /// meanwhile (this admin changed the group) or read since the task began stays as it is.
    fn refresh_group(&self, id: i64) {
        if !lock(&self.inner.refreshing_groups).insert(id) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let started = now_ms();
            match this.inner.db.get_group(id).await {
                Ok(read) => {
                    let mut groups = lock(&this.inner.groups);
                    if let Some(entry) = groups.get_mut(&id).filter(|(at, _)| *at < started) {
                        *entry = (started, read);
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "reading a cached group again failed"
                    );
                }
            }
            lock(&this.inner.refreshing_groups).remove(&id);
        });
    }

    /// Forgets the cached copy of group `id`: call it after changing the group.
    pub fn forget_group(&self, id: i64) {
        if let Ok(mut groups) = self.inner.groups.lock() {
            groups.remove(&id);
        }
    }

    /// Calendar `name`, parsed, as read at most [`CACHE_TTL_MS`] ago (`None`: it does not
    /// exist, or no longer parses, which is logged).
    pub async fn calendar(&self, name: &str) -> anyhow::Result<Option<Arc<Calendar>>> {
        let now = now_ms();
        let cached = self.inner.calendars.lock().ok().and_then(|calendars| {
            let (read_at, calendar) = calendars.get(name)?;
            (now - read_at < CACHE_TTL_MS && *read_at <= now).then(|| calendar.clone())
        });
        if let Some(calendar) = cached {
            return Ok(calendar);
        }
        let record = self.inner.db.get_calendar(name).await?;
        let calendar = record.and_then(|record| match Calendar::parse(&record.spec) {
            Ok(calendar) => Some(Arc::new(calendar)),
            Err(error) => {
                tracing::error!(%error, "calendar `{name}` no longer parses");
                None
            }
        });
        if let Ok(mut calendars) = self.inner.calendars.lock() {
            if calendars.len() >= MAX_CACHED {
                calendars.clear();
            }
            calendars.insert(name.to_owned(), (now, calendar.clone()));
        }
        Ok(calendar)
    }

    /// Forgets the cached copy of calendar `name`: call it after changing the calendar.
    pub fn forget_calendar(&self, name: &str) {
        if let Ok(mut calendars) = self.inner.calendars.lock() {
            calendars.remove(name);
        }
    }

    /// Forgets the cached copy of job `id`: call it after changing the job.
    pub fn forget_job(&self, id: i64) {
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            jobs.remove(&id);
        }
    }

    /// The digest of version `version` of job `job_id`.
    pub async fn version_digest(
        &self,
        job_id: i64,
        version: i64,
    ) -> anyhow::Result<Option<String>> {
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
}

/// The entry `id` of `cache`, with when it was read, if that was within [`CACHE_TTL_MS`] of
/// `now_ms`.
fn cached_at<T: Clone>(
    cache: &Mutex<HashMap<i64, Cached<T>>>,
    id: i64,
    now_ms: i64,
) -> Option<Cached<T>> {
    let cache = cache.lock().ok()?;
    let (read_at, value) = cache.get(&id)?;
    (now_ms - read_at < CACHE_TTL_MS && *read_at <= now_ms).then(|| (*read_at, value.clone()))
}

/// `mutex`, locked even if a panic poisoned it: what it guards is only ever swapped whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn remember<T>(cache: &Mutex<HashMap<i64, Cached<T>>>, id: i64, now_ms: i64, value: T) {
    if let Ok(mut cache) = cache.lock() {
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(id, (now_ms, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        BlockStrategy, GlueType, JobSpec, MisfireStrategy, RouteStrategy, ScheduleType,
        ShardingStrategy,
    };

    /// The name of job `id` in the cache, or `None` when it holds no copy.
    fn cached_name(cache: &Cache, id: i64) -> Option<Option<String>> {
        let jobs = cache.inner.jobs.lock().unwrap();
        jobs.get(&id).map(|(_, job)| job.as_ref().map(|job| job.spec.name.clone()))
    }

    /// A cache over a new SQLite database in `dir`, and the id of its one group.
    async fn cache_on_sqlite(dir: &tempfile::TempDir) -> (Db, Cache, i64) {
        let url = format!("sqlite:{}", dir.path().join("cache.db").display());
        let db = Db::connect(&url).await.unwrap();
        let cache = Cache::new(db.clone(), 90_000);
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        (db, cache, group.id)
    }

    /// A job of `group_id` that never fires.
    fn job_spec(group_id: i64) -> JobSpec {
        JobSpec {
            group_id,
            name: String::new(),
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
            retry_interval_secs: 0,
            retry_backoff: crate::model::RetryBackoff::Fixed,
            retry_max_interval_secs: 0,
            max_concurrent_runs: 0,
            calendar: None,
            description: String::new(),
            owner: String::new(),
        }
    }

    #[tokio::test]
    async fn jobs_in_use_are_read_again_together_before_their_copies_expire() {
        let dir = tempfile::tempdir().unwrap();
        let (db, cache, group_id) = cache_on_sqlite(&dir).await;
        let spec = JobSpec { name: "first".to_owned(), ..job_spec(group_id) };
        let (one, two) =
            (db.create_job(&spec, 1).await.unwrap(), db.create_job(&spec, 1).await.unwrap());
        for job in [&one, &two] {
            assert_eq!(cache.job(job.id).await.unwrap().unwrap().spec.name, "first");
        }
        // Another admin renames one and deletes the other.
        let renamed = JobSpec { name: "renamed".to_owned(), ..spec.clone() };
        db.update_job(one.id, &renamed, 0, 2).await.unwrap().unwrap();
        assert!(db.delete_job(two.id).await.unwrap());
        // Copies half as old as they may get are still served, and both are read again together.
        let half_old = now_ms() - REFRESH_AFTER_MS;
        for (read_at, _) in cache.inner.jobs.lock().unwrap().values_mut() {
            *read_at = half_old;
        }
        assert_eq!(cache.job(one.id).await.unwrap().unwrap().spec.name, "first");
        assert_eq!(cache.job(two.id).await.unwrap().unwrap().spec.name, "first");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cached_name(&cache, two.id) != Some(None) {
            assert!(std::time::Instant::now() < deadline, "the copies were not read again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cached_name(&cache, one.id), Some(Some("renamed".to_owned())));
        // A copy this admin forgot (it changed the job) is not brought back by a read that
        // began before the change.
        cache.forget_job(one.id);
        cache.refresh_jobs(&[one.id]).await.unwrap();
        assert_eq!(cached_name(&cache, one.id), None);
    }

    // On one thread, so that every ask misses before the read task runs: on several, the read
    // may start while the asks are still being made, and take only those made by then.
    #[tokio::test]
    async fn jobs_missed_at_once_are_read_together_and_each_caller_gets_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (db, cache, group_id) = cache_on_sqlite(&dir).await;
        let mut ids = Vec::new();
        for name in ["a", "b", "c"] {
            let spec = JobSpec { name: name.to_owned(), ..job_spec(group_id) };
            ids.push(db.create_job(&spec, 1).await.unwrap().id);
        }
        assert!(db.delete_job(ids[2]).await.unwrap());
        let asked = [ids[0], ids[1], ids[2], ids[0], ids[1], 999_999];
        let read = futures_util::future::join_all(asked.iter().map(|id| cache.job(*id))).await;
        let names: Vec<Option<String>> =
            read.into_iter().map(|job| job.unwrap().map(|job| job.spec.name.clone())).collect();
        let name = |name: &str| Some(name.to_owned());
        assert_eq!(names, [name("a"), name("b"), None, name("a"), name("b"), None]);
        // Every answer is remembered, the missing jobs as missing, from the one read.
        let jobs = cache.inner.jobs.lock().unwrap();
        let read_at: HashSet<i64> = asked.iter().map(|id| jobs[id].0).collect();
        assert_eq!(read_at.len(), 1, "the jobs were not read together: {read_at:?}");
        assert!(jobs[&ids[2]].1.is_none() && jobs[&999_999].1.is_none());
        assert!(lock(&cache.inner.misses).is_empty());
    }

    #[tokio::test]
    async fn a_group_in_use_is_read_again_before_its_copy_expires() {
        let dir = tempfile::tempdir().unwrap();
        let (db, cache, group_id) = cache_on_sqlite(&dir).await;
        let title = |cache: &Cache| {
            let groups = cache.inner.groups.lock().unwrap();
            groups.get(&group_id).map(|(_, group)| group.as_ref().map(|g| g.title.clone()))
        };
        // Callers that find no copy at once all get the group, and one copy is remembered.
        let asked = futures_util::future::join_all((0..8).map(|_| cache.group(group_id))).await;
        assert!(asked.iter().all(|group| group.as_ref().unwrap().as_ref().unwrap().id == group_id));
        assert_eq!(title(&cache), Some(Some("Default".to_owned())));
        assert!(cache.group(999_999).await.unwrap().is_none());
        // Another admin renames it; a copy half as old as it may get is still served, and read
        // again in the background.
        db.update_group(group_id, "Renamed", AddressType::Auto, &[], 0, 2).await.unwrap().unwrap();
        let half_old = now_ms() - REFRESH_AFTER_MS;
        for (read_at, _) in cache.inner.groups.lock().unwrap().values_mut() {
            *read_at = half_old;
        }
        assert_eq!(cache.group(group_id).await.unwrap().unwrap().title, "Default");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while title(&cache) != Some(Some("Renamed".to_owned())) {
            assert!(std::time::Instant::now() < deadline, "the group was not read again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while !lock(&cache.inner.refreshing_groups).is_empty() {
            assert!(std::time::Instant::now() < deadline, "the group's refresh did not end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A copy this admin forgot (it changed the group) is not brought back by a refresh.
        for (read_at, _) in cache.inner.groups.lock().unwrap().values_mut() {
            *read_at = half_old;
        }
        cache.group(group_id).await.unwrap();
        cache.forget_group(group_id);
        while !lock(&cache.inner.refreshing_groups).is_empty() {
            assert!(std::time::Instant::now() < deadline, "the group's refresh did not end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(title(&cache), None);
    }
}
