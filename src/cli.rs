//! Command-line flags: the `wasmjob` binary's subcommands and their arguments.
//!
//! Flags are parsed here and nowhere else; every flag has a `WASMJOB_*` environment twin, and
//! every flag of `standalone`, `admin` and `executor` is also a key of their `--config` file
//! (`config::command_line` applies it). Values are checked and turned into typed configuration
//! by `config`, not here.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod client;

/// `wasmjob --version`: the version, the commit and the build date (from `build.rs`), and the
/// wasmtime that runs the jobs.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WASMJOB_GIT_COMMIT"),
    ", built ",
    env!("WASMJOB_BUILD_DATE"),
    ", wasmtime ",
    env!("WASMJOB_WASMTIME_VERSION"),
    ")"
);

/// wasmjob: a distributed job scheduler whose job handlers are WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "wasmjob", version = VERSION, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` for people, `json` (one object a line) for
    /// a log pipeline.
    #[arg(long, env = "WASMJOB_LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Fault testing: abort the process at named lifecycle points (`NAME=abort[@N],…`).
    #[arg(long, env = "WASMJOB_FAILPOINTS", global = true, hide = true, default_value = "")]
    pub failpoints: String,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Admin and one embedded executor in one process, on SQLite: the zero-setup default.
    Standalone(StandaloneArgs),
    /// The admin: REST API, scheduler and dispatch.
    Admin(AdminArgs),
    /// An executor daemon: registers with the admin and runs job components.
    Executor(ExecutorArgs),
    /// Console users, written straight into the admin's database.
    #[command(subcommand)]
    User(UserCommand),
    /// Jobs, through the REST API.
    Job(client::JobArgs),
    /// Runs, through the REST API.
    Run(client::RunArgs),
    /// A run's log; `--follow` streams it until the run ends.
    Log(client::LogArgs),
    /// A job's component versions, through the REST API.
    Version(client::VersionArgs),
    /// Executor groups, through the REST API.
    Group(client::GroupArgs),
    /// Registered executors, through the REST API.
    Executors(client::ExecutorsArgs),
    /// The admins that share the database and the partitions of the schedule each holds.
    Admins(client::AdminsArgs),
    /// Business calendars, through the REST API.
    Calendar(client::CalendarArgs),
    /// Workflows and their runs, through the REST API.
    Workflow(client::WorkflowArgs),
    /// Writes the admin's groups, calendars, jobs and alarms as one TOML or YAML document.
    Export(client::ExportArgs),
    /// Prints how the admin differs from a document; exits 8 when it does.
    Diff(client::DiffArgs),
    /// Makes the admin match a document: prints the diff, then creates, changes and (with
    /// `--prune`) deletes.
    Apply(client::ApplyArgs),
    /// Prints the JSON Schema of the document `export` writes and `apply` reads.
    Schema,
    /// Imports groups and jobs from another scheduler's database, through the REST API.
    Import(client::ImportArgs),
    /// Installs the builders of Python and JavaScript job source (componentize-py with pip,
    /// componentize-js with npm) at their pinned versions.
    SetupBuilders(SetupBuildersArgs),
    /// Copies a running standalone's or admin's SQLite database, consistently, into a file.
    Backup(BackupArgs),
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00Z  INFO span{field=…}: target: message`.
    Text,
    /// One JSON object a line: `time`, `level`, `target`, `message`, and the fields of the
    /// event and its spans (`run_id`, `job_id`, `executor`, …; dots in names become `_`).
    Json,
}

/// `--config` and `--print-config`, taken by `standalone`, `admin` and `executor`.
#[derive(Debug, Args)]
pub struct ConfigFileArgs {
    /// A TOML file of settings: each flag of this command is a key, with `-` written `_`
    /// (`database_url = "…"`). A flag or its environment variable wins over the file.
    #[arg(long, env = "WASMJOB_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Prints the effective settings as TOML, secrets redacted, and exits.
    #[arg(long)]
    pub print_config: bool,
}

/// `wasmjob backup`: exactly one of `--data-dir` or `--database-url`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["data_dir", "database_url"])))]
pub struct BackupArgs {
    /// A standalone's data directory (its database is `wasmjob.db` in it).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// An admin's database, `sqlite:PATH` (for PostgreSQL, use pg_dump).
    #[arg(long)]
    pub database_url: Option<String>,
    /// The copy to write; it must not exist yet.
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
}

/// `wasmjob setup-builders`.
#[derive(Debug, Args)]
pub struct SetupBuildersArgs {
    /// Where to install them; give the admin the same directory as `--builders-dir`.
    #[arg(long, env = "WASMJOB_BUILDERS_DIR", default_value = "wasmjob-data/builders")]
    pub dir: PathBuf,
    /// The Python interpreter whose pip installs componentize-py (and that later runs it).
    #[arg(long, env = "WASMJOB_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// The npm that installs componentize-js.
    #[arg(long, env = "WASMJOB_NPM", default_value = "npm")]
    pub npm: PathBuf,
}

/// How the admin builds job versions uploaded as Python or JavaScript source.
#[derive(Debug, Args)]
pub struct BuilderArgs {
    /// Where `wasmjob setup-builders` installed the builders; without it (and, for
    /// `standalone`, without `<data dir>/builders`), source uploads are refused.
    #[arg(long, env = "WASMJOB_BUILDERS_DIR")]
    pub builders_dir: Option<PathBuf>,
    /// The Python interpreter that runs componentize-py.
    #[arg(long, env = "WASMJOB_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// The Node.js that runs componentize-js.
    #[arg(long, env = "WASMJOB_NODE", default_value = "node")]
    pub node: PathBuf,
    /// Seconds a build may take before the builder is killed.
    #[arg(long, env = "WASMJOB_BUILD_TIMEOUT_SECS", default_value_t = 300)]
    pub build_timeout_secs: u64,
    /// Data-size limit of a builder process, in MiB.
    #[arg(long, env = "WASMJOB_BUILD_MEMORY_MB", default_value_t = 4096)]
    pub build_memory_mb: u64,
    /// Versions kept per job (XXL-JOB keeps 30); an upload deletes the oldest beyond it, never
    /// the active one.
    #[arg(long, env = "WASMJOB_MAX_VERSIONS_PER_JOB", default_value_t = 30)]
    pub max_versions_per_job: u32,
}

/// `wasmjob user …`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Creates a user; the password is asked for, or read from the first line of stdin.
    Create(CreateUserArgs),
}

/// `wasmjob user create`: exactly one of `--admin`, `--operator GROUP…` or `--viewer`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("role").required(true).args(["admin", "operator", "viewer"])))]
pub struct CreateUserArgs {
    /// The login name.
    #[arg(long)]
    pub name: String,
    /// An administrator: everything, users included.
    #[arg(long)]
    pub admin: bool,
    /// An operator of these groups (app names or ids, comma-separated).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub operator: Vec<String>,
    /// Read-only.
    #[arg(long)]
    pub viewer: bool,
    /// The admin's database (`standalone` keeps it in `<data dir>/wasmjob.db`).
    #[arg(long, env = "WASMJOB_DATABASE_URL", default_value = "sqlite:wasmjob-data/wasmjob.db")]
    pub database_url: String,
}

/// `wasmjob standalone`.
#[derive(Debug, Args)]
pub struct StandaloneArgs {
    /// Where the database, tokens, module cache and run logs live.
    #[arg(long, env = "WASMJOB_DATA_DIR", default_value = "wasmjob-data")]
    pub data_dir: PathBuf,
    /// The admin's listen address (REST API and executor API).
    #[arg(long, env = "WASMJOB_ADMIN_LISTEN", default_value = "127.0.0.1:8080")]
    pub admin_listen: SocketAddr,
    /// The embedded executor's listen address.
    #[arg(long, env = "WASMJOB_EXECUTOR_LISTEN", default_value = "127.0.0.1:9999")]
    pub executor_listen: SocketAddr,
    /// The operator token; generated and kept in the data dir when not given.
    #[arg(long, env = "WASMJOB_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the operator token (instead of --admin-token).
    #[arg(long, env = "WASMJOB_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// The admin⇄executor token; generated and kept in the data dir when not given.
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN", hide_env_values = true)]
    pub access_token: Option<String>,
    /// A file holding the admin⇄executor token (instead of --access-token).
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN_FILE", value_name = "FILE")]
    pub access_token_file: Option<PathBuf>,
    /// Components run by `BEAN` jobs, by file stem.
    #[arg(long, env = "WASMJOB_HANDLERS_DIR")]
    pub handlers_dir: Option<PathBuf>,
    /// Executor addresses accepted at registration and called: CIDRs (`10.0.0.0/8`), IPs and
    /// host patterns (`exec-1.internal`, `*.jobs.internal`, `*`), comma-separated. Link-local and
    /// cloud metadata addresses stay refused unless an entry inside their range names them.
    #[arg(long, env = "WASMJOB_EXECUTOR_ALLOW", value_delimiter = ',', default_value = crate::netpolicy::DEFAULT_ALLOW)]
    pub executor_allow: Vec<String>,
    /// Runs that may be unfinished (pending, dispatching or running) before the scheduler
    /// holds its fires, which then misfire by their jobs' misfire strategy, and triggers are
    /// refused with 503; 0: no bound.
    #[arg(long, env = "WASMJOB_MAX_UNFINISHED_RUNS", default_value_t = 10_000)]
    pub max_unfinished_runs: u64,
    /// How long, in ms, an executor's callback is applied before the rest of its results is
    /// recorded (applied right after) and the callback answered, at most 500; 0 records every
    /// callback's results before applying them.
    #[arg(long, env = "WASMJOB_CALLBACK_APPLY_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=500))]
    pub callback_apply_ms: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub alarms: AlarmArgs,
    #[command(flatten)]
    pub builders: BuilderArgs,
    #[command(flatten)]
    pub config: ConfigFileArgs,
}

/// `wasmjob admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The listen address (REST API and executor API).
    #[arg(long, env = "WASMJOB_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// `sqlite:PATH` (one admin), or `postgres://…` or `mysql://…` (several admins).
    #[arg(
        long,
        env = "WASMJOB_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite:wasmjob-data/wasmjob.db"
    )]
    pub database_url: String,
    /// A file holding the database URL (instead of --database-url).
    #[arg(long, env = "WASMJOB_DATABASE_URL_FILE", value_name = "FILE")]
    pub database_url_file: Option<PathBuf>,
    /// The operator token (`Authorization: Bearer …`); at least 16 characters.
    #[arg(long, env = "WASMJOB_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the operator token (instead of --admin-token).
    #[arg(long, env = "WASMJOB_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// The admin⇄executor token (`XXL-JOB-ACCESS-TOKEN`); at least 16 characters.
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN", hide_env_values = true)]
    pub access_token: Option<String>,
    /// A file holding the admin⇄executor token (instead of --access-token).
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN_FILE", value_name = "FILE")]
    pub access_token_file: Option<PathBuf>,
    /// Seconds between executor heartbeats; an executor is offline after three missed beats.
    #[arg(long, env = "WASMJOB_HEARTBEAT_SECS", default_value_t = 30)]
    pub heartbeat_secs: u64,
    /// Days ended run records are kept (XXL-JOB's log retention); 0 keeps them for ever.
    #[arg(long, env = "WASMJOB_RUN_RETENTION_DAYS", default_value_t = 30)]
    pub run_retention_days: u32,
    /// Executor addresses accepted at registration and called: CIDRs (`10.0.0.0/8`), IPs and
    /// host patterns (`exec-1.internal`, `*.jobs.internal`, `*`), comma-separated. Link-local and
    /// cloud metadata addresses stay refused unless an entry inside their range names them.
    #[arg(long, env = "WASMJOB_EXECUTOR_ALLOW", value_delimiter = ',', default_value = crate::netpolicy::DEFAULT_ALLOW)]
    pub executor_allow: Vec<String>,
    /// Runs that may be unfinished (pending, dispatching or running) before the scheduler
    /// holds its fires, which then misfire by their jobs' misfire strategy, and triggers are
    /// refused with 503; 0: no bound.
    #[arg(long, env = "WASMJOB_MAX_UNFINISHED_RUNS", default_value_t = 10_000)]
    pub max_unfinished_runs: u64,
    /// How long, in ms, an executor's callback is applied before the rest of its results is
    /// recorded (applied right after) and the callback answered, at most 500; 0 records every
    /// callback's results before applying them.
    #[arg(long, env = "WASMJOB_CALLBACK_APPLY_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=500))]
    pub callback_apply_ms: u64,
    /// This admin's URL as its executors are given it (`--admin-url`); default: the listen
    /// address, unless that is every interface. Runs name it, and an executor given it sends
    /// their results back here, where their sends are recorded with them.
    #[arg(long, env = "WASMJOB_ADVERTISE_URL", value_name = "URL")]
    pub advertise_url: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub alarms: AlarmArgs,
    #[command(flatten)]
    pub builders: BuilderArgs,
    #[command(flatten)]
    pub config: ConfigFileArgs,
}

