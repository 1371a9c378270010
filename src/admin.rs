//! The admin (scheduling centre): operator REST API, executor-facing API, scheduler, dispatch.
//!
//! [`start`] binds the listener (port 0 works), connects the database (answering probes while it
//! waits for it) and starts the scheduler and monitor loops; the returned [`Admin`] knows its
//! bound address and stops gracefully.
//! It never imports `executor`: executors, ours or XXL-JOB's, are reached only through `protocol`.

mod accounts;
pub mod admission;
mod alarms;
mod backfill;
pub mod builders;
mod console;
mod dispatch;
mod http;
mod partitions;
mod report;
mod scheduler;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::Instrument;

use crate::config::AdminConfig;
use crate::protocol;
use crate::readiness::Pulse;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::storage::{Db, Unavailable};

pub use self::accounts::{PasswordChecks, create_user_from_cli};
pub use self::dispatch::{
    ANSWER_WITHIN, APPLY_WITHIN, Applied, Cache, Dispatcher, RESULT_GRACE_MS,
};
pub use self::partitions::LEASE_MS;

/// What the admin's handlers and loops share. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The database.
    pub db: Db,
    /// The validated configuration.
    pub config: Arc<AdminConfig>,
    /// Compiles uploads to validate them (never runs them).
    pub validator: Arc<Runtime>,
    /// Bounds how many uploads compile at once.
    pub compile_slots: Arc<Semaphore>,
    /// Digests of the modules this process validated: the same bytes uploaded again (to
    /// another job, say) are not compiled twice.
    pub validated_modules: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Jobs, groups, online executors and version digests as read recently, shared with the
    /// dispatcher: a handler that changes a job forgets its copy here.
    pub cache: Cache,
    /// Sends runs to executors and applies their results.
    pub dispatcher: Dispatcher,
    /// Wakes the scheduler when a job's schedule changed.
    pub scheduler_wake: Arc<Notify>,
    /// Wakes the backfill driver when a backfill was created or resumed here.
    pub backfill_wake: Arc<Notify>,
    /// The runs whose logs are streamed now, one shared follower each.
    pub log_feeds: http::stream::Feeds,
    /// The bound on unfinished runs that fires and triggers wait for.
    pub admission: Arc<admission::Admission>,
    /// When the scheduler loop last completed a pass (`/readyz`).
    pub scheduler_pulse: Arc<Pulse>,
    /// The bound on password checks running at once.
    pub password_checks: Arc<PasswordChecks>,
    /// Cancelled when the admin stops: its loops end, and so do the open log streams, which
    /// would otherwise hold the server's graceful shutdown for as long as their runs last.
    pub shutdown: CancellationToken,
}

impl AppState {
    /// Builds the state over an open database.
    pub fn new(db: Db, config: AdminConfig) -> anyhow::Result<AppState> {
        let client_options = protocol::ClientOptions {
            ca_file: config.network.ca_file.clone(),
            policy: Some(config.network.executor_policy.clone()),
            pull: Some(Arc::default()),
            resolve: None,
            keep_alive: true,
        };
        let client = protocol::Client::with_options(
            &config.access_token,
            Duration::from_secs(10),
            &client_options,
        )?;
        let online_window_ms =
            3 * i64::try_from(config.heartbeat_interval.as_millis()).unwrap_or(30_000);
        let cache = Cache::new(db.clone(), online_window_ms);
        let dispatcher = Dispatcher::new(
            db.clone(),
            cache.clone(),
            client,
            online_window_ms,
            config.run_retention_days,
        );
        dispatcher.set_apply_within(config.callback_apply_within);
        Ok(AppState {
            dispatcher,
            admission: Arc::new(admission::Admission::new(db.clone(), config.max_unfinished_runs)),
            cache,
            db,
            config: Arc::new(config),
            validator: Arc::new(Runtime::new(RuntimeConfig::default())?),
            compile_slots: Arc::new(Semaphore::new(1)),
            validated_modules: Arc::default(),
            scheduler_wake: Arc::new(Notify::new()),
            backfill_wake: Arc::new(Notify::new()),
            log_feeds: http::stream::Feeds::default(),
            scheduler_pulse: Arc::default(),
            password_checks: Arc::new(PasswordChecks::per_core()),
            shutdown: CancellationToken::new(),
        })
    }
}

