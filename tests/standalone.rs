use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::end_to_end::cron_then_manual;
use crate::support::Api;

/// Starts `wasmjob standalone` on port 0 and returns it with its admin URL (read from its log).
fn spawn_standalone(data_dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
        .args([
            "standalone",
            "--admin-listen",
            "127.0.0.1:0",
            "--executor-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data_dir)
        .env("RUST_LOG", "info")
        .env_remove("WASMJOB_ADMIN_TOKEN")
        .env_remove("WASMJOB_ACCESS_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent && let Some((_, url)) = line.split_once("admin listening on ") {
                sender.send(url.trim().to_owned()).unwrap();
                sent = true;
            }
        }
    });
    let url = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("standalone did not log its admin address");
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_runs_uploaded_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (mut child, base) = spawn_standalone(&data_dir);

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

    // SIGTERM: a graceful stop that deregisters the executor and exits 0.
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "standalone exited with {status}");
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
