//! Admins that share a database share the schedule: each holds about a third of the
//! partitions, every fire happens once whichever admin holds its job, and an admin that stops
//! hands its partitions over without a fire missed; one that is killed loses its partitions
//! when its database session ends. (Fires through kills and pauses are the fault harness's:
//! `fault::three_admins_one_killed_one_paused_on_postgres`.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wasmjob::admin::{self, Admin};
use wasmjob::executor;
use wasmjob::storage::RunFilter;
use wasmjob::storage::testing::fetch_all;

use crate::support::app::{admin_config, executor_config};
use crate::support::cluster::Cluster;
use crate::support::metrics;
use crate::support::{
    ADMIN_TOKEN, Api, Backend, TestApp, backends, drop_database, sample_job, server_database,
    wait_until,
};

/// An admin alone holds every partition and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_alone_holds_every_partition() {
    let app = TestApp::start(Backend::Sqlite).await;
    let admins = shares(&app.api).await;
    assert_eq!(admins.len(), 1, "{admins:?}");
    let (_, body) = app.api.get("/api/v1/admins").await;
    assert_eq!(body[0]["this"], json!(true), "{body}");
    assert_eq!(body[0]["partitions"].as_array().map(Vec::len), Some(256), "{body}");
    assert_eq!(body[0]["address"], json!(app.api.base), "{body}");
    app.stop().await;
}

/// Three admins on one server database, one executor registered with all three: the shares
/// balance, twelve jobs firing every second fire each instant once, and when one admin stops
/// the other two take its partitions and its jobs' instants still fire, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_admins_share_the_schedule_and_hand_it_over_when_one_stops() {
    for backend in backends().into_iter().filter(|backend| *backend != Backend::Sqlite) {
        let url = server_database(backend, "partitions").await.unwrap();
        three_admins(&url).await;
        drop_database(&url).await;
    }
}

