//! The executor daemon: serves the executor API, runs triggers in job workers, keeps run logs,
//! journals every accepted run, reports results through a durable outbox, and beats to the admin.
//!
//! With `--pull` it registers `pull://{name}` and takes its calls over long polls it opens to
//! its admins (`pull.rs`); its own port then serves only probes, metrics and local reads.
//!
//! [`start`] binds the listener and starts every task, returning a handle that knows the bound
//! address (port 0 works) and stops everything gracefully, in this order ([`Executor::stop`]):
//! deregister (`/api/registryRemove`) and stop the heartbeats; refuse new triggers on `/run`,
//! `/trigger` and `/runs` with a message saying the executor is stopping (`/kill`, `/log` and
//! the rest still answer); let runs finish for the grace period (`--shutdown-grace-secs`); kill
//! the rest, those still fetching or compiling their module or waiting for a run slot included,
//! each reporting its end through the outbox; deliver the outbox until it is empty, or for at
//! most the grace period again, retrying with backoff (what is left waits on disk for the next
//! start); stop serving.
//!
//! A run's life here: `/run` journals the acceptance durably before it answers (so a `logId` is
//! accepted once per executor data dir, across restarts, within [`RESEND_WINDOW`]); the worker
//! journals its start, runs it, stores the result in the outbox and journals its end; the outbox
//! delivers it; every heartbeat lists the runs held (queued, running, or with a result not yet
//! acknowledged). At start, a run the journal shows accepted but not finished was cut short by
//! the stop: it is lost, its log says so, and it is never run.
//! It never imports `admin`: it speaks to an admin (ours or XXL-JOB's) only through `protocol`.

mod batched;
mod group_sync;
mod heartbeat;
mod http;
mod journal;
mod logs;
mod modules;
mod outbox;
mod pull;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::ExecutorConfig;
use crate::protocol;
use crate::readiness::Pulse;
use crate::runtime::{CacheStats, Level, PoolConfig, Runtime, RuntimeConfig};

pub use self::journal::RESEND_WINDOW;
pub use self::logs::{LogStore, format_lines as format_log_lines};

/// The admins this executor reports to, and how they speak: every call names the application in
/// `XXL-JOB-APPNAME` (older admins ignore it, 3.5 requires it), and the generation picks the
/// callback form.
#[derive(Debug, Clone)]
pub struct AdminLink {
    /// The admins' URLs, tried in order.
    pub urls: Vec<String>,
    /// This executor's application name.
    pub app_name: String,
    /// The admins' protocol generation (`--admin-protocol`).
    pub generation: protocol::Generation,
}

/// The largest memory cap a job may ask for (a 32-bit wasm memory cannot grow past 4 GiB).
pub const MAX_MEMORY_BYTES: usize = 4 << 30;

/// How long killed runs may take to store their results before the executor stops anyway.
const KILL_REPORT_WAIT: Duration = Duration::from_secs(10);

