//! Fault scenarios: the real binary as admin and executor processes on 127.0.0.1, killed at
//! chosen points of a run's life (failpoints) or at arbitrary moments (`SIGKILL`), restarted on
//! the same port and data, or paused (`SIGSTOP`) and resumed (`SIGCONT`) without a restart, and
//! then judged by the checker: no fire missing or doubled, no run executed twice or left
//! unfinished, no retry or child run forgotten.
//!
//! Each scenario prints what it killed and its figures
//! (`cargo test --test integration -- fault:: --nocapture`). A failpoint that is not reached
//! before its deadline (a build without that point, or a slow machine) is replaced by a
//! `SIGKILL` then, so a scenario kills as often as it plans whatever the build; the printout
//! says which deaths were the failpoint's. The scenarios run one at a time: they depend on
//! restarts beating the 5 s misfire threshold, which parallel scenarios on shared cores would
//! put at risk.
//!
//! The PostgreSQL scenarios need `WASMJOB_TEST_POSTGRES_URL`, the MySQL one
//! `WASMJOB_TEST_MYSQL_URL`; each is skipped without it.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use wasmjob::admin::now_ms;
use wasmjob::partition::{self, PARTITIONS};

use crate::support::checker::{self, Check, Report, Window};
use crate::support::cluster::{Cluster, Proc};
use crate::support::{ACCESS_TOKEN, Api, sample_job};

mod workflows;

/// The signal of `abort()`, which is how a failpoint ends a process.
const SIGABRT: i32 = 6;

/// One scenario at a time (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The job timeout of every scenario job (the sleeper's runs take under a second).
const TIMEOUT_SECS: i64 = 10;
/// How long past its timeout a run may stay unfinished: the admin's dispatch lease.
const TERMINAL_BOUND_MS: i64 = 15_000;
/// The longest wait for every run to finish after the jobs are stopped.
const SETTLE: Duration = Duration::from_secs(30);
/// Fires this close to a job's stop are not expected: a fire may rightly be up to the misfire
/// threshold (5 s) late, so a stop that soon after its instant may pre-empt it.
const END_MARGIN_MS: i64 = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_while_firing() {
    // 50 jobs firing every second for about 25 s: well over 1,000 fires. The failpoint counts
    // scheduler passes that committed fires (about one a second, each committing every fire
    // then due), so starting the jobs does not reach it.
    let scenario = Scenario {
        workload: Workload { plain: 40, failing: 5, parents: 5, bean: true, ..Workload::default() },
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::at("scheduler.after_fire_commit=abort@5", 8_000),
                Crash::sigkill(4_000),
                Crash::at("scheduler.after_fire_commit=abort@4", 8_000),
            ],
        )],
        chaos_for: Duration::from_secs(22),
        ..Scenario::new("admin killed while firing")
    };
    scenario.run(None).await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_while_sending() {
    let scenario = Scenario {
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::at("dispatch.before_send=abort@15", 5_000),
                Crash::at("dispatch.before_send=abort@30", 5_000),
                Crash::sigkill(2_500),
            ],
        )],
        ..Scenario::new("admin killed while sending")
    };
    scenario.run(None).await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_after_send_before_record() {
    let scenario = Scenario {
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::at("dispatch.after_send=abort@15", 5_000),
                Crash::at("dispatch.after_send=abort@30", 5_000),
            ],
        )],
        ..Scenario::new("admin killed after a send, before recording it")
    };
    scenario.run(None).await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_applying_callbacks() {
    // Twenty results due at the same second make callback batches of several results.
    let scenario = Scenario {
        workload: Workload { plain: 16, failing: 2, parents: 2, ..Workload::default() },
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::at("callback.mid_batch=abort@3", 5_000),
                Crash::at("callback.mid_batch=abort@5", 5_000),
            ],
        )],
        ..Scenario::new("admin killed while applying a callback batch")
    };
    scenario.run(None).await.assert_clean();
}

