//! `cargo bench --bench e2e`: the whole platform under load, as a user runs it.
//!
//! It starts the real binary as an admin and an executor on 127.0.0.1 (SQLite in a temp dir,
//! or a fresh PostgreSQL database with `--postgres` and `WASMJOB_TEST_POSTGRES_URL`, or a fresh
//! MySQL or MariaDB database with `--mysql` and `WASMJOB_TEST_MYSQL_URL`), sets up
//! jobs through the operator API with a sample job (`hello`), drives a workload and reads the
//! run table afterwards. It prints one `name: value` line per figure:
//!
//! - (a) `--jobs` jobs (2,000) firing every second for `--secs` (60): `fires_per_sec`,
//!   `missed_fires` (scheduled seconds with no run for that instant: a fire late but within its
//!   misfire threshold keeps its instant and counts), `misfire_runs` (fires past the threshold,
//!   run at a later instant), `duplicate_runs`, `fire_lateness_p50_ms`/`_p99_ms` (scheduled
//!   instant to the executor's start of the handler), `fire_accepted_p50_ms`/`_p99_ms`
//!   (scheduled instant to the admin's record of the executor's acceptance: negative for a run
//!   sent ahead of its instant), `fire_to_result_p50_ms`/`_p99_ms`;
//! - (b) `--defined` jobs (100,000), `--due` (1,000) of them firing every second, for
//!   `--secs-b` (30): the same figures, and the admin's memory;
//! - (c) a burst of `--triggers` (100,000) manual triggers from `--clients` (32) concurrent
//!   clients: `manual_runs_per_sec` (first trigger accepted to last result recorded). A
//!   trigger refused with 503 at the admin's bound on unfinished runs is sent again 100 ms
//!   later (`triggers_refused_overloaded` counts those answers); `admin_cpu_us_per_run` and
//!   `executor_cpu_us_per_run` (each process's CPU time over the burst, per run), and the
//!   bench's own (`clients_cpu_us_per_run`: the clients and the result polling),
//!   `results_per_callback` and `group_commits_per_1000_runs` (how well the hot path batched,
//!   from the admin's metrics);
//!
//! With `--backfill N`, workload (a) also backfills the last N seconds of a `hello` job firing
//! every second while its fires run: `a.backfill_secs` (created to done), `a.backfill_succeeded`
//! and `a.backfill_instants` (distinct instants with a successful run; both must be N), and the
//! fires' figures above measured beside it.
//!
//! - (x) `--jobs` jobs firing every second for `--secs` to an XXL-JOB 2.4 executor written in
//!   the bench (`e2e/xxl.rs`), not to ours: `fires_per_sec`, `missed_fires`, `duplicate_fires`,
//!   `fire_lateness_p50_ms`/`_p99_ms` (scheduled second to the executor's receipt of `/run`),
//!   `admin_cpu_secs_per_1000_fires`, and how `/api/callback` answered the executor's batched
//!   callbacks: `callback_answer_p50_ms`/`_p99_ms`/`_max_ms`, `callbacks_failed`. With
//!   `--xxl-admin URL --xxl-admin-pid PID` it measures an admin the bench did not start, for a
//!   side-by-side figure, and `--instant-from-receipt` takes the scheduled second from the
//!   receipt of `/run` (both in `e2e/xxl.rs`). With `--callgrind` the admin runs under
//!   `valgrind --tool=callgrind`, whose counters are zeroed at the judged window's start and
//!   dumped at its end, and the bench prints `admin_instructions_per_fire`: a count that the
//!   machine's other load does not move, for comparing two builds whose difference is smaller
//!   than the CPU time's noise (valgrind runs the admin some 50 times slower: `--jobs 50`);
//!
//! - (w) a workflow of `--levels` (10) levels of `--width` (10) `hello` nodes, each level
//!   after every node of the one before, run `--repeats` (5) times (`e2e/workflow.rs`):
//!   `trigger_to_end_p50_ms`/`_p99_ms`, `node_lateness_p50_ms`/`_p99_ms` (a node's last upstream
//!   run's end to its first run's start) and `admin_cpu_ms_per_node`;
//!
//! - (m) no platform: what the machine charges for a system call, a clock read, a thread's
//!   wake-up, a loopback round trip and a load from its caches and its memory, and its
//!   processor and clock source (`e2e/machine.rs`),
//!   printed as `machine.*` beside a workload's figures to compare two machines' runs;
//!
//! and for each, `admin_rss_mb` and `executor_rss_mb` (peak resident memory). `--standalone`
//! runs one `wasmjob standalone` process instead, as the README's first command does (SQLite
//! only): its figures are then `standalone_cpu_us_per_run` and `standalone_rss_mb`.
//! `--workload` picks some of `a`, `b`, `c`, `m`, `w`, `x` (default `abc`); `--binary` runs another build of
//! wasmjob, so that two versions can be measured side by side (its database schema must have
//! `handle_time`, `trigger_time` and `fire_time`; figures the older schema lacks print as `n/a`).
//! `--sample` names the sample job the jobs run (default `hello`): `legacy_hello` (the crate
//! `legacy-hello`), built against the job world as first released, is the one a build older
//! than the `sharding` import accepts.
//!
//! With `--pull`, our executor pulls its runs (`wasmjob executor --pull`, address
//! `pull://bench`) over long polls to every admin instead of being called at its port.
//!
//! With `--admins N` (1), N admin processes share the database, and so the schedule
//! (`e2e/admins.rs`); only with `--postgres` or `--mysql`, and not for workload (x), whose
//! executor registers with one admin.
//! The bench talks to the first admin, our executor is given every admin's URL, and each
//! workload starts once `GET /api/v1/admins` lists N admins holding the 256 partitions, each at
//! least 256/N - 1.
//! Workloads (a) and (b) then also print `admins`, `admins_cpu_secs_per_1000_fires` (the CPU
//! time of every admin over the judged window, added up, per 1,000 fires) and each admin's own
//! `admin_K_cpu_secs` (K from 1, the admin the bench talks to).
//! Every workload prints each admin's `admin_K_rss_mb` and their sum `admins_rss_mb`, and its
//! other admin CPU figures (`c.admin_cpu_us_per_run`, `w.admin_cpu_ms_per_node`) add the admins
//! up.
//! (a) and (b) print, from the run table, `failover_longest_fire_gap_ms` (over every job, the
//! longest time between two consecutive fires' commits, the runs' `created_at` consecutive by
//! fire time: about 1,000 in steady state), `failover_longest_start_gap_ms` (the same between
//! the fires' starts at the executor, `started_at`: the gap in firing, which a commit made
//! ahead of its instant does not lengthen), `failover_max_lateness_ms` (the latest commit after
//! its instant, `created_at` - `fire_time`), `failover_fires_committed_late` (how many fires
//! were committed after their instant), `failover_max_accepted_lateness_ms` and
//! `failover_fires_accepted_over_5s_late` (the same for the executor's acceptance as the admin
//! recorded it, `dispatched_at`: a run committed but not sent by an admin that died waits for its
//! claim to run out; `failover_fires_not_yet_accepted` are still unsent when the table is read,
//! and count as accepted then) and `runs_without_result`; without a kill these cover the whole
//! judged window, as a baseline.
//! With `--kill-admin-at S` (`--admins` 2 or more, S from 4 to `--secs` - 4), workload (a)
//! SIGKILLs the last admin (never the first) S seconds after its jobs started, and the lateness
//! figures cover the fires scheduled after the kill: how long the dead admin's jobs waited for
//! their partitions' takeover.
//! It prints which admin died (`failover_killed_admin`), when
//! (`failover_killed_after_window_start_ms`), and how many admins and partitions
//! `GET /api/v1/admins` lists after the window (`failover_admins_live_after`,
//! `failover_partitions_held_after`); a killed admin's CPU time and memory are as they were at
//! its death.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

