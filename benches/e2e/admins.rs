//! `--admins N` and `--kill-admin-at S`: several admins that share one database, and so share
//! the schedule (256 partitions of the jobs, each admin leasing about 1/N of them).
//!
//! The other admins start after the first is ready, each on its own port; the bench's API calls
//! go to the first, and our executor is given every admin's URL. Before a workload, the bench
//! waits until `GET /api/v1/admins` lists N admins whose partitions add up to 256, each with at
//! least 256/N - 1 of them.
//!
//! Over a scheduled workload's window it samples every admin's CPU time. With
//! `--kill-admin-at S`, workload (a) SIGKILLs the last admin (never the first, which the bench
//! talks to) S seconds after its jobs started, and reads from the run table how long the dead
//! admin's jobs waited: the longest gap between two consecutive fires' commits of one job, the
//! latest commit after its scheduled instant, and the latest acceptance by the executor after
//! it (a fire the dead admin committed ahead of its instant but did not send).

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::Duration;

use sqlx::Row;

use super::{ADMIN_TOKEN, Args, Platform, cpu_secs, fetch_all, now_ms, peak_rss_mb, wait_for};

/// An admin after the first, and the URL it serves at.
pub struct OtherAdmin {
    pub child: Child,
    pub api: String,
}

/// The admin `--kill-admin-at` killed, and what it had used when it was killed (a killed
/// process's `/proc` entry no longer says).
pub struct Killed {
    /// Among the admins, 0 the first.
    index: usize,
    cpu_secs: f64,
    rss_mb: f64,
}

/// Refuses what the options cannot measure, before anything starts.
pub fn check(args: &Args) {
    assert!(args.admins >= 1, "--admins must be at least 1");
    if args.admins > 1 {
        assert!(
            args.postgres || args.mysql,
            "--admins {} shares one database between admins: it needs --postgres or --mysql \
             (an SQLite database has one admin)",
            args.admins
        );
        assert!(
            !args.workloads.contains('x'),
            "workload (x)'s XXL-JOB executor registers with one admin: run it with --admins 1"
        );
    }
    if let Some(at) = args.kill_admin_at {
        assert!(
            args.admins >= 2,
            "--kill-admin-at kills the last admin and keeps the first: it needs --admins 2 or more"
        );
        assert!(
            args.workloads.contains('a'),
            "--kill-admin-at kills an admin during workload (a): add `a` to --workload"
        );
        assert!(
            at >= 4 && at + 4 <= args.secs,
            "--kill-admin-at {at} must fall inside workload (a)'s judged window: between 4 and \
             --secs - 4 ({})",
            args.secs.saturating_sub(4)
        );
    }
}

/// Sleeps until the wall-clock instant `ms`.
pub async fn sleep_until(ms: i64) {
    tokio::time::sleep(Duration::from_millis(u64::try_from(ms - now_ms()).unwrap_or(0))).await;
}

impl Platform {
    /// How many admins were started.
    pub fn admin_count(&self) -> usize {
        1 + self.others.len()
    }

    /// Every process, the executor first and the admin the bench talks to last.
    pub fn processes(&mut self) -> Vec<&mut Child> {
        let others = self.others.iter_mut().map(|other| &mut other.child);
        self.executor.iter_mut().chain(others).chain(std::iter::once(&mut self.admin)).collect()
    }

    /// `live` of each admin's process, the first's first; for a killed admin, `dead` of what it
    /// had used at its death.
    fn per_admin(&self, live: fn(u32) -> f64, dead: fn(&Killed) -> f64) -> Vec<f64> {
        let killed = self.killed.lock().unwrap();
        let others = self.others.iter().map(|other| other.child.id());
        let pids = std::iter::once(self.admin.id()).chain(others).enumerate();
        pids.map(|(index, pid)| match killed.as_ref().filter(|killed| killed.index == index) {
            Some(killed) => dead(killed),
            None => live(pid),
        })
        .collect()
    }

    /// Each admin's CPU time so far, the first's first.
    pub fn admin_cpu_secs(&self) -> Vec<f64> {
        self.per_admin(cpu_secs, |killed| killed.cpu_secs)
    }

    /// Each admin's peak resident memory, the first's first.
    pub fn admin_rss_mb(&self) -> Vec<f64> {
        self.per_admin(peak_rss_mb, |killed| killed.rss_mb)
    }

