//! The wasmtime host: one engine, compiled components, and one sandboxed run at a time per store.
//!
//! A [`Runtime`] owns the engine (fuel and epoch interruption on), a linker with only the
//! allowed imports (see `host`), an epoch ticker thread (ticking only while runs are in
//! progress) and a cache of pre-instantiated components by sha256, in memory and, when given
//! a directory, on disk as precompiled artifacts.
//! [`Runtime::run`] gives every run a fresh store with a fuel budget, a wall-clock deadline,
//! a memory cap and table/instance caps, and turns whatever happens into a [`RunOutcome`]:
//! a guest failure is an outcome, never a host error.
//!
//! This module knows nothing of HTTP, the database or log files: the caller passes a
//! [`LogSink`] for the run's lines and a cancellation token for kills.
#![warn(missing_docs)]

mod bindings;
mod cache;
mod host;
mod outcome;
mod output;
mod ticker;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use wasmtime::component::Component;
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store,
    UpdateDeadline,
};

pub use self::bindings::{Level, NodeOutput, ShardOutput, ShardingItem, Trigger};
pub use self::cache::{CacheStats, CompiledJob};
pub use self::host::{ALLOWED_IMPORTS, Imports, is_allowed_import};
pub use self::outcome::RunOutcome;
pub use self::validate::{ModuleInfo, ValidateError};

use self::host::RunState;
use self::outcome::{Phase, Stop};

/// How often the epoch ticker advances the engine's epoch: the granularity of deadlines and kills.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Engine-wide settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Largest wasm stack a guest may use, in bytes.
    pub max_wasm_stack: usize,
    /// Where precompiled artifacts are kept across restarts; `None` keeps them in memory only.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Run guests from a pool of preallocated instance slots (fast), sized for this many
    /// concurrent runs; `None` allocates per run (for a process that only validates uploads).
    pub pool: Option<PoolConfig>,
}

/// Sizes of the pooling allocator: the executor's hard concurrency and memory ceilings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Runs that may be instantiated at once; more wait in [`Runtime::run`] for a slot.
    pub max_concurrent_runs: u32,
    /// The largest memory cap any run may be given, in bytes.
    pub max_memory_bytes: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { max_wasm_stack: 512 * 1024, cache_dir: None, pool: None }
    }
}

/// The limits of one run.
#[derive(Debug, Clone)]
pub struct RunLimits {
    /// The fuel budget (roughly, wasm instructions).
    pub fuel: u64,
    /// The wall-clock limit; `None` means the run may take as long as it likes.
    pub timeout: Option<Duration>,
    /// The most linear memory the guest may have, in bytes.
    pub memory_bytes: usize,
    /// The most elements one table may hold.
    pub table_elements: usize,
    /// The most instances, tables and memories the component may create.
    pub instances: usize,
    /// See `instances`.
    pub tables: usize,
    /// See `instances`.
    pub memories: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            fuel: 1_000_000_000_000,
            timeout: None,
            memory_bytes: 256 * 1024 * 1024,
            table_elements: 20_000,
            instances: 64,
            tables: 64,
            memories: 16,
        }
    }
}

/// Receives the log lines of one run, from the `log` import and from stdout/stderr.
pub trait LogSink: Send + 'static {
    /// Appends one line.
    fn line(&mut self, level: Level, message: &str);
}

/// The wasmtime host. Cheap to share behind an `Arc`; dropping it stops the epoch ticker.
pub struct Runtime {
    engine: Engine,
    linker: wasmtime::component::Linker<RunState>,
    cache: cache::Cache,
    /// Advances the epoch while runs are in progress.
    ticker: Arc<ticker::Ticker>,
    /// One permit per slot of the instance pool (none without a pool): a run holds one from
    /// before its store exists until the store is gone.
    slots: Option<Arc<Semaphore>>,
}