/// With no time to apply a callback (`--callback-apply-ms 0`), every callback is recorded in the
/// inbox and acknowledged before its results are applied. The admin dies between the two: its
/// executors may have forgotten those results, and then only the inbox holds them, for the next
/// incarnation to take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_killed_with_callbacks_recorded_and_not_applied() {
    let scenario = Scenario {
        workload: Workload { plain: 16, failing: 2, parents: 2, ..Workload::default() },
        admin_args: &["--callback-apply-ms", "0"],
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::at("callback.before_recorded_apply=abort@4", 5_000),
                Crash::at("callback.before_recorded_apply=abort@7", 5_000),
            ],
        )],
        ..Scenario::new("admin killed with callbacks recorded and not applied")
    };
    let outcome = scenario.run(None).await;
    outcome.assert_clean();
    // Each death left at least the callback it died applying in the inbox.
    assert!(outcome.callbacks_taken_over >= 2, "{}", outcome.callbacks_taken_over);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_killed_mid_run() {
    executor_killed_mid_run_scenario(false).await;
}

/// [`executor_killed_mid_run`] with an executor that pulls its runs: its polls die with it, and
/// its restarted incarnation polls again under the same `pull://` address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulling_executor_killed_mid_run() {
    executor_killed_mid_run_scenario(true).await;
}

async fn executor_killed_mid_run_scenario(pull: bool) {
    // Sleepers are mid-run most of the time, so a kill at any moment catches runs in flight.
    let scenario = Scenario {
        pull,
        workload: Workload { sample: "sleeper", param: "700", ..Workload::default() },
        crashes: &[(
            Role::Executor(0),
            &[
                Crash::at("executor.after_accept=abort@10", 5_000),
                Crash::at("executor.before_report=abort@10", 5_000),
                Crash::sigkill(2_500),
                Crash::sigkill(3_000),
            ],
        )],
        chaos_for: Duration::from_secs(22),
        ..Scenario::new("executor killed mid-run")
    };
    scenario.run(None).await.assert_clean();
}

/// Under FAILOVER, an executor that accepts connections and never answers is passed over; the
/// real executor beside it runs every run exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_executor_under_failover() {
    let scenario = Scenario {
        workload: Workload { route: "FAILOVER", failing: 0, ..Workload::default() },
        hung_executor: true,
        chaos_for: Duration::from_secs(10),
        ..Scenario::new("an executor that never answers, under FAILOVER")
    };
    scenario.run(None).await.assert_clean();
}

/// Two admins on one PostgreSQL database; the first, which executors try first, is killed and
/// restarted again and again while the second keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_one_killed_repeatedly_on_postgres() {
    let Some(url) = wasmjob::storage::testing::postgres_database("fault").await.unwrap() else {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping the two-admin PostgreSQL scenario");
        return;
    };
    two_admins_one_killed_repeatedly(url, "two admins on PostgreSQL, one killed repeatedly").await;
}

/// The same two admins on one MySQL (MariaDB) database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_one_killed_repeatedly_on_mysql() {
    let Some(url) = wasmjob::storage::testing::mysql_database("fault").await.unwrap() else {
        eprintln!("WASMJOB_TEST_MYSQL_URL is unset: skipping the two-admin MySQL scenario");
        return;
    };
    two_admins_one_killed_repeatedly(url, "two admins on MySQL, one killed repeatedly").await;
}

async fn two_admins_one_killed_repeatedly(url: String, name: &'static str) {
    let scenario = Scenario {
        admins: 2,
        api_admin: 1,
        workload: Workload { plain: 16, failing: 2, parents: 2, ..Workload::default() },
        crashes: &[(
            Role::Admin(0),
            &[
                Crash::sigkill(3_000),
                Crash::at("scheduler.after_fire_commit=abort@3", 5_000),
                Crash::sigkill(3_500),
                Crash::at("dispatch.after_send=abort@20", 5_000),
            ],
        )],
        chaos_for: Duration::from_secs(24),
        ..Scenario::new(name)
    };
    scenario.run(Some(url)).await.assert_clean();
}

