//! The flags of the REST API's command-line client: `wasmjob job|run|log|version|group|calendar|
//! workflow …`.
//!
//! Only the shape of the commands is here; `client_cli` runs them against an admin.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// Where the admin is and who calls it, shared by every client command.
///
/// The URL and the token come from the flag, else the environment, else the config file
/// (`client_cli::config_file`), else the URL defaults to `http://127.0.0.1:8080`.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The admin's base URL [default: the config file's, else http://127.0.0.1:8080].
    #[arg(long, env = "WASMJOB_ADMIN_URL", global = true)]
    pub admin_url: Option<String>,
    /// A bearer token: the operator token or a personal API token [default: the config file's].
    #[arg(long, env = "WASMJOB_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// The config file [default: $XDG_CONFIG_HOME/wasmjob/config.toml, else
    /// ~/.config/wasmjob/config.toml].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The user's config directory, where the default config file is.
    #[arg(long, env = "XDG_CONFIG_HOME", hide = true, global = true)]
    pub xdg_config_home: Option<PathBuf>,
    /// The user's home, whose `.config` holds the default config file without XDG_CONFIG_HOME.
    #[arg(long = "home-dir", env = "HOME", hide = true, global = true)]
    pub home: Option<PathBuf>,
    /// Prints the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `wasmjob admins …`.
#[derive(Debug, Args)]
pub struct AdminsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: AdminsCommand,
}

/// `wasmjob job …`.
#[derive(Debug, Args)]
pub struct JobArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: JobCommand,
}

/// `wasmjob run …`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: RunCommand,
}

/// `wasmjob version …`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: VersionCommand,
}

/// `wasmjob group …`.
#[derive(Debug, Args)]
pub struct GroupArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: GroupCommand,
}

/// `wasmjob calendar …`.
#[derive(Debug, Args)]
pub struct CalendarArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: CalendarCommand,
}

/// `wasmjob workflow …`.
#[derive(Debug, Args)]
pub struct WorkflowArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: WorkflowCommand,
}

/// A document's text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DocumentFormat {
    Toml,
    Yaml,
}

/// `wasmjob export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Writes the document to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The format [default: YAML for a `.yaml` or `.yml` output, else TOML].
    #[arg(long, value_enum)]
    pub format: Option<DocumentFormat>,
    /// Saves each active component in DIR as `<sha256>.wasm` and names it by path, so that the
    /// document recreates the jobs on another admin.
    #[arg(long, value_name = "DIR")]
    pub components: Option<PathBuf>,
}

/// The document `diff` and `apply` read.
#[derive(Debug, Args)]
pub struct DocumentArgs {
    /// The document (`-` reads standard input).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// The format [default: YAML for a `.yaml` or `.yml` file, else TOML].
    #[arg(long, value_enum)]
    pub format: Option<DocumentFormat>,
}

/// `wasmjob diff -f FILE`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub document: DocumentArgs,
    /// Counts what the document does not have as to be deleted, as `apply --prune` would.
    #[arg(long)]
    pub prune: bool,
}

/// `wasmjob apply -f FILE`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub document: DocumentArgs,
    /// Also deletes the jobs, calendars and alarms the document does not have (groups stay).
    #[arg(long)]
    pub prune: bool,
    /// Prints the diff and changes nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `wasmjob import …`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    pub command: ImportCommand,
}

/// What `wasmjob import` reads.
#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// An XXL-JOB admin's executor groups and jobs, from its MySQL or MariaDB database (XXL-JOB
    /// 2.2 to 3.5); importing again changes only what changed there.
    XxlJob(ImportXxlArgs),
}

/// `wasmjob import xxl-job`.
#[derive(Debug, Args)]
pub struct ImportXxlArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The XXL-JOB database: `mysql://user:password@host:3306/xxl_job`.
    #[arg(long, value_name = "URL")]
    pub from: String,
    /// Prints what the import would create, change or leave, job by job, and changes nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `wasmjob executors …`.
