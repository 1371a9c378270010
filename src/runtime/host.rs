//! What a guest sees of the host: the per-run store data, the `log`, `sharding` and `workflow`
//! imports and the WASI subset.
//!
//! The linker built here holds only the interfaces a job may import (see [`ALLOWED_IMPORTS`]):
//! io streams, cli stdio/environment/exit/terminal, clocks and random, and `wasi:filesystem` and
//! `wasi:sockets` present but denying everything. Interpreter components (componentize-py,
//! componentize-js) import those two even when the script never touches a file or a socket, so
//! they are linked, and the WASI context gives them nothing to reach: no preopened directory (so
//! no path can be opened or listed), TCP and UDP refused, name lookup refused, and every
//! address check false. There is no HTTP interface, so a component that imports one fails to
//! instantiate ("unknown import"); uploads are refused earlier by `validate`.
//! The WASI context grants nothing else either: no environment, no arguments, empty stdin.

use std::sync::{Arc, Mutex};

use wasmtime::component::{HasData, Linker, ResourceTable};
use wasmtime_wasi::p2::bindings::{cli, clocks, random};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, Level, NodeOutput, ShardingItem};
use super::output::{LogStream, SharedSink};
use super::{LogSink, RunLimits};

/// Interfaces (by name without version) a job component may import.
pub const ALLOWED_IMPORTS: &[&str] = &[
    "wasmjob:job/log",
    "wasmjob:job/sharding",
    "wasmjob:job/workflow",
    "wasmjob:job/types",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    // Present, denying everything (see the module's documentation).
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// The store data of one run.
pub struct RunState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limiter: Limiter,
    log: SharedSink,
    stdout: LogStream,
    stderr: LogStream,
    /// What the `sharding` and `workflow` imports answer.
    imports: Imports,
}

/// What a run's imports answer, from its trigger.
#[derive(Debug, Clone, Default)]
pub struct Imports {
    /// The `sharding` import's items (empty for a job that is not sharded).
    pub sharding_items: Vec<ShardingItem>,
    /// The `workflow` import's inputs (empty for a run of no workflow node).
    pub workflow_inputs: Vec<NodeOutput>,
}

impl RunState {
    pub(super) fn new(limits: &RunLimits, imports: Imports, log: Box<dyn LogSink>) -> RunState {
        let log: SharedSink = Arc::new(Mutex::new(log));
        let stdout = LogStream::new(log.clone(), Level::Info);
        let stderr = LogStream::new(log.clone(), Level::Warn);
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            // No `preopened_dir`: the filesystem has no directory at all.
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        let limiter = Limiter { limits: limits.clone(), denied: None };
        let table = ResourceTable::new();
        RunState { wasi, table, limiter, log, stdout, stderr, imports }
    }

    /// The last lines the guest wrote to stderr (a Rust panic message lands there).
    pub(super) fn stderr_tail(&self) -> Option<String> {
        let lines = self.stderr.recent_lines();
        (!lines.is_empty()).then(|| lines.join(" / "))
    }

    /// Writes out what the guest left on stdout and stderr without a final newline.
    pub(super) fn flush_output(&mut self) {
        self.stdout.finish();
        self.stderr.finish();
    }
}

/// The store's resource limiter: [`RunLimits`] enforced, and the first refusal remembered so
/// that the trap which usually follows it (a Rust guest aborts when allocation fails) is
/// reported as the resource limit it is.
pub(super) struct Limiter {
    limits: RunLimits,
    pub(super) denied: Option<String>,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limits.memory_bytes {
            self.denied.get_or_insert_with(|| {
                format!("memory limit of {} MiB reached", self.limits.memory_bytes / (1024 * 1024))
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limits.table_elements {
            self.denied.get_or_insert_with(|| {
                format!("table limit of {} elements reached", self.limits.table_elements)
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.limits.instances
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl bindings::wasmjob::job::log::Host for RunState {
    fn log(&mut self, level: Level, message: String) {
        if let Ok(mut sink) = self.log.lock() {
            sink.line(level, &message);
        }
    }
}

impl bindings::wasmjob::job::sharding::Host for RunState {
    fn items(&mut self) -> Vec<ShardingItem> {
        self.imports.sharding_items.clone()
    }
}

impl bindings::wasmjob::job::workflow::Host for RunState {
    fn inputs(&mut self) -> Vec<NodeOutput> {
        self.imports.workflow_inputs.clone()
    }
}

impl bindings::wasmjob::job::types::Host for RunState {}

/// Marks that the io interfaces reach only the resource table of the store data.
struct HasTable;

impl HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// Builds the linker with the job world's imports and the allowed WASI subset, nothing more.
pub(super) fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<RunState>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView as _};
    use wasmtime_wasi::p2::bindings::{filesystem, sockets};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView as _};

    let mut linker = Linker::new(engine);
    let l = &mut linker;
    bindings::Job::add_to_linker::<RunState, wasmtime::component::HasSelf<RunState>>(l, |s| s)?;
    wasmtime_wasi::p2::bindings::io::error::add_to_linker::<RunState, HasTable>(l, |s| {
        &mut s.table
    })?;
    wasmtime_wasi::p2::bindings::io::poll::add_to_linker::<RunState, HasTable>(l, |s| {
        &mut s.table
    })?;
    wasmtime_wasi::p2::bindings::io::streams::add_to_linker::<RunState, HasTable>(l, |s| {
        &mut s.table
    })?;
    clocks::wall_clock::add_to_linker::<RunState, WasiClocks>(l, RunState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<RunState, WasiClocks>(l, RunState::clocks)?;
    random::random::add_to_linker::<RunState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure::add_to_linker::<RunState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure_seed::add_to_linker::<RunState, WasiRandom>(l, |s| s.wasi.random())?;
    cli::exit::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::environment::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::stdin::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::stdout::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::stderr::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::terminal_input::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::terminal_output::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::terminal_stdin::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::terminal_stdout::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    cli::terminal_stderr::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    // Deny-all: no preopens, and the context refuses every socket use (see `RunState::new`).
    filesystem::types::add_to_linker::<RunState, WasiFilesystem>(l, RunState::filesystem)?;
    filesystem::preopens::add_to_linker::<RunState, WasiFilesystem>(l, RunState::filesystem)?;
    let network = sockets::network::LinkOptions::default();
    sockets::network::add_to_linker::<RunState, WasiSockets>(l, &network, RunState::sockets)?;
    sockets::instance_network::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    sockets::tcp::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    sockets::tcp_create_socket::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    sockets::udp::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    sockets::udp_create_socket::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    sockets::ip_name_lookup::add_to_linker::<RunState, WasiSockets>(l, RunState::sockets)?;
    Ok(linker)
}

/// Whether an import name (`ns:pkg/iface@version`) is one a job may have.
pub fn is_allowed_import(name: &str) -> bool {
    let unversioned = name.split_once('@').map_or(name, |(head, _)| head);
    ALLOWED_IMPORTS.contains(&unversioned)
}
