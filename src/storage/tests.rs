//! Every storage function, on SQLite always, on PostgreSQL when `WASMJOB_TEST_POSTGRES_URL` is
//! set and on MySQL or MariaDB when `WASMJOB_TEST_MYSQL_URL` is (each test gets its own fresh
//! database there).

mod accounts;
mod alarms;
mod backfills;
mod calendars;
mod callbacks;
mod caps;
mod contention;
mod partitions;
mod plans;
mod transitions;
mod workflows;

use super::*;
use crate::lifecycle::{self, Event, JobFacts, RunFacts, Transition};
use crate::model::{
    AddressType, BlockStrategy, GlueType, Job, JobSpec, Language, MisfireStrategy, RouteStrategy,
    RunRecord, RunState, ScheduleType, ShardingItem, ShardingStrategy, TriggerType,
};
use crate::schedule::NextFire;

/// Runs `test` against each available backend.
async fn each_backend<F, Fut>(name: &str, test: F)
where
    F: Fn(Db) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("test.db").display());
    test(Db::connect(&url).await.unwrap()).await;

    match super::testing::postgres_database(name).await.unwrap() {
        Some(url) => {
            let db = Db::connect(&url).await.unwrap();
            test(db.clone()).await;
            db.close().await;
            super::testing::drop_postgres_database(&url).await.unwrap();
        }
        None => eprintln!("{name}: WASMJOB_TEST_POSTGRES_URL is unset, skipping PostgreSQL"),
    }
    match super::testing::mysql_database(name).await.unwrap() {
        Some(url) => {
            let db = Db::connect(&url).await.unwrap();
            test(db.clone()).await;
            db.close().await;
            super::testing::drop_mysql_database(&url).await.unwrap();
        }
        None => eprintln!("{name}: WASMJOB_TEST_MYSQL_URL is unset, skipping MySQL"),
    }
}

/// Every partition, as a filter: the reads of an admin alone.
fn everything() -> crate::partition::Held {
    crate::partition::Held::everything("test")
}

/// Leases every partition for `owner`, as an admin alone holds them.
async fn lease_everything(db: &Db, owner: &str) -> crate::partition::Held {
    let all: Vec<u16> = (0..crate::partition::PARTITIONS).collect();
    let fences = db.take_partitions(owner, &all, &[], 0, i64::MAX).await.unwrap();
    crate::partition::Held { owner: owner.to_owned(), fences: fences.into_iter().collect() }
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
        misfire_threshold_ms: 7_000,
        sharding_total_count: 3,
        sharding_item_parameters: "0=Beijing,2=Guangzhou".to_owned(),
        sharding_strategy: ShardingStrategy::RotateServerByName,
        alarm_silence_secs: 300,
        retry_interval_secs: 15,
        retry_backoff: crate::model::RetryBackoff::Exponential,
        retry_max_interval_secs: 600,
        max_concurrent_runs: 4,
        calendar: None,
        description: "settles the day ✓".to_owned(),
        owner: "Li Wei".to_owned(),
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
        sharding_items: Vec::new(),
        attempt: 0,
        version: None,
        parent_run_id: None,
        node: None,
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
                0,
                1,
            )
            .await
            .unwrap();
        assert_eq!(group.addresses, vec!["http://a:9999"]);
        let dup =
            db.create_group("billing", "Again", AddressType::Auto, &[], 0, 2).await.unwrap_err();
        assert!(dup.is_constraint_violation(), "{dup}");
        let first = db.ensure_group("default", "Default", 3).await.unwrap();
        let again = db.ensure_group("default", "Other title", 4).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(db.list_groups().await.unwrap().len(), 2);
        assert_eq!(db.get_group(group.id).await.unwrap().as_ref(), Some(&group));
        assert_eq!(db.get_group(999).await.unwrap(), None);
        let updated = db
            .update_group(group.id, "Billing team", AddressType::Auto, &[], 3, 5)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (updated.app_name.as_str(), updated.title.as_str(), updated.max_concurrent_runs),
            ("billing", "Billing team", 3)
        );
        assert_eq!(db.get_group(group.id).await.unwrap(), Some(updated));
        assert_eq!(db.update_group(999, "x", AddressType::Auto, &[], 0, 6).await.unwrap(), None);

        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://b:9999",
            &Peer { kind: "wasmjob", version: "" },
            100,
        )
        .await
        .unwrap();
        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://a:9999",
            &Peer { kind: "wasmjob", version: "" },
            100,
        )
        .await
        .unwrap();
        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://a:9999",
            &Peer { kind: "wasmjob", version: "0.2.0" },
            200,
        )
        .await
        .unwrap();
        assert_eq!(
            db.online_addresses("EXECUTOR", "default", 100).await.unwrap(),
            ["http://a:9999", "http://b:9999"]
        );
        assert_eq!(
            db.online_addresses("EXECUTOR", "default", 150).await.unwrap(),
            ["http://a:9999"]
        );
        // Each row says what answers there and which version it reported last.
        let rows = db.list_registrations("EXECUTOR").await.unwrap();
        let seen: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|row| (row.address.as_str(), row.peer_kind.as_str(), row.version.as_str()))
            .collect();
        assert_eq!(seen, [("http://a:9999", "wasmjob", "0.2.0"), ("http://b:9999", "wasmjob", "")]);
        assert_eq!(db.remove_stale_registrations(150).await.unwrap(), 1);
        db.remove_registration("EXECUTOR", "default", "http://a:9999").await.unwrap();
        assert!(db.list_registrations("EXECUTOR").await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_registration_keeps_what_answers_at_its_address() {
    each_backend("registered_peer", |db| async move {
        let peer = |app_name: &str, peer_kind: &str| {
            Some(RegisteredPeer { app_name: app_name.to_owned(), peer_kind: peer_kind.to_owned() })
        };
        let address = "http://a:9999";
        assert_eq!(db.registered_peer("EXECUTOR", address).await.unwrap(), None);
        db.upsert_registration(
            "EXECUTOR",
            "sample",
            address,
            &Peer { kind: "xxl-job-3.5", version: "" },
            100,
        )
        .await
        .unwrap();
        assert_eq!(
            db.registered_peer("EXECUTOR", address).await.unwrap(),
            peer("sample", "xxl-job-3.5")
        );
        // The next beat says what answers there now, even if it changed.
        db.upsert_registration(
            "EXECUTOR",
            "sample",
            address,
            &Peer { kind: "xxl-job", version: "" },
            200,
        )
        .await
        .unwrap();
        assert_eq!(
            db.registered_peer("EXECUTOR", address).await.unwrap(),
            peer("sample", "xxl-job")
        );
        // Registered for two applications, the address is what it last said.
        db.upsert_registration(
            "EXECUTOR",
            "other",
            address,
            &Peer { kind: "wasmjob", version: "" },
            300,
        )
        .await
        .unwrap();
        assert_eq!(
            db.registered_peer("EXECUTOR", address).await.unwrap(),
            peer("other", "wasmjob")
        );
        assert_eq!(db.registered_peer("EXECUTOR", "http://b:9999").await.unwrap(), None);
        assert_eq!(db.registered_peer("OTHER", address).await.unwrap(), None);
        db.remove_registration("EXECUTOR", "other", address).await.unwrap();
        db.remove_registration("EXECUTOR", "sample", address).await.unwrap();
        assert_eq!(db.registered_peer("EXECUTOR", address).await.unwrap(), None);
    })
    .await;
}

/// A copy of a job stands for it at its fire only with the same stamp; its next fire, moved by
/// every fire, is not part of it.
#[test]
fn a_due_row_matches_a_copy_only_with_the_same_stamp() {
    let job = Job {
        id: 4,
        spec: new_job(1),
        running: true,
        next_fire_ms: 1_000,
        active_version: Some(2),
        created_at_ms: 0,
        updated_at_ms: 7,
        revision: 3,
    };
    let stamp = JobStamp { revision: 3, updated_at_ms: 7 };
    let row = DueJob { id: 4, next_fire_ms: 9_000, stamp };
    assert!(row.matches(&job));
    type Change = fn(&mut DueJob);
    let changes: [(&str, Change); 3] = [
        ("id", |row| row.id = 5),
        ("revision", |row| row.stamp.revision += 1),
        ("change time", |row| row.stamp.updated_at_ms += 1),
    ];
    for (what, change) in changes {
        let mut changed = row.clone();
        change(&mut changed);
        assert!(!changed.matches(&job), "a different {what} does not match");
    }
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
        assert_eq!(job.spec, new_job(group.id), "every field round-trips");
        assert!(db.due_jobs(i64::MAX, 10, &everything()).await.unwrap().is_empty());

        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        assert_eq!(db.earliest_fire(&everything()).await.unwrap(), Some(1_000));
        assert_eq!(db.due_jobs(999, 10, &everything()).await.unwrap().len(), 0);
        // The due row has the job's stamp as stored: the job read whole stands for it.
        let due = db.due_jobs(1_000, 10, &everything()).await.unwrap();
        assert_eq!(due.len(), 1);
        let (row, stored) = (&due[0], db.get_job(job.id).await.unwrap().unwrap());
        assert_eq!((row.id, row.next_fire_ms, row.stamp), (job.id, 1_000, JobStamp::of(&stored)));
        assert!(row.matches(&stored));

        // Two schedulers that both saw the fire at 1000: only the first moves the job.
        let ids = db
            .fire_job(job.id, 1_000, NextFire::At(2_000), &[fire(job.id, 1_000, 0)], 12)
            .await
            .unwrap();
        assert_eq!(ids.len(), 1);
        let late = db
            .fire_job(job.id, 1_000, NextFire::At(2_000), &[fire(job.id, 1_000, 0)], 12)
            .await
            .unwrap();
        assert!(late.is_empty());
        // Even a scheduler that moved the job itself cannot create the same fire twice.
        db.set_job_running(job.id, Some(1_000), 13).await.unwrap();
        let again = db
            .fire_job(job.id, 1_000, NextFire::At(2_000), &[fire(job.id, 1_000, 0)], 14)
            .await
            .unwrap();
        assert!(again.is_empty());
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().next_fire_ms, 2_000);
        // A fire with no next fire stops the job.
        db.fire_job(job.id, 2_000, NextFire::Never, &[fire(job.id, 2_000, 0)], 15).await.unwrap();
        let stopped = db.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((stopped.running, stopped.next_fire_ms), (false, 0));

        let mut changed = new_job(group.id);
        changed.name = "renamed".to_owned();
        let updated = db.update_job(job.id, &changed, 5_000, 16).await.unwrap().unwrap();
        assert_eq!((updated.spec.name.as_str(), updated.next_fire_ms), ("renamed", 0));
        assert!(db.update_job(999, &changed, 0, 16).await.unwrap().is_none());
        assert_eq!(db.list_jobs(Some(group.id)).await.unwrap().len(), 1);
        assert_eq!(db.list_jobs(Some(group.id + 1)).await.unwrap().len(), 0);
        // Many at once, past one statement's chunk; the ones that do not exist are left out.
        let other = db.create_job(&new_job(group.id), 17).await.unwrap();
        let mut ids: Vec<i64> = (1_000..1_600).collect();
        ids.extend([other.id, job.id]);
        let mut read = db.get_jobs(&ids).await.unwrap();
        read.sort_by_key(|job| job.id);
        assert_eq!(read, vec![updated, other.clone()]);
        assert!(db.delete_job(other.id).await.unwrap());
        assert!(db.delete_job(job.id).await.unwrap());
        assert!(!db.delete_job(job.id).await.unwrap());
    })
    .await;
}