async fn three_admins(url: &str) {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let mut admins: Vec<Admin> = Vec::new();
    for _ in 0..3 {
        admins.push(admin::start(admin_config(url.to_owned())).await.unwrap());
    }
    admins[0].state.db.ensure_group("default", "Default", admin::now_ms()).await.unwrap();
    let mut config = executor_config(&admins[0].url(), dir.path().join("executor"));
    config.admin_urls = admins.iter().map(Admin::url).collect();
    let executor = executor::start(config).await.unwrap();
    let urls: Vec<String> = admins.iter().map(Admin::url).collect();
    let api = |index: usize| Api {
        http: reqwest::Client::new(),
        base: urls[index].clone(),
        token: ADMIN_TOKEN.to_owned(),
    };
    api(0).wait_for_executors(1).await;

    // The shares balance: 86, 85 and 85, every partition held once.
    wait_until("three admins share the partitions", || async {
        let shares = shares(&api(1)).await;
        let counts: Vec<usize> = shares.values().map(BTreeSet::len).collect();
        (counts.len() == 3 && counts.iter().all(|count| *count >= 85)).then_some(())
    })
    .await;
    let held = shares(&api(2)).await;
    let all: BTreeSet<u16> = held.values().flatten().copied().collect();
    assert_eq!(all.len(), 256, "every partition held, once: {held:?}");
    assert_eq!(held.values().map(BTreeSet::len).sum::<usize>(), 256);

    let mut jobs = Vec::new();
    for n in 0..12 {
        let id = api(0)
            .create_job(json!({
                "name": format!("every second {n}"),
                "schedule_type": "CRON",
                "schedule_conf": "* * * * * ?",
                "glue_type": "GLUE_WASM",
                "misfire_strategy": "FIRE_ONCE_NOW",
            }))
            .await;
        let (status, body) = api(0).upload(id, sample_job("hello")).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        jobs.push(id);
    }
    let mut started = BTreeMap::new();
    for id in &jobs {
        let (status, body) = api(0).post(&format!("/api/v1/jobs/{id}/start"), Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        started.insert(*id, admin::now_ms());
    }
    tokio::time::sleep(Duration::from_secs(4)).await;

    // The admin that holds the first job's partition stops: it gives its partitions back, and
    // the other two take them.
    let mut leaving = None;
    for index in 0..3 {
        let (_, body) = api(index).get("/api/v1/admins").await;
        let this = body.as_array().unwrap().iter().find(|admin| admin["this"] == json!(true));
        let partitions: BTreeSet<u16> = this.unwrap()["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u16)
            .collect();
        if partitions.contains(&wasmjob::partition::of(jobs[0])) {
            leaving = Some((index, partitions));
        }
    }
    let (leaving_index, leaving) = leaving.expect("some admin holds the first job's partition");
    let stay = (leaving_index + 1) % 3;
    let stopped_at = admin::now_ms();
    admins.remove(leaving_index).stop().await;
    wait_until("two admins share every partition", || async {
        let shares = shares(&api(stay)).await;
        let counts: Vec<usize> = shares.values().map(BTreeSet::len).collect();
        (counts == [128, 128]).then_some(())
    })
    .await;
    let handover_ms = admin::now_ms() - stopped_at;
    eprintln!("the stopped admin's {} partitions handed over in {handover_ms} ms", leaving.len());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stopped = admin::now_ms();
    for id in &jobs {
        api(stay).post(&format!("/api/v1/jobs/{id}/stop"), Value::Null).await;
    }

    // Every instant of every job from the first full second after its start to the last full
    // second before the stop has one first run: none missing, none twice.
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(url).await.unwrap();
    let rows = fetch_all(
        &pool,
        "select job_id, fire_time from runs
         where attempt = 0 and trigger_type in ('CRON', 'MISFIRE') and fire_time is not null",
        &[],
    )
    .await
    .unwrap();
    pool.close().await;
    let mut fires: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for row in rows {
        use sqlx::Row;
        fires.entry(row.get("job_id")).or_default().push(row.get("fire_time"));
    }
    let last = (stopped / 1_000 - 2) * 1_000;
    for id in &jobs {
        let first = (started[id] / 1_000 + 2) * 1_000;
        let times = fires.get(id).cloned().unwrap_or_default();
        let distinct: BTreeSet<i64> = times.iter().copied().collect();
        assert_eq!(distinct.len(), times.len(), "job {id} fired an instant twice: {times:?}");
        for instant in (first..=last).step_by(1_000) {
            assert!(distinct.contains(&instant), "job {id} missed {instant}: {distinct:?}");
        }
    }
    let moved: Vec<&i64> =
        jobs.iter().filter(|id| leaving.contains(&wasmjob::partition::of(**id))).collect();
    assert!(!moved.is_empty());
    eprintln!("jobs of the stopped admin's partitions, still fired each second: {moved:?}");

    executor.stop().await;
    for admin in admins {
        admin.stop().await;
    }
}

/// Three admin processes on PostgreSQL (and on MySQL when it is configured); the third is
/// SIGKILLed. Its database session ends with it, and the other two take its partitions at
/// their next beats instead of when its leases run out: they count every one of them as
/// `taken_at_session_end`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_admins_partitions_are_taken_when_its_session_ends() {
    let backends: Vec<Backend> =
        backends().into_iter().filter(|backend| *backend != Backend::Sqlite).collect();
    if backends.is_empty() {
        eprintln!("no PostgreSQL or MySQL configured: skipping the killed admin's session");
    }
    for backend in backends {
        let url = server_database(backend, "session_end").await.unwrap();
        let mut cluster = Cluster::start(Some(url.clone()), 3, 0).await;
        let (survivor, victim) = (cluster.api_of(0), cluster.api_of(2));
        wait_until("three admins share the partitions", || async {
            let counts: Vec<usize> = shares(&survivor).await.values().map(BTreeSet::len).collect();
            (counts.len() == 3 && counts.iter().all(|count| *count >= 85)).then_some(())
        })
        .await;
        let (_, body) = victim.get("/api/v1/admins").await;
        let this = body.as_array().unwrap().iter().find(|admin| admin["this"] == json!(true));
        let victim_id = this.unwrap()["id"].as_str().unwrap().to_owned();
        // A beat of each survivor sees the victim's session open.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let victim_held = shares(&survivor).await[&victim_id].len();

        let killed_at = admin::now_ms();
        cluster.admins[2].kill();
        let held_all_at = wait_until("the two survivors hold every partition", || async {
            let shares = shares(&survivor).await;
            let survivors: usize =
                shares.iter().filter(|(id, _)| **id != victim_id).map(|(_, held)| held.len()).sum();
            (survivors == 256).then(admin::now_ms)
        })
        .await;
        let mut taken_at_session_end = 0.0;
        for index in 0..2 {
            let api = cluster.api_of(index);
            let reply = api.http.get(api.url("/metrics")).bearer_auth(&api.token).send().await;
            let scrape = metrics::parse(&reply.unwrap().text().await.unwrap());
            taken_at_session_end +=
                scrape.value("wasmjob_partition_handovers_total{how=\"taken_at_session_end\"}");
        }
        assert_eq!(
            taken_at_session_end, victim_held as f64,
            "the survivors took the victim's {victim_held} partitions as its session ended"
        );
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await;
        let pool = pool.unwrap();
        let last_beat: i64 = sqlx::query_scalar::<sqlx::Any, i64>(&match backend {
            Backend::Mysql => "select seen_at from admins where owner = ?".to_owned(),
            _ => "select seen_at from admins where owner = $1".to_owned(),
        })
        .bind(&victim_id)
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        // How soon is a figure of the machine's load, not asserted: the bench's failover
        // figures measure it.
        eprintln!(
            "{backend:?}: the killed admin's {victim_held} partitions taken over {} ms after \
             the kill; its leases ran out {} ms after it",
            held_all_at - killed_at,
            last_beat + admin::LEASE_MS - killed_at
        );
        cluster.finish().await;
    }
}

/// Each live admin's id and the partitions it holds, as `GET /api/v1/admins` lists them.
async fn shares(api: &Api) -> BTreeMap<String, BTreeSet<u16>> {
    let (status, body) = api.get("/api/v1/admins").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .map(|admin| {
            let partitions = admin["partitions"].as_array().unwrap();
            let partitions = partitions.iter().map(|p| p.as_u64().unwrap() as u16).collect();
            (admin["id"].as_str().unwrap().to_owned(), partitions)
        })
        .collect()
}

/// A job changed through another admin (here: in the database, behind this admin's copy of it)
/// fires by its new schedule from its next pass on: a pass reads each due job's stamp from the
/// database, and a job whose copy has another stamp is read again whole. With this admin's copy
/// (every second) the fire after the due one would be a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_changed_through_another_admin_fires_by_its_new_schedule() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let state = &app.admin.as_ref().unwrap().state;
        let job_id = api
            .create_job(json!({
                "name": "changed elsewhere", "schedule_type": "CRON", "schedule_conf": "* * * * * ?",
            }))
            .await;
        api.upload(job_id, sample_job("hello")).await;
        let (status, started) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{started}");
        let runs = |from_ms: i64| {
            let filter = RunFilter {
                job_id: Some(job_id),
                from_ms: Some(from_ms),
                limit: 10,
                ..RunFilter::default()
            };
            async move { state.db.list_runs(&filter).await.unwrap().total }
        };
        wait_until("the job fires", || async { (runs(0).await > 0).then_some(()) }).await;
        // This admin's copy, read now, still says every second when the next pass uses it.
        state.cache.forget_job(job_id);
        assert!(state.cache.job(job_id).await.unwrap().is_some());
        let job = state.db.get_job(job_id).await.unwrap().unwrap();
        let mut spec = job.spec.clone();
        spec.schedule_conf = "0 0 0 1 1 ?".to_owned();
        state.db.update_job(job_id, &spec, job.next_fire_ms, admin::now_ms()).await.unwrap();
        let moved = wait_until("the job's next fire follows the new schedule", || async {
            let now = state.db.get_job(job_id).await.unwrap().unwrap();
            (now.next_fire_ms > admin::now_ms() + 86_400_000).then_some(now)
        })
        .await;
        assert!(moved.running);
        assert_eq!(
            runs(job.next_fire_ms + 1).await,
            0,
            "no fire after the one due at the change ({} ms)",
            job.next_fire_ms
        );
        app.stop().await;
    }
}
