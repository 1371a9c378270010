//! The fault tests' judge: reads the run table and the executors' journals after a scenario and
//! counts what went wrong.
//!
//! It reads the database directly (sqlx `Any`, the SQLite file or the PostgreSQL or MySQL database the
//! admins used), not the API, so that it sees every run, and it reads each executor's
//! `<data_dir>/journal/*.log` (`accepted <logId> <jobId> <ms>`, `started <logId> <ms>`,
//! `finished <logId> <code> <ms>`). A check whose input does not exist yet in this schema (the
//! `state` and `parent_run_id` columns, the journal) is skipped and says so, so the same checker
//! judges the lifecycle before and after those arrive.
//!
//! It does not wait for anything, kill anything or decide what a scenario expects beyond the
//! fire windows it is given.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::PathBuf;

use sqlx::Row;
use wasmjob::storage::testing::fetch_all;

mod overlap;
pub mod workflows;
use wasmjob::model::ScheduleType;
use wasmjob::schedule::Schedule;

/// The states in which a run still waits for its outcome.
const NON_TERMINAL: &[&str] = &["pending", "dispatching", "running"];
/// Terminal states after which a retry is due if attempts are left.
const RETRYABLE: &[&str] = &["failed", "timed_out", "lost"];

/// The time a cron job was started and stopped: its fires in between are expected.
#[derive(Debug, Clone)]
pub struct Window {
    pub job_id: i64,
    /// The job's cron expression (Quartz, with seconds), UTC.
    pub cron: String,
    /// When the start call had returned (ms).
    pub started_ms: i64,
    /// When the stop call was made (ms).
    pub stopped_ms: i64,
}

/// What the checker is given.
pub struct Check {
    pub database_url: String,
    /// Every executor's data dir.
    pub executor_dirs: Vec<PathBuf>,
    /// When each executor died (ms), by executor: a run it started and never finished ran
    /// until its executor's next death.
    pub executor_deaths: Vec<Vec<i64>>,
    pub windows: Vec<Window>,
    /// Fires this close to a window's end are not expected (the stop may have won the race).
    pub end_margin_ms: i64,
    /// How long past its job's timeout a run may stay unfinished (the admin's lease or grace).
    pub terminal_bound_ms: i64,
    /// When the check runs (ms).
    pub now_ms: i64,
}

/// The figures: every one but `fires_expected` must be 0.
#[derive(Debug, Default)]
pub struct Report {
    /// Schedule instants inside the windows.
    pub fires_expected: u64,
    /// Expected instants with no attempt-0 `CRON` run, nor a `MISFIRE` run standing for them.
    pub missing: u64,
    /// Extra attempt-0 runs for one fire (same job, fire time, shard), or for one parent run.
    pub duplicate_attempt0: u64,
    /// Runs with more than one `started` line across all journals.
    pub executed_twice: u64,
    /// Runs of a job with a concurrency cap that started on an executor while the cap was
    /// already taken by others of the job still executing (on any executor).
    pub overlapping_runs: u64,
    /// Unfinished runs older than their job's timeout plus the bound.
    pub not_terminal: u64,
    /// Failed, timed-out or lost runs with attempts left and no `RETRY` run following them.
    pub failures_without_retry: u64,
    /// Successful runs of a parent job lacking a `PARENT` run of one of its children.
    pub successes_without_children: u64,
    /// (day, state) counts of the daily report, and (day, job) counts of failed, timed-out and
    /// lost runs, that differ from a count of the run table.
    pub report_mismatches: u64,
    /// Runs in the table, by trigger type and state.
    pub runs: BTreeMap<String, u64>,
    /// Checks not made, with why.
    pub skipped: Vec<(&'static str, &'static str)>,
    /// A few offending cases per figure, to start debugging from.
    pub examples: BTreeMap<&'static str, Vec<String>>,
}

impl Report {
    /// Panics, showing the report, if any figure other than `fires_expected` is not 0.
    pub fn assert_clean(&self, scenario: &str) {
        let bad = [
            self.missing,
            self.duplicate_attempt0,
            self.executed_twice,
            self.overlapping_runs,
            self.not_terminal,
            self.failures_without_retry,
            self.successes_without_children,
            self.report_mismatches,
        ];
        assert!(bad.iter().all(|n| *n == 0), "{scenario}: faults found:\n{self}");
    }

