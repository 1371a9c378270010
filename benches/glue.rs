//! `cargo bench --bench glue`: what a Python or JavaScript handler costs against a Rust one.
//!
//! The three `hello` handlers of `sample-jobs/` (Rust built with cargo, Python and JavaScript
//! built by the admin's builders, installed under `target/tmp/builders` as the tests do) go
//! through an executor's runtime (pooling allocator, fuel, epochs): compile, then a first run
//! and warm runs, each a fresh store and instance as every run is. It prints one table row per
//! language: component size, compile time, first-run time and the median warm run.
//! Without python3/pip or node/npm it says so and measures Rust alone.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

#[path = "../tests/support/sample_jobs.rs"]
mod sample_jobs;

#[path = "../tests/support/builders.rs"]
mod builders;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use wasmjob::config::BuilderConfig;
use wasmjob::model::Language;
use wasmjob::runtime::{
    CompiledJob, Level, LogSink, PoolConfig, RunLimits, Runtime, RuntimeConfig, Trigger,
};

const MEMORY_BYTES: usize = 256 << 20;

fn main() {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    let mut handlers = vec![("rust", sample_jobs::sample_job("hello"), 2_000)];
    if let Some(dir) = builders::builders_dir() {
        let config = BuilderConfig {
            dir: Some(dir),
            python: "python3".into(),
            node: "node".into(),
            timeout: Duration::from_secs(600),
            memory_bytes: 4 << 30,
        };
        for (name, language, path) in [
            ("python", Language::Python, "python/hello.py"),
            ("javascript", Language::Javascript, "js/hello.js"),
        ] {
            let source = builders::sample_source(path);
            let started = Instant::now();
            let bytes = tokio
                .block_on(wasmjob::admin::builders::build(&config, language, &source))
                .unwrap_or_else(|error| panic!("building {name}: {error}"));
            println!("{name}: built (or taken from the cache) in {:.1} s", secs(started));
            handlers.push((name, bytes, 200));
        }
    }
    println!("| handler | size | compile | first run | warm run (median) |");
    println!("|---|---|---|---|---|");
    for (name, bytes, samples) in handlers {
        // A fresh runtime per handler: nothing compiled or instantiated before.
        let pool = PoolConfig { max_concurrent_runs: 4, max_memory_bytes: MEMORY_BYTES };
        let runtime = Runtime::new(RuntimeConfig { pool: Some(pool), ..RuntimeConfig::default() })
            .expect("building the runtime");
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let started = Instant::now();
        let job = runtime.load(&sha256, || Ok(bytes.clone())).expect("compiling");
        let compile = secs(started);
        let started = Instant::now();
        tokio.block_on(run(&runtime, &job));
        let first = started.elapsed();
        let mut warm: Vec<Duration> = (0..samples)
            .map(|_| {
                let started = Instant::now();
                tokio.block_on(run(&runtime, &job));
                started.elapsed()
            })
            .collect();
        warm.sort();
        let size = if bytes.len() < 1_000_000 {
            format!("{:.0} kB", bytes.len() as f64 / 1e3)
        } else {
            format!("{:.1} MB", bytes.len() as f64 / 1e6)
        };
        println!(
            "| {name} | {size} | {compile:.2} s | {:.2} ms | {:.1} µs |",
            first.as_secs_f64() * 1e3,
            warm[warm.len() / 2].as_secs_f64() * 1e6,
        );
    }
}

async fn run(runtime: &Runtime, job: &CompiledJob) {
    let limits = RunLimits {
        timeout: Some(Duration::from_secs(60)),
        memory_bytes: MEMORY_BYTES,
        ..RunLimits::default()
    };
    let trigger = Trigger {
        job_id: 1,
        log_id: 1,
        param: "bench".to_owned(),
        shard_index: 0,
        shard_total: 1,
        trigger_time_ms: 0,
        attempt: 0,
    };
    let cancel = CancellationToken::new();
    let outcome = runtime
        .run(job, trigger, wasmjob::runtime::Imports::default(), &limits, Box::new(NoLog), &cancel)
        .await;
    assert_eq!(outcome.handle_code(), 200, "{outcome}");
}

struct NoLog;

impl LogSink for NoLog {
    fn line(&mut self, _level: Level, _message: &str) {}
}

fn secs(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}