/// A job's stamp changes with every change a copy of the job must see, even within one
/// millisecond, and not when a fire only moves the job on.
#[tokio::test]
async fn a_job_stamp_changes_with_every_change_and_not_with_a_fire_that_moves_it() {
    each_backend("stamps", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let stamp = |db: Db| async move {
            let stamps = db.job_stamps(&[job.id, 999_999]).await.unwrap();
            assert!(stamps.len() <= 1 && stamps.iter().all(|(id, _)| *id == job.id));
            stamps.first().map(|(_, stamp)| *stamp)
        };
        let mut seen = vec![stamp(db.clone()).await.unwrap()];
        assert_eq!(seen[0], JobStamp::of(&job), "the stamp read is the one the job was read with");
        let mut changed = |now: Option<JobStamp>, what: &str| {
            let now = now.unwrap();
            assert!(!seen.contains(&now), "{what} did not change the stamp: {now:?}");
            seen.push(now);
        };
        // All at one instant: the revision tells them apart where `updated_at` cannot.
        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        changed(stamp(db.clone()).await, "a start");
        let mut spec = new_job(group.id);
        spec.param = "changed".to_owned();
        db.update_job(job.id, &spec, 1_000, 11).await.unwrap().unwrap();
        changed(stamp(db.clone()).await, "an edit");
        db.add_job_version(job.id, wasm_version("aa", b"\0asm-one", "one"), 11).await.unwrap();
        changed(stamp(db.clone()).await, "a new version");
        db.add_job_version(job.id, wasm_version("bb", b"\0asm-two", "two"), 11).await.unwrap();
        assert!(db.activate_job_version(job.id, 1, 11).await.unwrap());
        let rolled_back = stamp(db.clone()).await;
        changed(rolled_back, "a rollback");
        // Fires that move the job on leave it as it was.
        let runs = [fire(job.id, 1_000, 0)];
        let fired = db.fire_job(job.id, 1_000, NextFire::At(2_000), &runs, 12).await.unwrap();
        assert_eq!(fired.len(), 1);
        assert_eq!(stamp(db.clone()).await, rolled_back, "a fire that moves the job changed it");
        let moved = db.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((moved.next_fire_ms, JobStamp::of(&moved)), (2_000, rolled_back.unwrap()));
        // The fire that ends the job changes it: a copy must see it stopped.
        db.fire_job(job.id, 2_000, NextFire::Never, &[fire(job.id, 2_000, 0)], 13).await.unwrap();
        changed(stamp(db.clone()).await, "the last fire");
        assert!(db.set_job_running(job.id, None, 14).await.unwrap());
        changed(stamp(db.clone()).await, "a stop");
        assert!(db.delete_job(job.id).await.unwrap());
        assert_eq!(stamp(db.clone()).await, None, "a deleted job has no stamp");
    })
    .await;
}

fn wasm_version<'a>(sha256: &'a str, bytes: &'a [u8], remark: &'a str) -> NewVersion<'a> {
    NewVersion { sha256, bytes, remark, language: Language::Wasm, source: None, keep: 30 }
}

#[tokio::test]
async fn versions_share_blobs() {
    each_backend("versions", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let v1 = db.add_job_version(job.id, wasm_version("aa", b"\0asm-one", "first"), 20);
        let v1 = v1.await.unwrap();
        let v2 = db.add_job_version(job.id, wasm_version("bb", b"\0asm-two", "second"), 21);
        let v2 = v2.await.unwrap();
        let v3 = db.add_job_version(job.id, wasm_version("aa", b"\0asm-one", "first again"), 22);
        let v3 = v3.await.unwrap();
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
async fn versions_keep_their_source_and_old_ones_are_pruned() {
    each_backend("version_sources", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let python = |source: &'static str, keep| NewVersion {
            sha256: "cc",
            bytes: b"\0asm-py",
            remark: "",
            language: Language::Python,
            source: Some(source),
            keep,
        };
        let v1 = db.add_job_version(job.id, python("print(1)", 3), 20).await.unwrap();
        assert_eq!((v1.language, v1.has_source), (Language::Python, true));
        let v2 = db.add_job_version(job.id, wasm_version("dd", b"\0asm-w", ""), 21).await.unwrap();
        assert_eq!((v2.language, v2.has_source), (Language::Wasm, false));
        let source = db.get_job_version_source(job.id, 1).await.unwrap();
        assert_eq!(source, Some(Some("print(1)".to_owned())));
        assert_eq!(db.get_job_version_source(job.id, 2).await.unwrap(), Some(None));
        assert_eq!(db.get_job_version_source(job.id, 9).await.unwrap(), None);
        db.add_job_version(job.id, python("print(3)", 3), 22).await.unwrap();
        db.add_job_version(job.id, python("print(4)", 3), 23).await.unwrap();
        let listed: Vec<i64> =
            db.list_job_versions(job.id).await.unwrap().iter().map(|v| v.version).collect();
        assert_eq!(listed, [4, 3, 2]);
        // An upload makes itself active: with a rolled-back job, keeping one leaves only it.
        assert!(db.activate_job_version(job.id, 2, 24).await.unwrap());
        db.add_job_version(job.id, python("print(5)", 1), 25).await.unwrap();
        let listed: Vec<i64> =
            db.list_job_versions(job.id).await.unwrap().iter().map(|v| v.version).collect();
        assert_eq!(listed, [5]);
        assert!(db.activate_job_version(job.id, 5, 26).await.unwrap());
    })
    .await;
}