#[derive(Debug, Args)]
pub struct ExecutorsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: ExecutorsCommand,
}

/// `wasmjob job …`.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Lists jobs.
    List,
    /// Shows one job.
    Get { id: i64 },
    /// Creates a job (stopped).
    Create(JobFields),
    /// Changes the given fields of a job.
    Update {
        id: i64,
        #[command(flatten)]
        fields: JobFields,
    },
    /// Deletes a job.
    Delete { id: i64 },
    /// Starts a job's schedule.
    Start { id: i64 },
    /// Stops a job's schedule.
    Stop { id: i64 },
    /// Runs a job once now; prints the new runs' ids.
    Trigger {
        id: i64,
        /// The parameter of this run (default: the job's).
        #[arg(long)]
        param: Option<String>,
    },
    /// Runs a job once for every past instant its schedule would have fired in a window, each
    /// run seeing its instant as trigger time; prints the backfill.
    Backfill {
        id: i64,
        /// The window's first instant (RFC 3339), inclusive.
        #[arg(long)]
        from: String,
        /// The window's last instant (RFC 3339), inclusive.
        #[arg(long)]
        to: String,
        /// The most of its runs unfinished at once [default: 10].
        #[arg(long)]
        max_concurrent: Option<i64>,
        /// Runs instants that already have a run again.
        #[arg(long)]
        rerun: bool,
        /// Shows its progress until it ends; fails (exit 6) if an instant failed.
        #[arg(long)]
        follow: bool,
    },
    /// Lists a job's backfills with their progress.
    Backfills { id: i64 },
    /// Pauses a backfill (by the backfill's id).
    BackfillPause { backfill_id: i64 },
    /// Resumes a paused backfill.
    BackfillResume { backfill_id: i64 },
    /// Cancels a backfill for good.
    BackfillCancel { backfill_id: i64 },
}

/// A job's fields on the command line; those not given are left as they are (or defaulted).
#[derive(Debug, Clone, Default, Args)]
pub struct JobFields {
    /// The executor group's id.
    #[arg(long)]
    pub group_id: Option<i64>,
    #[arg(long)]
    pub name: Option<String>,
    /// `CRON`, `FIX_RATE`, `FIX_DELAY`, `ONCE` or `NONE`.
    #[arg(long)]
    pub schedule_type: Option<String>,
    /// The cron expression, or seconds for `FIX_RATE`.
    #[arg(long)]
    pub schedule_conf: Option<String>,
    #[arg(long)]
    pub param: Option<String>,
    /// One of XXL-JOB's route strategies (`FIRST`, `ROUND`, …).
    #[arg(long)]
    pub route_strategy: Option<String>,
    #[arg(long)]
    pub timeout_secs: Option<i64>,
    #[arg(long)]
    pub retry_count: Option<i64>,
    /// Seconds before the first retry (0: at once).
    #[arg(long)]
    pub retry_interval_secs: Option<i64>,
    /// `FIXED` or `EXPONENTIAL` (the interval doubles with each retry).
    #[arg(long)]
    pub retry_backoff: Option<String>,
    /// The longest wait before a retry, in seconds (0: one day).
    #[arg(long)]
    pub retry_max_interval_secs: Option<i64>,
    /// `GLUE_WASM` (default), `GLUE_PYTHON`, `GLUE_JAVASCRIPT` or `BEAN`.
    #[arg(long)]
    pub glue_type: Option<String>,
    /// The `BEAN` handler.
    #[arg(long)]
    pub handler: Option<String>,
    /// The business calendar whose excluded instants the job does not fire at.
    #[arg(long)]
    pub calendar: Option<String>,
}

/// `wasmjob run …`.
#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// Lists runs, newest first.
    List {
        #[arg(long)]
        job_id: Option<i64>,
        /// `pending`, `running`, `success`, `failed`, …
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Shows one run.
    Get { id: i64 },
    /// Kills a run.
    Kill { id: i64 },
}

