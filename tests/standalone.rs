use std::process::Command;

use crate::support::Api;
use crate::support::scenarios::cron_then_manual;
use crate::support::standalone::{spawn_standalone, stop_gracefully};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_runs_uploaded_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (child, base) = spawn_standalone(&data_dir);

    // Tokens are generated on first start and kept private in the data dir.
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data_dir.join("access-token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let api = Api { http: reqwest::Client::new(), base, token };
    let (status, _) = api.get("/api/v1/jobs").await;
    assert_eq!(status, 200);
    api.wait_for_executors(1).await;
    cron_then_manual(&api).await;

    stop_gracefully(child);
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Hostile jobs, run again and again, leave the process's memory where the first round left it.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_hostile_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (child, base) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    let api = Api { http: reqwest::Client::new(), base, token };
    api.wait_for_executors(1).await;
    let jobs = [("hog", "", 32), ("deep", "", 64), ("crash", "boom", 64), ("chatty", "2000", 64)];
    let mut ids = Vec::new();
    for (name, _, memory) in jobs {
        let job_id = api
            .create_job(
                serde_json::json!({"name": name, "timeout_secs": 5, "memory_limit_mb": memory}),
            )
            .await;
        api.upload(job_id, crate::support::sample_job(name)).await;
        ids.push(job_id);
    }
    let mut rss = Vec::new();
    for _round in 0..4 {
        for (job_id, (_, param, _)) in ids.iter().zip(jobs) {
            let (_, triggered) = api
                .post(
                    &format!("/api/v1/jobs/{job_id}/trigger"),
                    serde_json::json!({"param": param}),
                )
                .await;
            api.finished_run(triggered["log_ids"][0].as_i64().unwrap()).await;
        }
        rss.push(rss_kib(child.id()));
    }
    eprintln!("standalone RSS after each round (KiB): {rss:?}");
    // The first round compiles and warms up; after it, memory must not keep growing.
    let growth = rss[3].saturating_sub(rss[1]);
    assert!(growth < 16 * 1024, "RSS grew by {growth} KiB between rounds 2 and 4: {rss:?}");
    stop_gracefully(child);
}

#[test]
fn admin_and_executor_refuse_to_start_without_strong_tokens() {
    let cases: &[(&[&str], &str)] = &[
        (&["admin", "--listen", "127.0.0.1:0"], "--admin-token / WASMJOB_ADMIN_TOKEN is required"),
        (&["admin", "--listen", "127.0.0.1:0", "--admin-token", "default_token"], "too short"),
        (
            &[
                "executor",
                "--admin-url",
                "http://127.0.0.1:1",
                "--app-name",
                "a",
                "--access-token",
                "xxxxxxxxxxxxxxxxxxxx",
            ],
            "well-known value",
        ),
    ];
    for (args, expected) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .args(*args)
            .env_remove("WASMJOB_ADMIN_TOKEN")
            .env_remove("WASMJOB_ACCESS_TOKEN")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} started");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
