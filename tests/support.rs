//! Test helpers: built sample jobs, a platform started in-process on 127.0.0.1:0, an HTTP client.

pub mod app;
mod sample_jobs;

pub use app::{ACCESS_TOKEN, ADMIN_TOKEN, Api, Backend, TestApp, backends};
pub use sample_jobs::sample_job;
