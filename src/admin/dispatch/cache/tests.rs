//! The cache's copies: read together, checked again by their stamps, kept and forgotten.

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
pub(in crate::admin::dispatch) fn job_spec(group_id: i64) -> JobSpec {
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

/// A check of the jobs in use keeps the copy of a job that was only fired, and reads again
/// one changed through another admin: in the same millisecond as the copy was read, or by
/// an admin of an earlier build, which sets `updated_at` but not the revision.
#[tokio::test]
async fn a_copy_checked_again_is_kept_unless_its_job_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (db, cache, group_id) = cache_on_sqlite(&dir).await;
    let spec = JobSpec { name: "first".to_owned(), ..job_spec(group_id) };
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = db.create_job(&spec, 1).await.unwrap().id;
        assert!(db.set_job_running(id, Some(1_000), 2).await.unwrap());
        ids.push(id);
    }
    let [fired, edited, by_earlier_build] = ids[..] else { unreachable!() };
    let copies: Vec<Arc<Job>> = futures_util::future::join_all(ids.iter().map(|id| cache.job(*id)))
        .await
        .into_iter()
        .map(|job| job.unwrap().unwrap())
        .collect();
    let fire = db.fire_job(fired, 1_000, crate::schedule::NextFire::At(2_000), &[], 3);
    fire.await.unwrap();
    let renamed = JobSpec { name: "renamed".to_owned(), ..spec.clone() };
    db.update_job(edited, &renamed, 1_000, copies[1].updated_at_ms).await.unwrap().unwrap();
    let url = format!("sqlite:{}", dir.path().join("cache.db").display());
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await;
    let pool = pool.unwrap();
    let earlier_build = "update jobs set name = 'renamed', updated_at = updated_at + 1 \
                         where id = $1 returning id";
    crate::storage::testing::fetch_all(&pool, earlier_build, &[by_earlier_build]).await.unwrap();
    pool.close().await;

    let half_old = now_ms() - REFRESH_AFTER_MS;
    for (read_at, _) in cache.inner.jobs.lock().unwrap().values_mut() {
        *read_at = half_old;
    }
    cache.refresh_jobs(&ids).await.unwrap();
    let renamed_copy = {
        let jobs = cache.inner.jobs.lock().unwrap();
        let copy = |id: i64| jobs[&id].1.clone().unwrap();
        assert!(
            Arc::ptr_eq(&copy(fired), &copies[0]),
            "the copy of a job only fired was read again"
        );
        assert!(jobs[&fired].0 > half_old, "the kept copy is not fresh again");
        assert_eq!(
            copy(edited).spec.name,
            "renamed",
            "a change in the same millisecond was missed"
        );
        assert_eq!(
            copy(by_earlier_build).spec.name,
            "renamed",
            "an earlier build's change was missed"
        );
        copy(edited)
    };

    // A copy that expired is checked the same way when a caller asks for its job: kept if the
    // job did not change, read again if it did.
    let retitled = JobSpec { name: "retitled".to_owned(), ..spec.clone() };
    db.update_job(edited, &retitled, 1_000, 5).await.unwrap().unwrap();
    let expired = now_ms() - CACHE_TTL_MS - 1;
    for (read_at, _) in cache.inner.jobs.lock().unwrap().values_mut() {
        *read_at = expired;
    }
    let asked = futures_util::future::join_all([fired, edited].map(|id| cache.job(id))).await;
    let [kept, read] = [0, 1].map(|at| asked[at].as_ref().unwrap().clone().unwrap());
    assert!(Arc::ptr_eq(&kept, &copies[0]), "the expired copy of an unchanged job was read again");
    assert!(!Arc::ptr_eq(&read, &renamed_copy) && read.spec.name == "retitled");
    assert!(cache.inner.jobs.lock().unwrap()[&fired].0 > expired, "the kept copy is not fresh");
}

/// The scheduler's due read confirms a copy by the stamp it read: the copy, however old,
/// counts as read then and is served without a read of its own; a copy with another stamp,
/// or of a job known to be missing, is not confirmed and stays as it was.
#[tokio::test]
async fn a_copy_confirmed_by_its_stamp_counts_as_read_then() {
    let dir = tempfile::tempdir().unwrap();
    let (db, cache, group_id) = cache_on_sqlite(&dir).await;
    let spec = JobSpec { name: "first".to_owned(), ..job_spec(group_id) };
    let id = db.create_job(&spec, 1).await.unwrap().id;
    let copy = cache.job(id).await.unwrap().unwrap();
    let expired = now_ms() - CACHE_TTL_MS - 1;
    let read_at = |cache: &Cache| cache.inner.jobs.lock().unwrap()[&id].0;
    cache.inner.jobs.lock().unwrap().get_mut(&id).unwrap().0 = expired;
    let stamp = |db: Db| async move { db.job_stamps(&[id]).await.unwrap()[0].1 };

    let now = now_ms();
    let read = stamp(db.clone()).await;
    let confirmed = cache.confirmed_job(id, now, |job| JobStamp::of(job) == read).unwrap();
    assert!(Arc::ptr_eq(&confirmed, &copy));
    assert_eq!(read_at(&cache), now);
    // An earlier confirmation does not make the copy older.
    assert!(cache.confirmed_job(id, now - 10, |job| JobStamp::of(job) == read).is_some());
    assert_eq!(read_at(&cache), now);
    // Served as fresh: no read of it is asked for.
    assert!(Arc::ptr_eq(&cache.cached_job(id).unwrap().unwrap(), &copy));
    assert!(lock(&cache.inner.refresh).is_empty(), "a confirmed copy was read again");

    // Another admin renames the job: the stamp read now does not confirm the copy.
    let renamed = JobSpec { name: "renamed".to_owned(), ..spec.clone() };
    db.update_job(id, &renamed, 0, 2).await.unwrap().unwrap();
    let changed = stamp(db.clone()).await;
    assert_ne!(changed, read);
    assert!(cache.confirmed_job(id, now + 10, |job| JobStamp::of(job) == changed).is_none());
    assert_eq!(read_at(&cache), now);
    // Nor is a job known to be missing, nor one of which no copy is held.
    assert!(db.delete_job(id).await.unwrap());
    cache.forget_job(id);
    assert!(cache.job(id).await.unwrap().is_none());
    assert!(cache.confirmed_job(id, now_ms(), |_| true).is_none());
    assert!(cache.confirmed_job(999_999, now_ms(), |_| true).is_none());
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