    fn note(&mut self, figure: &'static str, example: String) {
        let list = self.examples.entry(figure).or_default();
        if list.len() < 5 {
            list.push(example);
        }
    }

    fn skip(&mut self, figure: &'static str, why: &'static str) {
        self.skipped.push((figure, why));
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.runs.values().sum();
        let kinds: Vec<String> = self.runs.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        writeln!(f, "runs: {total} ({})", kinds.join(", "))?;
        let figures = [
            ("fires_expected", self.fires_expected),
            ("missing", self.missing),
            ("duplicate_attempt0", self.duplicate_attempt0),
            ("executed_twice", self.executed_twice),
            ("overlapping_runs", self.overlapping_runs),
            ("not_terminal", self.not_terminal),
            ("failures_without_retry", self.failures_without_retry),
            ("successes_without_children", self.successes_without_children),
            ("report_mismatches", self.report_mismatches),
        ];
        for (name, value) in figures {
            match self.skipped.iter().find(|(figure, _)| *figure == name) {
                Some((_, why)) => writeln!(f, "{name}: skipped ({why})")?,
                None => writeln!(f, "{name}: {value}")?,
            }
            if let Some(examples) = self.examples.get(name) {
                writeln!(f, "  e.g. {}", examples.join("; "))?;
            }
        }
        Ok(())
    }
}

/// One row of `runs`, as the checker needs it.
#[derive(Debug)]
struct Run {
    id: i64,
    job_id: i64,
    trigger_type: String,
    trigger_time: i64,
    fire_time: Option<i64>,
    attempt: i64,
    shard_index: i64,
    executor_address: Option<String>,
    /// `state` when the column exists, else derived from `handle_code` (and `handle_msg`, whose
    /// `skipped: …` marks a fire dropped because its job stopped).
    state: String,
    parent_run_id: Option<i64>,
}

/// One row of `jobs`.
#[derive(Debug)]
struct Job {
    retry_count: i64,
    child_job_ids: Vec<i64>,
    timeout_secs: i64,
    max_concurrent_runs: i64,
}

/// Reads the table and the journals and counts.
pub async fn check(input: &Check) -> Report {
    let (runs, jobs, lifecycle) = read_database(&input.database_url).await;
    let mut report = Report::default();
    for run in &runs {
        *report.runs.entry(format!("{}/{}", run.trigger_type, run.state)).or_default() += 1;
    }
    count_fires(input, &runs, &mut report);
    count_duplicates(&runs, lifecycle, &mut report);
    count_unfinished(input, &runs, &jobs, &mut report);
    if lifecycle {
        count_follow_ups(&runs, &jobs, &mut report);
    } else {
        for figure in ["failures_without_retry", "successes_without_children"] {
            report.skip(figure, "the runs table has no parent_run_id yet");
        }
    }
    count_executions(&input.executor_dirs, &mut report);
    count_overlaps(input, &jobs, &mut report);
    count_report(&input.database_url, &mut report).await;
    report
}

/// Runs not finished yet, whatever their age.
pub async fn unfinished_runs(database_url: &str) -> u64 {
    let (runs, _, _) = read_database(database_url).await;
    runs.iter().filter(|run| NON_TERMINAL.contains(&run.state.as_str())).count() as u64
}

/// Finished runs that did not succeed.
pub async fn unsuccessful_runs(database_url: &str) -> u64 {
    let (runs, _, _) = read_database(database_url).await;
    let unsuccessful =
        |run: &&Run| !NON_TERMINAL.contains(&run.state.as_str()) && run.state != "success";
    // A fire dropped because its job stopped did not fail.
    runs.iter().filter(unsuccessful).filter(|run| run.state != "skipped").count() as u64
}

/// Runs the admin sent (or meant to send) to `address`.
pub async fn runs_sent_to(database_url: &str, address: &str) -> u64 {
    let (runs, _, _) = read_database(database_url).await;
    runs.iter().filter(|run| run.executor_address.as_deref() == Some(address)).count() as u64
}