/// A running admin.
pub struct Admin {
    /// The address the API is bound to.
    pub local_addr: SocketAddr,
    /// The shared state (tests and `standalone` use its database).
    pub state: AppState,
    shutdown: CancellationToken,
    /// Cancelled to stop creating runs (a child of `shutdown`).
    firing: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// Runs an admin until Ctrl-C or SIGTERM.
pub async fn run(config: AdminConfig) -> anyhow::Result<()> {
    let admin = start(config).await?;
    crate::telemetry::shutdown_signal().await;
    admin.stop().await;
    Ok(())
}

/// Binds, connects and starts the admin's tasks.
///
/// The listener is bound first: until the database answers, the admin serves `/healthz`, and
/// `/readyz` with 503 and the last connection error (`http::health::waiting`), and tries again
/// every [`CONNECT_RETRY`], so that a service manager or an orchestrator can start admins before
/// their database. A database that answers but cannot be used (its schema is newer than this
/// build, a migration fails) stops the start with that error. `admin listening on` is logged
/// once the whole API serves.
pub async fn start(config: AdminConfig) -> anyhow::Result<Admin> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the admin API to {}", config.listen))?;
    let local_addr = listener.local_addr()?;
    let tls = match &config.network.serve_tls {
        Some((cert, key)) => Some(crate::tls::server_config(cert, key)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let shutdown = CancellationToken::new();
    let last_error = Arc::new(std::sync::Mutex::new(String::new()));
    let api: Arc<OnceLock<Router>> = Arc::default();
    let app = {
        let waiting = http::health::waiting(last_error.clone());
        let api = api.clone();
        Router::new().fallback_service(tower::service_fn(move |request: Request| {
            let router = api.get().unwrap_or(&waiting).clone();
            router.oneshot(request)
        }))
    };
    let span = tracing::info_span!("admin_http");
    let server = crate::tls::spawn_server(listener, tls, app, shutdown.clone(), span, "admin API");
    let db = match connect(&config.database_url, &last_error, scheme, local_addr).await {
        Ok(db) => db,
        Err(error) => {
            shutdown.cancel();
            let _ = server.await;
            return Err(error);
        }
    };
    let config = fit_modules_to_database(&db, config).await?;
    // The admin names itself in the runs it sends, so that executors that were given that URL
    // deliver the results here: the URL it advertises, else its own address if it is bound to
    // one (bound to every interface, no URL names it).
    let reply_to = config.advertise_url.clone().or_else(|| {
        (!local_addr.ip().is_unspecified()).then(|| format!("{scheme}://{local_addr}"))
    });
    // The state's token is the admin's, so open log streams end when the admin stops.
    let state = AppState { shutdown: shutdown.clone(), ..AppState::new(db, config)? };
    if let Some(url) = reply_to {
        state.dispatcher.set_reply_to(url);
    }
    let router = router(state.clone()).layer(tower_http::trace::TraceLayer::new_for_http());
    let _ = api.set(router);
    tracing::info!("admin listening on {scheme}://{local_addr}");
    let mut tasks = vec![server];
    // The loops that create runs stop first when the admin stops firing (`stop_firing`).
    let firing = shutdown.child_token();
    tasks.push(tokio::spawn(
        partitions::run(
            state.clone(),
            format!("{scheme}://{local_addr}"),
            local_addr,
            firing.clone(),
        )
        .instrument(tracing::info_span!("partitions")),
    ));
    tasks.push(tokio::spawn(
        scheduler::run(state.clone(), firing.clone()).instrument(tracing::info_span!("scheduler")),
    ));
    tasks.push(tokio::spawn(
        scheduler::run_workflows(state.clone(), firing.clone())
            .instrument(tracing::info_span!("workflows")),
    ));
    tasks.push(tokio::spawn(
        dispatch::sweep(state.dispatcher.clone(), shutdown.clone())
            .instrument(tracing::info_span!("sweep")),
    ));
    tasks.push(tokio::spawn(
        alarms::run(state.clone(), shutdown.clone()).instrument(tracing::info_span!("alarms")),
    ));
    tasks.push(tokio::spawn(
        backfill::run(state.clone(), firing.clone()).instrument(tracing::info_span!("backfill")),
    ));
    tasks.push(tokio::spawn(
        report::run(state.db.clone(), state.dispatcher.partitions().clone(), shutdown.clone())
            .instrument(tracing::info_span!("report")),
    ));
    Ok(Admin { local_addr, state, shutdown, firing, tasks })
}

/// `config` with its largest module lowered, with a warning, to what one statement can carry
/// to the database: a MySQL server takes statements up to its `max_allowed_packet` (16 MiB by
/// default in MariaDB), and a larger upload is then refused with 413, saying the limit, instead
/// of failing in the database.
async fn fit_modules_to_database(db: &Db, mut config: AdminConfig) -> anyhow::Result<AdminConfig> {
    /// Room in the statement for the rest of a version's row.
    const ROW_ROOM: u64 = 1024 * 1024;
    let Some(packet) = db.largest_statement_bytes().await? else { return Ok(config) };
    let fits = usize::try_from(packet.saturating_sub(ROW_ROOM)).unwrap_or(usize::MAX);
    if config.max_module_bytes > fits {
        tracing::warn!(
            "the MySQL server takes statements up to {packet} bytes (max_allowed_packet): \
             components are limited to {fits} bytes instead of {}; raise max_allowed_packet \
             (for example to 64M) to store larger ones",
            config.max_module_bytes
        );
        config.max_module_bytes = fits;
    }
    Ok(config)
}

/// How long the admin waits between two attempts to reach its database at start.
pub const CONNECT_RETRY: Duration = Duration::from_secs(1);

/// Connects to the database, trying again while it does not answer; each failure is logged
/// (the first as a warning, then every tenth) and kept in `last_error` for `/readyz`.
async fn connect(
    url: &str,
    last_error: &std::sync::Mutex<String>,
    scheme: &str,
    local_addr: SocketAddr,
) -> anyhow::Result<Db> {
    let mut attempt = 0u64;
    loop {
        match Db::connect(url).await {
            Ok(db) => return Ok(db),
            Err(error) if error.downcast_ref::<Unavailable>().is_some() => {
                if attempt.is_multiple_of(10) {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "waiting for the database (/healthz and /readyz answer at \
                         {scheme}://{local_addr} meanwhile)"
                    );
                }
                if let Ok(mut last) = last_error.lock() {
                    *last = format!("{error:#}");
                }
                attempt += 1;
                tokio::time::sleep(CONNECT_RETRY).await;
            }
            Err(error) => return Err(error),
        }
    }
}

impl Admin {
    /// The base URL executors and operators use.
    pub fn url(&self) -> String {
        let scheme = if self.state.config.network.serve_tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Stops creating and sending runs: the scheduler fires no more, backfills release no
    /// more and send timers are cancelled (their runs wait, pending or claimed, for the next
    /// start), while the API still takes results. A standalone stops firing before its
    /// executor stops, so that no run goes to an executor that refuses it.
    pub fn stop_firing(&self) {
        self.firing.cancel();
        self.state.dispatcher.stop();
    }

    /// Stops the loops and the server, then closes the database.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.state.dispatcher.stop();
        self.state.db.close().await;
    }
}

/// The admin's router: its HTTP API (`http`) and the console (`console`).
pub fn router(state: AppState) -> axum::Router {
    http::routes(&state).merge(console::router()).with_state(state)
}

/// The current time in milliseconds since the Unix epoch: the admin's one clock. Read from
/// `SystemTime`: `chrono::Utc::now` builds a calendar date and time of day too, a fifth of a
/// microsecond each of the five or so reads a run makes.
pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let ms = |elapsed: std::time::Duration| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => ms(since),
        Err(before) => -ms(before.duration()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_reads_the_calendar_clock_in_milliseconds() {
        let before = chrono::Utc::now().timestamp_millis();
        let now = super::now_ms();
        let after = chrono::Utc::now().timestamp_millis();
        assert!(before <= now && now <= after, "{before} <= {now} <= {after}");
    }
}