/// `--admins` and `--kill-admin-at`: admins that share the database and the schedule.
#[path = "e2e/admins.rs"]
mod admins;
/// Workload (m): the machine's own costs.
#[path = "e2e/machine.rs"]
mod machine;
#[path = "../tests/support/sample_jobs.rs"]
mod sample_jobs;
/// Workload (w): a workflow of levels of nodes.
#[path = "e2e/workflow.rs"]
mod workflow;
#[path = "e2e/xxl.rs"]
mod xxl;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row;
use wasmjob::storage::testing::fetch_all;

const ADMIN_TOKEN: &str = "bench-admin-token-7f3a9c2e5b1d";
const ACCESS_TOKEN: &str = "bench-access-token-4e8b2a6c9d0f";

#[derive(Debug, Clone)]
struct Args {
    workloads: String,
    jobs: usize,
    secs: u64,
    defined: usize,
    due: usize,
    secs_b: u64,
    triggers: usize,
    clients: usize,
    postgres: bool,
    mysql: bool,
    standalone: bool,
    binary: PathBuf,
    sample: String,
    backfill: usize,
    levels: usize,
    width: usize,
    repeats: usize,
    admins: usize,
    kill_admin_at: Option<u64>,
    pull: bool,
    xxl_admin: Option<String>,
    xxl_admin_pid: Option<u32>,
    xxl_access_token: String,
    instant_from_receipt: bool,
    callgrind: bool,
}

