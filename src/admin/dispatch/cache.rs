//! The dispatcher's read-through copies of what runs need on the hot path: jobs, groups, the
//! groups' online executors, version digests and business calendars (parsed). One [`Cache`] is
//! shared by the dispatcher and the HTTP handlers (through `AppState`), so that a handler that
//! changes a job forgets the copy the dispatcher would send with.

use foldhash::{HashMap, HashMapExt, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::admin::now_ms;
use crate::model::{AddressType, Group, Job};
use crate::protocol::REGISTRY_GROUP_EXECUTOR;
use crate::schedule::calendar::Calendar;
use crate::storage::{Db, JobStamp};

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
/// A job whose copy is this old when it is used is checked again in the background, together
/// with the other jobs in use, while its copy is still served: a job in use is checked once per
/// interval with the others, instead of read by each of the many callers that find its copy
/// expired at once (a thousand jobs triggered every second were a thousand reads a second, a
/// twentieth of the admin's time). The check reads each job's stamp, and the whole job only if
/// it changed.
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
    /// Jobs in use whose copy is older than [`REFRESH_AFTER_MS`], to be checked again together.
    refresh: Mutex<HashSet<i64>>,
    /// Whether a task is about to read `refresh`.
    refreshing: AtomicBool,
    /// Callers waiting for jobs they found no fresh copy of, by job, to be read together.
    misses: Mutex<HashMap<i64, Vec<oneshot::Sender<MissAnswer>>>>,
    /// Whether a task is about to read `misses`.
    reading_misses: AtomicBool,
    /// Groups, with when they were read.
    groups: Mutex<HashMap<i64, Cached<Option<Arc<Group>>>>>,
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

    /// The addresses runs of `group` may go to now: heartbeats for `AUTO`, configuration for
    /// `MANUAL`.
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

    /// Job `id` as it was at most [`CACHE_TTL_MS`] ago (`None`: it does not exist), shared with
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

    /// The copy of job `id` this cache holds, however old, if `is_current` finds it current as
    /// of `read_at` (ms): the copy then counts as read at `read_at`, unless it was read later,
    /// and no read of it is asked for. The scheduler's pass reads each due job's stamp, and
    /// a job that fires every second is sent, and its result applied, right after the pass
    /// that read its next fire; without this, each of its fires found its copy nearly a second
    /// old and read the stamp again.
    pub fn confirmed_job(
        &self,
        id: i64,
        read_at: i64,
        is_current: impl FnOnce(&Job) -> bool,
    ) -> Option<Arc<Job>> {
        let mut jobs = lock(&self.inner.jobs);
        let (copy_read_at, Some(job)) = jobs.get_mut(&id)? else { return None };
        if !is_current(job) {
            return None;
        }
        *copy_read_at = (*copy_read_at).max(read_at);
        Some(job.clone())
    }

    /// Reads job `id`, which has no fresh copy, with the other jobs missed at the same moment
    /// ([`Cache::current_jobs`]: their stamps, and the whole of those that changed, for them
    /// all). A callback's results are applied together, and each needs its job; the jobs
    /// firing every second are used once a second, as long as their copies last, so a copy
    /// often expires just before its next use, and each would be a query of its own.
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
        match self.current_jobs(&ids).await {
            Ok(mut current) => {
                for (id, callers) in waiting {
                    let job = current.remove(&id).flatten();
                    remember(&self.inner.jobs, id, started, job.clone());
                    for caller in callers {
                        let _ = caller.send(Ok(job.clone()));
                    }
                }
            }
            Err(error) => {
                let error = format!("reading jobs: {error:#}");
                for caller in waiting.into_values().flatten() {
                    let _ = caller.send(Err(error.clone()));
                }
            }
        }
    }

    /// Jobs `ids` as they are now (`None`: it does not exist): the copy this cache holds of
    /// each, however old, where the job's stamp is still the copy's, else the job read whole.
    /// Two queries at most: the stamps of the jobs a copy is held of, and every column of the
    /// others and of those whose stamp changed. Most jobs in use are moved by their fires and
    /// changed by nobody, so their copies stand for another while on two numbers read each; a
    /// copy that expired between two uses (a job used once a second, its copy kept a second)
    /// is checked as one still fresh is.
    async fn current_jobs(&self, ids: &[i64]) -> anyhow::Result<HashMap<i64, Option<Arc<Job>>>> {
        let copies: HashMap<i64, Option<Arc<Job>>> = {
            let jobs = lock(&self.inner.jobs);
            ids.iter().filter_map(|id| Some((*id, jobs.get(id)?.1.clone()))).collect()
        };
        let mut current = HashMap::with_capacity(ids.len());
        if !copies.is_empty() {
            let held: Vec<i64> = copies.keys().copied().collect();
            let stamps: HashMap<i64, JobStamp> =
                self.inner.db.job_stamps(&held).await?.into_iter().collect();
            for (id, copy) in copies {
                if copy.as_deref().map(JobStamp::of) == stamps.get(&id).copied() {
                    current.insert(id, copy);
                }
            }
        }
        let rest: Vec<i64> = ids.iter().filter(|id| !current.contains_key(id)).copied().collect();
        if !rest.is_empty() {
            let read = self.inner.db.get_jobs(&rest).await?;
            let mut read: HashMap<i64, Job> = read.into_iter().map(|job| (job.id, job)).collect();
            for id in rest {
                current.insert(id, read.remove(&id).map(Arc::new));
            }
        }
        Ok(current)
    }

    /// Has job `id` checked again, with the other jobs asked for meanwhile, by a task that waits
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

    /// Reads jobs `ids` again into the copies still cached ([`Cache::current_jobs`]: a copy
    /// whose job's stamp did not change stands for another while). A copy forgotten meanwhile
    /// (this admin changed the job) or read since this read began stays as it is; every copy
    /// stored is the job as it was at or after that instant.
    async fn refresh_jobs(&self, ids: &[i64]) -> anyhow::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let started = now_ms();
        let mut current = self.current_jobs(ids).await?;
        let mut jobs = lock(&self.inner.jobs);
        for id in ids {
            if let Some(entry) = jobs.get_mut(id).filter(|(read_at, _)| *read_at < started) {
                *entry = (started, current.remove(id).flatten());
            }
        }
        Ok(())
    }

    /// Group `id` as read at most [`CACHE_TTL_MS`] ago (`None`: it does not exist).
    ///
    /// Every run of a group needs it, so a copy in use is read again in the background once it
    /// is [`REFRESH_AFTER_MS`] old, and a group without a copy is read by one caller while the
    /// others wait for it: its expiry found hundreds of sends and results at once, and each
    /// read it (75 reads a second at 2,000 runs a second). A copy is shared, not cloned: a run
    /// asks for its group three times.
    pub async fn group(&self, id: i64) -> anyhow::Result<Option<Arc<Group>>> {
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
        let group = self.inner.db.get_group(id).await?.map(Arc::new);
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
                        *entry = (started, read.map(Arc::new));
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
pub(super) mod tests;
