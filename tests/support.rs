//! Test helpers: built sample jobs, a platform started in-process on 127.0.0.1:0, an HTTP client,
//! and for the fault tests real processes (`cluster`) and the judge of their runs (`checker`).

pub mod app;
pub mod browser;
pub mod builders;
pub mod checker;
pub mod cluster;
pub mod metrics;
pub mod runs;
mod sample_jobs;
pub mod scenarios;
pub mod sse;
pub mod standalone;

pub use app::{
    ACCESS_TOKEN, ADMIN_TOKEN, Api, Backend, TestApp, backends, drop_database, server_database,
    wait_until,
};
pub use sample_jobs::sample_job;