    /// Waits for the other admins to be ready, then for the partitions to be shared out: N live
    /// admins, 256 partitions held in all, each admin at least 256/N - 1.
    pub async fn wait_for_admins(&self) {
        for other in &self.others {
            wait_for("another admin to be ready", || {
                let (http, url) = (self.http.clone(), format!("{}/readyz", other.api));
                async move {
                    let reply = http.get(url).send().await.ok()?;
                    reply.status().is_success().then_some(())
                }
            })
            .await;
        }
        let admins = self.admin_count();
        if admins == 1 {
            return;
        }
        let least = (256 / admins).saturating_sub(1);
        wait_for("the admins to share the partitions", || async move {
            let counts = self.partition_counts().await;
            let fair = counts.len() == admins
                && counts.iter().sum::<usize>() == 256
                && counts.iter().all(|count| *count >= least);
            fair.then_some(())
        })
        .await;
    }

    /// Each live admin's partition count, as the first admin lists them.
    async fn partition_counts(&self) -> Vec<usize> {
        let reply = self
            .http
            .get(format!("{}/api/v1/admins", self.api))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        let Ok(reply) = reply else { return Vec::new() };
        let listed: serde_json::Value = reply.json().await.unwrap_or_default();
        let listed = listed.as_array().cloned().unwrap_or_default();
        let count = |admin: &serde_json::Value| admin["partition_count"].as_u64().unwrap_or(0);
        listed.iter().map(|admin| usize::try_from(count(admin)).unwrap_or(0)).collect()
    }

    /// SIGKILLs the last admin, after reading what it used.
    fn kill_last_admin(&self) -> i64 {
        let index = self.others.len();
        let pid = self.others.last().expect("no admin to kill but the first").child.id();
        let (cpu_secs, rss_mb) = (cpu_secs(pid), peak_rss_mb(pid));
        let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        assert!(status.success(), "killing admin {} (pid {pid}): {status}", index + 1);
        *self.killed.lock().unwrap() = Some(Killed { index, cpu_secs, rss_mb });
        now_ms()
    }

    /// Workload `name`'s memory line for each admin and their sum, with more than one admin.
    pub fn report_admins_memory(&self, name: &str) {
        if self.others.is_empty() {
            return;
        }
        let rss = self.admin_rss_mb();
        for (index, mb) in rss.iter().enumerate() {
            println!("{name}.admin_{}_rss_mb: {mb:.1}", index + 1);
        }
        println!("{name}.admins_rss_mb: {:.1}", rss.iter().sum::<f64>());
    }
}

/// The admins' CPU time over a scheduled workload's judged window, and the kill within it.
pub struct Window {
    before: Vec<f64>,
    /// When the last admin was killed, if it was.
    pub killed_at_ms: Option<i64>,
}

impl Window {
    /// Waits for the window's start (`from`) and samples the admins' CPU time; then, with a
    /// kill at `kill_ms`, waits for it and kills the last admin.
    pub async fn open(platform: &Platform, from: i64, kill_ms: Option<i64>) -> Window {
        sleep_until(from).await;
        let before = platform.admin_cpu_secs();
        let killed_at_ms = match kill_ms {
            Some(at) => {
                sleep_until(at).await;
                Some(platform.kill_last_admin())
            }
            None => None,
        };
        Window { before, killed_at_ms }
    }

    /// Each admin's CPU time since [`Window::open`].
    pub fn close(&self, platform: &Platform) -> Vec<f64> {
        let after = platform.admin_cpu_secs();
        after.iter().zip(&self.before).map(|(after, before)| after - before).collect()
    }
}

/// Prints the admins' figures: their count, their CPU time per 1,000 `fires` in all, and each
/// admin's own.
pub fn report_cpu(name: &str, cpu: &[f64], fires: usize) {
    println!("{name}.admins: {}", cpu.len());
    let total: f64 = cpu.iter().sum();
    println!("{name}.admins_cpu_secs_per_1000_fires: {:.3}", total * 1000.0 / fires.max(1) as f64);
    for (index, secs) in cpu.iter().enumerate() {
        println!("{name}.admin_{}_cpu_secs: {secs:.2}", index + 1);
    }
}