/// Compares the daily report (its table and the deltas not yet folded into it) with a count of
/// the run table by creation day and state, the unfinished states as `running`.
async fn count_report(url: &str, report: &mut Report) {
    let pool = connect(url).await;
    let stored = "select day, state, cast(sum(runs) as bigint) as n from (
            select day, state, runs from run_report
            union all
            select day, state, runs from run_report_delta
        ) as counted group by day, state";
    let Ok(stored) = fetch_all(&pool, stored, &[]).await else {
        report.skip("report_mismatches", "the database has no incremental daily report yet");
        pool.close().await;
        return;
    };
    let bucket = "case when state in ('pending', 'dispatching', 'running') then 'running' \
                  else state end";
    // The day of a time, in integers on every dialect (MySQL's `/` divides as decimals).
    let day = "cast((created_at - created_at % 86400000) / 86400000 as bigint)";
    let counted = format!(
        "select {day} as day, {bucket} as state, count(*) as n from runs
         group by {day}, {bucket}"
    );
    let counted = fetch_all(&pool, &counted, &[]).await.unwrap();
    // The dashboard's failures per job and day, kept the same way, as `failures of job N`.
    let stored_failures = "select day, 'failures of job ' || cast(job_id as text) as state,
            cast(sum(runs) as bigint) as n from (
                select day, job_id, runs from job_failures
                union all
                select day, job_id, runs from job_failure_delta
            ) as counted group by day, job_id";
    let counted_failures = format!(
        "select {day} as day,
            'failures of job ' || cast(job_id as text) as state, count(*) as n from runs
            where state in ('failed', 'timed_out', 'lost')
            group by {day}, job_id"
    );
    let failures = match fetch_all(&pool, stored_failures, &[]).await {
        Ok(stored) => Some((stored, fetch_all(&pool, &counted_failures, &[]).await.unwrap())),
        Err(_) => None,
    };
    pool.close().await;
    let read = |rows: &[sqlx::any::AnyRow]| -> BTreeMap<(i64, String), i64> {
        rows.iter()
            .map(|row| ((row.get("day"), row.get("state")), row.get::<i64, _>("n")))
            .filter(|(_, n)| *n != 0)
            .collect()
    };
    let (mut stored, mut counted) = (read(&stored), read(&counted));
    match failures {
        Some((stored_failures, counted_failures)) => {
            stored.extend(read(&stored_failures));
            counted.extend(read(&counted_failures));
        }
        None => report.note("report_mismatches", "no job failure counts yet".to_owned()),
    }
    for key in stored.keys().chain(counted.keys()).collect::<BTreeSet<_>>() {
        let (in_report, in_table) = (stored.get(key), counted.get(key));
        if in_report != in_table {
            report.report_mismatches += 1;
            let example =
                format!("day {} {}: report {in_report:?}, runs {in_table:?}", key.0, key.1);
            report.note("report_mismatches", example);
        }
    }
}

pub(super) async fn connect(url: &str) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    let url = match url.strip_prefix("sqlite:") {
        Some(path) => format!("sqlite://{path}?mode=rw"),
        None => url.to_owned(),
    };
    sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap()
}