fn sent(address: &str, at_ms: i64, timeout_secs: i64) -> Transition {
    let facts = RunFacts {
        state: RunState::Dispatching,
        attempt: 0,
        kill_requested: false,
        trigger_type: TriggerType::Manual,
        from_fire: false,
    };
    let event = Event::Sent { address: address.to_owned(), at_ms, timeout_secs, grace_ms: 10 };
    lifecycle::transition(&facts, None, &event).unwrap()
}

fn failed(state: RunState) -> Transition {
    let facts = RunFacts {
        state,
        attempt: 0,
        kill_requested: false,
        trigger_type: TriggerType::Manual,
        from_fire: false,
    };
    let job = JobFacts { retry_count: 1, has_children: false, fix_delay_ms: None };
    let event = Event::Result {
        handle_code: 500,
        message: "boom\0".to_owned(),
        started_at_ms: Some(350),
        accepted: None,
    };
    lifecycle::transition(&facts, Some(&job), &event).unwrap()
}

/// A transition of a run of a `FIX_DELAY` job (delay 30 s, one retry) from one of its fires.
fn fix_delay_end(state: RunState, attempt: i64, event: Event) -> Transition {
    let facts = RunFacts {
        state,
        attempt,
        kill_requested: false,
        trigger_type: if attempt == 0 { TriggerType::Cron } else { TriggerType::Retry },
        from_fire: true,
    };
    let job = JobFacts { retry_count: 1, has_children: false, fix_delay_ms: Some(30_000) };
    lifecycle::transition(&facts, Some(&job), &event).unwrap()
}

#[tokio::test]
async fn a_fix_delay_job_fires_again_once_every_run_of_its_fire_ended() {
    each_backend("fix_delay", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let spec = JobSpec {
            schedule_type: ScheduleType::FixDelay,
            schedule_conf: "30".to_owned(),
            ..new_job(group.id)
        };
        let job = db.create_job(&spec, 10).await.unwrap();
        let next_fire = || async { db.get_job(job.id).await.unwrap().unwrap().next_fire_ms };
        db.set_job_running(job.id, Some(1_000), 11).await.unwrap();
        let items = vec![
            ShardingItem { item: 1, parameter: "Shanghai".to_owned() },
            ShardingItem { item: 2, parameter: String::new() },
        ];
        let shards = [
            fire(job.id, 1_000, 0),
            NewRun { sharding_items: items.clone(), ..fire(job.id, 1_000, 1) },
        ];
        let ids = db.fire_job(job.id, 1_000, NextFire::WhenRunsEnd, &shards, 12).await.unwrap();
        assert_eq!(db.get_run(ids[1]).await.unwrap().unwrap().sharding_items, items);
        // The job waits for its fire's runs: running, with no next fire time.
        let waiting = db.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((waiting.running, waiting.next_fire_ms), (true, 0));
        assert_eq!(db.earliest_fire(&everything()).await.unwrap(), None);
        // Saving the job unchanged keeps it waiting.
        db.update_job(job.id, &spec, 99_999, 13).await.unwrap();
        assert_eq!(next_fire().await, 0);

        // Shard 0 ends while shard 1 is pending: the job keeps waiting.
        let killed = fix_delay_end(RunState::Pending, 0, Event::Kill);
        assert_eq!(killed.next_fire_delay_ms, Some(30_000));
        db.apply_transition(ids[0], &killed, None, None, &[], 2_000).await.unwrap().unwrap();
        assert_eq!(next_fire().await, 0);
        // Shard 1 is not sent and retried: the retry belongs to the fire, the job waits on.
        let claim = db.claim_run(ids[1], "admin", 3_000, 4_000).await.unwrap().unwrap();
        let not_sent =
            fix_delay_end(RunState::Dispatching, 0, Event::NotSent { reason: "no".to_owned() });
        assert_eq!((not_sent.retry, not_sent.next_fire_delay_ms), (true, None));
        let retry = NewRun {
            trigger_type: TriggerType::Retry,
            attempt: 1,
            parent_run_id: Some(ids[1]),
            node: None,
            ..shards[1].clone()
        };
        let lease = Some(("admin", claim.fence));
        let (_, retried) = db
            .apply_transition(ids[1], &not_sent, lease, None, &[retry], 3_000)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next_fire().await, 0);
        // The retry, the fire's last unfinished run, ends at 5 s: the next fire is 30 s later.
        let last = fix_delay_end(RunState::Pending, 1, Event::Kill);
        db.apply_transition(retried[0], &last, None, None, &[], 5_000).await.unwrap().unwrap();
        assert_eq!(next_fire().await, 35_000);
        assert_eq!(db.earliest_fire(&everything()).await.unwrap(), Some(35_000));
        // A stopped job is not started again by a run that ends.
        let ids = db
            .fire_job(job.id, 35_000, NextFire::WhenRunsEnd, &[fire(job.id, 35_000, 0)], 35_000)
            .await
            .unwrap();
        db.set_job_running(job.id, None, 36_000).await.unwrap();
        db.apply_transition(ids[0], &killed, None, None, &[], 37_000).await.unwrap().unwrap();
        let stopped = db.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((stopped.running, stopped.next_fire_ms), (false, 0));
    })
    .await;
}

#[tokio::test]
async fn runs_move_through_their_lifecycle_once() {
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
        assert_eq!(
            db.dispatchable_runs(550, 100, 10, &everything()).await.unwrap(),
            [(a, 1), (b, 1)]
        );

        // A claim is a lease with an owner; every claim bumps the fence.
        let claim = db.claim_run(a, "admin-1", 100, 200).await.unwrap().unwrap();
        assert_eq!((claim.run.id, claim.run.state, claim.fence), (a, RunState::Dispatching, 1));
        assert_eq!(claim.run.first_claimed_at_ms, 100);
        assert!(db.claim_run(a, "admin-2", 150, 250).await.unwrap().is_none(), "lease held");
        assert!(db.renew_lease(a, "admin-1", 1, 300).await.unwrap());
        assert!(db.claim_run(a, "admin-2", 250, 350).await.unwrap().is_none(), "renewed");
        assert_eq!(
            db.dispatchable_runs(550, 301, 10, &everything()).await.unwrap(),
            [(b, 1), (a, 1)],
            "lease ran out"
        );
        let taken = db.claim_run(a, "admin-2", 301, 400).await.unwrap().unwrap();
        assert_eq!((taken.fence, taken.run.first_claimed_at_ms), (2, 100));
        // The old holder can no longer renew, target or record anything.
        assert!(!db.renew_lease(a, "admin-1", 1, 500).await.unwrap());
        assert!(!db.set_run_target(a, "admin-1", 1, "http://old:9999").await.unwrap());
        let stale = sent("http://old:9999", 302, 5);
        assert!(
            db.apply_transition(a, &stale, Some(("admin-1", 1)), None, &[], 302)
                .await
                .unwrap()
                .is_none()
        );
        assert!(db.set_run_target(a, "admin-2", 2, "http://e:9999").await.unwrap());
        let (running, _) = db
            .apply_transition(
                a,
                &sent("http://e:9999", 303, 5),
                Some(("admin-2", 2)),
                None,
                &[],
                303,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (running.state, running.trigger_code, running.dispatched_at_ms),
            (RunState::Running, 200, 303)
        );
        assert!(db.claim_run(a, "admin-3", 10_000, 20_000).await.unwrap().is_none(), "sent");

        // The admin's deadline: timeout 5 s plus grace 10 ms.
        assert!(db.runs_past_deadline(5_313, 10, &everything()).await.unwrap().is_empty());
        let overdue = db.runs_past_deadline(5_314, 10, &everything()).await.unwrap();
        assert_eq!(overdue.iter().map(|r| r.id).collect::<Vec<_>>(), [a]);
        assert_eq!(db.executors_with_running_runs().await.unwrap(), ["http://e:9999"]);
        let on = |before| db.running_run_ids_on("http://e:9999", before, 10);
        assert!(on(303).await.unwrap().is_empty());
        assert_eq!(on(304).await.unwrap(), [a]);

        // A result applies once, with its retry in the same transaction; NUL is cleaned away.
        let mut retry = manual.clone();
        retry.trigger_type = TriggerType::Retry;
        retry.attempt = 1;
        retry.parent_run_id = Some(a);
        let (done, ids) = db
            .apply_transition(a, &failed(RunState::Running), None, Some(6), &[retry.clone()], 400)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (done.state, done.handle_code, done.handle_msg.as_str(), done.handle_time_ms),
            (RunState::Failed, 500, "boom\u{fffd}", 400)
        );
        assert_eq!((ids.len(), done.started_at_ms), (1, 350));
        let again = failed(RunState::Running);
        let again = db.apply_transition(a, &again, None, None, &[retry], 401).await.unwrap();
        assert!(again.is_none(), "a result applies once");
        let follow_up = db.get_run(ids[0]).await.unwrap().unwrap();
        assert_eq!((follow_up.parent_run_id, follow_up.attempt), (Some(a), 1));

        let all = db
            .list_runs(&RunFilter { job_id: Some(1), limit: 2, ..RunFilter::default() })
            .await
            .unwrap();
        assert_eq!((all.total, all.items.len()), (5, 2));
        let failed_runs = db
            .list_runs(&RunFilter {
                job_id: Some(1),
                state: Some(RunState::Failed),
                limit: 10,
                ..RunFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(failed_runs.items.iter().map(|r| r.id).collect::<Vec<_>>(), [a]);

        // Retention deletes ended runs only, in bounded batches.
        assert_eq!(db.delete_ended_runs(2, 10).await.unwrap(), 1);
        assert!(db.get_run(a).await.unwrap().is_none());
        assert!(db.get_run(b).await.unwrap().is_some(), "pending runs are kept");
    })
    .await;
}