/// The failover figures over the fires of `ids` scheduled in `from..=until`: the longest gap
/// between two consecutive fires' commits of one job (`created_at`, consecutive by fire time),
/// and between their starts at the executor (`started_at`; the acceptance, `dispatched_at`, for
/// a run that recorded no start; the time of the read for one not yet sent): the gap in firing;
/// among the fires scheduled after `killed_at_ms` (after `from` without a kill), the latest
/// commit after its instant and how many were committed after it, and the latest acceptance by
/// the executor after its instant (`dispatched_at`: a fire the dead admin committed but did not
/// send waits for its run's claim to run out) and how many were accepted over 5 s late, a fire
/// still unsent when the table is read counting as accepted then (and as not yet accepted); and
/// how many runs of the window have no result yet.
pub async fn report_failover(
    platform: &Platform,
    pool: &sqlx::AnyPool,
    name: &str,
    ids: &[String],
    (from, until): (i64, i64),
    killed_at_ms: Option<i64>,
) {
    let rows = fetch_all(
        pool,
        &format!(
            "select job_id, fire_time, created_at, dispatched_at, started_at, handle_code, state
             from runs
             where fire_time >= $1 and fire_time <= $2 and attempt = 0
             and trigger_type in ('CRON', 'MISFIRE') and job_id in ({})",
            ids.join(",")
        ),
        &[from, until],
    )
    .await
    .unwrap();
    let read_ms = now_ms();
    let after = killed_at_ms.unwrap_or(from);
    let mut fires: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
    // Each fire's start at the executor (or its acceptance, or now for one not yet sent), by job.
    let mut starts: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
    let (mut max_late, mut committed_late, mut without_result) = (i64::MIN, 0, 0);
    let (mut max_sent_late, mut sent_over_5s_late, mut unsent) = (i64::MIN, 0, 0);
    for row in &rows {
        let (job_id, fire_time, created_at): (i64, i64, i64) =
            (row.get("job_id"), row.get("fire_time"), row.get("created_at"));
        fires.entry(job_id).or_default().push((fire_time, created_at));
        let (dispatched_at, started_at): (i64, i64) =
            (row.get("dispatched_at"), row.get("started_at"));
        let state: String = row.get("state");
        let not_yet_sent = dispatched_at == 0 && (state == "pending" || state == "dispatching");
        let accepted_at = match dispatched_at {
            0 if not_yet_sent => Some(read_ms),
            0 => None,
            at => Some(at),
        };
        if let Some(at) = if started_at > 0 { Some(started_at) } else { accepted_at } {
            starts.entry(job_id).or_default().push((fire_time, at));
        }
        if fire_time > after {
            max_late = max_late.max(created_at - fire_time);
            committed_late += i64::from(created_at > fire_time);
            unsent += i64::from(not_yet_sent);
            if let Some(at) = accepted_at {
                max_sent_late = max_sent_late.max(at - fire_time);
                sent_over_5s_late += i64::from(at - fire_time > 5_000);
            }
        }
        without_result += i64::from(row.get::<i64, _>("handle_code") == 0);
    }
    let longest_gap = |by_job: &mut HashMap<i64, Vec<(i64, i64)>>| {
        let mut longest = 0;
        for job_fires in by_job.values_mut() {
            job_fires.sort_unstable();
            for pair in job_fires.windows(2) {
                longest = longest.max(pair[1].1 - pair[0].1);
            }
        }
        longest
    };
    let (longest_commit_gap, longest_start_gap) =
        (longest_gap(&mut fires), longest_gap(&mut starts));
    if let Some(at) = killed_at_ms {
        println!("{name}.failover_killed_admin: {}", platform.admin_count());
        println!("{name}.failover_killed_after_window_start_ms: {}", at - from);
    }
    println!("{name}.failover_longest_fire_gap_ms: {longest_commit_gap}");
    println!("{name}.failover_longest_start_gap_ms: {longest_start_gap}");
    let or_na = |ms: i64| if ms == i64::MIN { "n/a".to_owned() } else { ms.to_string() };
    println!("{name}.failover_max_lateness_ms: {}", or_na(max_late));
    println!("{name}.failover_fires_committed_late: {committed_late}");
    println!("{name}.failover_max_accepted_lateness_ms: {}", or_na(max_sent_late));
    println!("{name}.failover_fires_accepted_over_5s_late: {sent_over_5s_late}");
    println!("{name}.failover_fires_not_yet_accepted: {unsent}");
    println!("{name}.runs_without_result: {without_result}");
    if killed_at_ms.is_some() {
        let counts = platform.partition_counts().await;
        println!("{name}.failover_admins_live_after: {}", counts.len());
        println!("{name}.failover_partitions_held_after: {}", counts.iter().sum::<usize>());
    }
}