async fn read_database(url: &str) -> (Vec<Run>, HashMap<i64, Job>, bool) {
    let pool = connect(url).await;
    // The lifecycle columns arrive with a later migration: probe for them.
    let lifecycle =
        fetch_all(&pool, "select state, parent_run_id from runs where 1 = 0", &[]).await.is_ok();
    let extra = if lifecycle { ", state, parent_run_id" } else { "" };
    let sql = format!(
        "select id, job_id, trigger_type, trigger_time, fire_time, attempt, shard_index, \
         executor_address, handle_code, handle_msg{extra} from runs order by id"
    );
    let mut runs = Vec::new();
    for row in fetch_all(&pool, &sql, &[]).await.unwrap() {
        let handle_code: i64 = row.get("handle_code");
        let (state, parent_run_id) = if lifecycle {
            (row.get::<String, _>("state"), row.get::<Option<i64>, _>("parent_run_id"))
        } else {
            let handle_msg: String = row.get("handle_msg");
            let state = match handle_code {
                0 => "running",
                200 => "success",
                502 => "timed_out",
                _ if handle_msg.starts_with("skipped") => "skipped",
                _ => "failed",
            };
            (state.to_owned(), None)
        };
        runs.push(Run {
            id: row.get("id"),
            job_id: row.get("job_id"),
            trigger_type: row.get("trigger_type"),
            trigger_time: row.get("trigger_time"),
            fire_time: row.get("fire_time"),
            attempt: row.get("attempt"),
            shard_index: row.get("shard_index"),
            executor_address: row.get("executor_address"),
            state,
            parent_run_id,
        });
    }
    let mut jobs = HashMap::new();
    let rows = fetch_all(
        &pool,
        "select id, retry_count, child_job_ids, timeout_secs, max_concurrent_runs from jobs",
        &[],
    )
    .await
    .unwrap();
    for row in rows {
        let child_job_ids: String = row.get("child_job_ids");
        let job = Job {
            retry_count: row.get("retry_count"),
            child_job_ids: child_job_ids
                .split(',')
                .filter_map(|id| id.trim().parse().ok())
                .collect(),
            timeout_secs: row.get("timeout_secs"),
            max_concurrent_runs: row.get("max_concurrent_runs"),
        };
        jobs.insert(row.get::<i64, _>("id"), job);
    }
    pool.close().await;
    (runs, jobs, lifecycle)
}

/// Expected instants, and those with no run. An on-time run carries its instant; a `MISFIRE`
/// run (fired late, at "now") stands for one instant: the latest uncovered one before it. With
/// restarts shorter than the misfire threshold there should be none.
fn count_fires(input: &Check, runs: &[Run], report: &mut Report) {
    let mut on_time: HashMap<i64, BTreeSet<i64>> = HashMap::new();
    let mut misfires: HashMap<i64, Vec<i64>> = HashMap::new();
    for run in runs.iter().filter(|run| run.attempt == 0) {
        let at = run.fire_time.unwrap_or(run.trigger_time);
        match run.trigger_type.as_str() {
            "CRON" => {
                on_time.entry(run.job_id).or_default().insert(at);
            }
            "MISFIRE" => misfires.entry(run.job_id).or_default().push(at),
            _ => {}
        }
    }
    let empty = BTreeSet::new();
    for window in &input.windows {
        let schedule = Schedule::parse(ScheduleType::Cron, &window.cron, None).unwrap();
        let last = window.stopped_ms - input.end_margin_ms;
        let on_time = on_time.get(&window.job_id).unwrap_or(&empty);
        let mut uncovered = Vec::new();
        let mut cursor = window.started_ms;
        while let Some(instant) = schedule.next_after(cursor).filter(|instant| *instant <= last) {
            cursor = instant;
            report.fires_expected += 1;
            if !on_time.contains(&instant) {
                uncovered.push(instant);
            }
        }
        let mut misfired = misfires.get(&window.job_id).cloned().unwrap_or_default();
        misfired.sort_unstable();
        for at in misfired {
            if let Some(index) = uncovered.iter().rposition(|instant| *instant <= at) {
                uncovered.remove(index);
            }
        }
        report.missing += uncovered.len() as u64;
        for instant in uncovered {
            report.note("missing", format!("job {} at {instant}", window.job_id));
        }
    }
}

/// Attempt-0 runs sharing a fire (job, fire time, shard), or, for child runs, a parent run.
fn count_duplicates(runs: &[Run], lifecycle: bool, report: &mut Report) {
    let mut seen: HashMap<(i64, &str, i64, i64), Vec<i64>> = HashMap::new();
    for run in runs.iter().filter(|run| run.attempt == 0) {
        let key = match (run.trigger_type.as_str(), run.fire_time, run.parent_run_id) {
            ("CRON" | "MISFIRE", Some(fire), _) => (run.job_id, "fire", fire, run.shard_index),
            ("PARENT", _, Some(parent)) if lifecycle => {
                (run.job_id, "parent", parent, run.shard_index)
            }
            _ => continue,
        };
        seen.entry(key).or_default().push(run.id);
    }
    for ((job_id, kind, at, _), ids) in seen.into_iter().filter(|(_, ids)| ids.len() > 1) {
        report.duplicate_attempt0 += ids.len() as u64 - 1;
        report.note("duplicate_attempt0", format!("job {job_id} {kind} {at}: runs {ids:?}"));
    }
}