fn args() -> Args {
    let mut args = Args {
        workloads: "abc".to_owned(),
        jobs: 2_000,
        secs: 60,
        defined: 100_000,
        due: 1_000,
        secs_b: 30,
        triggers: 100_000,
        clients: 32,
        postgres: false,
        mysql: false,
        standalone: false,
        binary: PathBuf::from(env!("CARGO_BIN_EXE_wasmjob")),
        sample: "hello".to_owned(),
        backfill: 0,
        levels: 10,
        width: 10,
        repeats: 5,
        admins: 1,
        kill_admin_at: None,
        pull: false,
        xxl_admin: None,
        xxl_admin_pid: None,
        xxl_access_token: ACCESS_TOKEN.to_owned(),
        instant_from_receipt: false,
        callgrind: false,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().unwrap_or_else(|| panic!("{word} needs a value"));
        match word.as_str() {
            "--workload" => args.workloads = value(),
            "--jobs" => args.jobs = value().parse().unwrap(),
            "--secs" => args.secs = value().parse().unwrap(),
            "--defined" => args.defined = value().parse().unwrap(),
            "--due" => args.due = value().parse().unwrap(),
            "--secs-b" => args.secs_b = value().parse().unwrap(),
            "--triggers" => args.triggers = value().parse().unwrap(),
            "--clients" => args.clients = value().parse().unwrap(),
            "--binary" => args.binary = PathBuf::from(value()),
            "--postgres" => args.postgres = true,
            "--mysql" => args.mysql = true,
            "--standalone" => args.standalone = true,
            "--sample" => args.sample = value(),
            "--backfill" => args.backfill = value().parse().unwrap(),
            "--levels" => args.levels = value().parse().unwrap(),
            "--width" => args.width = value().parse().unwrap(),
            "--repeats" => args.repeats = value().parse().unwrap(),
            "--admins" => args.admins = value().parse().unwrap(),
            "--kill-admin-at" => args.kill_admin_at = Some(value().parse().unwrap()),
            "--pull" => args.pull = true,
            "--xxl-admin" => args.xxl_admin = Some(value()),
            "--xxl-admin-pid" => args.xxl_admin_pid = Some(value().parse().unwrap()),
            "--xxl-access-token" => args.xxl_access_token = value(),
            "--instant-from-receipt" => args.instant_from_receipt = true,
            "--callgrind" => args.callgrind = true,
            // cargo bench passes `--bench`.
            _ => {}
        }
    }
    admins::check(&args);
    assert!(
        !args.callgrind || (args.workloads == "x" && args.xxl_admin.is_none()),
        "--callgrind counts the instructions of our admin under workload (x): use --workload x"
    );
    assert!(
        args.xxl_admin.is_none() || args.workloads == "x",
        "--xxl-admin measures another admin with workload (x) alone: use --workload x"
    );
    args
}

fn main() {
    let args = args();
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    tokio.block_on(async {
        if args.xxl_admin.is_some() {
            return xxl::against_other_admin(&args).await;
        }
        for workload in args.workloads.chars() {
            if workload == 'm' {
                machine::report();
                continue;
            }
            let platform = Platform::start(&args, workload).await;
            match workload {
                'a' => {
                    let backfill = match args.backfill {
                        0 => None,
                        instants => Some(Backfill::start(&platform, instants).await),
                    };
                    let kill = args.kill_admin_at;
                    scheduled(&platform, "a", args.jobs, args.jobs, args.secs, kill).await;
                    if let Some(backfill) = backfill {
                        backfill.finish(&platform).await;
                    }
                }
                'b' => scheduled(&platform, "b", args.defined, args.due, args.secs_b, None).await,
                'c' => manual(&platform, args.triggers, args.clients).await,
                'x' => fired_to_xxl(&platform, args.jobs, args.secs).await,
                'w' => workflow::dag(&platform, args.levels, args.width, args.repeats).await,
                other => panic!("unknown workload `{other}`: use a, b, c, m, w or x"),
            }
            platform.report_memory(&workload.to_string());
            platform.stop().await;
        }
    });
}

/// An admin and an executor process (or one `standalone` process, which is both), and what the
/// bench needs to talk to them.
struct Platform {
    /// The admin the bench talks to.
    admin: Child,
    /// With `--admins N`, the N - 1 other admins on the same database, in start order.
    others: Vec<admins::OtherAdmin>,
    /// The admin `--kill-admin-at` killed.
    killed: std::sync::Mutex<Option<admins::Killed>>,
    /// `None` for `standalone`, whose executor is in the admin's process.
    executor: Option<Child>,
    api: String,
    http: reqwest::Client,
    db_url: String,
    server_url: Option<String>,
    component: Vec<u8>,
    /// Workload (x)'s XXL-JOB executor, in the bench's process, instead of ours.
    xxl: Option<xxl::XxlExecutor>,
    /// Whether the admin runs under callgrind (`--callgrind`).
    callgrind: bool,
    dir: tempfile::TempDir,
}

