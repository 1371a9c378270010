//! Every storage function, on SQLite always and on PostgreSQL when `WASMJOB_TEST_POSTGRES_URL`
//! is set (each test gets its own fresh database there).

use super::*;
use crate::model::{
    AddressType, BlockStrategy, GlueType, JobSpec, MisfireStrategy, RouteStrategy, ScheduleType,
    TriggerType,
};

/// Runs `test` against each available backend.
async fn each_backend<F, Fut>(name: &str, test: F)
where
    F: Fn(Db) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("test.db").display());
    test(Db::connect(&url).await.unwrap()).await;

    let Some(url) = super::testing::postgres_database(name).await.unwrap() else {
        eprintln!("{name}: WASMJOB_TEST_POSTGRES_URL is unset, skipping PostgreSQL");
        return;
    };
    let db = Db::connect(&url).await.unwrap();
    test(db.clone()).await;
    db.close().await;
    super::testing::drop_postgres_database(&url).await.unwrap();
}

fn new_job(group_id: i64) -> JobSpec {
    JobSpec {
        group_id,
        name: "nightly".to_owned(),
        schedule_type: ScheduleType::Cron,
        schedule_conf: "0 0 3 * * ?".to_owned(),
        time_zone: Some("Europe/Berlin".to_owned()),
        misfire_strategy: MisfireStrategy::DoNothing,
        route_strategy: RouteStrategy::Round,
        block_strategy: BlockStrategy::SerialExecution,
        timeout_secs: 30,
        retry_count: 2,
        glue_type: GlueType::GlueWasm,
        handler: None,
        param: "p".to_owned(),
        child_job_ids: vec![7, 8],
        alarm_email: None,
        fuel_limit: Some(1000),
        memory_limit_mb: None,
    }
}

fn fire(job_id: i64, at: i64, shard_index: i64) -> NewRun {
    NewRun {
        job_id,
        trigger_type: TriggerType::Cron,
        trigger_time_ms: at,
        fire_time_ms: Some(at),
        param: "p".to_owned(),
        executor_address: None,
        shard_index,
        shard_total: 1,
        attempt: 0,
        version: None,
    }
}