fn count_unfinished(input: &Check, runs: &[Run], jobs: &HashMap<i64, Job>, report: &mut Report) {
    for run in runs.iter().filter(|run| NON_TERMINAL.contains(&run.state.as_str())) {
        let timeout_ms = jobs.get(&run.job_id).map_or(0, |job| job.timeout_secs * 1000);
        if run.trigger_time + timeout_ms + input.terminal_bound_ms < input.now_ms {
            report.not_terminal += 1;
            let age = input.now_ms - run.trigger_time;
            report.note("not_terminal", format!("run {} {} for {age} ms", run.id, run.state));
        }
    }
}

/// Retries of failures and child runs of successes, both linked by `parent_run_id`.
fn count_follow_ups(runs: &[Run], jobs: &HashMap<i64, Job>, report: &mut Report) {
    let mut retried = BTreeSet::new();
    let mut children = BTreeSet::new();
    for run in runs {
        match (run.trigger_type.as_str(), run.parent_run_id) {
            ("RETRY", Some(parent)) => retried.insert(parent),
            ("PARENT", Some(parent)) => children.insert((parent, run.job_id)),
            _ => false,
        };
    }
    for run in runs {
        let Some(job) = jobs.get(&run.job_id) else { continue };
        if RETRYABLE.contains(&run.state.as_str())
            && run.attempt < job.retry_count
            && !retried.contains(&run.id)
        {
            report.failures_without_retry += 1;
            report.note("failures_without_retry", format!("run {} {}", run.id, run.state));
        }
        if run.state == "success"
            && let Some(child) =
                job.child_job_ids.iter().find(|child| !children.contains(&(run.id, **child)))
        {
            report.successes_without_children += 1;
            report.note("successes_without_children", format!("run {} child job {child}", run.id));
        }
    }
}

fn count_overlaps(input: &Check, jobs: &HashMap<i64, Job>, report: &mut Report) {
    let caps: HashMap<i64, i64> =
        jobs.iter().map(|(id, job)| (*id, job.max_concurrent_runs)).collect();
    if caps.values().all(|cap| *cap == 0) {
        report.skip("overlapping_runs", "no job has a concurrency cap");
        return;
    }
    let executions =
        overlap::executions(&input.executor_dirs, &input.executor_deaths, input.now_ms);
    for (execution, running) in overlap::overlapping(&executions, &caps) {
        report.overlapping_runs += 1;
        report.note(
            "overlapping_runs",
            format!(
                "run {} of job {} started at {} while {running:?} ran",
                execution.log_id, execution.job_id, execution.started_ms
            ),
        );
    }
}