/// A transition returns only the columns a write may change and takes the others from the run
/// as its caller read it: a run read before its claim and its target comes back as stored.
#[tokio::test]
async fn a_transition_reads_back_what_changed_since_the_run_was_read() {
    each_backend("read_back", |db| async move {
        let mut new = fire(1, 500, 0);
        new.sharding_items = vec![ShardingItem { item: 0, parameter: "a".to_owned() }];
        new.param = "the parameter".to_owned();
        let id = db.create_run(&new, 1).await.unwrap().unwrap();
        let read = db.get_run(id).await.unwrap().unwrap();
        assert_eq!((read.state, read.executor_address.as_deref()), (RunState::Pending, None));

        let claim = db.claim_run(id, "admin-1", 100, 200).await.unwrap().unwrap();
        assert!(db.set_run_target(id, "admin-1", claim.fence, "http://e:9999").await.unwrap());
        let lease = Some(("admin-1", claim.fence));
        let sent = sent("http://e:9999", 150, 5);
        let (run, _) = db.apply_to(read, &sent, lease, None, &[], 150).await.unwrap().unwrap();
        assert_eq!(Some(&run), db.get_run(id).await.unwrap().as_ref());
        assert_eq!(run.state, RunState::Running);
        assert_eq!(run.executor_address.as_deref(), Some("http://e:9999"));
        assert_eq!((run.first_claimed_at_ms, run.dispatched_at_ms), (100, 150));
        assert_eq!((run.param.as_str(), run.sharding_items.len()), ("the parameter", 1));
    })
    .await;
}

#[tokio::test]
async fn runs_are_listed_between_two_trigger_times() {
    each_backend("runs_by_time", |db| async move {
        for at in [1_000, 2_000, 3_000, 4_000] {
            db.create_run(&fire(1, at, 0), 1).await.unwrap().unwrap();
        }
        db.create_run(&fire(2, 2_500, 0), 1).await.unwrap().unwrap();
        let times = |filter: RunFilter| {
            let db = db.clone();
            async move {
                let page = db.list_runs(&RunFilter { limit: 10, ..filter }).await.unwrap();
                let times: Vec<i64> = page.items.iter().map(|run| run.trigger_time_ms).collect();
                (page.total, times)
            }
        };
        let bounds = |from_ms, to_ms| RunFilter { from_ms, to_ms, ..RunFilter::default() };
        assert_eq!(times(bounds(None, None)).await, (5, vec![2_500, 4_000, 3_000, 2_000, 1_000]));
        assert_eq!(times(bounds(Some(2_000), None)).await, (4, vec![2_500, 4_000, 3_000, 2_000]));
        assert_eq!(times(bounds(None, Some(2_000))).await, (2, vec![2_000, 1_000]));
        assert_eq!(times(bounds(Some(2_000), Some(3_000))).await, (3, vec![2_500, 3_000, 2_000]));
        assert_eq!(times(bounds(Some(3_001), Some(3_999))).await, (0, vec![]));
        let of_job = RunFilter { job_id: Some(1), ..bounds(Some(2_000), Some(3_000)) };
        assert_eq!(times(of_job).await, (2, vec![3_000, 2_000]));
    })
    .await;
}