/// Three admins on one PostgreSQL database share the schedule, each holding about a third of
/// the partitions (checked through `GET /api/v1/admins` before the chaos and after the calm).
/// The first is killed and restarted again and again; the second is paused (`SIGSTOP`) past
/// its lease twice and resumed, not restarted; the third, spoken to, is never harmed. A killed
/// admin's partitions are taken over when its database session ends (or by its restarted
/// incarnation), a paused one's once its lease ran out, within the misfire threshold: no fire goes missing or doubles, and a resumed admin fires nothing it lost.
/// Consecutive job ids fall in partitions far apart (`partition::of`), so every admin's share
/// holds some of the jobs (the printout says how many).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_admins_one_killed_one_paused_on_postgres() {
    let Some(url) = wasmjob::storage::testing::postgres_database("fault").await.unwrap() else {
        eprintln!(
            "WASMJOB_TEST_POSTGRES_URL is unset: skipping the three-admin PostgreSQL scenario"
        );
        return;
    };
    let scenario = Scenario {
        admins: 3,
        api_admin: 2,
        workload: Workload { plain: 16, failing: 2, parents: 2, ..Workload::default() },
        crashes: &[
            (
                Role::Admin(0),
                &[
                    Crash::sigkill(4_000),
                    Crash::at("scheduler.after_fire_commit=abort@3", 6_000),
                    Crash::sigkill(5_000),
                ],
            ),
            // Each pause outlasts the 4 s lease: its partitions are taken over meanwhile.
            (Role::Admin(1), &[Crash::pause(3_000, 6_000), Crash::pause(4_000, 6_000)]),
        ],
        shares: Some(80),
        chaos_for: Duration::from_secs(26),
        ..Scenario::new("three admins on PostgreSQL, one killed, one paused past its lease")
    };
    scenario.run(Some(url)).await.assert_clean();
}

/// Jobs capped at one run in flight, fired every second on two executors with runs that take
/// longer than a second, so that without the cap each run would overlap the next on the other
/// executor; the admin and an executor are killed again and again. No two runs of a job ever
/// execute at once (`overlapping_runs`), and every other figure stays 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_job_never_runs_twice_at_once_through_kills() {
    capped_job_scenario(false).await;
}

/// [`a_capped_job_never_runs_twice_at_once_through_kills`] with executors that pull their runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_job_never_runs_twice_at_once_through_kills_of_pulling_executors() {
    capped_job_scenario(true).await;
}

async fn capped_job_scenario(pull: bool) {
    let scenario = Scenario {
        pull,
        executors: 2,
        workload: Workload {
            plain: 3,
            sample: "sleeper",
            param: "1200",
            failing: 0,
            parents: 0,
            route: "ROUND",
            max_concurrent_runs: 1,
            ..Workload::default()
        },
        crashes: &[
            (
                Role::Admin(0),
                &[
                    Crash::sigkill(4_000),
                    Crash::at("dispatch.after_send=abort@4", 5_000),
                    Crash::sigkill(3_500),
                ],
            ),
            (Role::Executor(1), &[Crash::sigkill(3_000), Crash::sigkill(4_500)]),
        ],
        chaos_for: Duration::from_secs(20),
        ..Scenario::new("capped jobs through admin and executor kills")
    };
    let outcome = scenario.run(None).await;
    outcome.assert_clean();
    assert!(
        !outcome.report.skipped.iter().any(|(figure, _)| *figure == "overlapping_runs"),
        "the overlap figure was judged"
    );
}

/// A cluster, its jobs, who dies when, and for how long it all runs.
struct Scenario<'a> {
    name: &'static str,
    admins: usize,
    executors: usize,
    /// The admin the test talks to: one that is never killed.
    api_admin: usize,
    workload: Workload,
    crashes: &'a [(Role, &'a [Crash])],
    /// Beside the real executor, a registered one that accepts connections and never answers.
    hung_executor: bool,
    /// How long the jobs fire while the crashes happen.
    chaos_for: Duration,
    /// How long they fire afterwards, everything up.
    calm_for: Duration,
    /// The fewest partitions each admin must hold before the chaos and after the calm, when
    /// every admin is listed live and their shares add up to all partitions; `None` checks
    /// nothing after the calm (before the chaos, every scenario waits until its admins' current
    /// incarnations hold every partition).
    shares: Option<usize>,
    /// Whether the executors pull their runs (`wasmjob executor --pull`).
    pull: bool,
    /// Arguments added to the command line of the admins that crash, from their first restart.
    admin_args: &'a [&'a str],
}