/// `wasmjob executor`.
#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The listen address of the executor API.
    #[arg(long, env = "WASMJOB_LISTEN", default_value = "0.0.0.0:9999")]
    pub listen: SocketAddr,
    /// Admin base URLs, comma-separated, tried in order.
    #[arg(long, env = "WASMJOB_ADMIN_URL", value_delimiter = ',', required = true)]
    pub admin_url: Vec<String>,
    /// The executor group's application name.
    #[arg(long, env = "WASMJOB_APP_NAME")]
    pub app_name: String,
    /// The URL the admin calls this executor at (default: http://<listen address>); with
    /// --pull, `pull://<name>` (default: the host name and an id kept in the data directory).
    #[arg(long, env = "WASMJOB_ADDRESS")]
    pub address: Option<String>,
    /// Pull runs from the admins over connections this executor opens, instead of being called
    /// at an address: no port needs to be reachable from the admins (behind NAT, in a pod).
    #[arg(long, env = "WASMJOB_PULL")]
    pub pull: bool,
    /// Where the module cache, the result outbox and run logs live.
    #[arg(long, env = "WASMJOB_DATA_DIR", default_value = "wasmjob-executor")]
    pub data_dir: PathBuf,
    /// Components run by `BEAN` jobs, by file stem.
    #[arg(long, env = "WASMJOB_HANDLERS_DIR")]
    pub handlers_dir: Option<PathBuf>,
    /// The admin⇄executor token (`XXL-JOB-ACCESS-TOKEN`); at least 16 characters.
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN", hide_env_values = true)]
    pub access_token: Option<String>,
    /// A file holding the admin⇄executor token (instead of --access-token).
    #[arg(long, env = "WASMJOB_ACCESS_TOKEN_FILE", value_name = "FILE")]
    pub access_token_file: Option<PathBuf>,
    /// Seconds between heartbeats (XXL-JOB's 30); the admin's `--heartbeat-secs` must match.
    #[arg(long, env = "WASMJOB_HEARTBEAT_SECS", default_value_t = 30)]
    pub heartbeat_secs: u64,
    /// The admins' protocol: `classic` (wasmjob, XXL-JOB 2.2 to 3.4) or `3.5` (XXL-JOB 3.5:
    /// callbacks wrapped in `callbackList`).
    #[arg(long, env = "WASMJOB_ADMIN_PROTOCOL", default_value = "classic")]
    pub admin_protocol: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub config: ConfigFileArgs,
}