#[tokio::test]
async fn groups_and_registry() {
    each_backend("groups", |db| async move {
        let group = db
            .create_group(
                "billing",
                "Billing",
                AddressType::Manual,
                &["http://a:9999".to_owned()],
                1,
            )
            .await
            .unwrap();
        assert_eq!(group.addresses, vec!["http://a:9999"]);
        let dup = db.create_group("billing", "Again", AddressType::Auto, &[], 2).await.unwrap_err();
        assert!(dup.is_constraint_violation(), "{dup}");
        let first = db.ensure_group("default", "Default", 3).await.unwrap();
        let again = db.ensure_group("default", "Other title", 4).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(db.list_groups().await.unwrap().len(), 2);
        assert_eq!(db.get_group(group.id).await.unwrap(), Some(group));
        assert_eq!(db.get_group(999).await.unwrap(), None);

        db.upsert_registration("EXECUTOR", "default", "http://b:9999", 100).await.unwrap();
        db.upsert_registration("EXECUTOR", "default", "http://a:9999", 100).await.unwrap();
        db.upsert_registration("EXECUTOR", "default", "http://a:9999", 200).await.unwrap();
        assert_eq!(
            db.online_addresses("EXECUTOR", "default", 100).await.unwrap(),
            ["http://a:9999", "http://b:9999"]
        );
        assert_eq!(
            db.online_addresses("EXECUTOR", "default", 150).await.unwrap(),
            ["http://a:9999"]
        );
        assert_eq!(db.remove_stale_registrations(150).await.unwrap(), 1);
        db.remove_registration("EXECUTOR", "default", "http://a:9999").await.unwrap();
        assert!(db.list_registrations("EXECUTOR").await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn jobs_fire_once() {
    each_backend("jobs", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        assert_eq!(
            (job.running, job.spec.child_job_ids.clone(), job.spec.fuel_limit),
            (false, vec![7, 8], Some(1000))
        );
        assert!(db.due_jobs(i64::MAX, 10).await.unwrap().is_empty());

        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        assert_eq!(db.earliest_fire().await.unwrap(), Some(1_000));
        assert_eq!(db.due_jobs(999, 10).await.unwrap().len(), 0);
        assert_eq!(db.due_jobs(1_000, 10).await.unwrap().len(), 1);

        // Two schedulers that both saw the fire at 1000: only the first moves the job.
        let ids =
            db.fire_job(job.id, 1_000, Some(2_000), &[fire(job.id, 1_000, 0)], 12).await.unwrap();
        assert_eq!(ids.len(), 1);
        let late =
            db.fire_job(job.id, 1_000, Some(2_000), &[fire(job.id, 1_000, 0)], 12).await.unwrap();
        assert!(late.is_empty());
        // Even a scheduler that moved the job itself cannot create the same fire twice.
        db.set_job_running(job.id, Some(1_000), 13).await.unwrap();
        let again =
            db.fire_job(job.id, 1_000, Some(2_000), &[fire(job.id, 1_000, 0)], 14).await.unwrap();
        assert!(again.is_empty());
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().next_fire_ms, 2_000);
        // A fire with no next fire stops the job.
        db.fire_job(job.id, 2_000, None, &[fire(job.id, 2_000, 0)], 15).await.unwrap();
        let stopped = db.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((stopped.running, stopped.next_fire_ms), (false, 0));

        let mut changed = new_job(group.id);
        changed.name = "renamed".to_owned();
        let updated = db.update_job(job.id, &changed, 5_000, 16).await.unwrap().unwrap();
        assert_eq!((updated.spec.name.as_str(), updated.next_fire_ms), ("renamed", 0));
        assert!(db.update_job(999, &changed, 0, 16).await.unwrap().is_none());
        assert_eq!(db.list_jobs(Some(group.id)).await.unwrap().len(), 1);
        assert_eq!(db.list_jobs(Some(group.id + 1)).await.unwrap().len(), 0);
        assert!(db.delete_job(job.id).await.unwrap());
        assert!(!db.delete_job(job.id).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn versions_share_blobs() {
    each_backend("versions", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let v1 = db.add_job_version(job.id, "aa", b"\0asm-one", "first", 20).await.unwrap();
        let v2 = db.add_job_version(job.id, "bb", b"\0asm-two", "second", 21).await.unwrap();
        let v3 = db.add_job_version(job.id, "aa", b"\0asm-one", "first again", 22).await.unwrap();
        assert_eq!((v1.version, v2.version, v3.version), (1, 2, 3));
        assert_eq!(db.count_modules().await.unwrap(), 2);
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().active_version, Some(3));
        assert!(db.activate_job_version(job.id, 2, 23).await.unwrap());
        assert!(!db.activate_job_version(job.id, 9, 23).await.unwrap());
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().active_version, Some(2));
        let listed: Vec<i64> =
            db.list_job_versions(job.id).await.unwrap().iter().map(|v| v.version).collect();
        assert_eq!(listed, [3, 2, 1]);
        assert_eq!(db.get_job_version(job.id, 2).await.unwrap(), Some(v2));
        assert_eq!(db.get_module("bb").await.unwrap().as_deref(), Some(&b"\0asm-two"[..]));
        assert_eq!(db.get_module("cc").await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn runs_are_claimed_and_finished_once() {
    each_backend("runs", |db| async move {
        let mut manual = fire(1, 500, 0);
        manual.trigger_type = TriggerType::Manual;
        manual.fire_time_ms = None;
        let a = db.create_run(&manual, 1).await.unwrap().unwrap();
        let b = db.create_run(&manual, 1).await.unwrap().unwrap();
        assert_ne!(a, b, "manual runs have no fire key and never collide");
        assert!(db.create_run(&fire(1, 600, 0), 1).await.unwrap().is_some());
        assert!(db.create_run(&fire(1, 600, 0), 1).await.unwrap().is_none());
        assert!(db.create_run(&fire(1, 600, 1), 1).await.unwrap().is_some());

        assert_eq!(db.pending_runs(550, 100, 10).await.unwrap(), [a, b]);
        let claimed = db.claim_run(a, 100, 50).await.unwrap().unwrap();
        assert_eq!((claimed.id, claimed.trigger_type), (a, TriggerType::Manual));
        assert!(db.claim_run(a, 101, 50).await.unwrap().is_none(), "claimed already");
        assert!(db.claim_run(a, 200, 150).await.unwrap().is_some(), "a stale claim expires");
        db.set_trigger_result(a, Some("http://a:9999"), 200, "sent").await.unwrap();
        assert!(db.claim_run(a, 300, 300).await.unwrap().is_none(), "sent runs are not pending");
        db.finish_run(b, 500, "killed before it was sent", None, 300).await.unwrap();
        assert!(
            db.claim_run(b, 300, 300).await.unwrap().is_none(),
            "finished runs are not pending"
        );
        assert_eq!(db.pending_runs(550, 301, 10).await.unwrap(), Vec::<i64>::new());

        assert_eq!(
            db.unfinished_runs(501, 10).await.unwrap().iter().map(|r| r.id).collect::<Vec<_>>(),
            [a]
        );
        assert!(db.unfinished_runs(500, 10).await.unwrap().is_empty());
        let done = db.finish_run(a, 200, "ok", Some(6000), 400).await.unwrap().unwrap();
        assert_eq!(done.fuel_used, Some(6000));
        assert_eq!(
            (done.handle_code, done.handle_msg.as_str(), done.handle_time_ms),
            (200, "ok", 400)
        );
        assert!(db.finish_run(a, 500, "late duplicate", None, 401).await.unwrap().is_none());
        assert_eq!(db.get_run(a).await.unwrap().unwrap().handle_msg, "ok");

        let all = db
            .list_runs(&RunFilter { job_id: Some(1), handle_code: None, limit: 2, offset: 0 })
            .await
            .unwrap();
        assert_eq!((all.total, all.items.len()), (4, 2));
        let ok = db
            .list_runs(&RunFilter { job_id: Some(1), handle_code: Some(200), limit: 10, offset: 0 })
            .await
            .unwrap();
        assert_eq!(ok.items.iter().map(|r| r.id).collect::<Vec<_>>(), [a]);
    })
    .await;
}