/// The scenario's cron jobs (all every second unless `cron` says otherwise), each with its
/// component uploaded and started.
struct Workload {
    /// Jobs running `sample` with `param`, no retry.
    plain: usize,
    sample: &'static str,
    param: &'static str,
    /// Jobs running `fail`, with one retry.
    failing: usize,
    /// Jobs running `hello`, each with a child job (`hello`, schedule `NONE`).
    parents: usize,
    cron: &'static str,
    route: &'static str,
    /// `BEAN` jobs naming the executors' own copy of the sample (no upload: a fast setup for
    /// many jobs), instead of `GLUE_WASM` with an uploaded version.
    bean: bool,
    /// The plain jobs' concurrency cap (0: none).
    max_concurrent_runs: i64,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            plain: 8,
            sample: "hello",
            param: "fault",
            failing: 1,
            parents: 1,
            cron: "* * * * * ?",
            route: "FIRST",
            bean: false,
            max_concurrent_runs: 0,
        }
    }
}

/// A process of the cluster, by its index.
#[derive(Debug, Clone, Copy)]
enum Role {
    Admin(usize),
    Executor(usize),
}

/// One planned death: the incarnation runs with `failpoints` armed and dies there, or is killed
/// with `SIGKILL` once `within_ms` (plus up to a second of jitter) has passed since its start.
/// With `pause_ms`, not a death: once `within_ms` (plus jitter) has passed, the incarnation is
/// paused with `SIGSTOP` for `pause_ms`, then resumed with `SIGCONT`; the next crash's clock
/// starts at the resume. A process is not restarted after a pause, so no crash with failpoints
/// may follow one.
#[derive(Debug, Clone, Copy)]
struct Crash {
    failpoints: &'static str,
    within_ms: u64,
    /// How long a pause lasts; 0 for a death.
    pause_ms: u64,
}

impl Crash {
    const fn at(failpoints: &'static str, within_ms: u64) -> Crash {
        Crash { failpoints, within_ms, pause_ms: 0 }
    }

    const fn sigkill(within_ms: u64) -> Crash {
        Crash { failpoints: "", within_ms, pause_ms: 0 }
    }

    const fn pause(within_ms: u64, for_ms: u64) -> Crash {
        Crash { failpoints: "", within_ms, pause_ms: for_ms }
    }
}

/// What a scenario found: its deaths and the checker's report.
struct Outcome {
    name: &'static str,
    report: Report,
    /// With a hung executor: runs the admin sent to it, and finished runs that did not succeed
    /// (none is right for either: every job succeeds on the real executor).
    hung_figures: Option<(u64, u64)>,
    /// Processes that died without a plan: real crashes.
    unplanned: Vec<String>,
    /// The admins' shares of the partitions when they were not balanced after the calm.
    unbalanced: Option<String>,
    /// Recorded callbacks that an admin took over from a dead one (or from its own dead
    /// incarnation), as the admins' logs say.
    callbacks_taken_over: usize,
}

impl Outcome {
    fn assert_clean(&self) {
        assert!(
            self.unplanned.is_empty(),
            "{}: unplanned deaths:\n{:#?}",
            self.name,
            self.unplanned
        );
        if let Some(unbalanced) = &self.unbalanced {
            panic!(
                "{}: the admins' shares are not balanced after the calm: {unbalanced}",
                self.name
            );
        }
        if let Some(figures) = self.hung_figures {
            assert_eq!(figures, (0, 0), "{}: runs failed or went to the hung executor", self.name);
        }
        self.report.assert_clean(self.name);
    }
}