/// Where alarm e-mails go out (webhooks are configured through the API).
///
/// `--smtp-url` and `--smtp-from` go together; `config` checks that, not clap, as either may
/// come from the config file or a `_file`.
#[derive(Debug, Args)]
pub struct AlarmArgs {
    /// SMTP server for alarm e-mails: `smtp://host:25`, `smtp://user:pass@host:587?tls=required`
    /// (STARTTLS) or `smtps://user:pass@host` (TLS); none sends no e-mail.
    #[arg(long, env = "WASMJOB_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,
    /// A file holding the SMTP URL (instead of --smtp-url).
    #[arg(long, env = "WASMJOB_SMTP_URL_FILE", value_name = "FILE")]
    pub smtp_url_file: Option<PathBuf>,
    /// The sender of alarm e-mails (`wasmjob <alarms@example.com>`).
    #[arg(long, env = "WASMJOB_SMTP_FROM")]
    pub smtp_from: Option<String>,
}

/// TLS: the roots trusted when calling peers, and the certificate served.
///
/// `--tls-cert` and `--tls-key` go together; `config` checks that, not clap, as either may
/// come from the config file.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// PEM file of CA certificates trusted (besides the webpki roots) for https:// peers.
    #[arg(long, env = "WASMJOB_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain to serve the API over https (with --tls-key).
    #[arg(long, env = "WASMJOB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "WASMJOB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

