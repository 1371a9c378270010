//! Real `wasmjob admin` and `wasmjob executor` processes on 127.0.0.1, for the fault tests.
//!
//! Each [`Proc`] is one role on a fixed port (picked free once, reused across restarts, so an
//! executor restarted "at the same address" is the same executor to the admin, and executors
//! find a restarted admin where they left it). Its stderr goes to a log file in the cluster's
//! temp dir, which is how a start is confirmed (the `listening on` line) and what a failing test
//! shows. `kill` is `SIGKILL` by PID; dropping a `Proc` (hence a [`Cluster`], also while a test
//! unwinds from a panic) kills its child, so no test leaves a process behind. `pause` and
//! `resume` are `SIGSTOP` and `SIGCONT` by PID (sent by the `kill` command: the crate has no
//! `libc` or `nix` dependency, and no unsafe code): a paused process keeps its sockets,
//! connections and leases and does nothing. `SIGKILL` ends a paused process as well, so the
//! kill of a drop also ends a process a panicking test left paused.
//!
//! Every process of a cluster runs one pinned copy of the binary (a hard link made when the
//! cluster starts): a build that replaces the binary in the target dir meanwhile, as builds
//! sharing a target dir do, cannot slip another version into a restart.
//!
//! This module does not decide when to kill; the scenarios in `fault.rs` do. It also does not
//! drop a PostgreSQL database on panic (that needs async); the normal end does, in
//! [`Cluster::finish`].

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{ACCESS_TOKEN, ADMIN_TOKEN, Api};

/// The sample jobs every executor has as `BEAN` handlers (by the same name).
pub const BEAN_HANDLERS: &[&str] = &["hello", "fail", "sleeper"];

/// The name of the cluster's pinned copy of the binary, in its temp dir.
const PINNED_BINARY: &str = "wasmjob";

/// How long a process may take to log that it listens.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One role of the cluster: the real binary with fixed arguments, started and killed at will.
pub struct Proc {
    /// `admin-0`, `executor-1`, …: names its log file.
    pub name: String,
    /// The port it listens on, the same in every incarnation.
    pub port: u16,
    binary: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    child: Option<Child>,
    /// How many times it was started.
    pub starts: u32,
    /// When the current (or last) incarnation was spawned (ms since the epoch).
    pub started_ms: i64,
    /// When its incarnations died (ms since the epoch): killed, or seen to have exited.
    pub deaths: Vec<i64>,
    /// When the current incarnation was paused, if it is: the instant, and ms since the epoch.
    paused: Option<(Instant, i64)>,
}

impl Proc {
    fn new(name: String, port: u16, args: Vec<String>, dir: &Path) -> Proc {
        let log_path = dir.join(format!("{name}.log"));
        let binary = dir.join(PINNED_BINARY);
        Proc {
            name,
            port,
            binary,
            args,
            log_path,
            child: None,
            starts: 0,
            started_ms: 0,
            deaths: Vec::new(),
            paused: None,
        }
    }

    /// A process of the binary under test outside a [`Cluster`]: `name` run with `args` on
    /// `port` (which `args` name), its log and the pinned copy of the binary in `dir`.
    pub fn outside_cluster(dir: &Path, name: &str, port: u16, args: Vec<String>) -> Proc {
        let binary = dir.join(PINNED_BINARY);
        if !binary.exists() {
            pin_binary(&binary);
        }
        Proc::new(name.to_owned(), port, args, dir)
    }