impl Scenario<'_> {
    fn new(name: &'static str) -> Scenario<'static> {
        Scenario {
            name,
            admins: 1,
            executors: 1,
            api_admin: 0,
            workload: Workload::default(),
            crashes: &[],
            hung_executor: false,
            chaos_for: Duration::from_secs(18),
            calm_for: Duration::from_secs(5),
            shares: None,
            pull: false,
            admin_args: &[],
        }
    }

    async fn run(&self, database_url: Option<String>) -> Outcome {
        for (role, crashes) in self.crashes {
            for pair in crashes.windows(2) {
                assert!(
                    pair[0].pause_ms == 0 || pair[1].failpoints.is_empty(),
                    "{role:?}: a crash with failpoints follows a pause, which restarts nothing \
                     to arm them"
                );
            }
        }
        let _serial = SERIAL.lock().await;
        let mut cluster =
            Cluster::start_pulling(database_url, self.admins, self.executors, self.pull).await;
        let api = cluster.api_of(self.api_admin);
        let hung = match self.hung_executor {
            true => Some(HungExecutor::start(&cluster).await),
            false => None,
        };
        let expected = self.executors + usize::from(hung.is_some());
        api.wait_for_executors(expected).await;
        let jobs = create_jobs(&api, &self.workload).await;

        // Arm the first crash of each process before anything runs: a restart now kills nothing.
        // A process to be paused first has nothing to arm. A restarted admin fires again only
        // once its dead incarnation's leases on partitions ran out (up to 4 s): the jobs start
        // only when the admins' current incarnations hold every partition, so that the first
        // planned crash does not find the fires already late.
        let mut plans = Vec::new();
        for (role, crashes) in self.crashes {
            let queue: VecDeque<Crash> = crashes.iter().copied().collect();
            if queue.front().is_none_or(|crash| crash.pause_ms == 0) {
                let first = queue.front().map_or("", |crash| crash.failpoints);
                let proc = process(&mut cluster, *role);
                if matches!(role, Role::Admin(_)) {
                    proc.add_args(self.admin_args);
                }
                proc.restart(first).await;
            }
            plans.push(Plan { role: *role, queue, since: Instant::now(), jitter_ms: jitter() });
        }
        api.wait_for_executors(expected).await;
        let mut log = String::new();
        match balanced_shares(&api, &cluster, self.shares.unwrap_or(0), &jobs).await {
            Ok(shares) => writeln!(log, "shares before the chaos: {shares}").unwrap(),
            Err(shares) => panic!("{}: unbalanced before the chaos: {shares}", self.name),
        }

        let started = start_jobs(&api, &jobs).await;
        for plan in &mut plans {
            plan.since = Instant::now();
        }
        let unplanned = inflict(&mut cluster, &mut plans, self.chaos_for, &mut log).await;
        tokio::time::sleep(self.calm_for).await;
        let mut unbalanced = None;
        if let Some(least) = self.shares {
            let shares = balanced_shares(&api, &cluster, least, &jobs).await;
            let (Ok(listed) | Err(listed)) = &shares;
            writeln!(log, "shares after the calm: {listed}").unwrap();
            unbalanced = shares.err();
        }
        let windows = stop_jobs(&api, started, self.workload.cron).await;

        settle(&cluster.database_url).await;
        let check = Check {
            database_url: cluster.database_url.clone(),
            executor_dirs: cluster.executor_dirs(),
            executor_deaths: cluster.executors.iter().map(|proc| proc.deaths.clone()).collect(),
            windows,
            end_margin_ms: END_MARGIN_MS,
            terminal_bound_ms: TERMINAL_BOUND_MS,
            now_ms: now_ms(),
        };
        let report = checker::check(&check).await;
        eprintln!("== fault scenario: {}\n{log}{report}", self.name);
        let mut hung_figures = None;
        if let Some(hung) = &hung {
            let sent = checker::runs_sent_to(&check.database_url, &hung.address).await;
            let unsuccessful = checker::unsuccessful_runs(&check.database_url).await;
            eprintln!("sent_to_hung_executor: {sent}\nunsuccessful_runs: {unsuccessful}");
            hung_figures = Some((sent, unsuccessful));
        }
        let mut unplanned = unplanned;
        for proc in cluster.admins.iter_mut().chain(cluster.executors.iter_mut()) {
            if !proc.is_alive() {
                eprintln!("{}: died unplanned after the chaos", proc.name);
                unplanned.push(proc.name.clone());
            }
        }
        let mut unplanned_with_logs = Vec::new();
        for name in unplanned {
            let tail = cluster
                .admins
                .iter()
                .chain(&cluster.executors)
                .find(|proc| proc.name == name)
                .map(Proc::log_tail)
                .unwrap_or_default();
            unplanned_with_logs.push(format!("{name}:\n{tail}"));
        }
        if let Some(hung) = hung {
            hung.stop();
        }
        let callbacks_taken_over = cluster
            .admins
            .iter()
            .map(|admin| admin.log().matches("taking over recorded callback").count())
            .sum();
        eprintln!("callbacks_taken_over: {callbacks_taken_over}");
        cluster.finish().await;
        Outcome {
            name: self.name,
            report,
            hung_figures,
            unplanned: unplanned_with_logs,
            unbalanced,
            callbacks_taken_over,
        }
    }
}

/// One process's remaining deaths and when its current incarnation started.
struct Plan {
    role: Role,
    queue: VecDeque<Crash>,
    since: Instant,
    jitter_ms: u64,
}