fn count_executions(executor_dirs: &[PathBuf], report: &mut Report) {
    let journals: Vec<PathBuf> =
        executor_dirs.iter().map(|dir| dir.join("journal")).filter(|dir| dir.is_dir()).collect();
    if journals.is_empty() {
        report.skip("executed_twice", "no executor keeps a journal yet");
        return;
    }
    let mut starts: HashMap<i64, u64> = HashMap::new();
    for journal in journals {
        for entry in std::fs::read_dir(&journal).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "log") {
                continue;
            }
            // A process killed mid-write leaves a torn last line: it does not parse, and counts
            // for nothing.
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            for line in text.lines() {
                let mut fields = line.split_whitespace();
                if fields.next() == Some("started")
                    && let Some(Ok(log_id)) = fields.next().map(str::parse::<i64>)
                {
                    *starts.entry(log_id).or_default() += 1;
                }
            }
        }
    }
    for (log_id, count) in starts.into_iter().filter(|(_, count)| *count > 1) {
        report.executed_twice += 1;
        report.note("executed_twice", format!("run {log_id} started {count} times"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(id, job, trigger type, fire time, attempt, state, parent run)`.
    type Row = (i64, i64, &'static str, Option<i64>, i64, &'static str, Option<i64>);

    /// Job 1 fires every second from 0 to 5 s (so 1, 2 and 3 s are expected with the 2 s end
    /// margin), has one retry and the child job 2. Figures: fires expected, missing, duplicate
    /// attempt-0 runs, failures without retry, successes without children.
    fn check(rows: &[Row]) -> [u64; 5] {
        let runs: Vec<Run> = rows
            .iter()
            .map(|&(id, job_id, trigger_type, fire_time, attempt, state, parent_run_id)| Run {
                id,
                job_id,
                trigger_type: trigger_type.to_owned(),
                trigger_time: fire_time.unwrap_or(0),
                fire_time,
                attempt,
                shard_index: 0,
                executor_address: None,
                state: state.to_owned(),
                parent_run_id,
            })
            .collect();
        let jobs = HashMap::from([
            (
                1,
                Job {
                    retry_count: 1,
                    child_job_ids: vec![2],
                    timeout_secs: 0,
                    max_concurrent_runs: 0,
                },
            ),
            (
                2,
                Job {
                    retry_count: 0,
                    child_job_ids: Vec::new(),
                    timeout_secs: 0,
                    max_concurrent_runs: 0,
                },
            ),
        ]);
        let input = Check {
            database_url: String::new(),
            executor_dirs: Vec::new(),
            executor_deaths: Vec::new(),
            windows: vec![Window {
                job_id: 1,
                cron: "* * * * * ?".to_owned(),
                started_ms: 0,
                stopped_ms: 5_000,
            }],
            end_margin_ms: 2_000,
            terminal_bound_ms: 0,
            now_ms: 0,
        };
        let mut report = Report::default();
        count_fires(&input, &runs, &mut report);
        count_duplicates(&runs, true, &mut report);
        count_follow_ups(&runs, &jobs, &mut report);
        [
            report.fires_expected,
            report.missing,
            report.duplicate_attempt0,
            report.failures_without_retry,
            report.successes_without_children,
        ]
    }

    #[test]
    fn figures_of_run_tables() {
        let cases: &[(&str, &[Row], [u64; 5])] = &[
            (
                "every fire on time, each success with its child",
                &[
                    (1, 1, "CRON", Some(1_000), 0, "success", None),
                    (2, 1, "CRON", Some(2_000), 0, "success", None),
                    (3, 1, "CRON", Some(3_000), 0, "success", None),
                    (4, 2, "PARENT", None, 0, "success", Some(1)),
                    (5, 2, "PARENT", None, 0, "success", Some(2)),
                    (6, 2, "PARENT", None, 0, "success", Some(3)),
                ],
                [3, 0, 0, 0, 0],
            ),
            (
                "a gap of two fires: one misfire stands for one of them",
                &[
                    (1, 1, "CRON", Some(1_000), 0, "success", None),
                    (2, 1, "MISFIRE", Some(3_500), 0, "success", None),
                    (3, 2, "PARENT", None, 0, "success", Some(1)),
                    (4, 2, "PARENT", None, 0, "success", Some(2)),
                ],
                [3, 1, 0, 0, 0],
            ),
            (
                "a doubled fire and a doubled child run",
                &[
                    (1, 1, "CRON", Some(1_000), 0, "success", None),
                    (2, 1, "CRON", Some(1_000), 0, "success", None),
                    (3, 1, "CRON", Some(2_000), 0, "skipped", None),
                    (4, 1, "CRON", Some(3_000), 0, "running", None),
                    (5, 2, "PARENT", None, 0, "success", Some(1)),
                    (6, 2, "PARENT", None, 0, "success", Some(1)),
                    (7, 2, "PARENT", None, 0, "success", Some(2)),
                ],
                [3, 0, 2, 0, 0],
            ),
            (
                "a failure not retried, a retried one, a success without its child",
                &[
                    (1, 1, "CRON", Some(1_000), 0, "lost", None),
                    (2, 1, "CRON", Some(2_000), 0, "failed", None),
                    (3, 1, "RETRY", None, 1, "failed", Some(2)),
                    (4, 1, "CRON", Some(3_000), 0, "success", None),
                ],
                [3, 0, 0, 1, 1],
            ),
        ];
        for (name, rows, expected) in cases {
            assert_eq!(check(rows), *expected, "{name}");
        }
    }
}