/// A bench that fails (a panic, a refused upload) leaves no process behind to skew the next
/// measurement: what `stop` did not end is killed here.
impl Drop for Platform {
    fn drop(&mut self) {
        for child in self.processes() {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Platform {
    async fn start(args: &Args, workload: char) -> Platform {
        let xxl_executor = workload == 'x';
        assert!(!(xxl_executor && args.standalone), "workload (x) runs an admin, not `standalone`");
        let dir = tempfile::tempdir().unwrap();
        let server_url = if args.postgres {
            let url = wasmjob::storage::testing::postgres_database("bench").await.unwrap();
            Some(url.expect("--postgres needs WASMJOB_TEST_POSTGRES_URL"))
        } else if args.mysql {
            let url = wasmjob::storage::testing::mysql_database("bench").await.unwrap();
            Some(url.expect("--mysql needs WASMJOB_TEST_MYSQL_URL"))
        } else {
            None
        };
        let db_url = server_url
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", dir.path().join("bench.db").display()));
        let (admin_port, executor_port) = (free_port(), free_port());
        let api = format!("http://127.0.0.1:{admin_port}");
        let spawn_admin = |port: u16| {
            let mut admin = match args.callgrind {
                true => {
                    let mut valgrind = Command::new("valgrind");
                    let out = dir.path().join("callgrind.%p");
                    valgrind
                        .arg("--tool=callgrind")
                        .arg(format!("--callgrind-out-file={}", out.display()));
                    valgrind.arg(&args.binary);
                    valgrind
                }
                false => Command::new(&args.binary),
            };
            admin
                .args(["admin", "--listen", &format!("127.0.0.1:{port}")])
                .args(["--database-url", &db_url, "--admin-token", ADMIN_TOKEN])
                .args(["--access-token", ACCESS_TOKEN])
                .env("RUST_LOG", "warn");
            // Workload (x) measures the admin as it runs by default, logging included.
            if xxl_executor {
                admin.env_remove("RUST_LOG");
            }
            admin.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("starting an admin")
        };
        let admin = if args.standalone {
            assert!(!args.postgres && !args.mysql, "`standalone` runs on SQLite only");
            Command::new(&args.binary)
                .args(["standalone", "--admin-listen", &format!("127.0.0.1:{admin_port}")])
                .args(["--executor-listen", &format!("127.0.0.1:{executor_port}")])
                .arg("--data-dir")
                .arg(dir.path())
                .args(["--admin-token", ADMIN_TOKEN, "--access-token", ACCESS_TOKEN])
                .args(["--max-concurrent-runs", "512"])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting standalone")
        } else {
            spawn_admin(admin_port)
        };
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
        let platform_api = api.clone();
        // Ready, not only up: an admin answers `/healthz` while it still migrates its database.
        wait_for("the admin to be ready", || {
            let http = http.clone();
            let url = format!("{platform_api}/readyz");
            async move {
                let reply = http.get(url).send().await.ok()?;
                reply.status().is_success().then_some(())
            }
        })
        .await;
        // The other admins start once the first has migrated the database.
        let others: Vec<admins::OtherAdmin> = (1..args.admins)
            .map(|_| {
                let port = free_port();
                let api = format!("http://127.0.0.1:{port}");
                admins::OtherAdmin { child: spawn_admin(port), api }
            })
            .collect();
        // Executors register by application name, so the group may come after the executor.
        let executor = (!args.standalone && !xxl_executor).then(|| {
            let mut executor = Command::new(&args.binary);
            executor.args(["executor", "--listen", &format!("127.0.0.1:{executor_port}")]);
            for url in std::iter::once(&api).chain(others.iter().map(|other| &other.api)) {
                executor.args(["--admin-url", url]);
            }
            executor
                .args(["--app-name", "default"])
                .arg("--data-dir")
                .arg(dir.path().join("executor"))
                .args(["--access-token", ACCESS_TOKEN, "--max-concurrent-runs", "512"])
                .args(if args.pull { &["--pull", "--address", "pull://bench"][..] } else { &[] })
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting the executor")
        });
        let db_url = if args.standalone {
            format!("sqlite:{}", dir.path().join("wasmjob.db").display())
        } else {
            db_url
        };
        let xxl = match xxl_executor {
            true => {
                let receipt = args.instant_from_receipt;
                Some(xxl::XxlExecutor::start(&api, "default", ACCESS_TOKEN, receipt).await)
            }
            false => None,
        };
        let platform = Platform {
            admin,
            others,
            killed: std::sync::Mutex::new(None),
            executor,
            api,
            http,
            db_url,
            server_url,
            component: sample_jobs::sample_job(&args.sample),
            xxl,
            callgrind: args.callgrind,
            dir,
        };
        platform.wait_for_admins().await;
        platform
            .post(
                "/api/v1/groups",
                json!({"app_name": "default", "title": "Bench", "address_type": "AUTO"}),
            )
            .await;
        wait_for("the executor to register", || async {
            let group = platform.get("/api/v1/groups/1").await;
            (group["online_addresses"].as_array().map_or(0, Vec::len) == 1).then_some(())
        })
        .await;
        platform
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let reply = self
            .http
            .post(format!("{}{path}", self.api))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        reply.json().await.unwrap_or(Value::Null)
    }

    async fn get(&self, path: &str) -> Value {
        let reply = self
            .http
            .get(format!("{}{path}", self.api))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        reply.json().await.unwrap_or(Value::Null)
    }

    /// Creates `count` jobs with `body` (and the sample component when `with_version`);
    /// returns their ids.
    async fn create_jobs(&self, count: usize, body: Value, with_version: bool) -> Vec<i64> {
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (next, body, http, api, component) = (
                next.clone(),
                body.clone(),
                self.http.clone(),
                self.api.clone(),
                self.component.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let job: Value = http
                        .post(format!("{api}/api/v1/jobs"))
                        .bearer_auth(ADMIN_TOKEN)
                        .json(&body)
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    let id = job["id"].as_i64().unwrap_or_else(|| panic!("creating a job: {job}"));
                    if with_version {
                        let reply = http
                            .post(format!("{api}/api/v1/jobs/{id}/versions"))
                            .bearer_auth(ADMIN_TOKEN)
                            .header("content-type", "application/wasm")
                            .body(component.clone())
                            .send()
                            .await
                            .unwrap();
                        assert!(reply.status().is_success(), "uploading: {}", reply.status());
                    }
                    ids.push(id);
                }
                ids
            }));
        }
        let mut ids = Vec::new();
        for task in tasks {
            ids.extend(task.await.unwrap());
        }
        ids.sort_unstable();
        ids
    }

    async fn start_jobs(&self, ids: &[i64], start: bool) {
        let action = if start { "start" } else { "stop" };
        let chunks: Vec<Vec<i64>> =
            ids.chunks(ids.len().div_ceil(16).max(1)).map(<[i64]>::to_vec).collect();
        let mut tasks = Vec::new();
        for chunk in chunks {
            let (http, api) = (self.http.clone(), self.api.clone());
            tasks.push(tokio::spawn(async move {
                for id in chunk {
                    http.post(format!("{api}/api/v1/jobs/{id}/{action}"))
                        .bearer_auth(ADMIN_TOKEN)
                        .send()
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }

    async fn db(&self) -> sqlx::AnyPool {
        sqlx::any::install_default_drivers();
        let url = match self.db_url.strip_prefix("sqlite:") {
            Some(path) => format!("sqlite://{path}?mode=ro"),
            None => self.db_url.clone(),
        };
        sqlx::AnyPool::connect(&url).await.unwrap()
    }

    /// The admin's metrics: each sample's name with its labels, and its value.
    async fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let reply = self.http.get(format!("{}/metrics", self.api)).bearer_auth(ADMIN_TOKEN).send();
        let text = reply.await.unwrap().text().await.unwrap();
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter_map(|(name, value)| Some((name.to_owned(), value.parse().ok()?)))
            .collect()
    }

    fn report_memory(&self, workload: &str) {
        match &self.executor {
            None if self.xxl.is_some() => {
                println!("{workload}.admin_rss_mb: {:.1}", peak_rss_mb(self.admin.id()));
            }
            Some(executor) => {
                println!("{workload}.admin_rss_mb: {:.1}", peak_rss_mb(self.admin.id()));
                println!("{workload}.executor_rss_mb: {:.1}", peak_rss_mb(executor.id()));
            }
            None => println!("{workload}.standalone_rss_mb: {:.1}", peak_rss_mb(self.admin.id())),
        }
        self.report_admins_memory(workload);
    }

    /// The CPU time the admins (all of them, added up) and the executor used so far (the
    /// executor's is 0 in `standalone`, where the admin's process has both).
    fn cpu_secs(&self) -> (f64, f64) {
        let admins = self.admin_cpu_secs().iter().sum();
        (admins, self.executor.as_ref().map_or(0.0, |e| cpu_secs(e.id())))
    }

    async fn stop(mut self) {
        if let Some(xxl) = self.xxl.take() {
            xxl.stop();
        }
        let children = self.processes();
        for child in &children {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
        for child in children {
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(url) = &self.server_url {
            if url.starts_with("mysql://") {
                wasmjob::storage::testing::drop_mysql_database(url).await.unwrap();
            } else {
                wasmjob::storage::testing::drop_postgres_database(url).await.unwrap();
            }
        }
    }
}

/// Workloads (a) and (b): `defined` jobs, `due` of them every second, for `secs`; the last
/// admin killed `kill_at` seconds in.
async fn scheduled(
    platform: &Platform,
    name: &str,
    defined: usize,
    due: usize,
    secs: u64,
    kill_at: Option<u64>,
) {
    let setup = Instant::now();
    let every_second = json!({"group_id": 1, "name": "due", "schedule_type": "CRON",
        "schedule_conf": "* * * * * ?", "param": "bench"});
    let due_ids = platform.create_jobs(due, every_second, true).await;
    let idle = json!({"group_id": 1, "name": "idle", "schedule_type": "CRON",
        "schedule_conf": "0 0 0 1 1 ? 2099", "param": "bench"});
    let idle_ids = platform.create_jobs(defined.saturating_sub(due), idle, false).await;
    platform.start_jobs(&idle_ids, true).await;
    println!("{name}.setup_secs: {:.1}", setup.elapsed().as_secs_f64());
    platform.start_jobs(&due_ids, true).await;
    let started_ms = now_ms();
    let end_ms = started_ms + secs as i64 * 1000;
    // Judge whole seconds well inside the window, and the admins' CPU time over them; give late
    // results time to land.
    let from = (started_ms / 1000 + 3) * 1000;
    let until = (end_ms / 1000 - 3) * 1000;
    let kill_ms = kill_at.map(|secs| started_ms + secs as i64 * 1000);
    let window = admins::Window::open(platform, from, kill_ms).await;
    admins::sleep_until(until + 1000).await;
    let admins_cpu = window.close(platform);
    admins::sleep_until(end_ms).await;
    platform.start_jobs(&due_ids, false).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pool = platform.db().await;
    let ids: Vec<String> = due_ids.iter().map(i64::to_string).collect();
    let rows = fetch_all(
        &pool,
        &format!(
            "select job_id, fire_time, trigger_time, handle_time, trigger_type from runs
             where fire_time >= $1 and fire_time <= $2 and attempt = 0 and job_id in ({})",
            ids.join(",")
        ),
        &[from, until],
    )
    .await
    .unwrap();
    let seconds = (until - from) / 1000 + 1;
    let expected = seconds * due_ids.len() as i64;
    let mut keys = std::collections::HashSet::new();
    let (mut duplicates, mut misfires) = (0, 0);
    let mut to_result = Vec::new();
    for row in &rows {
        let key: (i64, i64) = (row.get("job_id"), row.get("fire_time"));
        // A fire past its misfire threshold (`MISFIRE`) runs at a later instant: it stands for
        // no scheduled second, which stays missed.
        if row.get::<String, _>("trigger_type") == "MISFIRE" {
            misfires += 1;
            continue;
        }
        if !keys.insert(key) {
            duplicates += 1;
        }
        let handle_time: i64 = row.get("handle_time");
        if handle_time > 0 {
            to_result.push(handle_time - row.get::<i64, _>("trigger_time"));
        }
    }
    let started = "case when started_at > 0 then started_at else dispatched_at end";
    let late = lateness(&pool, started, from, until, &ids).await;
    let accepted = lateness(&pool, "dispatched_at", from, until, &ids).await;
    println!("{name}.jobs_defined: {defined}");
    println!("{name}.jobs_due_per_sec: {due}");
    println!("{name}.fires_per_sec: {:.0}", keys.len() as f64 / seconds as f64);
    println!("{name}.missed_fires: {}", expected - keys.len() as i64);
    println!("{name}.duplicate_runs: {duplicates}");
    println!("{name}.misfire_runs: {misfires}");
    print_percentiles(&format!("{name}.fire_lateness"), late);
    // When the admin recorded the executor's acceptance: negative for a run sent ahead.
    print_percentiles(&format!("{name}.fire_accepted"), accepted);
    print_percentiles(&format!("{name}.fire_to_result"), Some(to_result));
    admins::report_cpu(name, &admins_cpu, keys.len());
    let killed_at = window.killed_at_ms;
    admins::report_failover(platform, &pool, name, &ids, (from, until), killed_at).await;
    pool.close().await;
}

/// Workload (x): `jobs` jobs every second, fired to the bench's XXL-JOB executor for `secs`.
async fn fired_to_xxl(platform: &Platform, jobs: usize, secs: u64) {
    let body = json!({"group_id": 1, "name": "xxl", "schedule_type": "CRON",
        "schedule_conf": "* * * * * ?", "glue_type": "BEAN", "handler": "demoJobHandler",
        "param": "bench"});
    let ids = platform.create_jobs(jobs, body, false).await;
    platform.start_jobs(&ids, true).await;
    let started_ms = now_ms();
    // Judge whole seconds well inside the window, and the admin's CPU time over them.
    let from = (started_ms / 1000 + 3) * 1000;
    let until = ((started_ms + secs as i64 * 1000) / 1000 - 3) * 1000;
    let sleep_until =
        |ms: i64| tokio::time::sleep(Duration::from_millis((ms - now_ms()).max(0) as u64));
    sleep_until(from).await;
    let cpu_before = platform.cpu_secs().0;
    let callgrind = platform.callgrind.then(|| Callgrind::zero(platform));
    // For a profiler to attach to the admin over the window.
    println!("x.window_secs: {} (admin pid {})", (until + 1000 - from) / 1000, platform.admin.id());
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    sleep_until(until + 1000).await;
    let cpu = platform.cpu_secs().0 - cpu_before;
    let instructions = callgrind.map(Callgrind::dump);
    sleep_until(started_ms + secs as i64 * 1000).await;
    platform.start_jobs(&ids, false).await;
    // Late fires and their callbacks land.
    tokio::time::sleep(Duration::from_secs(5)).await;
    platform.xxl.as_ref().unwrap().report(jobs, from, until, cpu, instructions);
}

/// The admin's instructions counted by callgrind over a window.
struct Callgrind {
    pid: u32,
    dump: PathBuf,
}

impl Callgrind {
    /// Zeroes the counters of the admin, which runs under callgrind.
    fn zero(platform: &Platform) -> Callgrind {
        let pid = platform.admin.id();
        callgrind_control(&["-z", &pid.to_string()]);
        Callgrind { pid, dump: platform.dir.path().join(format!("callgrind.{pid}.1")) }
    }

    /// Dumps the counters; the instructions counted since [`Callgrind::zero`].
    fn dump(self) -> u64 {
        callgrind_control(&["-d", &self.pid.to_string()]);
        let text = std::fs::read_to_string(&self.dump)
            .unwrap_or_else(|error| panic!("{}: {error}", self.dump.display()));
        let summary = text.lines().find_map(|line| line.strip_prefix("summary: "));
        summary.and_then(|count| count.trim().parse().ok()).expect("a callgrind summary line")
    }
}

fn callgrind_control(args: &[&str]) {
    let status = Command::new("callgrind_control").args(args).stdout(Stdio::null()).status();
    assert!(status.is_ok_and(|status| status.success()), "callgrind_control {args:?} failed");
}

/// A backfill of the last `instants` seconds of a `hello` job that fires every second.
struct Backfill {
    id: i64,
    job_id: i64,
    instants: usize,
    started: Instant,
}

impl Backfill {
    async fn start(platform: &Platform, instants: usize) -> Backfill {
        let every_second = json!({"group_id": 1, "name": "backfilled", "schedule_type": "CRON",
            "schedule_conf": "* * * * * ?", "param": "backfill"});
        let job_id = platform.create_jobs(1, every_second, true).await[0];
        let to_ms = (now_ms() / 1000 - 1) * 1000;
        let from_ms = to_ms - (instants as i64 - 1) * 1000;
        let iso = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339();
        let body = json!({"from": iso(from_ms), "to": iso(to_ms), "max_concurrent": 10});
        let started = Instant::now();
        let backfill = platform.post(&format!("/api/v1/jobs/{job_id}/backfill"), body).await;
        let id = backfill["id"].as_i64().unwrap_or_else(|| panic!("no backfill: {backfill}"));
        Backfill { id, job_id, instants, started }
    }

    async fn finish(self, platform: &Platform) {
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            let backfill = platform.get(&format!("/api/v1/backfills/{}", self.id)).await;
            if backfill["state"] != "running" {
                println!("a.backfill_state: {}", backfill["state"]);
                break;
            }
            assert!(Instant::now() < deadline, "the backfill did not end: {backfill}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("a.backfill_secs: {:.1}", self.started.elapsed().as_secs_f64());
        let pool = platform.db().await;
        let rows = fetch_all(
            &pool,
            "select count(*) as runs, count(distinct trigger_time) as instants from runs
             where job_id = $1 and trigger_type = 'BACKFILL' and state = 'success'",
            &[self.job_id],
        )
        .await
        .unwrap();
        let row = &rows[0];
        println!("a.backfill_instants_asked: {}", self.instants);
        println!("a.backfill_succeeded: {}", row.get::<i64, _>("runs"));
        println!("a.backfill_instants: {}", row.get::<i64, _>("instants"));
        pool.close().await;
    }
}

/// Scheduled instant to `instant` (a column expression of the run), where the schema records it.
async fn lateness(
    pool: &sqlx::AnyPool,
    instant: &str,
    from: i64,
    until: i64,
    ids: &[String],
) -> Option<Vec<i64>> {
    let rows = fetch_all(
        pool,
        &format!(
            "select ({instant}) - trigger_time as late from runs
             where fire_time >= $1 and fire_time <= $2 and attempt = 0 and dispatched_at > 0
             and job_id in ({})",
            ids.join(",")
        ),
        &[from, until],
    )
    .await
    .ok()?;
    Some(rows.iter().map(|row| row.get::<i64, _>("late")).collect())
}

/// Workload (c): a burst of manual triggers from concurrent clients.
async fn manual(platform: &Platform, triggers: usize, clients: usize) {
    // Runs of one job queue behind each other on the executor: spread them over many jobs.
    let body = json!({"group_id": 1, "name": "manual", "schedule_type": "NONE", "param": "bench"});
    let job_ids = Arc::new(platform.create_jobs(clients * 8, body, true).await);
    let sent = Arc::new(AtomicUsize::new(0));
    let cpu_before = platform.cpu_secs();
    let client_before = cpu_secs(std::process::id());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (sent, job_ids, http, api) =
            (sent.clone(), job_ids.clone(), platform.http.clone(), platform.api.clone());
        tasks.push(tokio::spawn(async move {
            let (mut accepted, mut refused, mut latencies) = (0, 0, Vec::new());
            let mut n = client;
            while sent.fetch_add(1, Ordering::Relaxed) < triggers {
                let job = job_ids[n % job_ids.len()];
                n += clients;
                loop {
                    let sent_at = Instant::now();
                    let reply = http
                        .post(format!("{api}/api/v1/jobs/{job}/trigger"))
                        .bearer_auth(ADMIN_TOKEN)
                        .send()
                        .await;
                    match reply.map(|reply| reply.status()) {
                        // The admin is at its bound on unfinished runs: wait a little, as a
                        // client that wants every trigger run would, and send it again.
                        Ok(StatusCode::SERVICE_UNAVAILABLE) => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Ok(status) if status.is_success() => {
                            accepted += 1;
                            latencies.push(sent_at.elapsed().as_millis() as i64);
                            break;
                        }
                        _ => break,
                    }
                }
            }
            (accepted, refused, latencies)
        }));
    }
    let (mut accepted, mut refused, mut latencies) = (0, 0, Vec::new());
    for task in tasks {
        let (client_accepted, client_refused, client_latencies) = task.await.unwrap();
        accepted += client_accepted;
        refused += client_refused;
        latencies.extend(client_latencies);
    }
    let accepting = started.elapsed();
    let pool = platform.db().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut finished = 0;
    while Instant::now() < deadline {
        let rows = fetch_all(&pool, "select count(*) as n from runs where handle_code <> 0", &[])
            .await
            .unwrap();
        let row = &rows[0];
        finished = row.get::<i64, _>("n");
        if finished >= accepted as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    let cpu_after = platform.cpu_secs();
    let client_after = cpu_secs(std::process::id());
    println!("c.triggers_accepted: {accepted}");
    println!("c.triggers_refused_overloaded: {refused}");
    println!("c.triggers_per_sec: {:.0}", accepted as f64 / accepting.as_secs_f64());
    // Each client waits for its trigger's answer (the runs committed) before the next.
    print_percentiles("c.trigger_latency", Some(latencies));
    println!("c.runs_finished: {finished}");
    println!("c.manual_runs_per_sec: {:.0}", finished as f64 / elapsed.as_secs_f64());
    // CPU per run is steadier than a rate on a shared machine: it says what each run costs.
    let per_run_us = |secs: f64| secs * 1e6 / finished.max(1) as f64;
    if platform.executor.is_some() {
        println!("c.admin_cpu_us_per_run: {:.0}", per_run_us(cpu_after.0 - cpu_before.0));
        println!("c.executor_cpu_us_per_run: {:.0}", per_run_us(cpu_after.1 - cpu_before.1));
    } else {
        println!("c.standalone_cpu_us_per_run: {:.0}", per_run_us(cpu_after.0 - cpu_before.0));
    }
    // The clients share the machine: what they cost is not left to the platform.
    println!("c.clients_cpu_us_per_run: {:.0}", per_run_us(client_after - client_before));
    // How well the hot path batched: results per callback, runs per group commit.
    let metrics = platform.metrics().await;
    let ratio = |sum: &str, count: &str| match (metrics.get(sum), metrics.get(count)) {
        (Some(sum), Some(count)) if *count > 0.0 => sum / count,
        _ => 0.0,
    };
    let callbacks = ("wasmjob_callback_batch_size_sum", "wasmjob_callback_batch_size_count");
    println!("c.results_per_callback: {:.1}", ratio(callbacks.0, callbacks.1));
    let commits = metrics.get(r#"wasmjob_db_transaction_seconds_count{kind="batch"}"#);
    let per_thousand = commits.unwrap_or(&0.0) * 1000.0 / finished.max(1) as f64;
    println!("c.group_commits_per_1000_runs: {per_thousand:.0}");
    let commit_secs = ratio(
        r#"wasmjob_db_transaction_seconds_sum{kind="batch"}"#,
        r#"wasmjob_db_transaction_seconds_count{kind="batch"}"#,
    );
    println!("c.group_commit_mean_ms: {:.2}", commit_secs * 1000.0);
    pool.close().await;
}

fn print_percentiles(name: &str, samples: Option<Vec<i64>>) {
    let Some(mut samples) = samples.filter(|samples| !samples.is_empty()) else {
        println!("{name}_p50_ms: n/a");
        println!("{name}_p99_ms: n/a");
        return;
    };
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!("{name}_p50_ms: {}", at(0.50));
    println!("{name}_p99_ms: {}", at(0.99));
}

fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The CPU time (user and system) process `pid` has used so far, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) end at the last parenthesis;
    // utime and stime are the 14th and 15th fields, the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 =
        rest.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<f64>().ok()).sum();
    let per_sec = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    ticks / per_sec
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn wait_for<F, Fut>(what: &str, probe: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe().await.is_none() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