/// Watches every process for `duration`: a planned death (its failpoint, or the deadline's
/// `SIGKILL`) is followed at once by a restart armed with the next crash; a planned pause
/// (`SIGSTOP` at the deadline) ends with `SIGCONT` once it lasted its time; a process that dies
/// without a plan is restarted unarmed and named in the result. At the end a pause still under
/// way is ended, and crashes still planned are dropped, their processes restarted unarmed
/// (those to be paused next were not armed), so nothing is paused or dies during the check.
async fn inflict(
    cluster: &mut Cluster,
    plans: &mut [Plan],
    duration: Duration,
    log: &mut String,
) -> Vec<String> {
    let begin = Instant::now();
    let mut unplanned = Vec::new();
    while begin.elapsed() < duration {
        for plan in plans.iter_mut() {
            let Some(crash) = plan.queue.front().copied() else { continue };
            let proc = process(cluster, plan.role);
            if let Some(paused) = proc.paused_for() {
                if paused >= Duration::from_millis(crash.pause_ms) {
                    end_pause(proc, plan.since.elapsed().saturating_sub(paused), "", log);
                    plan.queue.pop_front();
                    plan.since = Instant::now();
                    plan.jitter_ms = jitter();
                }
                continue;
            }
            let lived = plan.since.elapsed();
            let deadline = Duration::from_millis(crash.within_ms + plan.jitter_ms);
            let (status, killed) = match proc.exited() {
                Some(status) => (status, false),
                None if lived >= deadline && crash.pause_ms > 0 => {
                    proc.pause();
                    continue;
                }
                None if lived >= deadline => (proc.kill().unwrap(), true),
                None => continue,
            };
            let died_ms = now_ms();
            // A failpoint aborts (SIGABRT); any other death the test did not cause is a crash.
            let how = match (status.signal(), crash.failpoints, killed) {
                (Some(SIGABRT), armed, _) if !armed.is_empty() => {
                    format!("died at its failpoint `{armed}`")
                }
                (_, _, false) => {
                    unplanned.push(proc.name.clone());
                    format!("died unplanned with {status}")
                }
                (_, "", true) => "killed (SIGKILL)".to_owned(),
                (_, armed, true) => format!("killed (SIGKILL): failpoint `{armed}` not reached"),
            };
            plan.queue.pop_front();
            let next = plan.queue.front().map_or("", |crash| crash.failpoints);
            let restart = Instant::now();
            proc.start(next).await;
            let (lived, down) = (lived.as_millis(), restart.elapsed().as_millis());
            writeln!(
                log,
                "{}: {how} after {lived} ms at {died_ms}, up again in {down} ms",
                proc.name
            )
            .unwrap();
            plan.since = Instant::now();
            plan.jitter_ms = jitter();
        }
        for proc in cluster.admins.iter_mut().chain(cluster.executors.iter_mut()) {
            let planned = plans
                .iter()
                .any(|plan| !plan.queue.is_empty() && process_name(plan.role) == proc.name);
            if !planned && let Some(status) = proc.exited() {
                writeln!(log, "{}: died unplanned with {status}", proc.name).unwrap();
                unplanned.push(proc.name.clone());
                proc.start("").await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for plan in plans.iter_mut() {
        let proc = process(cluster, plan.role);
        if let Some(paused) = proc.paused_for() {
            let lived = plan.since.elapsed().saturating_sub(paused);
            end_pause(proc, lived, " early: the chaos ended", log);
            plan.queue.pop_front();
        }
    }
    for plan in plans.iter_mut().filter(|plan| !plan.queue.is_empty()) {
        let proc = process(cluster, plan.role);
        writeln!(log, "{}: {} planned crashes left undone", proc.name, plan.queue.len()).unwrap();
        if plan.queue.front().is_some_and(|crash| crash.pause_ms == 0) {
            proc.restart("").await;
        }
        plan.queue.clear();
    }
    unplanned
}

/// Resumes a paused process and logs the pause: how long it lasted, after how long up, and
/// from when to when (ms since the epoch).
fn end_pause(proc: &mut Proc, lived: Duration, note: &str, log: &mut String) {
    let Some((paused, since_ms)) = proc.resume() else { return };
    let (lived, paused) = (lived.as_millis(), paused.as_millis());
    let until_ms = now_ms();
    writeln!(
        log,
        "{}: paused (SIGSTOP) for {paused} ms after {lived} ms, from {since_ms} to {until_ms}, \
         resumed{note}",
        proc.name
    )
    .unwrap();
}

fn process(cluster: &mut Cluster, role: Role) -> &mut Proc {
    match role {
        Role::Admin(index) => &mut cluster.admins[index],
        Role::Executor(index) => &mut cluster.executors[index],
    }
}

fn process_name(role: Role) -> String {
    match role {
        Role::Admin(index) => format!("admin-{index}"),
        Role::Executor(index) => format!("executor-{index}"),
    }
}

/// Up to a second, so deaths by deadline fall at varied points of the one-second fire cycle.
fn jitter() -> u64 {
    rand::random::<u64>() % 1_000
}

/// Creates the workload's jobs (children included); returns the cron jobs' ids.
async fn create_jobs(api: &Api, workload: &Workload) -> Vec<i64> {
    let kinds = [
        (workload.plain, workload.sample, workload.param, 0),
        (workload.failing, "fail", "on purpose", 1),
        (workload.parents, "hello", "parent", 0),
    ];
    let caps = [workload.max_concurrent_runs, 0, 0];
    let mut cron_jobs = Vec::new();
    for (kind_idx, (count, sample, param, retry_count)) in kinds.into_iter().enumerate() {
        for n in 0..count {
            let mut children = Vec::new();
            if kind_idx == 2 {
                let fields = json!({
                    "name": format!("child {n}"),
                    "route_strategy": workload.route,
                    "timeout_secs": TIMEOUT_SECS,
                    "param": "child",
                });
                children.push(create_job(api, workload, "hello", fields).await);
            }
            let fields = json!({
                "name": format!("{sample} {n}"),
                "schedule_type": "CRON",
                "schedule_conf": workload.cron,
                "misfire_strategy": "FIRE_ONCE_NOW",
                "route_strategy": workload.route,
                "retry_count": retry_count,
                "child_job_ids": children,
                "timeout_secs": TIMEOUT_SECS,
                "param": param,
                "max_concurrent_runs": caps[kind_idx],
            });
            cron_jobs.push(create_job(api, workload, sample, fields).await);
        }
    }
    cron_jobs
}

/// Creates one job running `sample`, a `BEAN` handler or an uploaded version.
async fn create_job(api: &Api, workload: &Workload, sample: &str, mut fields: Value) -> i64 {
    if workload.bean {
        fields["glue_type"] = json!("BEAN");
        fields["handler"] = json!(sample);
        return api.create_job(fields).await;
    }
    let job_id = api.create_job(fields).await;
    upload(api, job_id, sample_job(sample)).await;
    job_id
}

async fn upload(api: &Api, job_id: i64, bytes: Vec<u8>) {
    let (status, version) = api.upload(job_id, bytes).await;
    assert_eq!(status, 201, "{version}");
}

/// Starts the jobs; returns each with the time its start had returned.
async fn start_jobs(api: &Api, jobs: &[i64]) -> Vec<(i64, i64)> {
    // All at once, so that the scheduler passes woken by the starts (which count towards the
    // firing failpoint) are few and the chaos begins with every job running.
    let mut starts = tokio::task::JoinSet::new();
    for job_id in jobs.iter().copied() {
        let api = Api { http: api.http.clone(), base: api.base.clone(), token: api.token.clone() };
        starts.spawn(async move {
            let (status, job) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
            assert_eq!(status, 200, "{job}");
            (job_id, now_ms())
        });
    }
    let mut started = Vec::new();
    while let Some(start) = starts.join_next().await {
        started.push(start.unwrap());
    }
    started.sort_unstable();
    started
}

/// Stops the jobs; returns their fire windows.
async fn stop_jobs(api: &Api, started: Vec<(i64, i64)>, cron: &str) -> Vec<Window> {
    let mut windows = Vec::new();
    for (job_id, started_ms) in started {
        let mut stopped_ms = now_ms();
        let mut stop = api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
        // Answered 503 while the database is busy with the same rows: sent again after a
        // while, as a client should.
        for _ in 0..5 {
            if stop.0 != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopped_ms = now_ms();
            stop = api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
        }
        let (status, job) = stop;
        assert_eq!(status, 200, "{job}");
        windows.push(Window { job_id, cron: cron.to_owned(), started_ms, stopped_ms });
    }
    windows
}

/// The live admins' shares of the partitions, as `GET /api/v1/admins` lists them, once each
/// admin of the cluster is listed once, as its current incarnation (a dead one is listed until
/// its lease ran out, and a new one only after its first beat), their shares add up to all
/// partitions and each holds at least `least`: each admin's name, its partition count and how
/// many of `jobs` fall in its partitions. Or, if that is not seen within 20 s, the last listing.
async fn balanced_shares(
    api: &Api,
    cluster: &Cluster,
    least: usize,
    jobs: &[i64],
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, admins) = api.get("/api/v1/admins").await;
        assert_eq!(status, 200, "{admins}");
        let listed = admins.as_array().cloned().unwrap_or_default();
        let mut shares = Vec::new();
        for admin in &listed {
            let address = admin["address"].as_str().unwrap_or_default();
            let started_ms = admin["started_at"]
                .as_str()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .map_or(0, |at| at.timestamp_millis());
            let name = match cluster.admins.iter().find(|proc| proc.url() == address) {
                Some(proc) if started_ms >= proc.started_ms => proc.name.clone(),
                Some(proc) => format!("{} (a dead incarnation)", proc.name),
                None => address.to_owned(),
            };
            let partitions: Vec<u64> = admin["partitions"]
                .as_array()
                .map(|partitions| partitions.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let count = admin["partition_count"].as_u64().unwrap_or(0) as usize;
            let held = jobs
                .iter()
                .filter(|job| partitions.contains(&u64::from(partition::of(**job))))
                .count();
            shares.push((name, count, held));
        }
        shares.sort();
        let total: usize = shares.iter().map(|(_, count, _)| count).sum();
        let current = cluster
            .admins
            .iter()
            .all(|proc| shares.iter().filter(|(name, _, _)| *name == proc.name).count() == 1);
        let balanced = shares.len() == cluster.admins.len()
            && current
            && total == usize::from(PARTITIONS)
            && shares.iter().all(|(_, count, _)| *count >= least);
        let text: Vec<String> = shares
            .iter()
            .map(|(name, count, held)| format!("{name} {count} partitions ({held} jobs)"))
            .collect();
        let text = format!("{} (total {total})", text.join(", "));
        if balanced {
            return Ok(text);
        }
        if Instant::now() >= deadline {
            return Err(text);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until no run is unfinished on two looks a second apart (retries and child runs follow
/// their cause), or until [`SETTLE`] has passed; what is left then is for the checker to judge.
async fn settle(database_url: &str) {
    let deadline = Instant::now() + SETTLE;
    let mut quiet_looks = 0;
    while quiet_looks < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        quiet_looks = match checker::unfinished_runs(database_url).await {
            0 => quiet_looks + 1,
            _ => 0,
        };
    }
}

/// A registered executor that accepts connections and never answers them.
struct HungExecutor {
    address: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HungExecutor {
    /// Listens on a port below the real executor's, so FAILOVER (which tries the online
    /// addresses in order) meets it first, and registers it with the first admin every second.
    async fn start(cluster: &Cluster) -> HungExecutor {
        let real_port = cluster.executors[0].port;
        let mut listener = None;
        for _ in 0..200 {
            let candidate = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            if candidate.local_addr().unwrap().port() < real_port {
                listener = Some(candidate);
                break;
            }
        }
        let listener = listener.unwrap_or_else(|| {
            eprintln!("no port below {real_port}: the hung executor may be tried second");
            std::net::TcpListener::bind("127.0.0.1:0").unwrap()
        });
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let accept = tokio::spawn(async move {
            // Held, never read or answered; bounded so a runaway client cannot exhaust us.
            let mut held = Vec::new();
            while held.len() < 10_000 {
                let Ok((stream, _)) = listener.accept().await else { break };
                held.push(stream);
            }
            std::future::pending::<()>().await;
        });
        let admin = cluster.admins[0].url();
        let body = json!({
            "registryGroup": "EXECUTOR",
            "registryKey": "default",
            "registryValue": address,
        });
        let register = tokio::spawn(async move {
            let http = reqwest::Client::new();
            for _ in 0..600 {
                let _ = http
                    .post(format!("{admin}/api/registry"))
                    .header("XXL-JOB-ACCESS-TOKEN", ACCESS_TOKEN)
                    .json(&body)
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        HungExecutor { address, tasks: vec![accept, register] }
    }

    fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}