    /// Adds `args` to its command line, from its next start.
    pub fn add_args(&mut self, args: &[&str]) {
        self.args.extend(args.iter().map(|arg| (*arg).to_owned()));
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the process with `failpoints` armed (`""` arms none) and waits until it listens.
    pub async fn start(&mut self, failpoints: &str) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let mut log =
            std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).unwrap();
        let offset = log.seek(SeekFrom::End(0)).unwrap();
        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("WASMJOB_ADMIN_TOKEN")
            .env_remove("WASMJOB_ACCESS_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        if failpoints.is_empty() {
            command.env_remove("WASMJOB_FAILPOINTS");
        } else {
            command.env("WASMJOB_FAILPOINTS", failpoints);
        }
        self.started_ms = wasmjob::admin::now_ms();
        self.child = Some(command.spawn().unwrap());
        self.starts += 1;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if self.log_since(offset).contains("listening on") {
                return;
            }
            if let Some(status) = self.exited() {
                panic!("{} exited with {status} while starting:\n{}", self.name, self.log_tail());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} did not log that it listens:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `SIGKILL` by PID (what `Child::kill` sends on Unix), then reaps it; `None` if it was not
    /// running. The status says whether it had already died on its own (a failpoint's abort).
    /// A paused incarnation is killed all the same (`SIGKILL` needs no `SIGCONT`).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        self.paused = None;
        // An error here means it already exited; `wait` reaps it either way.
        let _ = child.kill();
        let status = child.wait().unwrap();
        self.deaths.push(wasmjob::admin::now_ms());
        Some(status)
    }

    /// Kills it and starts it again on the same port and data, with `failpoints` armed.
    pub async fn restart(&mut self, failpoints: &str) {
        self.kill();
        self.start(failpoints).await;
    }

    /// Pauses the current incarnation with `SIGSTOP`: it stays up, holds its sockets, database
    /// connections and leases, and does nothing (no beat, no fire, no answer) until
    /// [`Proc::resume`] or [`Proc::kill`]. `false` if it is not running or already paused.
    pub fn pause(&mut self) -> bool {
        if self.paused.is_some() {
            return false;
        }
        let Some(child) = &self.child else { return false };
        // Not reaped yet (only `kill` and `exited` reap), so the PID is still this child's.
        send_signal(child.id(), "-STOP");
        self.paused = Some((Instant::now(), wasmjob::admin::now_ms()));
        true
    }

    /// Resumes a paused incarnation with `SIGCONT`; how long it was paused and when the pause
    /// began (ms since the epoch), or `None` if it was not paused.
    pub fn resume(&mut self) -> Option<(Duration, i64)> {
        let (since, since_ms) = self.paused.take()?;
        if let Some(child) = &self.child {
            send_signal(child.id(), "-CONT");
        }
        Some((since.elapsed(), since_ms))
    }

    /// How long the current incarnation has been paused, if it is.
    pub fn paused_for(&self) -> Option<Duration> {
        self.paused.map(|(since, _)| since.elapsed())
    }

    /// Whether the current incarnation is still running (a paused one is).
    pub fn is_alive(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// The exit status if the current incarnation died on its own (it is then reaped and gone).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().unwrap()?;
        self.child = None;
        self.paused = None;
        self.deaths.push(wasmjob::admin::now_ms());
        Some(status)
    }

    /// The last lines of its log, for failure messages.
    /// Its whole log, every incarnation's.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log_path) {
            let _ = file.seek(SeekFrom::Start(offset));
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Proc {
    /// Kills the child, paused or not.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `signal` (`-STOP`, `-CONT`) to `pid` with the `kill` command.
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// Admins on one database and executors of the group `default`, in one temp dir.
pub struct Cluster {
    pub admins: Vec<Proc>,
    pub executors: Vec<Proc>,
    /// `sqlite:PATH`, or a fresh PostgreSQL or MySQL database's URL.
    pub database_url: String,
    /// Whether the database is a server's (PostgreSQL or MySQL), dropped at the end.
    server: bool,
    /// Whether executors added from now on pull their runs (`--pull`, `pull://executor-N`).
    pub pull: bool,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// `admins` admins (started) on `server_url`'s database (PostgreSQL or MySQL), or on a
    /// SQLite file when `None`,
    /// the group `default`, and `executors` executors (started, online) pointed at every admin.
    pub async fn start(server_url: Option<String>, admins: usize, executors: usize) -> Cluster {
        Cluster::start_pulling(server_url, admins, executors, false).await
    }

    /// [`Cluster::start`], with executors that pull their runs when `pull` is true.
    pub async fn start_pulling(
        server_url: Option<String>,
        admins: usize,
        executors: usize,
        pull: bool,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        pin_binary(&dir.path().join(PINNED_BINARY));
        let server = server_url.is_some();
        let database_url = server_url
            .unwrap_or_else(|| format!("sqlite:{}", dir.path().join("wasmjob.db").display()));
        let mut cluster =
            Cluster { admins: Vec::new(), executors: Vec::new(), database_url, server, pull, dir };
        for _ in 0..admins {
            cluster.add_admin().await;
        }
        let (status, group) = cluster
            .api()
            .post(
                "/api/v1/groups",
                json!({"app_name": "default", "title": "Default", "address_type": "AUTO"}),
            )
            .await;
        assert_eq!(status, 201, "{group}");
        for _ in 0..executors {
            cluster.add_executor().await;
        }
        cluster.api().wait_for_executors(executors).await;
        cluster
    }

    /// Starts one more admin on the cluster's database.
    pub async fn add_admin(&mut self) -> &mut Proc {
        let port = free_port();
        let args = vec![
            "admin".to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--database-url".to_owned(),
            self.database_url.clone(),
            "--admin-token".to_owned(),
            ADMIN_TOKEN.to_owned(),
            "--access-token".to_owned(),
            ACCESS_TOKEN.to_owned(),
            "--heartbeat-secs".to_owned(),
            "1".to_owned(),
        ];
        let name = format!("admin-{}", self.admins.len());
        let mut admin = Proc::new(name, port, args, self.dir.path());
        admin.start("").await;
        self.admins.push(admin);
        self.admins.last_mut().unwrap()
    }

    /// Starts one more executor, registered with every admin (in order), with its own data dir
    /// and the [`BEAN_HANDLERS`].
    pub async fn add_executor(&mut self) -> &mut Proc {
        let port = free_port();
        let name = format!("executor-{}", self.executors.len());
        let data_dir = self.dir.path().join(&name);
        let handlers_dir = data_dir.join("handlers");
        std::fs::create_dir_all(&handlers_dir).unwrap();
        for sample in BEAN_HANDLERS {
            let path = handlers_dir.join(format!("{sample}.wasm"));
            std::fs::write(path, super::sample_job(sample)).unwrap();
        }
        let admin_urls: Vec<String> = self.admins.iter().map(Proc::url).collect();
        let args = vec![
            "executor".to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--address".to_owned(),
            match self.pull {
                true => format!("pull://{name}"),
                false => format!("http://127.0.0.1:{port}"),
            },
            "--admin-url".to_owned(),
            admin_urls.join(","),
            "--app-name".to_owned(),
            "default".to_owned(),
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
            "--handlers-dir".to_owned(),
            handlers_dir.display().to_string(),
            "--access-token".to_owned(),
            ACCESS_TOKEN.to_owned(),
            "--heartbeat-secs".to_owned(),
            "1".to_owned(),
        ];
        let mut args = args;
        if self.pull {
            args.push("--pull".to_owned());
        }
        let mut executor = Proc::new(name, port, args, self.dir.path());
        executor.start("").await;
        self.executors.push(executor);
        self.executors.last_mut().unwrap()
    }

    /// A client of the first admin.
    pub fn api(&self) -> Api {
        self.api_of(0)
    }

    /// A client of admin `index`.
    pub fn api_of(&self, index: usize) -> Api {
        Api {
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap(),
            base: self.admins[index].url(),
            token: ADMIN_TOKEN.to_owned(),
        }
    }

    /// Every executor's data dir (their journals live there).
    pub fn executor_dirs(&self) -> Vec<PathBuf> {
        self.executors.iter().map(|executor| self.dir.path().join(&executor.name)).collect()
    }

    /// Kills every process, then drops the PostgreSQL or MySQL database if the cluster made
    /// one. With `WASMJOB_FAULT_KEEP` set, the temp dir (logs, SQLite file, executor data) and
    /// the server's database stay, for a look at what a scenario found.
    pub async fn finish(mut self) {
        for proc in self.admins.iter_mut().chain(self.executors.iter_mut()) {
            proc.kill();
        }
        #[expect(clippy::disallowed_methods, reason = "test configuration")]
        let keep = std::env::var_os("WASMJOB_FAULT_KEEP").is_some();
        if keep {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
            if self.server {
                eprintln!("kept {}", self.database_url);
            }
            return;
        }
        if self.server {
            if self.database_url.starts_with("mysql://") {
                wasmjob::storage::testing::drop_mysql_database(&self.database_url).await.unwrap();
            } else {
                wasmjob::storage::testing::drop_postgres_database(&self.database_url)
                    .await
                    .unwrap();
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // `Proc`'s own drop would do it too; this keeps the guarantee visible where it matters.
        for proc in self.admins.iter_mut().chain(self.executors.iter_mut()) {
            proc.kill();
        }
    }
}

/// Pins the binary cargo built for this test run at `path`: a hard link (cheap, and it keeps
/// the inode when the target dir's file is replaced), or a copy across file systems.
fn pin_binary(path: &Path) {
    let built = env!("CARGO_BIN_EXE_wasmjob");
    if std::fs::hard_link(built, path).is_err() {
        std::fs::copy(built, path).unwrap();
    }
}

/// A port free on 127.0.0.1 now (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