/// A running executor.
pub struct Executor {
    /// The address the API is bound to.
    pub local_addr: SocketAddr,
    /// The address registered with the admin.
    pub address: String,
    runtime: Arc<Runtime>,
    workers: worker::Workers,
    grace: Duration,
    /// Stops the heartbeats, which then deregister.
    heartbeat_stop: CancellationToken,
    heartbeat: JoinHandle<()>,
    /// Has the outbox deliver what is left, until none is or the grace has passed, and end.
    outbox_stop: CancellationToken,
    outbox_task: JoinHandle<()>,
    /// Stops the API, log spilling and log retention.
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// Runs an executor until Ctrl-C or SIGTERM.
pub async fn run(config: ExecutorConfig) -> anyhow::Result<()> {
    let executor = start(config).await?;
    crate::telemetry::shutdown_signal().await;
    executor.stop().await;
    Ok(())
}

/// Binds the executor API and starts the executor's tasks.
pub async fn start(config: ExecutorConfig) -> anyhow::Result<Executor> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the executor API to {}", config.listen))?;
    let local_addr = listener.local_addr()?;
    let tls = match &config.network.serve_tls {
        Some((cert, key)) => Some(crate::tls::server_config(cert, key)?),
        None => None,
    };
    let address = if config.pull {
        pull::address(config.address.as_deref(), &config.data_dir)
            .context("choosing this executor's pull address")?
    } else {
        advertised_address(&config, local_addr)
    };
    tracing::info!(
        "executor `{}` listening on {local_addr}, registered as {address}",
        config.app_name
    );

    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        cache_dir: Some(config.data_dir.join("modules")),
        pool: Some(PoolConfig {
            max_concurrent_runs: config.limits.max_concurrent_runs,
            max_memory_bytes: MAX_MEMORY_BYTES,
        }),
        ..RuntimeConfig::default()
    })?);
    let client_options =
        protocol::ClientOptions { ca_file: config.network.ca_file.clone(), ..Default::default() };
    let client = protocol::Client::with_options(
        &config.access_token,
        Duration::from_secs(10),
        &client_options,
    )?;
    let logs = LogStore::new(config.data_dir.join("logs"), config.limits.max_log_bytes)
        .context("creating the log directory")?;
    let outbox_dir = config.data_dir.join("outbox");
    let outbox = tokio::task::spawn_blocking(move || outbox::Outbox::open(outbox_dir))
        .await?
        .context("opening the outbox")?;
    let journal = Arc::new(
        open_journal(config.data_dir.join("journal"), outbox.clone(), logs.clone()).await?,
    );
    let modules = modules::Modules {
        runtime: runtime.clone(),
        client: client.clone(),
        admin_urls: config.admin_urls.clone(),
        handlers_dir: config.handlers_dir.clone(),
        resolving: Default::default(),
    };
    let workers = worker::Workers::new(worker::RunContext {
        runtime: runtime.clone(),
        modules,
        logs: logs.clone(),
        outbox: outbox.clone(),
        journal: journal.clone(),
        defaults: config.limits.clone(),
        address: address.clone(),
        held_bytes: Default::default(),
    });
    let shutdown = CancellationToken::new();
    let registered = Arc::new(Pulse::default());
    let state = http::ExecutorState {
        workers: workers.clone(),
        logs: logs.clone(),
        access_token: Arc::from(config.access_token.as_str()),
        registered: registered.clone(),
        registered_max_age_ms: 3 * i64::try_from(config.heartbeat_interval.as_millis())
            .unwrap_or(30_000),
    };
    let api = http::router(state);
    let app = api.clone().layer(tower_http::trace::TraceLayer::new_for_http());
    let span = tracing::info_span!("executor_http");
    let server =
        crate::tls::spawn_server(listener, tls, app, shutdown.clone(), span, "executor API");
    let mut tasks = vec![server];
    if config.pull {
        // The polls last until the API stops: a stopping executor still answers kills and
        // log reads, as it does over HTTP.
        let puller = pull::Puller {
            api,
            address: address.clone(),
            app_name: config.app_name.clone(),
            access_token: Arc::from(config.access_token.as_str()),
            ca_file: config.network.ca_file.clone(),
        };
        let urls = config.admin_urls.clone();
        tasks.push(tokio::spawn(puller.run(urls, shutdown.clone())));
    }
    let admin_link = AdminLink {
        urls: config.admin_urls.clone(),
        app_name: config.app_name.clone(),
        generation: config.admin_protocol,
    };
    let outbox_stop = CancellationToken::new();
    let outbox_task = tokio::spawn(
        outbox
            .clone()
            .deliver(
                client.clone(),
                admin_link.clone(),
                outbox_stop.clone(),
                config.limits.shutdown_grace,
            )
            .instrument(tracing::info_span!("outbox")),
    );
    let heartbeat_stop = CancellationToken::new();
    let heartbeat = tokio::spawn(
        heartbeat::run(
            client,
            admin_link,
            heartbeat::param(&config.app_name, &address),
            heartbeat::Held { journal, outbox: outbox.clone() },
            config.heartbeat_interval,
            registered,
            heartbeat_stop.clone(),
        )
        .instrument(tracing::info_span!("heartbeat")),
    );
    tasks.push(tokio::spawn(
        spill_running_logs(logs.clone(), shutdown.clone())
            .instrument(tracing::info_span!("log_spill")),
    ));
    tasks.push(tokio::spawn(
        retention(logs, config.limits.log_retention_days, shutdown.clone())
            .instrument(tracing::info_span!("log_retention")),
    ));
    Ok(Executor {
        local_addr,
        address,
        runtime,
        workers,
        grace: config.limits.shutdown_grace,
        heartbeat_stop,
        heartbeat,
        outbox_stop,
        outbox_task,
        shutdown,
        tasks,
    })
}

impl Executor {
    /// How modules were obtained so far (compiled, loaded from the disk cache, found in memory).
    pub fn cache_stats(&self) -> CacheStats {
        self.runtime.cache_stats()
    }