/// `wasmjob log RUN`.
#[derive(Debug, Args)]
pub struct LogArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The run's id.
    pub run: i64,
    /// Follows the log as it is written until the run ends; the exit code is then the run's.
    #[arg(long, short)]
    pub follow: bool,
}

/// `wasmjob version …`.
#[derive(Debug, Subcommand)]
pub enum VersionCommand {
    /// Lists a job's versions.
    List { job: i64 },
    /// Uploads a component as the job's new active version.
    Upload {
        job: i64,
        file: PathBuf,
        #[arg(long, default_value = "")]
        remark: String,
    },
    /// Makes an earlier version active again.
    Activate { job: i64, version: i64 },
}

/// `wasmjob group …`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Lists executor groups with their online addresses.
    List,
    /// Shows one group.
    Get { id: i64 },
    /// Creates a group.
    Create {
        #[arg(long)]
        app_name: String,
        #[arg(long)]
        title: Option<String>,
        /// Fixed addresses, comma-separated (a `MANUAL` group).
        #[arg(long, value_delimiter = ',')]
        addresses: Vec<String>,
    },
}

/// `wasmjob calendar …`.
#[derive(Debug, Subcommand)]
pub enum CalendarCommand {
    /// Lists business calendars.
    List,
    /// Shows one calendar.
    Get { name: String },
    /// Creates or replaces the calendar a JSON file describes (its `name` says which).
    Apply {
        /// The calendar as the API takes it: `{"name": "cn", "weekdays": ["SAT", "SUN"], …}`.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Deletes a calendar no job names.
    Delete { name: String },
    /// Adds the dates of an iCalendar (`.ics`) file's events to a calendar.
    ImportIcs {
        name: String,
        file: PathBuf,
        /// Adds them as included dates (make-up workdays) instead of excluded ones.
        #[arg(long)]
        included: bool,
    },
}

/// `wasmjob workflow …`.
#[derive(Debug, Subcommand)]
pub enum WorkflowCommand {
    /// Lists workflows.
    List {
        /// Only this executor group's workflows.
        #[arg(long)]
        group_id: Option<i64>,
    },
    /// Prints a workflow's JSON document, as `create` and `update` take it.
    Get { id: i64 },
    /// Creates the workflow a JSON document describes; prints its id.
    Create {
        /// The document as the API takes it: `{"name": "etl", "group_id": 1, "nodes": [{"name":
        /// "extract", "job_id": 3}, …], "edges": [{"from": "extract", "to": "load"}, …]}` (`-`
        /// reads standard input).
        file: PathBuf,
    },
    /// Replaces a workflow's document; its runs under way keep the one they started with.
    Update {
        id: i64,
        /// The document, as `create` takes it (`-` reads standard input).
        file: PathBuf,
    },
    /// Deletes a workflow; its runs stay.
    Delete { id: i64 },
    /// Runs a workflow once now; prints the workflow run's id.
    Trigger { id: i64 },
    /// Starts a workflow: it fires on its schedule; prints its next fire.
    Start { id: i64 },
    /// Stops a workflow: it no longer fires on its schedule.
    Stop { id: i64 },
    /// Lists a workflow's runs, newest first.
    Runs { id: i64 },
    /// Shows a workflow run: its state and each node's.
    Run { run_id: i64 },
    /// Kills a running workflow run: no node starts any more, and its runs are killed.
    Kill { run_id: i64 },
    /// Retries a failed node of a workflow run; the run goes on from there.
    Retry { run_id: i64, node_name: String },
}

/// `wasmjob executors`.
#[derive(Debug, Subcommand)]
pub enum ExecutorsCommand {
    /// Lists registered executors with their last heartbeat.
    List,
}

/// `wasmjob admins`.
#[derive(Debug, Subcommand)]
pub enum AdminsCommand {
    /// Lists the live admins with how many partitions of the schedule each holds.
    List,
}
