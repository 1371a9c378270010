//! A power cut on SQLite, simulated: the admin's database goes back to a copy taken at a
//! checkpoint, so the commits after it (runs an executor has since accepted, run and journaled)
//! are lost and their run ids are handed out again, for other runs.
//!
//! The executor is a real process that lives through it all with its journal. The test checks
//! that no run made after the restart is swallowed as a duplicate of the lost run its id once
//! named: each one runs, or is refused for the conflict and retried under a fresh id.
//!
//! It does not cut power (a `SIGKILL` and a file copy stand in for it), so it says nothing of
//! what `synchronous = FULL` keeps; `storage::tests` checks that setting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::Api;
use crate::support::cluster::Cluster;

/// How many runs the power cut loses, and how many are triggered after it.
const RUNS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_after_a_power_cut_that_lost_commits_are_never_taken_for_duplicates() {
    let mut cluster = Cluster::start(None, 1, 1).await;
    let api = cluster.api();
    let job_id = api
        .create_job(json!({
            "name": "power cut",
            "glue_type": "BEAN",
            "handler": "hello",
            "retry_count": RUNS,
            "timeout_secs": 10,
        }))
        .await;
    let before = trigger_and_finish(&api, job_id, 2).await;

    // The checkpoint: the database and its WAL as they are on disk, the admin stopped.
    let db = PathBuf::from(cluster.database_url.strip_prefix("sqlite:").unwrap());
    cluster.admins[0].kill();
    let saved = copy_database(&db, "saved");
    cluster.admins[0].start("").await;

    // Commits the power cut loses: runs the executor accepts, runs and journals.
    let lost = trigger_and_finish(&cluster.api(), job_id, RUNS).await;
    for run in &lost {
        assert_eq!(run["state"], "success", "{run}");
    }

    // The power cut: the admin dies, and its database is the copy again.
    cluster.admins[0].kill();
    restore_database(&saved, &db);
    cluster.admins[0].start("").await;
    let api = cluster.api();
    api.wait_for_executors(1).await;

    // Every trigger now gets one of the lost runs' ids back first.
    let newest_kept = before.iter().map(|run| run["id"].as_i64().unwrap()).max().unwrap();
    let mut first_ids = Vec::new();
    for _ in 0..RUNS {
        let (status, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert_eq!(status, 200, "{triggered}");
        first_ids.push(triggered["log_ids"][0].as_i64().unwrap());
    }
    let lost_ids: Vec<i64> = lost.iter().map(|run| run["id"].as_i64().unwrap()).collect();
    assert!(
        first_ids.iter().any(|id| lost_ids.contains(id)),
        "the restored database hands out a lost run's id again (lost {lost_ids:?}, new \
         {first_ids:?})"
    );

    // Each new run ends: run, or refused for the conflict and retried (with as many retries as
    // there are lost ids, every trigger ends in a success). None is left waiting for a result
    // its executor will never send.
    let runs = settled_runs_after(&api, job_id, newest_kept).await;
    let mut report = String::new();
    let mut successes = 0;
    for run in &runs {
        let state = run["state"].as_str().unwrap_or_default();
        let conflict = [&run["trigger_msg"], &run["handle_msg"]]
            .iter()
            .any(|text| text.as_str().unwrap_or_default().contains("run id conflict"));
        report.push_str(&format!(
            "run {} attempt {}: {state} {} {}\n",
            run["id"], run["attempt"], run["trigger_msg"], run["handle_msg"]
        ));
        successes += usize::from(state == "success");
        assert!(state == "success" || (state == "failed" && conflict), "{report}");
    }
    assert_eq!(successes, RUNS, "every trigger ends in one success:\n{report}");
    cluster.finish().await;
}

/// Triggers `count` runs of `job_id` and waits for their ends; the run records.
async fn trigger_and_finish(api: &Api, job_id: i64, count: usize) -> Vec<Value> {
    let mut runs = Vec::new();
    for _ in 0..count {
        let (status, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
        assert_eq!(status, 200, "{triggered}");
        runs.push(api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await);
    }
    runs
}

/// The runs of `job_id` with ids above `after`, once every one of them has ended (within a
/// bound: a run answered as a duplicate would wait out its timeout and the dispatch sweep).
async fn settled_runs_after(api: &Api, job_id: i64, after: i64) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, page) = api.get(&format!("/api/v1/logs?job_id={job_id}&limit=100")).await;
        assert_eq!(status, 200, "{page}");
        let runs: Vec<Value> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|run| run["id"].as_i64().unwrap() > after)
            .cloned()
            .collect();
        let ended = ["success", "failed", "timed_out", "killed", "lost", "skipped"];
        let open: Vec<&Value> =
            runs.iter().filter(|run| !ended.contains(&run["state"].as_str().unwrap())).collect();
        if open.is_empty() && runs.len() >= RUNS {
            return runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "runs never ended: {open:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies the database file and its WAL next to it, with `suffix`.
fn copy_database(db: &Path, suffix: &str) -> PathBuf {
    let saved = db.with_extension(suffix);
    std::fs::copy(db, &saved).unwrap();
    let wal = wal_of(db);
    if wal.exists() {
        std::fs::copy(&wal, wal_of(&saved)).unwrap();
    }
    saved
}

/// Puts the copy back as the database; the WAL index (`-shm`) goes, so SQLite rebuilds it from
/// the WAL as after a reboot.
fn restore_database(saved: &Path, db: &Path) {
    std::fs::copy(saved, db).unwrap();
    let _ = std::fs::remove_file(wal_of(db));
    if wal_of(saved).exists() {
        std::fs::copy(wal_of(saved), wal_of(db)).unwrap();
    }
    let _ = std::fs::remove_file(PathBuf::from(format!("{}-shm", db.display())));
}

fn wal_of(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", db.display()))
}