/// A page of runs says whether another follows (from one row past it) and counts the matching
/// runs only up to its cap (one row past the cap says the count stopped), so a page of a table
/// of millions never counts the table.
#[tokio::test]
async fn run_pages_say_whether_more_follow_and_count_only_up_to_their_cap() {
    each_backend("runs_paged", |db| async move {
        for at in 1..=7 {
            db.create_run(&fire(1, at * 1_000, 0), 1).await.unwrap().unwrap();
        }
        db.create_run(&fire(2, 500, 0), 1).await.unwrap().unwrap();
        // (job, limit, offset, count up to) → (total, capped, has_more, items)
        let cases = [
            (Some(1), 3, 0, Some(100), (7, false, true, 3)),
            (Some(1), 3, 3, Some(100), (7, false, true, 3)),
            (Some(1), 3, 6, Some(100), (7, false, false, 1)),
            (Some(1), 7, 0, Some(100), (7, false, false, 7)),
            (Some(1), 2, 0, Some(7), (7, false, true, 2)),
            (Some(1), 2, 0, Some(6), (6, true, true, 2)),
            (None, 2, 0, Some(3), (3, true, true, 2)),
            (None, 10, 0, Some(3), (3, true, false, 8)),
            (None, 10, 0, None, (8, false, false, 8)),
            (Some(3), 10, 0, Some(3), (0, false, false, 0)),
        ];
        for (job_id, limit, offset, count_up_to, expected) in cases {
            let filter = RunFilter { job_id, limit, offset, count_up_to, ..RunFilter::default() };
            let page = db.list_runs(&filter).await.unwrap();
            let got = (page.total, page.total_capped, page.has_more, page.items.len());
            assert_eq!(got, expected, "{filter:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn concurrent_writers_commit_together_and_fail_alone() {
    each_backend("batch", |db| async move {
        // 100 writers at once: each creates a run; one carries a NUL byte, which PostgreSQL
        // refuses in text. Its write fails alone; every other run is created once.
        let mut writers = tokio::task::JoinSet::new();
        for n in 0..100 {
            let db = db.clone();
            writers.spawn(async move {
                let mut run = fire(1, 1_000 + n, 0);
                if n == 50 {
                    run.param = "bad\0param".to_owned();
                }
                (n, db.create_run(&run, 1).await)
            });
        }
        let mut created = std::collections::HashSet::new();
        while let Some(joined) = writers.join_next().await {
            let (n, result) = joined.unwrap();
            match (n, db.dialect(), result) {
                (50, Dialect::Postgres, result) => assert!(result.is_err(), "{result:?}"),
                (_, _, result) => assert!(created.insert(result.unwrap().unwrap())),
            }
        }
        let expected = if db.dialect() == Dialect::Postgres { 99 } else { 100 };
        assert_eq!(created.len(), expected);

        // Ten dispatchers race for one run: exactly one wins the lease.
        let contested = *created.iter().min().unwrap();
        let mut claimers = tokio::task::JoinSet::new();
        for n in 0..10 {
            let db = db.clone();
            claimers.spawn(async move {
                db.claim_run(contested, &format!("admin-{n}"), 5_000, 9_000).await.unwrap()
            });
        }
        let mut winners = 0;
        while let Some(claim) = claimers.join_next().await {
            winners += usize::from(claim.unwrap().is_some());
        }
        assert_eq!(winners, 1);
    })
    .await;
}

#[tokio::test]
async fn every_sqlite_connection_checkpoints_at_the_same_wal_size() {
    let dir = tempfile::tempdir().unwrap();
    let db =
        Db::connect(&format!("sqlite:{}", dir.path().join("test.db").display())).await.unwrap();
    let pages = |row: sqlx::any::AnyRow| sqlx::Row::get::<i64, _>(&row, 0);
    let pool = sqlx::query("pragma wal_autocheckpoint").fetch_one(&db.pool).await.unwrap();
    let writer = sqlx::query("pragma wal_autocheckpoint").fetch_one(db.writer()).await.unwrap();
    let group_commit = db.sqlite_writer.as_ref().unwrap();
    let group_commit = group_commit
        .run(|conn| conn.query_row("pragma wal_autocheckpoint", [], |row| row.get::<_, i64>(0)))
        .await
        .unwrap()
        .unwrap();
    let expected = i64::from(CHECKPOINT_PAGES);
    assert_eq!((pages(pool), pages(writer), group_commit), (expected, expected, expected));
}

/// A commit answered survives a power cut: every connection that writes (the pools' and the
/// group commit's) syncs the WAL at each commit (`synchronous = FULL`, which SQLite reports as 2).
#[tokio::test]
async fn every_sqlite_connection_syncs_each_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db =
        Db::connect(&format!("sqlite:{}", dir.path().join("test.db").display())).await.unwrap();
    let level = |row: sqlx::any::AnyRow| sqlx::Row::get::<i64, _>(&row, 0);
    let pool = sqlx::query("pragma synchronous").fetch_one(&db.pool).await.unwrap();
    let writer = sqlx::query("pragma synchronous").fetch_one(db.writer()).await.unwrap();
    let group_commit = db.sqlite_writer.as_ref().unwrap();
    let group_commit = group_commit
        .run(|conn| conn.query_row("pragma synchronous", [], |row| row.get::<_, i64>(0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((level(pool), level(writer), group_commit), (2, 2, 2));
}

/// The writes of the steady state, the beat, the fire and the group commit, commit on the
/// group commit's own connection, so its page cache survives from one to the next: SQLite
/// changes a connection's `pragma data_version` exactly when another connection has committed,
/// which is when it empties that connection's cache.
#[tokio::test]
async fn beats_fires_and_results_commit_on_the_group_commits_connection() {
    let dir = tempfile::tempdir().unwrap();
    let db =
        Db::connect(&format!("sqlite:{}", dir.path().join("test.db").display())).await.unwrap();
    let group = db.ensure_group("default", "Default", 0).await.unwrap();
    let job = db.create_job(&new_job(group.id), 10).await.unwrap();
    assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
    let partition = crate::partition::of(job.id);
    let taken = db.take_partitions("admin-a", &[partition], &[], 12, 5_000).await.unwrap();
    let lease =
        crate::partition::Held { owner: "admin-a".to_owned(), fences: taken.into_iter().collect() };
    let writer = db.sqlite_writer.clone().unwrap();
    let data_version = || async {
        let read = writer
            .run(|conn| conn.query_row("pragma data_version", [], |row| row.get::<_, i64>(0)));
        read.await.unwrap().unwrap()
    };
    let before = data_version().await;

    let beat = db.beat_partitions("admin-a", "http://127.0.0.1:1", "m", 1, 1_000, 4_000).await;
    assert_eq!(beat.unwrap().renewed.len(), 1, "the beat renewed the lease");
    let planned = Fire {
        job_id: job.id,
        expected_fire_ms: 1_000,
        next: NextFire::At(2_000),
        runs: vec![fire(job.id, 1_000, 0)],
        claim: Some(("admin-a".to_owned(), 60_000)),
    };
    let mut fired =
        db.fire_jobs(std::slice::from_ref(&planned), 1_001, Some(&lease)).await.unwrap();
    let Some(Fired::Claimed(claim)) = fired[0].pop() else {
        panic!("the fire committed under its lease, its run claimed: {fired:?}")
    };
    let lease = Some(("admin-a", claim.fence));
    let sent = sent("127.0.0.1:9", 1_002, 0);
    let applied = db.apply_transition(claim.run.id, &sent, lease, None, &[], 1_002).await;
    assert!(applied.unwrap().is_some(), "the send was recorded");
    assert_eq!(data_version().await, before, "no other connection committed meanwhile");

    // The check sees a commit of another connection: an edit through the sqlx writer.
    assert!(db.set_job_running(job.id, None, 1_003).await.unwrap());
    assert_ne!(data_version().await, before);
}

#[tokio::test]
async fn a_claimed_fire_creates_its_runs_held_by_the_dispatcher() {
    each_backend("claimed_fire", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        let mut run = fire(job.id, 1_000, 0);
        run.executor_address = Some("http://127.0.0.1:9".to_owned());
        let claimed = Fire {
            job_id: job.id,
            expected_fire_ms: 1_000,
            next: NextFire::At(2_000),
            runs: vec![run],
            claim: Some(("admin-a".to_owned(), 16_000)),
        };
        let mut fired = db.fire_jobs(std::slice::from_ref(&claimed), 12, None).await.unwrap();
        let Some(Fired::Claimed(claim)) = fired.pop().and_then(|mut runs| runs.pop()) else {
            panic!("the fire's run was not created claimed");
        };
        assert_eq!(
            (claim.run.state, claim.fence, claim.run.executor_address.as_deref()),
            (RunState::Dispatching, 1, Some("http://127.0.0.1:9"))
        );
        assert_eq!(claim.run.first_claimed_at_ms, 12);
        // Another dispatcher cannot take it before the lease runs out, and can after.
        assert!(db.claim_run(claim.run.id, "admin-b", 15_999, 30_000).await.unwrap().is_none());
        let taken = db.claim_run(claim.run.id, "admin-b", 16_001, 30_000).await.unwrap().unwrap();
        assert_eq!(taken.fence, 2);
        // The same fire again creates nothing.
        let again = db.fire_jobs(std::slice::from_ref(&claimed), 13, None).await.unwrap();
        assert!(again.iter().all(Vec::is_empty));
    })
    .await;
}

/// A created run is answered from what was inserted, not read back: it must be the row stored,
/// also for runs of one insert that differ only in their parameter.
#[tokio::test]
async fn created_runs_are_answered_as_stored() {
    each_backend("created_as_stored", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let manual = |param: &str| NewRun {
            trigger_type: TriggerType::Manual,
            fire_time_ms: None,
            param: param.to_owned(),
            executor_address: Some("http://127.0.0.1:9".to_owned()),
            shard_index: 1,
            shard_total: 3,
            sharding_items: vec![ShardingItem { item: 2, parameter: "Guangzhou".to_owned() }],
            version: Some((4, "ab".repeat(32))),
            parent_run_id: Some(77),
            node: None,
            ..fire(job.id, 1_000, 0)
        };
        let runs = [manual("first"), manual("second"), fire(job.id, 2_000, 0)];
        let created = db.create_claimed_runs(&runs, "admin-a", 12, 16_000, None).await.unwrap();
        assert_eq!(created.len(), 3);
        for (run, claim) in runs.iter().zip(created) {
            let claim = claim.expect("each run is new");
            assert_eq!(claim.run.param, run.param);
            assert_eq!(claim.fence, 1);
            let stored = db.get_run(claim.run.id).await.unwrap().unwrap();
            assert_eq!(claim.run, stored);
        }
        // Many rows of one statement, each answered with its own id; then a statement of
        // which one row is skipped by its fire's key, and the others still answered as stored.
        let many: Vec<NewRun> = (0..40).map(|n| manual(&format!("run {n}"))).collect();
        let skipped = [manual("before"), fire(job.id, 2_000, 0), manual("after")];
        for (runs, skips) in [(&many[..], None), (&skipped[..], Some(1))] {
            let created = db.create_claimed_runs(runs, "admin-a", 13, 16_000, None).await.unwrap();
            assert_eq!(created.len(), runs.len());
            for (at, (run, claim)) in runs.iter().zip(created).enumerate() {
                let Some(claim) = claim else {
                    assert_eq!(Some(at), skips, "only the fire that exists is skipped");
                    continue;
                };
                assert_eq!(claim.run.param, run.param);
                assert_eq!(claim.run, db.get_run(claim.run.id).await.unwrap().unwrap());
            }
        }
    })
    .await;
}

/// `count` fires of job 1, each created and claimed by `admin-1` (fence 1): their ids.
async fn claimed_fires(db: &Db, count: i64) -> Vec<i64> {
    let mut ids = Vec::new();
    for n in 0..count {
        let id = db.create_run(&fire(1, 1_000 + n, 0), 1).await.unwrap().unwrap();
        db.claim_run(id, "admin-1", 10, 20_000).await.unwrap().unwrap();
        ids.push(id);
    }
    ids
}

/// Runs `ids` as read now, for the transitions a test asks for.
async fn read_runs(db: &Db, ids: &[i64]) -> Vec<RunRecord> {
    let mut runs = Vec::new();
    for &id in ids {
        runs.push(db.get_run(id).await.unwrap().unwrap());
    }
    runs
}

/// Run `id` of `runs`, boxed for a [`batch::Write::Apply`].
fn as_read(runs: &[RunRecord], id: i64) -> Box<RunRecord> {
    Box::new(runs.iter().find(|run| run.id == id).unwrap().clone())
}

#[tokio::test]
async fn a_batch_records_plain_transitions_in_one_statement_with_each_compare_its_own() {
    each_backend("merged_updates", |db| async move {
        let ids = claimed_fires(&db, 5).await;
        let read = read_runs(&db, &ids).await;
        let apply = |id: i64, fence: i64, follow_ups: Vec<NewRun>| batch::Write::Apply {
            run: as_read(&read, id),
            transition: sent("http://e:9999", 50, 5),
            lease: Some(("admin-1".to_owned(), fence)),
            fuel_used: None,
            follow_ups,
            now_ms: 50,
        };
        let mut retry = fire(1, 1_004, 0);
        retry.attempt = 1;
        // Runs 0 and 2 apply; run 1's fence is stale; run 0 again (already running) breaks the
        // merged group and fails its compare alone; run 3 is a claim in between; run 4 carries
        // a follow-up and goes by itself.
        let writes = vec![
            apply(ids[0], 1, Vec::new()),
            apply(ids[1], 7, Vec::new()),
            apply(ids[2], 1, Vec::new()),
            apply(ids[0], 1, Vec::new()),
            batch::Write::Claim {
                id: ids[3],
                owner: "admin-2".into(),
                now_ms: 11,
                lease_until_ms: 12,
            },
            apply(ids[4], 1, vec![retry]),
        ];
        let mut applied = Vec::new();
        for answer in commit_batch(&db, writes).await {
            applied.push(match answer.unwrap() {
                batch::Written::Applied(Some((run, follow_ups))) => {
                    assert_eq!(run.state, RunState::Running);
                    Some(follow_ups.len())
                }
                batch::Written::Applied(None) | batch::Written::Claim(None) => None,
                other => panic!("unexpected answer {other:?}"),
            });
        }
        assert_eq!(applied, [Some(0), None, Some(0), None, None, Some(1)]);
        let states = db.get_runs(&ids).await.unwrap();
        let states: Vec<_> =
            ids.iter().map(|id| states.iter().find(|run| run.id == *id).unwrap().state).collect();
        use RunState::{Dispatching, Running};
        assert_eq!(states, [Running, Dispatching, Running, Dispatching, Running]);
    })
    .await;
}

/// Batches of a count that is no power of two: on PostgreSQL their statements are padded with
/// rows that match nothing (`statement_shapes`), which must change no run and no job.
#[tokio::test]
async fn padded_statements_change_only_the_rows_they_carry() {
    each_backend("padded_statements", |db| async move {
        let ids = claimed_fires(&db, 23).await;
        let read = read_runs(&db, &ids).await;
        // Every fifth compare fails (a stale fence): 23 updates, of which 5 apply nothing.
        let writes = ids
            .iter()
            .enumerate()
            .map(|(at, &id)| batch::Write::Apply {
                run: as_read(&read, id),
                transition: sent("http://e:9999", 50, 5),
                lease: Some(("admin-1".to_owned(), if at % 5 == 0 { 7 } else { 1 })),
                fuel_used: None,
                follow_ups: Vec::new(),
                now_ms: 50,
            })
            .collect();
        let answers = commit_batch(&db, writes).await;
        let applied: Vec<bool> = answers
            .into_iter()
            .map(|answer| match answer.unwrap() {
                batch::Written::Applied(run) => run.is_some(),
                other => panic!("unexpected answer {other:?}"),
            })
            .collect();
        assert_eq!(applied, (0..23).map(|at| at % 5 != 0).collect::<Vec<_>>());
        let runs = db.get_runs(&ids).await.unwrap();
        assert_eq!(runs.len(), 23);
        for run in &runs {
            let at = ids.iter().position(|id| *id == run.id).unwrap();
            let expected = if at % 5 == 0 { RunState::Dispatching } else { RunState::Running };
            assert_eq!(run.state, expected, "run {at}");
        }

        // Five jobs fired at once (at 5 s, past the runs above, which job 1 may share), one
        // of them read at a fire it has left: four move on.
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let mut fires = Vec::new();
        for at in 0..5 {
            let job = db.create_job(&new_job(group.id), 10).await.unwrap();
            assert!(db.set_job_running(job.id, Some(5_000), 11).await.unwrap());
            let expected_fire_ms = if at == 2 { 4_000 } else { 5_000 };
            fires.push(Fire {
                job_id: job.id,
                expected_fire_ms,
                next: NextFire::At(6_000),
                runs: vec![fire(job.id, 5_000, 0)],
                claim: None,
            });
        }
        let fired = db.fire_jobs(&fires, 12, None).await.unwrap();
        let counts: Vec<usize> = fired.iter().map(Vec::len).collect();
        assert_eq!(counts, [1, 1, 0, 1, 1]);
        for (at, planned) in fires.iter().enumerate() {
            let job = db.get_job(planned.job_id).await.unwrap().unwrap();
            assert_eq!(job.next_fire_ms, if at == 2 { 5_000 } else { 6_000 }, "job {at}");
        }
    })
    .await;
}

/// Commits `writes` as one batch and returns each write's answer.
async fn commit_batch(db: &Db, writes: Vec<batch::Write>) -> Vec<Result<batch::Written>> {
    let mut answers = Vec::new();
    let mut requests = Vec::new();
    for write in writes {
        let (reply, answer) = tokio::sync::oneshot::channel();
        requests.push((write, reply));
        answers.push(answer);
    }
    batch::commit(&db.writer, db.sqlite_writer.as_deref(), requests).await;
    let mut answered = Vec::new();
    for answer in answers {
        answered.push(answer.await.unwrap());
    }
    answered
}

#[tokio::test]
async fn a_batch_of_grouped_writes_commits_as_one_and_a_failed_write_fails_alone() {
    // Creations, plain transitions and audit records only: on SQLite the batch goes to the
    // group commit's own connection in one call, on PostgreSQL through sqlx.
    each_backend("grouped_batch", |db| async move {
        let ids = claimed_fires(&db, 3).await;
        let read = read_runs(&db, &ids).await;
        let apply = |id: i64, fence: i64| batch::Write::Apply {
            run: as_read(&read, id),
            transition: sent("http://e:9999", 50, 5),
            lease: Some(("admin-1".to_owned(), fence)),
            fuel_used: None,
            follow_ups: Vec::new(),
            now_ms: 50,
        };
        let entry = AuditEntry {
            actor: "ops".to_owned(),
            user_id: None,
            source: "127.0.0.1".to_owned(),
            action: "job.trigger".to_owned(),
            target: "job 2".to_owned(),
            before_json: None,
            after_json: Some("{\"param\":\"x\"}".to_owned()),
        };
        let mut manual = fire(2, 60, 0);
        (manual.trigger_type, manual.fire_time_ms) = (TriggerType::Manual, None);
        manual.executor_address = Some("http://e:9999".to_owned());
        let writes = vec![
            batch::Write::CreateClaimed {
                runs: vec![manual.clone(), manual.clone()],
                owner: "admin-1".to_owned(),
                now_ms: 60,
                lease_until_ms: 15_060,
                audit: Some(entry.clone()),
            },
            apply(ids[0], 1),
            // A stale fence: its compare fails, the others apply.
            apply(ids[1], 9),
            batch::Write::Audit { entry: entry.clone(), now_ms: 61 },
        ];
        let mut answers = commit_batch(&db, writes).await.into_iter();
        let created = match answers.next().unwrap().unwrap() {
            batch::Written::Claims(claims) => claims,
            other => panic!("unexpected answer {other:?}"),
        };
        assert_eq!(created.len(), 2);
        for claim in created.iter().map(|claim| claim.as_ref().unwrap()) {
            assert_eq!(Some(&claim.run), db.get_run(claim.run.id).await.unwrap().as_ref());
            assert_eq!((claim.run.state, claim.fence), (RunState::Dispatching, 1));
        }
        let running = match answers.next().unwrap().unwrap() {
            batch::Written::Applied(Some((run, follow_ups))) if follow_ups.is_empty() => run,
            other => panic!("unexpected answer {other:?}"),
        };
        assert_eq!(Some(running), db.get_run(ids[0]).await.unwrap());
        assert!(matches!(answers.next().unwrap(), Ok(batch::Written::Applied(None))));
        assert!(matches!(answers.next().unwrap(), Ok(batch::Written::Done(true))));
        let audit = db.list_audit(Some("ops"), None, 10, 0).await.unwrap();
        assert_eq!(audit.total, 2, "the trigger's record and the plain one");
        let states = db.get_runs(&ids).await.unwrap();
        let state = |id: i64| states.iter().find(|run| run.id == id).unwrap().state;
        assert_eq!([state(ids[0]), state(ids[1])], [RunState::Running, RunState::Dispatching]);

        // With the audit table gone, the batch fails as a whole, and is committed again write
        // by write: the audit record fails alone, the transition is recorded.
        sqlx::query("drop table audit").execute(&db.writer).await.unwrap();
        let answers = commit_batch(
            &db,
            vec![apply(ids[2], 1), batch::Write::Audit { entry: entry.clone(), now_ms: 62 }],
        )
        .await;
        assert!(matches!(&answers[0], Ok(batch::Written::Applied(Some(_)))), "{answers:?}");
        assert!(answers[1].is_err(), "{answers:?}");
        assert_eq!(db.get_run(ids[2]).await.unwrap().unwrap().state, RunState::Running);
    })
    .await;
}

#[test]
fn batched_statements_have_few_shapes_and_rounds_never_repeat_a_run() {
    assert_eq!(statement_sizes(13, 512).collect::<Vec<_>>(), [8, 4, 1]);
    assert_eq!(statement_sizes(0, 512).count(), 0);
    assert_eq!(statement_sizes(1_100, 512).collect::<Vec<_>>(), [512, 512, 64, 8, 4]);
    assert_eq!(statement_shapes(13, 256, false), [(8, 8), (4, 4), (1, 1)]);
    assert_eq!(statement_shapes(13, 256, true), [(13, 16)]);
    assert_eq!(statement_shapes(600, 256, true), [(256, 256), (256, 256), (88, 128)]);
    assert_eq!(statement_shapes(512, 256, true), [(256, 256), (256, 256)]);
    assert!(statement_shapes(0, 256, true).is_empty());
    assert_eq!(distinct_rounds([5, 6, 5, 7, 5]), [vec![0, 1, 3], vec![2], vec![4]]);
    assert!(distinct_rounds([]).is_empty());
}

/// Migration 0010 (the fire key over fires only) rebuilds SQLite's run table: every run stays
/// as it was, the id sequence goes on after the highest id ever given, so a deleted run's id is
/// not given again, and a fire is still created once while manual runs never conflict.
#[tokio::test]
async fn the_fire_key_migration_keeps_every_run_and_the_id_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let created = format!("sqlite:{}?mode=rwc", path.display());
    let url = format!("sqlite:{}", path.display());
    check_fire_key_migration("sqlite", &created, &url, dir.path()).await;
    let Some(url) = super::testing::postgres_database("firekey").await.unwrap() else {
        eprintln!("fire key migration: WASMJOB_TEST_POSTGRES_URL is unset, skipping PostgreSQL");
        return;
    };
    check_fire_key_migration("postgres", &url, &url, dir.path()).await;
    super::testing::drop_postgres_database(&url).await.unwrap();
}

/// Migrates the database at `url` to the schema before 0010, writes runs there, then connects
/// as the admin does (which applies 0010) and checks what it finds.
async fn check_fire_key_migration(
    dialect: &str,
    create_url: &str,
    url: &str,
    scratch: &std::path::Path,
) {
    let old = scratch.join(format!("{dialect}-before-0010"));
    std::fs::create_dir_all(&old).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(dialect);
    for entry in std::fs::read_dir(&all).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().as_ref() < "0010" {
            std::fs::copy(entry.path(), old.join(entry.file_name())).unwrap();
        }
    }
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(create_url).await.unwrap();
    sqlx::migrate::Migrator::new(old.as_path()).await.unwrap().run(&pool).await.unwrap();
    sqlx::raw_sql(
        "insert into runs (job_id, trigger_type, trigger_time, fire_time, param, created_at, state)
         values (1, 'CRON', 1000, 1000, 'a', 1, 'success'), (1, 'MANUAL', 2000, null, 'b', 2, 'failed'),
            (1, 'MANUAL', 3000, null, 'c', 3, 'pending'), (1, 'MANUAL', 4000, null, 'd', 4, 'pending');
         delete from runs where id = 4",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let db = Db::connect(url).await.unwrap();
    let mut kept = Vec::new();
    for id in 1..=4 {
        let run = db.get_run(id).await.unwrap();
        kept.push(run.map(|run| (run.id, run.fire_time_ms, run.param, run.state)));
    }
    assert_eq!(
        kept,
        vec![
            Some((1, Some(1000), "a".to_owned(), RunState::Success)),
            Some((2, None, "b".to_owned(), RunState::Failed)),
            Some((3, None, "c".to_owned(), RunState::Pending)),
            None,
        ]
    );
    let mut manual = fire(1, 5000, 0);
    (manual.trigger_type, manual.fire_time_ms) = (TriggerType::Manual, None);
    let created = db.create_runs(&[manual.clone(), manual], 5).await.unwrap();
    assert_eq!(
        created,
        vec![Some(5), Some(6)],
        "manual runs never conflict, and id 4 is not reused"
    );
    let again = db.create_runs(&[fire(1, 1000, 0), fire(1, 1000, 1)], 6).await.unwrap();
    // PostgreSQL's sequence moves on for the conflicting row too.
    assert!(
        again[0].is_none() && again[1].is_some_and(|id| id > 6),
        "a fire's shard is created once: {again:?}"
    );
    db.close().await;
}

/// SQLite tests an `in` list of three or more constants through a temporary table it builds for
/// every row an insert or update touches, which made a partial index of `runs` that tested one
/// cost a fifth of a run's writes: no partial index on SQLite tests such a list.
#[tokio::test]
async fn no_partial_index_on_sqlite_tests_a_long_in_list() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    let rows = super::query::query(
        "select name, sql from sqlite_master where type = 'index' and sql is not null",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(rows.len() > 10, "the schema's indexes are read");
    for row in rows {
        let (name, sql): (String, String) = (row.get("name"), row.get("sql"));
        let Some((_, test)) =
            sql.to_lowercase().split_once(" where ").map(|(a, b)| (a.to_owned(), b.to_owned()))
        else {
            continue;
        };
        for list in test.split(" in (").skip(1) {
            let items = list.split(')').next().unwrap_or("").split(',').count();
            assert!(items <= 2, "{name} tests an `in` list of {items}: {sql}");
        }
    }
}

/// The fire key (migration 0023) leads with the fire time, which only grows, so that a fire's
/// entries go to the end of the index and not to each job's place in it; a fire's runs are
/// still found by their job and fire time through it.
#[tokio::test]
async fn the_fire_key_leads_with_the_fire_time_and_finds_a_jobs_fire() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    let key = super::query::query("select sql from sqlite_master where name = 'runs_by_fire'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let sql: String = key.get("sql");
    assert!(sql.contains("(fire_time, job_id, shard_index, attempt)"), "{sql}");
    let plan =
        sqlite_plan(&db, "select id from runs where job_id = $1 and fire_time = $2", 2).await;
    assert!(plan.iter().any(|step| step.contains("INDEX runs_by_fire")), "{plan:?}");
    db.close().await;
}

/// Sets `change` on run `id` by hand, without the events that would make it.
async fn set_by_hand(db: &Db, change: &str, id: i64) {
    let sql = format!("update runs set {change} where id = $1");
    let done = super::query::query(&sql).bind(id).execute(&db.pool).await.unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// What SQLite's `explain query plan` says of `sql`, its `args` parameters bound to 1.
async fn sqlite_plan(db: &Db, sql: &str, args: usize) -> Vec<String> {
    let explain = format!("explain query plan {sql}");
    let mut statement = super::query::query(&explain);
    for _ in 0..args {
        statement = statement.bind(1_i64);
    }
    let plan = statement.fetch_all(&db.pool).await.unwrap();
    plan.iter().map(|row| row.get::<String, _>("detail")).collect()
}

/// The sweep of passed deadlines reads SQLite's partial index of the running runs, not every
/// run kept.
#[tokio::test]
async fn passed_deadlines_are_read_from_their_partial_index() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    let plan = sqlite_plan(&db, &super::runs::past_deadline_sql(&everything()), 2).await;
    assert!(plan.iter().any(|step| step.contains("INDEX runs_deadlines")), "{plan:?}");
    assert!(!plan.iter().any(|step| step.starts_with("SCAN runs")), "{plan:?}");
    db.close().await;
}

/// The count of unfinished runs that admission reads is answered by the sweeps' partial indexes
/// on SQLite, not by a scan of every run kept, and it is right: pending, held and in-flight runs
/// count, ended ones do not, and the count stops at its cap.
#[tokio::test]
async fn unfinished_runs_are_counted_from_partial_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    let plan = sqlite_plan(&db, super::runs::COUNT_UNFINISHED, 1).await;
    let reads: Vec<&String> = plan.iter().filter(|line| line.contains(" runs")).collect();
    assert_eq!(reads.len(), 3, "{plan:?}");
    for (read, index) in reads.iter().zip(["runs_pending", "runs_held", "runs_in_flight"]) {
        assert!(read.contains(&format!("INDEX {index}")), "{plan:?}");
    }

    db.close().await;

    each_backend("count_unfinished", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        let runs = [fire(job.id, 1_000, 0), fire(job.id, 1_000, 1), fire(job.id, 1_000, 2)];
        let ids = db.fire_job(job.id, 1_000, NextFire::At(2_000), &runs, 12).await.unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(db.count_unfinished_runs(100).await.unwrap(), 3, "three pending");
        assert_eq!(db.count_unfinished_runs(2).await.unwrap(), 2, "the count stops at its cap");
        let claim = db.claim_run(ids[0], "admin", 13, 10_000).await.unwrap().unwrap();
        assert_eq!(claim.run.state, RunState::Dispatching);
        assert_eq!(db.count_unfinished_runs(100).await.unwrap(), 3, "two pending, one in flight");
        // Set by hand: a held run and an ended one, without the caps and results that make them.
        set_by_hand(&db, "held = 1", ids[1]).await;
        assert_eq!(
            db.count_unfinished_runs(100).await.unwrap(),
            3,
            "one pending, one held, one in flight"
        );
        set_by_hand(&db, "state = 'success'", ids[2]).await;
        assert_eq!(db.count_unfinished_runs(100).await.unwrap(), 2, "the ended run does not count");
    })
    .await;
}

/// The metrics' counts of unfinished runs by state, and a list of the runs in an unfinished
/// state, read the sweeps' partial indexes on SQLite, not every run kept, and they are right on
/// each backend: each state's runs, newest first, a job's alone, a page and a capped count.
#[tokio::test]
async fn unfinished_states_are_read_from_partial_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    let plan = |sql: String, args: usize| {
        let db = db.clone();
        async move {
            let plan = sqlite_plan(&db, &sql, args).await;
            assert!(plan.iter().any(|line| line.contains("INDEX runs_")), "{sql}: {plan:?}");
            assert!(!plan.iter().any(|line| line == "SCAN runs"), "{sql}: {plan:?}");
        }
    };
    plan(super::runs::COUNT_BY_UNFINISHED_STATE.to_owned(), 0).await;
    for state in [RunState::Pending, RunState::Dispatching, RunState::Running] {
        for count_up_to in [None, Some(100)] {
            let filter = RunFilter { state: Some(state), count_up_to, ..RunFilter::default() };
            let (counted, listed) = super::runs::list_statements(&filter);
            plan(counted, 3 + usize::from(count_up_to.is_some())).await;
            plan(listed, 5).await;
        }
    }
    db.close().await;

    each_backend("unfinished_states", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let other = db.create_job(&new_job(group.id), 10).await.unwrap();
        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        assert!(db.set_job_running(other.id, Some(1_000), 11).await.unwrap());
        let runs: Vec<NewRun> = (0..5).map(|shard| fire(job.id, 1_000, shard)).collect();
        let ids = db.fire_job(job.id, 1_000, NextFire::At(2_000), &runs, 12).await.unwrap();
        let others = db
            .fire_job(other.id, 1_000, NextFire::At(2_000), &[fire(other.id, 1_000, 0)], 12)
            .await
            .unwrap();
        assert_eq!((ids.len(), others.len()), (5, 1));
        db.claim_run(ids[0], "admin", 13, 10_000).await.unwrap().unwrap();
        // Set by hand: a running run, a held one and an ended one.
        for (change, id) in
            [("state = 'running'", ids[1]), ("held = 1", ids[2]), ("state = 'success'", ids[3])]
        {
            set_by_hand(&db, change, id).await;
        }
        assert_eq!(
            db.count_runs_by_unfinished_state().await.unwrap(),
            [(RunState::Pending, 3), (RunState::Dispatching, 1), (RunState::Running, 1)],
            "pending, held or not; dispatching; running; the ended run in none"
        );
        let list = |state: Option<RunState>, job_id: Option<i64>, limit: i64, cap: Option<i64>| {
            let db = db.clone();
            async move {
                let filter =
                    RunFilter { state, job_id, limit, count_up_to: cap, ..RunFilter::default() };
                let page = db.list_runs(&filter).await.unwrap();
                let ids: Vec<i64> = page.items.iter().map(|run| run.id).collect();
                (page.total, page.total_capped, page.has_more, ids)
            }
        };
        let pending = Some(RunState::Pending);
        assert_eq!(
            list(pending, None, 10, None).await,
            (3, false, false, vec![others[0], ids[4], ids[2]])
        );
        assert_eq!(
            list(pending, Some(job.id), 10, None).await,
            (2, false, false, vec![ids[4], ids[2]])
        );
        assert_eq!(list(pending, None, 1, Some(2)).await, (2, true, true, vec![others[0]]));
        let dispatching = Some(RunState::Dispatching);
        assert_eq!(list(dispatching, None, 10, Some(5)).await, (1, false, false, vec![ids[0]]));
        let running = Some(RunState::Running);
        assert_eq!(list(running, None, 10, None).await, (1, false, false, vec![ids[1]]));
        assert_eq!(list(running, Some(other.id), 10, None).await, (0, false, false, vec![]));
        let success = Some(RunState::Success);
        assert_eq!(list(success, None, 10, None).await, (1, false, false, vec![ids[3]]));
        assert_eq!(list(None, None, 10, None).await.0, 6, "every run");
    })
    .await;
}
