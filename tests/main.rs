//! Integration tests: one binary, one module per area, helpers in `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

/// Users, sessions and roles through the router: every route with every caller, login, logout.
mod access;
/// The bound on unfinished runs: refused triggers and held fires, then recovery.
mod admission;
/// Alarms from real failing runs: signed webhooks, silence windows, a webhook down, e-mail.
mod alarms;
/// The operator and executor APIs' answers to bad input, through the router (no socket).
mod api_errors;
/// Backfills of past instants with real components: once per instant, paused, resumed, restarted.
mod backfill;
/// The bad-input battery against every API: no 5xx, no panic, no state changed.
mod bad_input;
/// Business calendars: excluded instants neither fired nor misfired, the API, `.ics` imports.
mod calendars;
/// Concurrency caps of jobs and groups: held runs, their release in order, the block strategies.
mod caps;
/// The command-line client as real processes against `wasmjob standalone`, `--follow` included.
mod cli;
/// XXL-JOB wire conformance per generation (2.2 to 3.5), both directions, from recorded bodies.
mod conformance;
/// The console through the router: both languages on every page, the runs list's time filter,
/// the job form against the API's job.
mod console;
/// The console in headless Chromium against `wasmjob standalone` (skipped without chromium).
mod console_browser;
/// Between admin and executor: body limits, the outbox at stop, kills of lost runs, panics.
mod delivery;
/// The Kubernetes manifests of `deploy/kubernetes/`, read into the API types, nothing unknown.
mod deploy_manifests;
/// The whole platform on 127.0.0.1: cron fires, manual triggers, logs, on each database.
mod end_to_end;
/// The executor's run lifecycle: duplicate triggers, restarts and kills, held runs, the outbox.
mod executor_lifecycle;
/// Real admin and executor processes killed and restarted mid-lifecycle, then checked.
mod fault;
/// Jobs as files: `wasmjob apply|diff|export` against real admins, round trips, prune.
mod files;
/// GLUE source: Python and JavaScript handlers built by the admin, run, diffed, rolled back, contained.
mod glue;
/// The admin's side of the run lifecycle: each way a run was lost, stranded or doubled.
mod lifecycle;
/// `/metrics` of the admin and the executor, parsed strictly and watched as runs happen.
mod metrics;
/// MySQL and MariaDB: characters beyond the BMP, case, the server's bound on a statement.
mod mysql;
/// The network attack surface: executor addresses, redirects, reply caps, excerpts, TLS.
mod network_trust;
/// `GET /api/v1/openapi.json`: a 3.1 document of exactly the routes the router serves.
mod openapi;
/// The daemons as an operations team runs them: config files, JSON logs, `--version`, backups.
mod operations;
/// Admins that share a database share the schedule: balanced partitions, a handover at a stop.
mod partitions;
/// A power cut on SQLite simulated with a copy of the database: no run is swallowed after it.
mod power_loss;
/// Executors that pull their runs: routes, broadcasts, logs and kills over their polls,
/// reconnection to a restarted admin, a pull executor that does not poll.
mod pull;
/// The daily report and the dashboard summary, counted from real runs.
mod report;
/// Retry intervals and backoff through a real standalone process, across a killed admin.
mod retry_backoff;
/// The sandbox through the real executor: hostile jobs, kills, block strategies, the cache.
mod sandbox;
/// `GET /api/v1/schedule/preview` through the router: fire times, DST, every refusal.
mod schedule_preview;
/// `wasmjob standalone` as a real process, the way the README runs it.
mod standalone;
/// Live log streams (SSE) from a real executor through the admin, with resume.
mod streaming;
/// Rules of the source tree: docs on every file, layering, migrations.
mod tidy;
/// Rolling upgrades: an earlier build's files opened, migrations with several admins, `/readyz`.
mod upgrade;
/// Workflows with real components: a sharded join, outputs, a retry by hand, a kill, refusals.
mod workflows;
/// `wasmjob import xxl-job` from XXL-JOB's tables of each layout in MariaDB (skipped without one).
mod xxl_import;
