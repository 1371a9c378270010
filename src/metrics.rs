//! Prometheus metrics: every metric's name, help and buckets, and their text exposition.
//!
//! Counters and histograms live for the process ([`admin`] and [`executor`] hand out the one
//! set of each), so the code that counts an event is one line where it happens. Levels that
//! an admin or an executor can read off its own state at any moment (online executors,
//! queued runs, unacknowledged results) are not tracked here: the `/metrics` handlers read
//! them at scrape time and pass them in as an [`AdminLevels`] or [`ExecutorLevels`], so they
//! are never stale and cost nothing between scrapes.
//!
//! Names follow Prometheus's conventions: `wasmjob_` first, base units (`_seconds`), `_total`
//! on counters. The exposition is OpenMetrics text (`# EOF` last), which Prometheus reads.
//! This module knows nothing of HTTP, tokens or storage.

#![warn(missing_docs)]

use std::sync::OnceLock;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of [`AdminMetrics::encode`] and [`ExecutorMetrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels as name and value.
type Labels = Vec<(&'static str, String)>;

/// The admin's counters and histograms.
pub struct AdminMetrics {
    /// Fires committed by the scheduler (one per job and scheduled instant).
    pub fires: Counter,
    /// From a scheduled (`CRON`) run's instant to its start on an executor.
    pub fire_lateness: Histogram,
    /// Runs that reached a terminal state, by state.
    pub runs_ended: Family<Labels, Counter>,
    /// Runs that no executor took (refused, unreachable, unconfirmed).
    pub dispatch_failures: Counter,
    /// Fuel used by the successful runs whose results reported it.
    pub fuel_used: Histogram,
    /// Results per `/api/callback` request.
    pub callback_batch_size: Histogram,
    /// Callback results recorded in the inbox before they were applied (`dispatch::inbox`).
    pub callback_results_recorded: Counter,
    /// Results this admin holds recorded and not applied yet.
    pub callback_results_unapplied: Gauge,
    /// Open log streams (`/api/v1/logs/{id}/stream`).
    pub log_streams: Gauge,
    /// Write transactions, from begin to commit, by kind: `batch` (the group commit of the
    /// lifecycle's writes) or `fire` (a scheduler pass's fires and their runs).
    pub db_transaction: Family<Labels, Histogram>,
    /// Alarm delivery attempts by channel (`webhook`, `email`) and outcome (`delivered`,
    /// `retried`, `failed`: failed for the last time).
    pub alarm_deliveries: Family<Labels, Counter>,
    /// Failures whose alarm was silenced by their job's silence window.
    pub alarms_silenced: Counter,
    /// Scheduled fires skipped by their job's misfire strategy (too late to run).
    pub misfires: Counter,
    /// New runs held back at the bound on unfinished runs, by source: `schedule` (a
    /// scheduler pass that waited) or `trigger` (a trigger refused with 503).
    pub admission_refusals: Family<Labels, Counter>,
    /// Workflow runs triggered.
    pub workflow_runs_started: Counter,
    /// From the decision that a workflow node starts (its upstream nodes done) to its runs'
    /// creation.
    pub workflow_node_lateness: Histogram,
    /// The partitions of the schedule this admin holds.
    pub partitions_held: Gauge,
    /// Partitions that changed hands at this admin, by how: `taken`, `released` (given back
    /// to share them, or at a graceful stop) or `lost` (taken over by another admin); and,
    /// among those `taken`, `taken_at_session_end` (from an admin whose database session
    /// ended, before their lease ran out).
    pub partition_handovers: Family<Labels, Counter>,
}

/// What the admin reads off its database at scrape time.
#[derive(Debug, Default)]
pub struct AdminLevels {
    /// Online executors per group (`app_name`).
    pub online_executors: Vec<(String, i64)>,
    /// Unfinished runs per state (`pending`, `dispatching`, `running`).
    pub unfinished_runs: Vec<(&'static str, i64)>,
    /// Workflow runs per state (`running`, `success`, `failed`, `killed`).
    pub workflow_runs: Vec<(String, i64)>,
}

/// The executor's counters and histograms.
pub struct ExecutorMetrics {
    /// Module lookups by result: `hit` (compiled already, in memory or on disk) or `miss`.
    pub module_cache: Family<Labels, Counter>,
    /// Fetching and compiling a module the cache did not have.
    pub module_compile: Histogram,
    /// Log streams (`GET /log/stream`) served.
    pub log_streams: Counter,
}

/// What an executor reads off its workers and outbox at scrape time.
#[derive(Debug, Default)]
pub struct ExecutorLevels {
    /// Runs accepted and waiting for their job's worker.
    pub queued: i64,
    /// Runs running now.
    pub running: i64,
    /// Results not yet acknowledged by an admin.
    pub outbox: i64,
    /// How long the oldest of them has waited, in seconds (0 when none waits).
    pub outbox_oldest_age: f64,
}

/// The admin's metrics.
pub fn admin() -> &'static AdminMetrics {
    static METRICS: OnceLock<AdminMetrics> = OnceLock::new();
    METRICS.get_or_init(|| AdminMetrics {
        fires: Counter::default(),
        // 1 ms to about 65 s.
        fire_lateness: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
        runs_ended: Family::default(),
        dispatch_failures: Counter::default(),
        // A thousand to about a trillion units of fuel.
        fuel_used: Histogram::new(exponential_buckets(1e3, 10.0, 10)),
        callback_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
        callback_results_recorded: Counter::default(),
        callback_results_unapplied: Gauge::default(),
        log_streams: Gauge::default(),
        // 100 µs to about 6.5 s.
        db_transaction: Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 17))
        }),
        alarm_deliveries: Family::default(),
        alarms_silenced: Counter::default(),
        misfires: Counter::default(),
        admission_refusals: Family::default(),
        workflow_runs_started: Counter::default(),
        // 1 ms to about 65 s.
        workflow_node_lateness: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
        partitions_held: Gauge::default(),
        partition_handovers: Family::default(),
    })
}

/// The executor's metrics.
pub fn executor() -> &'static ExecutorMetrics {
    static METRICS: OnceLock<ExecutorMetrics> = OnceLock::new();
    METRICS.get_or_init(|| ExecutorMetrics {
        module_cache: Family::default(),
        // 1 ms to about 65 s.
        module_compile: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
        log_streams: Counter::default(),
    })
}

impl AdminMetrics {
    /// Counts a run that ended in `state`, with the fuel it reported.
    pub fn run_ended(&self, state: &str, fuel_used: Option<i64>) {
        self.runs_ended.get_or_create(&vec![("state", state.to_owned())]).inc();
        if let Some(fuel) = fuel_used {
            self.fuel_used.observe(fuel as f64);
        }
    }

    /// Counts an alarm delivery attempt on `channel` that ended with `outcome`.
    pub fn alarm_delivery(&self, channel: &str, outcome: &str) {
        let labels = vec![("channel", channel.to_owned()), ("outcome", outcome.to_owned())];
        self.alarm_deliveries.get_or_create(&labels).inc();
    }

    /// Counts new runs from `source` held back at the bound on unfinished runs.
    pub fn admission_refused(&self, source: &str) {
        self.admission_refusals.get_or_create(&vec![("source", source.to_owned())]).inc();
    }

    /// Counts `count` partitions that changed hands here, `how` (`taken`, `released`, `lost`,
    /// `taken_at_session_end`).
    pub fn partition_handovers(&self, how: &str, count: usize) {
        let counter = self.partition_handovers.get_or_create(&vec![("how", how.to_owned())]);
        counter.inc_by(count as u64);
    }

    /// Counts a scheduled run started `late_ms` after its instant.
    pub fn fire_started(&self, late_ms: i64) {
        self.fire_lateness.observe(late_ms.max(0) as f64 / 1000.0);
    }

    /// Times one write transaction of `kind` that took `elapsed`.
    pub fn db_transaction(&self, kind: &'static str, elapsed: std::time::Duration) {
        self.db_transaction
            .get_or_create(&vec![("kind", kind.to_owned())])
            .observe(elapsed.as_secs_f64());
    }

    /// The exposition of these metrics and `levels`.
    pub fn encode(&self, levels: &AdminLevels) -> String {
        let mut registry = Registry::with_prefix("wasmjob");
        registry.register("fires", "Fires committed by the scheduler", self.fires.clone());
        registry.register(
            "misfires",
            "Scheduled fires skipped by their job's misfire strategy",
            self.misfires.clone(),
        );
        registry.register(
            "admission_refusals",
            "New runs held back at the bound on unfinished runs, by source",
            self.admission_refusals.clone(),
        );
        registry.register_with_unit(
            "fire_lateness",
            "From a scheduled run's instant to its start on an executor (to its acceptance, on an executor that does not report its start)",
            Unit::Seconds,
            self.fire_lateness.clone(),
        );
        registry.register(
            "runs_ended",
            "Runs that reached a terminal state, by state",
            self.runs_ended.clone(),
        );
        registry.register(
            "dispatch_failures",
            "Runs no executor took: refused, unreachable or unconfirmed",
            self.dispatch_failures.clone(),
        );
        registry.register("run_fuel_used", "Fuel used by successful runs", self.fuel_used.clone());
        registry.register(
            "callback_batch_size",
            "Results per executor callback request",
            self.callback_batch_size.clone(),
        );
        registry.register(
            "callback_results_recorded",
            "Callback results acknowledged from the inbox before they were applied",
            self.callback_results_recorded.clone(),
        );
        registry.register(
            "callback_results_unapplied",
            "Callback results this admin holds recorded and not applied yet",
            self.callback_results_unapplied.clone(),
        );
        registry.register("log_streams", "Open log streams", self.log_streams.clone());
        registry.register_with_unit(
            "db_transaction",
            "Write transactions from begin to commit, by kind: batch (lifecycle writes) or fire",
            Unit::Seconds,
            self.db_transaction.clone(),
        );
        registry.register(
            "alarm_deliveries",
            "Alarm delivery attempts by channel and outcome (delivered, retried, failed)",
            self.alarm_deliveries.clone(),
        );
        registry.register(
            "alarms_silenced",
            "Failures whose alarm was silenced by their job's silence window",
            self.alarms_silenced.clone(),
        );
        registry.register(
            "executors_online",
            "Online executors per group",
            family(levels.online_executors.iter().map(|(group, n)| ("group", group.clone(), *n))),
        );
        registry.register(
            "runs_unfinished",
            "Runs not finished yet, by state",
            family(
                levels.unfinished_runs.iter().map(|(state, n)| ("state", state.to_string(), *n)),
            ),
        );
        registry.register(
            "workflow_runs_started",
            "Workflow runs triggered",
            self.workflow_runs_started.clone(),
        );
        registry.register(
            "workflow_runs",
            "Workflow runs in the database, by state",
            family(levels.workflow_runs.iter().map(|(state, n)| ("state", state.clone(), *n))),
        );
        registry.register_with_unit(
            "workflow_node_lateness",
            "From the decision that a workflow node starts (its upstream nodes done) to its runs' creation",
            Unit::Seconds,
            self.workflow_node_lateness.clone(),
        );
        registry.register(
            "partitions_held",
            "Partitions of the schedule this admin holds",
            self.partitions_held.clone(),
        );
        registry.register(
            "partition_handovers",
            "Partitions that changed hands at this admin, by how (taken, released, lost)",
            self.partition_handovers.clone(),
        );
        text(&registry)
    }
}

impl ExecutorMetrics {
    /// Counts a module lookup: found compiled, or not.
    pub fn module_lookup(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.module_cache.get_or_create(&vec![("result", result.to_owned())]).inc();
    }

    /// The exposition of these metrics and `levels`.
    pub fn encode(&self, levels: &ExecutorLevels) -> String {
        let mut registry = Registry::with_prefix("wasmjob_executor");
        registry.register(
            "module_cache_lookups",
            "Module lookups by result: hit (compiled already) or miss",
            self.module_cache.clone(),
        );
        registry.register_with_unit(
            "module_compile",
            "Fetching and compiling a module the cache did not have",
            Unit::Seconds,
            self.module_compile.clone(),
        );
        registry.register("log_streams", "Log streams served", self.log_streams.clone());
        registry.register(
            "queue_depth",
            "Runs queued for their job's worker",
            gauge(levels.queued),
        );
        registry.register("runs_in_flight", "Runs running now", gauge(levels.running));
        registry.register(
            "outbox_depth",
            "Results waiting for an admin's acknowledgement",
            gauge(levels.outbox),
        );
        let oldest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        oldest.set(levels.outbox_oldest_age);
        registry.register_with_unit(
            "outbox_oldest_age",
            "How long the oldest result waiting for an admin's acknowledgement has waited",
            Unit::Seconds,
            oldest,
        );
        text(&registry)
    }
}

fn gauge(value: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

fn family(values: impl Iterator<Item = (&'static str, String, i64)>) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    for (name, value, n) in values {
        family.get_or_create(&vec![(name, value)]).set(n);
    }
    family
}

fn text(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn levels_are_exposed_as_given() {
        let metrics = ExecutorMetrics {
            module_cache: Family::default(),
            module_compile: Histogram::new([0.5]),
            log_streams: Counter::default(),
        };
        metrics.module_lookup(true);
        metrics.module_lookup(true);
        metrics.module_lookup(false);
        metrics.module_compile.observe(0.25);
        metrics.log_streams.inc();
        let text = metrics.encode(&ExecutorLevels {
            queued: 2,
            running: 1,
            outbox: 3,
            outbox_oldest_age: 1.5,
        });
        expect![[r#"
            # HELP wasmjob_executor_module_cache_lookups Module lookups by result: hit (compiled already) or miss.
            # TYPE wasmjob_executor_module_cache_lookups counter
            wasmjob_executor_module_cache_lookups_total{result="hit"} 2
            wasmjob_executor_module_cache_lookups_total{result="miss"} 1
            # HELP wasmjob_executor_module_compile_seconds Fetching and compiling a module the cache did not have.
            # TYPE wasmjob_executor_module_compile_seconds histogram
            # UNIT wasmjob_executor_module_compile_seconds seconds
            wasmjob_executor_module_compile_seconds_sum 0.25
            wasmjob_executor_module_compile_seconds_count 1
            wasmjob_executor_module_compile_seconds_bucket{le="0.5"} 1
            wasmjob_executor_module_compile_seconds_bucket{le="+Inf"} 1
            # HELP wasmjob_executor_log_streams Log streams served.
            # TYPE wasmjob_executor_log_streams counter
            wasmjob_executor_log_streams_total 1
            # HELP wasmjob_executor_queue_depth Runs queued for their job's worker.
            # TYPE wasmjob_executor_queue_depth gauge
            wasmjob_executor_queue_depth 2
            # HELP wasmjob_executor_runs_in_flight Runs running now.
            # TYPE wasmjob_executor_runs_in_flight gauge
            wasmjob_executor_runs_in_flight 1
            # HELP wasmjob_executor_outbox_depth Results waiting for an admin's acknowledgement.
            # TYPE wasmjob_executor_outbox_depth gauge
            wasmjob_executor_outbox_depth 3
            # HELP wasmjob_executor_outbox_oldest_age_seconds How long the oldest result waiting for an admin's acknowledgement has waited.
            # TYPE wasmjob_executor_outbox_oldest_age_seconds gauge
            # UNIT wasmjob_executor_outbox_oldest_age_seconds seconds
            wasmjob_executor_outbox_oldest_age_seconds 1.5
            # EOF
        "#]]
        .assert_eq(&in_label_order(&text));
    }

    /// `text` with the samples of each labelled family in label order: a family keeps its
    /// samples in a hash map, so their order varies from run to run.
    fn in_label_order(text: &str) -> String {
        let family = |line: &str| {
            let sample = !line.starts_with('#') && !line.contains("le=\"");
            line.split_once('{').filter(|_| sample).map(|(name, _)| name.to_owned())
        };
        let mut lines: Vec<&str> = text.lines().collect();
        for run in lines.chunk_by_mut(|a, b| family(a).is_some() && family(a) == family(b)) {
            run.sort_unstable();
        }
        lines.join("\n") + "\n"
    }
}
