//! wasmjob: a distributed job scheduler whose job handlers are WebAssembly components.
//!
//! Code map, in reading order:
//! - `model`, `lifecycle`, `schedule`, `routing`: data, a run's state machine, fire times and
//!   executor choice; pure, no IO.
//! - `backfill`: the past instants a backfill covers and how many it releases; pure.
//! - `access`: roles and which route asks for which; pure.
//! - `netpolicy`: which executor addresses an admin accepts and calls; pure.
//! - `workflow`: a DAG of jobs: validation, which nodes start or are skipped (storage asks it);
//!   pure.
//! - `partition`: how admins sharing a database share the schedule (fair shares, takes and
//!   give-backs of leases on partitions of the jobs); pure.
//! - `protocol`: the admin⇄executor wire format (XXL-JOB compatible) and its HTTP client.
//! - `storage`: every SQL query, for SQLite, PostgreSQL and MySQL/MariaDB.
//! - `runtime`: wasmtime; compiles components and runs one job in a sandbox.
//! - `admin`: REST API, scheduler and dispatch. `executor`: runs triggers, reports results.
//! - `cli`, `config`, `telemetry`, `metrics`: flags, validated configuration, logging,
//!   Prometheus metrics.
//! - `client_cli`: the REST API's command-line client (`wasmjob job|run|log|…`).
//! - `tls`: serving the APIs over plain HTTP or rustls.
//! - `readiness`: what `/readyz` answers, on the admin and the executor.
//! - `failpoint`: named crash points for the fault tests.
//!
//! `admin` and `executor` never import each other; `main` wires both for `standalone`.

pub mod access;
pub mod admin;
pub mod backfill;
pub mod cli;
pub mod client_cli;
pub mod config;
pub mod executor;
pub mod failpoint;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod netpolicy;
pub mod partition;
pub mod protocol;
pub mod readiness;
pub mod routing;
pub mod runtime;
pub mod schedule;
pub mod storage;
pub mod telemetry;
pub mod tls;
pub mod workflow;
