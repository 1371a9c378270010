//! The daemons as an operations team runs them, as real processes: configuration files and
//! `--print-config`, secrets in files, JSON log lines that follow a run from the admin to the
//! executor, `--version`, and a backup of a running standalone restored into a new one.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::standalone::spawn_standalone;
use crate::support::{Api, sample_job};

/// Runs `wasmjob args…` with `env` and none of the `WASMJOB_*` variables a developer may have set.
fn wasmjob(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wasmjob"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WASMJOB_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied()).env_remove("RUST_LOG").output().unwrap()
}

#[test]
fn a_config_file_sits_below_the_environment_and_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admin.toml");
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    std::fs::write(
        &config,
        format!(
            "# The admin of the tests.\nlisten = \"127.0.0.1:9000\"\nheartbeat_secs = 10\n\
             admin_token_file = \"{}\"\ndatabase_url = \"postgres://wasmjob:hunter2@db/wasmjob\"\n",
            token.display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let print = |args: &[&str], env: &[(&str, &str)]| {
        let output = wasmjob(args, env);
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {}\n{stderr}", output.status);
        assert!(stderr.is_empty(), "{stderr}");
        assert!(!stdout.contains("hunter2") && !stdout.contains("0123456789abcdef"), "{stdout}");
        let wanted = ["heartbeat_secs", "listen", "admin_token", "database_url"];
        stdout
            .lines()
            .filter(|line| wanted.iter().any(|key| line.starts_with(&format!("{key} = "))))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let env = [("WASMJOB_HEARTBEAT_SECS", "20")];
    // The arguments, the environment, and the lines printed for the four keys.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let table: &[Case<'_>] = &[
        (
            &["admin", "--print-config"],
            &[],
            "listen = \"0.0.0.0:8080\" # default; database_url = \"<redacted>\" # default; \
             heartbeat_secs = 30 # default",
        ),
        (
            &["admin", "--config", config, "--print-config"],
            &[],
            "listen = \"127.0.0.1:9000\" # config file; database_url = \"<redacted>\" # config \
             file; admin_token = \"<redacted>\" # from admin_token_file; heartbeat_secs = 10 # \
             config file",
        ),
        (
            &["admin", "--print-config"],
            &[("WASMJOB_CONFIG", config), env[0]],
            "listen = \"127.0.0.1:9000\" # config file; database_url = \"<redacted>\" # config \
             file; admin_token = \"<redacted>\" # from admin_token_file; heartbeat_secs = 20 # \
             WASMJOB_HEARTBEAT_SECS",
        ),
        (
            &["admin", "--config", config, "--heartbeat-secs", "40", "--print-config"],
            &env,
            "listen = \"127.0.0.1:9000\" # config file; database_url = \"<redacted>\" # config \
             file; admin_token = \"<redacted>\" # from admin_token_file; heartbeat_secs = 40 # \
             flag",
        ),
    ];
    for (args, env, expected) in table {
        assert_eq!(print(args, env), *expected, "{args:?} {env:?}");
    }

    // A mistake in the file stops the daemon before it starts, naming the file and the line.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "listen = \"127.0.0.1:0\"\nheartbeat_sec = 10\n").unwrap();
    let output = wasmjob(&["admin", "--config", bad.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:2:1: unknown key `heartbeat_sec`", bad.display())),
        "{stderr}"
    );
    std::fs::write(&bad, "listen = \"127.0.0.1:0\"\n\nheartbeat_secs = \"ten\"\n").unwrap();
    let output = wasmjob(&["admin", "--config", bad.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:3:18: `heartbeat_secs` takes an integer, not string \"ten\"",
            bad.display()
        )),
        "{stderr}"
    );
    let output = wasmjob(&["admin", "--config", "/nonexistent/admin.toml"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("config file /nonexistent/admin.toml: No such file"), "{stderr}");
}

#[test]
fn version_names_the_commit_the_build_date_and_wasmtime() {
    let output = wasmjob(&["--version"], &[]);
    assert!(output.status.success());
    let version = String::from_utf8(output.stdout).unwrap();
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap();
    let wasmtime = lock
        .split("[[package]]")
        .find(|package| package.contains("\nname = \"wasmtime\"\n"))
        .and_then(|package| package.split("version = \"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap();
    let rest = version
        .strip_prefix(&format!("wasmjob {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("{version}"));
    let (commit, rest) = rest.split_once(", built ").unwrap_or_else(|| panic!("{version}"));
    let (date, rest) = rest.split_once(", wasmtime ").unwrap_or_else(|| panic!("{version}"));
    assert_eq!(rest, format!("{wasmtime})\n"), "{version}");
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{version}"
    );
    let date_ok = date.len() == 10
        && date
            .char_indices()
            .all(|(i, c)| if i == 4 || i == 7 { c == '-' } else { c.is_ascii_digit() });
    assert!(date_ok, "{version}");
    // In a git checkout, the commit is one of the repository's (HEAD when the build ran; a
    // commit made while the tests run moves HEAD past it, so HEAD itself is not compared).
    let known = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "cat-file", "-e"])
        .arg(format!("{commit}^{{commit}}"))
        .status();
    if commit != "unknown"
        && let Ok(inside) =
            Command::new("git").args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse"]).status()
        && inside.success()
    {
        assert!(
            known.is_ok_and(|status| status.success()),
            "{version}: not a commit of this repository"
        );
    }
}

/// A daemon whose stderr lines are kept; killed (by PID) if the test ends without stopping it.
struct Daemon {
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// SIGTERM, then every line it wrote.
    fn stop(mut self) -> Vec<String> {
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert!(status.success(), "exited with {status}");
        self.reader.take().unwrap().join().unwrap();
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_follow_a_run_from_the_admin_to_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("operator-token");
    let token = "9a8b7c6d5e4f3a2b1c0d";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let config = dir.path().join("standalone.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nadmin_listen = \"127.0.0.1:0\"\nexecutor_listen = \"127.0.0.1:0\"\n\
             admin_token_file = \"{}\"\nlog_format = \"json\"\n",
            dir.path().join("data").display(),
            token_file.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
        .args(["standalone", "--config"])
        .arg(&config)
        // A run's send and its success are debug lines.
        .env("RUST_LOG", "info,wasmjob=debug")
        .env_remove("WASMJOB_ADMIN_TOKEN")
        .env_remove("WASMJOB_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (sender, receiver) = std::sync::mpsc::channel();
    let kept = lines.clone();
    let reader = std::thread::spawn(move || {
        let mut url = None;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let message = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|value| value["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            if let Some(listening) = message.strip_prefix("admin listening on ") {
                url.get_or_insert_with(|| listening.trim().to_owned());
            }
            if message.contains("wasmjob standalone is up")
                && let Some(url) = url.take()
            {
                let _ = sender.send(url);
            }
            kept.lock().unwrap().push(line);
        }
    });
    let daemon = Daemon { child: Some(child), lines, reader: Some(reader) };
    let base = receiver
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("no JSON line said the standalone is up: {:?}", daemon.lines));

    // The operator token is the one in the file the config file names.
    let api = Api { http: reqwest::Client::new(), base, token: token.to_owned() };
    api.wait_for_executors(1).await;
    let job_id = api.create_job(json!({"name": "hello"})).await;
    api.upload(job_id, sample_job("hello")).await;
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "x"})).await;
    let run_id = triggered["log_ids"][0].as_i64().unwrap();
    let run = api.finished_run(run_id).await;
    assert_eq!(run["handle_code"], 200, "{run}");

    let lines = daemon.stop();
    let mut admin_lines = Vec::new();
    let mut executor_lines = Vec::new();
    for line in &lines {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
        for key in ["time", "level", "target", "message"] {
            assert!(value[key].is_string(), "{key} in {line}");
        }
        if value["run_id"] != run_id {
            continue;
        }
        let target = value["target"].as_str().unwrap();
        if target.starts_with("wasmjob::admin") {
            admin_lines.push(value);
        } else if target.starts_with("wasmjob::executor") {
            executor_lines.push(value);
        }
    }
    let all = lines.join("\n");
    // On each side a line names the run, its job and the executor, by the same address.
    let named = |side: &[Value]| {
        side.iter()
            .find(|line| {
                line["job_id"] == job_id && line["executor"].as_str().is_some_and(|e| !e.is_empty())
            })
            .map(|line| line["executor"].as_str().unwrap().to_owned())
    };
    let admin = named(&admin_lines).unwrap_or_else(|| panic!("admin side: {admin_lines:?}\n{all}"));
    let executor = named(&executor_lines)
        .unwrap_or_else(|| panic!("executor side: {executor_lines:?}\n{all}"));
    assert_eq!(admin, executor);
    assert!(admin.starts_with("http://127.0.0.1:"), "{admin}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_running_standalone_is_consistent_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (standalone, base) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap();
    let api = Api { http: reqwest::Client::new(), base, token };
    api.wait_for_executors(1).await;
    // FAILOVER: the restored copy still lists this executor until its heartbeats run out, and
    // a run must then go to the one that answers.
    let mut job_ids = Vec::new();
    for name in ["backup-a", "backup-b", "backup-c"] {
        let job_id = api.create_job(json!({"name": name, "route_strategy": "FAILOVER"})).await;
        api.upload(job_id, sample_job("hello")).await;
        job_ids.push(job_id);
    }
    let mut run_ids = Vec::new();
    for &job_id in &job_ids {
        let (_, triggered) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "x"})).await;
        run_ids.push(triggered["log_ids"][0].as_i64().unwrap());
    }
    for &run_id in &run_ids {
        assert_eq!(api.finished_run(run_id).await["handle_code"], 200);
    }

    // Backed up while runs are triggered and written.
    let writing = {
        let api = Api { http: api.http.clone(), base: api.base.clone(), token: api.token.clone() };
        let job_id = job_ids[0];
        tokio::spawn(async move {
            for _ in 0..20 {
                api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "y"})).await;
            }
        })
    };
    let copy = dir.path().join("wasmjob-backup.db");
    let (data, to) = (data_dir.display().to_string(), copy.display().to_string());
    let output = tokio::task::spawn_blocking(move || {
        wasmjob(&["backup", "--data-dir", &data, "--to", &to], &[])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    assert!(stderr.contains("integrity check ok"), "{stderr}");
    writing.await.unwrap();

    // The copy is one self-contained file, whole, with the jobs and the finished runs.
    assert!(!dir.path().join("wasmjob-backup.db-wal").exists());
    {
        let copy = rusqlite::Connection::open(&copy).unwrap();
        let check: String = copy.query_row("pragma integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(check, "ok");
        let jobs: i64 = copy.query_row("select count(*) from jobs", [], |row| row.get(0)).unwrap();
        assert_eq!(jobs, 3);
        let finished: i64 = copy
            .query_row(
                &format!(
                    "select count(*) from runs where handle_code = 200 and id in ({})",
                    run_ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
                ),
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(finished, 3);
    }
    // A second backup into the same file is refused; the first is left alone.
    let args = ["backup", "--data-dir", data_dir.to_str().unwrap(), "--to", copy.to_str().unwrap()];
    let output = wasmjob(&args, &[]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("exists already"));
    crate::support::standalone::stop_gracefully(standalone);

    // Restored: the copy is the database of a new data directory.
    let restored_dir = dir.path().join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    std::fs::copy(&copy, restored_dir.join("wasmjob.db")).unwrap();
    let (restored, base) = spawn_standalone(&restored_dir);
    let token = std::fs::read_to_string(restored_dir.join("admin-token")).unwrap();
    let api = Api { http: reqwest::Client::new(), base, token };
    let (status, jobs) = api.get("/api/v1/jobs").await;
    assert_eq!(status, 200, "{jobs}");
    let names: Vec<&str> =
        jobs.as_array().unwrap().iter().filter_map(|job| job["name"].as_str()).collect();
    assert_eq!(names.len(), 3, "{jobs}");
    for &run_id in &run_ids {
        let (status, run) = api.get(&format!("/api/v1/logs/{run_id}")).await;
        assert_eq!((status.as_u16(), &run["handle_code"]), (200, &json!(200)), "{run}");
    }
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{}/trigger", job_ids[1]), json!({"param": "z"})).await;
    let run_id = triggered["log_ids"][0].as_i64().unwrap();
    assert_eq!(api.finished_run(run_id).await["handle_code"], 200);
    crate::support::standalone::stop_gracefully(restored);
}

#[test]
fn backup_refuses_what_it_cannot_copy() {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("copy.db");
    let to = to.to_str().unwrap();
    let table: &[(&[&str], &str)] = &[
        (
            &["backup", "--database-url", "postgres://wasmjob:hunter2@db/wasmjob", "--to", to],
            "back it up with pg_dump",
        ),
        (
            &["backup", "--database-url", "mysql://wasmjob:hunter2@db/wasmjob", "--to", to],
            "back it up with mysqldump",
        ),
        (&["backup", "--database-url", "redis://db/0", "--to", to], "use sqlite:PATH"),
        (
            &["backup", "--data-dir", "/nonexistent", "--to", to],
            "/nonexistent/wasmjob.db is not a database file",
        ),
        (&["backup", "--to", to], "--data-dir <DATA_DIR>|--database-url <DATABASE_URL>"),
    ];
    for (args, expected) in table {
        let output = wasmjob(args, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!Path::new(to).exists());
    }
}