/// Defaults for runs whose job does not set its own limits.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Fuel budget of a run (about one unit per wasm instruction).
    #[arg(long, env = "WASMJOB_DEFAULT_FUEL", default_value_t = 1_000_000_000_000)]
    pub default_fuel: u64,
    /// Memory cap of a run, in MiB.
    #[arg(long, env = "WASMJOB_DEFAULT_MEMORY_MB", default_value_t = 256)]
    pub default_memory_mb: u64,
    /// Largest run log kept, in KiB; the rest is cut with one marker line.
    #[arg(long, env = "WASMJOB_MAX_LOG_KB", default_value_t = 4096)]
    pub max_log_kb: u64,
    /// Days run logs are kept.
    #[arg(long, env = "WASMJOB_LOG_RETENTION_DAYS", default_value_t = 30)]
    pub log_retention_days: u32,
    /// Runs one executor runs at once; runs past that wait for a free slot.
    #[arg(long, env = "WASMJOB_MAX_CONCURRENT_RUNS", default_value_t = 64)]
    pub max_concurrent_runs: u32,
    /// Runs of one job waiting in its queue on this executor; a trigger past that is refused.
    #[arg(long, env = "WASMJOB_MAX_QUEUE_PER_JOB", default_value_t = 1000)]
    pub max_queue_per_job: u32,
    /// MiB of triggers (parameters, handler names, sharding items) held by this executor's
    /// accepted runs that have not ended; a trigger past that is refused.
    #[arg(long, env = "WASMJOB_MAX_QUEUED_MB", default_value_t = 256)]
    pub max_queued_mb: u64,
    /// Seconds running runs may go on after a stop request before the rest are killed.
    #[arg(long, env = "WASMJOB_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_cli() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
