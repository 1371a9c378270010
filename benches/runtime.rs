//! `cargo bench --bench runtime`: the cost of one run, bare wasmtime against wasmjob's path.
//!
//! Both sides run the sample job `hello` with the same tuned engine configuration (pooling
//! allocator, keep-resident slots with pagemap scanning where available, no component-model
//! concurrency, fuel and epochs on). Bare wasmtime: a fresh store with an empty WASI context, a
//! no-op `log` and no sharding items, instantiate, call `run`, drop, with no wasmjob code.
//! wasmjob: `Runtime::run`, everything an executor does per run except HTTP and storing the log
//! (limits, a fresh store with its limiter, deadline callback and output pipes, the async call
//! with its cancellation, outcome classification, log lines formatted by the executor's own
//! formatter into memory, where a short run's log stays until the run ends).
//! It prints `bare_us`, `wasmjob_us` (medians of single runs), their `ratio`, and
//! `runs_per_sec` of wasmjob's path on all cores.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

#[path = "../tests/support/sample_jobs.rs"]
mod sample_jobs;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use wasmjob::runtime::{
    Imports, Level, LogSink, PoolConfig, RunLimits, Runtime, RuntimeConfig, Trigger,
};

mod bare {
    wasmtime::component::bindgen!({ path: "wit", world: "job" });
}

const WARMUP: usize = 2_000;
const SAMPLES: usize = 20_000;
const ROUNDS: usize = 3;

fn main() {
    let bytes = sample_jobs::sample_job("hello");
    let pool = PoolConfig { max_concurrent_runs: 64, max_memory_bytes: 64 << 20 };
    let runtime = Arc::new(
        Runtime::new(RuntimeConfig { pool: Some(pool), ..RuntimeConfig::default() })
            .expect("building the wasmjob runtime"),
    );
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let job = runtime.load(&sha256, || Ok(bytes.clone())).expect("compiling hello");
    let bare = Bare::new(&bytes);
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");

    let mut bare_samples = Vec::new();
    let mut wasmjob_samples = Vec::new();
    for _ in 0..WARMUP {
        bare.run_once();
        tokio.block_on(wasmjob_run(&runtime, &job));
    }
    // Interleaved rounds, so that a noisy neighbour hurts both sides alike.
    for _ in 0..ROUNDS {
        for _ in 0..SAMPLES / ROUNDS {
            let started = Instant::now();
            bare.run_once();
            bare_samples.push(started.elapsed());
        }
        for _ in 0..SAMPLES / ROUNDS {
            let started = Instant::now();
            tokio.block_on(wasmjob_run(&runtime, &job));
            wasmjob_samples.push(started.elapsed());
        }
    }
    let bare_us = median_us(&mut bare_samples);
    let wasmjob_us = median_us(&mut wasmjob_samples);
    let runs_per_sec = throughput(&runtime, &job);
    println!("bare_us: {bare_us:.2}");
    println!("wasmjob_us: {wasmjob_us:.2}");
    println!("ratio: {:.2}", wasmjob_us / bare_us);
    println!("runs_per_sec: {runs_per_sec:.0}");
}

/// wasmjob's per-run path, as the executor's worker takes it.
async fn wasmjob_run(runtime: &Runtime, job: &wasmjob::runtime::CompiledJob) {
    let limits = RunLimits { timeout: Some(Duration::from_secs(10)), ..RunLimits::default() };
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
        .run(job, trigger, Imports::default(), &limits, Box::new(MemoryLog::default()), &cancel)
        .await;
    assert_eq!(outcome.handle_code(), 200, "{outcome}");
}

/// The executor's run log lines, kept in memory as a short run's log is.
#[derive(Default)]
struct MemoryLog(Vec<u8>);

impl LogSink for MemoryLog {
    fn line(&mut self, level: Level, message: &str) {
        self.0.extend_from_slice(wasmjob::executor::format_log_lines(level, message).as_bytes());
    }
}

/// Runs on every core at once: one single-threaded tokio runtime per OS thread, as many
/// threads as the machine has, each running the same number of runs.
fn throughput(runtime: &Arc<Runtime>, job: &wasmjob::runtime::CompiledJob) -> f64 {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let per_thread = 20_000;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let runtime = runtime.clone();
            let job = job.clone();
            scope.spawn(move || {
                let tokio = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio");
                for _ in 0..per_thread {
                    tokio.block_on(wasmjob_run(&runtime, &job));
                }
            });
        }
    });
    (threads * per_thread) as f64 / started.elapsed().as_secs_f64()
}

fn median_us(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// Bare wasmtime: the same engine settings, nothing of wasmjob.
struct Bare {
    engine: wasmtime::Engine,
    pre: bare::JobPre<BareState>,
}

struct BareState {
    wasi: wasmtime_wasi::WasiCtx,
    table: wasmtime::component::ResourceTable,
}

impl wasmtime_wasi::WasiView for BareState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        wasmtime_wasi::WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl bare::wasmjob::job::log::Host for BareState {
    fn log(&mut self, _level: bare::wasmjob::job::log::Level, _message: String) {}
}

impl bare::wasmjob::job::sharding::Host for BareState {
    fn items(&mut self) -> Vec<bare::wasmjob::job::sharding::ShardingItem> {
        Vec::new()
    }
}

impl bare::wasmjob::job::workflow::Host for BareState {
    fn inputs(&mut self) -> Vec<bare::wasmjob::job::workflow::NodeOutput> {
        Vec::new()
    }
}

impl bare::wasmjob::job::types::Host for BareState {}

impl Bare {
    fn new(bytes: &[u8]) -> Bare {
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true).epoch_interruption(true).concurrency_support(false);
        let mut pooling = wasmtime::PoolingAllocationConfig::new();
        pooling
            .total_component_instances(64)
            .total_core_instances(512)
            .total_memories(128)
            .total_tables(256)
            .total_stacks(64)
            .max_memory_size(64 << 20);
        if wasmtime::PoolingAllocationConfig::is_pagemap_scan_available() {
            pooling
                .pagemap_scan(wasmtime::Enabled::Yes)
                .linear_memory_keep_resident(1 << 20)
                .table_keep_resident(64 << 10);
        }
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling));
        let engine = wasmtime::Engine::new(&config).expect("engine");
        let component = wasmtime::component::Component::new(&engine, bytes).expect("compile");
        let mut linker = wasmtime::component::Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).expect("wasi");
        bare::Job::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)
            .expect("log");
        let pre =
            bare::JobPre::new(linker.instantiate_pre(&component).expect("pre")).expect("job pre");
        Bare { engine, pre }
    }

    fn run_once(&self) {
        let state = BareState {
            wasi: wasmtime_wasi::WasiCtx::builder().build(),
            table: wasmtime::component::ResourceTable::new(),
        };
        let mut store = wasmtime::Store::new(&self.engine, state);
        store.set_fuel(u64::MAX / 2).expect("fuel");
        store.set_epoch_deadline(u64::MAX / 2);
        let trigger = bare::wasmjob::job::types::Trigger {
            job_id: 1,
            log_id: 1,
            param: "bench".to_owned(),
            shard_index: 0,
            shard_total: 1,
            trigger_time_ms: 0,
            attempt: 0,
        };
        let job = self.pre.instantiate(&mut store).expect("instantiate");
        let result = job.call_run(&mut store, &trigger).expect("call");
        assert_eq!(result.as_deref(), Ok("hello, bench"));
    }
}