impl Runtime {
    /// Builds the engine and linker and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Runtime> {
        let engine = engine(&config)?;
        let linker = host::linker(&engine)?;
        let cache = cache::Cache::new(&engine, config.cache_dir.clone())?;
        let ticking = engine.clone();
        let ticker = ticker::Ticker::spawn(EPOCH_TICK, move || ticking.increment_epoch())?;
        let slots = config.pool.as_ref().map(|pool| {
            Arc::new(Semaphore::new(usize::try_from(pool.max_concurrent_runs.max(1)).unwrap_or(1)))
        });
        Ok(Runtime { engine, linker, cache, ticker, slots })
    }

    /// Checks that `bytes` are a job component we can run, compiling them once to be sure.
    /// Blocking and CPU-heavy: call it from a blocking thread.
    pub fn validate(&self, bytes: &[u8]) -> Result<ModuleInfo, ValidateError> {
        validate::validate(&self.engine, &self.linker, bytes)
    }

    /// Returns the compiled job for `sha256`, from memory, from the disk cache, or by compiling
    /// `bytes()` (which must hash to `sha256`). Blocking: call it from a blocking thread.
    pub fn load(
        &self,
        sha256: &str,
        bytes: impl FnOnce() -> anyhow::Result<Vec<u8>>,
    ) -> anyhow::Result<CompiledJob> {
        self.cache.load(&self.engine, &self.linker, sha256, bytes)
    }

    /// Returns the compiled job for `sha256` if it is already at hand (memory or disk cache).
    pub fn cached(&self, sha256: &str) -> Option<CompiledJob> {
        self.cache.cached(&self.engine, &self.linker, sha256)
    }

    /// The compiled job for `sha256` if it is in memory; never blocks on the disk, so it may be
    /// called on the async runtime.
    pub fn in_memory(&self, sha256: &str) -> Option<CompiledJob> {
        self.cache.in_memory(sha256)
    }

    /// How often modules were compiled, loaded from disk, or found in memory.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// How many slots of the instance pool are free now (`None` without a pool).
    pub fn free_slots(&self) -> Option<usize> {
        self.slots.as_ref().map(|slots| slots.available_permits())
    }

    /// Runs `job` once for `trigger` in a fresh store with `limits`. The guest gets `trigger` as
    /// the argument of its `run`, and from the `sharding` and `workflow` imports, if it imports
    /// them, what `imports` holds (empty lists for a job that is not sharded and a run of no
    /// workflow node: `Imports::default()`).
    ///
    /// Returns when the guest returns, traps, runs out of fuel or time, or `cancel` fires;
    /// a guest waiting in a host call (a sleep) is stopped by the deadline or `cancel` as well.
    ///
    /// With an instance pool, a run first waits for a free slot; the wait counts towards its
    /// deadline (the admin's clock for the run started with the trigger) and `cancel` ends it.
    pub async fn run(
        &self,
        job: &CompiledJob,
        trigger: Trigger,
        imports: Imports,
        limits: &RunLimits,
        log: Box<dyn LogSink>,
        cancel: &CancellationToken,
    ) -> RunOutcome {
        let deadline = limits.timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        // Held until the end of this function, after the store (and its pool slot) is gone.
        let _slot = match &self.slots {
            // A free slot is taken at once, without arming the deadline's timer for the wait.
            Some(slots) if let Ok(permit) = slots.try_acquire() => Some(permit),
            Some(slots) => tokio::select! {
                permit = slots.acquire() => match permit {
                    Ok(permit) => Some(permit),
                    Err(_) => return RunOutcome::Host("the run slots are closed".to_owned()),
                },
                () = sleep_until_opt(deadline) => return RunOutcome::Timeout,
                () = cancel.cancelled() => return RunOutcome::Killed,
            },
            None => None,
        };
        // The epoch advances from here until the run is over.
        let _running = self.ticker.enter();
        let mut store = Store::new(&self.engine, RunState::new(limits, imports, log));
        store.limiter(|state| &mut state.limiter);
        if let Err(error) = store.set_fuel(limits.fuel) {
            return RunOutcome::Host(format!("setting fuel: {error}"));
        }
        let deadline_std = deadline.map(tokio::time::Instant::into_std);

        // The epoch callback runs at every tick while the guest executes wasm: it stops a guest
        // that is past its deadline or killed, and otherwise yields so that the async call below
        // stays responsive (and cancellable) even while the guest never calls the host.
        let callback_cancel = cancel.clone();
        store.epoch_deadline_callback(move |_| {
            let late = deadline_std.is_some_and(|at| std::time::Instant::now() >= at);
            if late || callback_cancel.is_cancelled() {
                return Err(wasmtime::Trap::Interrupt.into());
            }
            Ok(UpdateDeadline::Yield(1))
        });
        store.set_epoch_deadline(1);

        let fuel_start = limits.fuel;
        let call = call_run(&mut store, job, trigger);
        // A guest blocked in a host call (a wasi sleep) does not reach the epoch callback, so the
        // deadline and the kill are also awaited here; dropping the call future abandons the
        // guest, and the store goes with it. The call is polled first: a guest that ends in its
        // first poll (most do) then never arms the deadline's timer or the kill's waiter.
        let result = tokio::select! {
            biased;
            result = call => Ok(result),
            () = sleep_until_opt(deadline) => Err(Stop::Timeout),
            () = cancel.cancelled() => Err(Stop::Killed),
        };
        let fuel_used = store.get_fuel().ok().map(|left| fuel_start.saturating_sub(left));
        let mut state = store.into_data();
        state.flush_output();
        let facts = outcome::Facts {
            cancelled: cancel.is_cancelled(),
            fuel_used,
            denied: state.limiter.denied.take(),
            stderr_tail: state.stderr_tail(),
        };
        outcome::classify(result, facts)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}

async fn call_run(
    store: &mut Store<RunState>,
    job: &CompiledJob,
    trigger: Trigger,
) -> Result<Result<String, String>, (Phase, wasmtime::Error)> {
    let instance = job
        .pre
        .instantiate_async(&mut *store)
        .await
        .map_err(|error| (Phase::Instantiate, error))?;
    instance.call_run(&mut *store, &trigger).await.map_err(|error| (Phase::Call, error))
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn engine(config: &RuntimeConfig) -> anyhow::Result<Engine> {
    let mut wasm_config = Config::new();
    wasm_config
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(config.max_wasm_stack)
        .async_stack_size(config.max_wasm_stack + 1024 * 1024)
        // Component-model async is not part of the job world; with it off, calls into a
        // component are about three times cheaper.
        .concurrency_support(false);
    if let Some(pool) = &config.pool {
        // Preallocated slots make a store's setup and teardown a few microseconds. Keeping the
        // first pages of each slot resident (reset with pagemap scanning where the kernel has
        // it) avoids page faults on every run; without pagemap_scan keep-resident is slower.
        let runs = pool.max_concurrent_runs.max(1);
        let mut pooling = PoolingAllocationConfig::new();
        pooling
            .total_component_instances(runs)
            .total_core_instances(runs.saturating_mul(8))
            .total_memories(runs.saturating_mul(2))
            .total_tables(runs.saturating_mul(4))
            .total_stacks(runs)
            .max_memory_size(pool.max_memory_bytes)
            .table_elements(RunLimits::default().table_elements);
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pooling
                .pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(1024 * 1024)
                .table_keep_resident(64 * 1024);
        }
        wasm_config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    }
    Ok(Engine::new(&wasm_config)?)
}

/// Compiles `bytes` as a component (the raw step under validation and caching).
fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    Component::new(engine, bytes)
}

#[cfg(test)]
pub(crate) mod tests;