    /// Bytes of triggers held by accepted runs that have not ended (bounded by
    /// `--max-queued-mb`).
    pub fn held_bytes(&self) -> usize {
        self.workers.held_bytes()
    }

    /// Stops gracefully, in the order the module docs give.
    pub async fn stop(self) {
        // Deregistered first, so that admins stop choosing this executor before it refuses.
        self.heartbeat_stop.cancel();
        if let Err(error) = self.heartbeat.await {
            tracing::error!(%error, "the heartbeat task failed");
        }
        let workers = self.workers.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || workers.close()).await {
            tracing::error!(%error, "closing the job queues failed");
        }
        let held = self.workers.busy_count();
        if held > 0 {
            tracing::info!(
                "stopping: {held} runs held, waiting up to {} s for them to end",
                self.grace.as_secs()
            );
        }
        wait_until_idle(&self.workers, self.grace).await;
        let left = self.workers.busy_count();
        if left > 0 {
            tracing::warn!("stopping: killing the {left} runs still held after the grace period");
            let workers = self.workers.clone();
            if let Err(error) = tokio::task::spawn_blocking(move || workers.kill_all()).await {
                tracing::error!(%error, "killing the remaining runs failed");
            }
            // Each killed run stores its result in the outbox as it ends.
            wait_until_idle(&self.workers, KILL_REPORT_WAIT).await;
        }
        // Every result is delivered before the API stops (an admin may still read the logs
        // meanwhile), unless no admin takes them within the grace: they wait on disk then.
        self.outbox_stop.cancel();
        if let Err(error) = self.outbox_task.await {
            tracing::error!(%error, "the outbox task failed");
        }
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Waits until no run is held, or `limit` has passed.
async fn wait_until_idle(workers: &worker::Workers, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while workers.busy_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens the run journal and writes into the log of each run the last stop cut short that it
/// is lost.
async fn open_journal(
    dir: std::path::PathBuf,
    outbox: outbox::Outbox,
    logs: LogStore,
) -> anyhow::Result<journal::Journal> {
    tokio::task::spawn_blocking(move || {
        let now = journal::now_ms();
        let (journal, lost) = journal::Journal::open(dir, now, |log_id| outbox.stored_code(log_id))
            .context("opening the run journal")?;
        for run in &lost {
            tracing::warn!(
                job.id = run.job_id,
                run.id = run.log_id,
                "run {} was accepted before this executor restarted and did not finish: lost",
                run.log_id
            );
            let message = format!(
                "lost: run {} was accepted by this executor, which stopped before the run \
                 finished; it will not run here",
                run.log_id
            );
            if let Err(error) = logs.append_once(run.log_id, run.accepted_ms, Level::Warn, &message)
            {
                tracing::warn!(%error, "cannot write to the log of lost run {}", run.log_id);
            }
        }
        Ok(journal)
    })
    .await?
}

fn advertised_address(config: &ExecutorConfig, local_addr: SocketAddr) -> String {
    if let Some(address) = &config.address {
        return address.trim_end_matches('/').to_owned();
    }
    let ip = if local_addr.ip().is_unspecified() {
        tracing::warn!(
            "listening on all interfaces: registering 127.0.0.1; set --address for other hosts"
        );
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        local_addr.ip()
    };
    let scheme = if config.network.serve_tls.is_some() { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, local_addr.port()))
}

/// Moves the logs of runs running for [`logs::SPILL_AFTER`] from memory to their own files,
/// checking every quarter of that.
async fn spill_running_logs(logs: LogStore, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(logs::SPILL_AFTER / 4) => {}
            () = shutdown.cancelled() => return,
        }
        let logs_now = logs.clone();
        let spilled =
            tokio::task::spawn_blocking(move || logs_now.spill_running(logs::SPILL_AFTER)).await;
        if let Err(error) = spilled {
            tracing::warn!(%error, "moving run logs to their files failed");
        }
    }
}

async fn retention(logs: LogStore, keep_days: u32, shutdown: CancellationToken) {
    loop {
        let logs_now = logs.clone();
        match tokio::task::spawn_blocking(move || {
            logs_now.remove_older_than(chrono::Utc::now(), keep_days)
        })
        .await
        {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!("removed {removed} days of run logs"),
            Ok(Err(error)) => tracing::warn!(%error, "log retention failed"),
            Err(error) => tracing::warn!(%error, "log retention failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
