//! Validated, typed configuration built from the command line, its `WASMJOB_*` twins and a
//! daemon's configuration file.
//!
//! [`command_line`] parses the flags, the environment and the file (`file`), in that order of
//! precedence, and reads the secrets' `_file`s. Everything a process needs is then checked here,
//! before anything starts: tokens (present, long, not a well-known value), addresses and limits.
//! `standalone`'s generated tokens are created and read here too. The rest of the code receives
//! these structs and never reads the environment.

mod checks;
mod command_line;
pub mod file;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use self::checks::{advertise_url, check_admin_url, check_app_name, heartbeat, max_unfinished};
pub use self::command_line::{CommandLine, REDACTED, command_line};
use crate::access::Role;
use crate::cli::{
    AdminArgs, AlarmArgs, BackupArgs, BuilderArgs, CreateUserArgs, ExecutorArgs, LimitArgs,
    StandaloneArgs, TlsArgs,
};
use crate::netpolicy::AddressPolicy;
use crate::protocol::Generation;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// The database's file in `standalone`'s data directory.
pub const DATABASE_FILE: &str = "wasmjob.db";

/// Values that are not secrets although they pass the other rules: each is at least
/// [`MIN_TOKEN_LEN`] long and not one character repeated, so each can match (a test checks it).
/// Shorter well-known values, XXL-JOB's shipped `default_token` among them, never get this far:
/// the length check refuses them.
const WELL_KNOWN_TOKENS: &[&str] = &[
    "1234567890123456",
    "12345678901234567890",
    "0123456789abcdef",
    "abcdefghijklmnop",
    "abcdefghijklmnopqrstuvwxyz",
    "qwertyuiopasdfgh",
    "changemechangeme",
    "passwordpassword",
    "default_token_default_token",
];

/// How the admin runs.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where the API listens.
    pub listen: SocketAddr,
    /// The database.
    pub database_url: String,
    /// The operator token.
    pub admin_token: String,
    /// The admin⇄executor token.
    pub access_token: String,
    /// How often executors are expected to beat; one is dead after three missed beats.
    pub heartbeat_interval: Duration,
    /// The largest module accepted at upload, in bytes.
    pub max_module_bytes: usize,
    /// Days ended runs are kept; `None` keeps them.
    pub run_retention_days: Option<u32>,
    /// Executor addresses, TLS.
    pub network: NetworkConfig,
    /// Where alarm e-mails go out.
    pub alarms: AlarmConfig,
    /// Where the builders of source versions are, and their limits.
    pub builders: BuilderConfig,
    /// Versions kept per job; an upload deletes older ones, never the active one.
    pub max_versions_per_job: u32,
    /// New fires and triggers wait while this many runs are unfinished; `None`: no bound.
    pub max_unfinished_runs: Option<u64>,
    /// How long a callback is applied before the rest is recorded and it is answered.
    pub callback_apply_within: std::time::Duration,
    /// The URL executors are given for this admin (`--advertise-url`); `None`: the listen
    /// address, unless that is every interface.
    pub advertise_url: Option<String>,
}

/// Alarm channels configured by flags (webhooks live in the database).
#[derive(Debug, Clone, Default)]
pub struct AlarmConfig {
    /// The SMTP server alarm e-mails go through; `None` sends none.
    pub smtp: Option<SmtpConfig>,
}

/// An SMTP server and the sender of alarm e-mails.
#[derive(Clone)]
pub struct SmtpConfig {
    /// `smtp://…` or `smtps://…`, credentials included (never logged).
    pub url: String,
    /// The `From` mailbox.
    pub from: String,
}

impl std::fmt::Debug for SmtpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpConfig").field("url", &"…").field("from", &self.from).finish()
    }
}

impl AlarmConfig {
    /// Checks `--smtp-url` and `--smtp-from`.
    pub fn from_args(args: AlarmArgs) -> anyhow::Result<AlarmConfig> {
        let smtp = match (args.smtp_url, args.smtp_from) {
            (None, None) => None,
            (Some(url), Some(from)) => {
                let parsed = url::Url::parse(&url)
                    .map_err(|error| anyhow::anyhow!("--smtp-url: not a URL: {error}"))?;
                if !matches!(parsed.scheme(), "smtp" | "smtps") || parsed.host_str().is_none() {
                    anyhow::bail!("--smtp-url: use smtp://host[:port] or smtps://host[:port]");
                }
                from.parse::<lettre::message::Mailbox>()
                    .map_err(|error| anyhow::anyhow!("--smtp-from `{from}`: {error}"))?;
                Some(SmtpConfig { url, from })
            }
            _ => anyhow::bail!("--smtp-url and --smtp-from go together"),
        };
        Ok(AlarmConfig { smtp })
    }
}

/// Where the builders of Python and JavaScript versions are and how a build is bounded.
#[derive(Debug, Clone)]
pub struct BuilderConfig {
    /// The directory `wasmjob setup-builders` installed into; `None`: no builders.
    pub dir: Option<PathBuf>,
    /// The Python interpreter that runs componentize-py.
    pub python: PathBuf,
    /// The Node.js that runs componentize-js.
    pub node: PathBuf,
    /// The longest a build may take; then the builder is killed.
    pub timeout: Duration,
    /// The data-size limit of a builder process, in bytes.
    pub memory_bytes: u64,
}

impl BuilderConfig {
    /// Checks the builder flags; `default_dir` is used when `--builders-dir` is not given.
    pub fn from_args(
        args: BuilderArgs,
        default_dir: Option<PathBuf>,
    ) -> anyhow::Result<BuilderConfig> {
        if !(1..=3600).contains(&args.build_timeout_secs) {
            anyhow::bail!("--build-timeout-secs must be between 1 and 3600");
        }
        if !(256..=65_536).contains(&args.build_memory_mb) {
            anyhow::bail!("--build-memory-mb must be between 256 and 65536");
        }
        Ok(BuilderConfig {
            dir: args.builders_dir.or(default_dir),
            python: args.python,
            node: args.node,
            timeout: Duration::from_secs(args.build_timeout_secs),
            memory_bytes: args.build_memory_mb * 1024 * 1024,
        })
    }
}

/// Checks `--max-versions-per-job`.
fn max_versions(args: &BuilderArgs) -> anyhow::Result<u32> {
    if !(1..=10_000).contains(&args.max_versions_per_job) {
        anyhow::bail!("--max-versions-per-job must be between 1 and 10000");
    }
    Ok(args.max_versions_per_job)
}

/// How an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Where the executor API listens.
    pub listen: SocketAddr,
    /// The URL the admin calls this executor at (pulling, `pull://name`); `None` derives it.
    pub address: Option<String>,
    /// Whether it pulls its runs from the admins (`--pull`) rather than being called.
    pub pull: bool,
    /// Admin base URLs, tried in order.
    pub admin_urls: Vec<String>,
    /// The group's application name.
    pub app_name: String,
    /// Module cache, outbox and logs live here.
    pub data_dir: PathBuf,
    /// Components of `BEAN` jobs.
    pub handlers_dir: Option<PathBuf>,
    /// The admin⇄executor token.
    pub access_token: String,
    /// Defaults for runs.
    pub limits: RunDefaults,
    /// How often to send a heartbeat.
    pub heartbeat_interval: Duration,
    /// TLS (its executor policy is the admin's business and unused here).
    pub network: NetworkConfig,
    /// The admins' protocol generation (`--admin-protocol`).
    pub admin_protocol: Generation,
}

/// Who a process talks to, and how: the executor addresses an admin accepts and calls, the
/// roots trusted for `https://` peers, and the certificate served.
#[derive(Debug, Clone, Default)]
pub struct NetworkConfig {
    /// The executor addresses an admin accepts at registration and calls.
    pub executor_policy: AddressPolicy,
    /// CA certificates (PEM) trusted besides the webpki roots.
    pub ca_file: Option<PathBuf>,
    /// The certificate chain and key (PEM files) to serve the API over https.
    pub serve_tls: Option<(PathBuf, PathBuf)>,
}

impl NetworkConfig {
    fn from_args(tls: TlsArgs, executor_allow: Option<&[String]>) -> anyhow::Result<NetworkConfig> {
        let executor_policy = match executor_allow {
            Some(entries) => executor_policy(entries)?,
            None => AddressPolicy::default(),
        };
        for path in [&tls.ca_file, &tls.tls_cert, &tls.tls_key].into_iter().flatten() {
            if !path.is_file() {
                anyhow::bail!("{} is not a readable file", path.display());
            }
        }
        let serve_tls = match (tls.tls_cert, tls.tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => anyhow::bail!("--tls-cert and --tls-key go together"),
        };
        Ok(NetworkConfig { executor_policy, ca_file: tls.ca_file, serve_tls })
    }
}

/// Limits applied to runs whose job does not set its own.
#[derive(Debug, Clone)]
pub struct RunDefaults {
    /// Fuel budget.
    pub fuel: u64,
    /// Memory cap in bytes.
    pub memory_bytes: usize,
    /// Largest run log in bytes.
    pub max_log_bytes: u64,
    /// Days run logs are kept.
    pub log_retention_days: u32,
    /// Runs held at once (the size of the runtime's instance pool).
    pub max_concurrent_runs: u32,
    /// Runs of one job that may wait in its queue.
    pub max_queue_per_job: usize,
    /// Bytes of triggers that the accepted runs not yet ended may hold, all jobs together.
    pub max_queued_bytes: usize,
    /// How long running runs may go on after a stop request before the rest are killed.
    pub shutdown_grace: Duration,
}

/// Both halves of `standalone`.
#[derive(Debug, Clone)]
pub struct StandaloneConfig {
    /// The admin.
    pub admin: AdminConfig,
    /// The embedded executor; its admin URL is filled in once the admin is bound.
    pub executor: ExecutorConfig,
    /// Where the generated tokens are kept, for the startup message.
    pub token_files: Vec<PathBuf>,
}

/// A user to create with `wasmjob user create`.
#[derive(Debug, Clone)]
pub struct NewUserConfig {
    /// The admin's database.
    pub database_url: String,
    /// The login name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// For an operator, its groups by app name or id.
    pub groups: Vec<String>,
}

impl NewUserConfig {
    /// Checks `wasmjob user create`'s flags.
    pub fn from_args(args: CreateUserArgs) -> anyhow::Result<NewUserConfig> {
        let name = args.name.trim().to_owned();
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || ".-_@".contains(c));
        if !name_ok {
            anyhow::bail!("--name `{name}`: use 1 to 64 letters, digits, '.', '-', '_' or '@'");
        }
        let groups: Vec<String> =
            args.operator.iter().map(|g| g.trim().to_owned()).filter(|g| !g.is_empty()).collect();
        let role = match (args.admin, groups.is_empty(), args.viewer) {
            (true, true, false) => Role::Admin,
            (false, false, false) => Role::Operator,
            (false, true, true) => Role::Viewer,
            _ => anyhow::bail!("give one role: --admin, --operator GROUP[,GROUP…] or --viewer"),
        };
        Ok(NewUserConfig { database_url: args.database_url, name, role, groups })
    }
}

impl AdminConfig {
    /// Checks `wasmjob admin`'s flags.
    pub fn from_args(args: AdminArgs) -> anyhow::Result<AdminConfig> {
        Ok(AdminConfig {
            listen: args.listen,
            database_url: args.database_url,
            admin_token: check_token("--admin-token / WASMJOB_ADMIN_TOKEN", args.admin_token)?,
            access_token: check_token("--access-token / WASMJOB_ACCESS_TOKEN", args.access_token)?,
            heartbeat_interval: heartbeat(args.heartbeat_secs)?,
            max_module_bytes: 32 * 1024 * 1024,
            run_retention_days: (args.run_retention_days > 0).then_some(args.run_retention_days),
            network: NetworkConfig::from_args(args.tls, Some(&args.executor_allow))?,
            alarms: AlarmConfig::from_args(args.alarms)?,
            max_versions_per_job: max_versions(&args.builders)?,
            builders: BuilderConfig::from_args(args.builders, None)?,
            max_unfinished_runs: max_unfinished(args.max_unfinished_runs),
            callback_apply_within: std::time::Duration::from_millis(args.callback_apply_ms),
            advertise_url: args.advertise_url.map(advertise_url).transpose()?,
        })
    }
}

impl ExecutorConfig {
    /// Checks `wasmjob executor`'s flags.
    pub fn from_args(args: ExecutorArgs) -> anyhow::Result<ExecutorConfig> {
        let access_token = check_token("--access-token / WASMJOB_ACCESS_TOKEN", args.access_token)?;
        let admin_urls: Vec<String> = args
            .admin_url
            .iter()
            .map(|url| url.trim().to_owned())
            .filter(|url| !url.is_empty())
            .collect();
        if admin_urls.is_empty() {
            anyhow::bail!("--admin-url needs at least one admin URL");
        }
        for url in &admin_urls {
            check_admin_url(url)?;
        }
        if let Some(address) = &args.address {
            let checked = match args.pull {
                true => crate::netpolicy::check_pull_address(address),
                false => crate::netpolicy::address_host(address).map(drop),
            };
            checked.map_err(|reason| anyhow::anyhow!("--address {reason}"))?;
        }
        check_app_name(&args.app_name)?;
        Ok(ExecutorConfig {
            listen: args.listen,
            address: args.address,
            pull: args.pull,
            admin_urls,
            app_name: args.app_name,
            data_dir: args.data_dir,
            handlers_dir: args.handlers_dir,
            access_token,
            limits: RunDefaults::from_args(&args.limits)?,
            heartbeat_interval: heartbeat(args.heartbeat_secs)?,
            network: NetworkConfig::from_args(args.tls, None)?,
            admin_protocol: args
                .admin_protocol
                .parse()
                .map_err(|error| anyhow::anyhow!("--admin-protocol: {error}"))?,
        })
    }
}

impl RunDefaults {
    fn from_args(args: &LimitArgs) -> anyhow::Result<RunDefaults> {
        if args.default_fuel == 0 {
            anyhow::bail!("--default-fuel must be positive");
        }
        if !(1..=4096).contains(&args.default_memory_mb) {
            anyhow::bail!("--default-memory-mb must be between 1 and 4096");
        }
        if !(1..=4096).contains(&args.max_concurrent_runs) {
            anyhow::bail!("--max-concurrent-runs must be between 1 and 4096");
        }
        if args.max_log_kb == 0 {
            anyhow::bail!("--max-log-kb must be positive");
        }
        if args.max_queue_per_job == 0 {
            anyhow::bail!("--max-queue-per-job must be positive");
        }
        if !(1..=65_536).contains(&args.max_queued_mb) {
            anyhow::bail!("--max-queued-mb must be between 1 and 65536");
        }
        if args.shutdown_grace_secs > 3600 {
            anyhow::bail!("--shutdown-grace-secs must be at most 3600");
        }
        Ok(RunDefaults {
            fuel: args.default_fuel,
            memory_bytes: usize::try_from(args.default_memory_mb * 1024 * 1024)
                .context("--default-memory-mb does not fit this machine")?,
            max_log_bytes: args.max_log_kb * 1024,
            log_retention_days: args.log_retention_days,
            max_concurrent_runs: args.max_concurrent_runs,
            max_queue_per_job: usize::try_from(args.max_queue_per_job)
                .context("--max-queue-per-job does not fit this machine")?,
            max_queued_bytes: usize::try_from(args.max_queued_mb * 1024 * 1024)
                .context("--max-queued-mb does not fit this machine")?,
            shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        })
    }
}

impl StandaloneConfig {
    /// Checks `wasmjob standalone`'s flags, generating the tokens on first start.
    pub fn from_args(args: StandaloneArgs) -> anyhow::Result<StandaloneConfig> {
        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("creating data dir {}", args.data_dir.display()))?;
        let admin_token_file = args.data_dir.join("admin-token");
        let access_token_file = args.data_dir.join("access-token");
        let admin_token = match args.admin_token {
            Some(token) => check_token("--admin-token / WASMJOB_ADMIN_TOKEN", Some(token))?,
            None => stored_token(&admin_token_file)?,
        };
        let access_token = match args.access_token {
            Some(token) => check_token("--access-token / WASMJOB_ACCESS_TOKEN", Some(token))?,
            None => stored_token(&access_token_file)?,
        };
        let database_path = args.data_dir.join(DATABASE_FILE);
        let admin = AdminConfig {
            listen: args.admin_listen,
            database_url: format!("sqlite:{}", database_path.display()),
            admin_token,
            access_token: access_token.clone(),
            heartbeat_interval: Duration::from_secs(30),
            max_module_bytes: 32 * 1024 * 1024,
            run_retention_days: Some(30),
            network: NetworkConfig {
                executor_policy: executor_policy(&args.executor_allow)?,
                ..NetworkConfig::default()
            },
            alarms: AlarmConfig::from_args(args.alarms)?,
            max_versions_per_job: max_versions(&args.builders)?,
            builders: BuilderConfig::from_args(
                args.builders,
                Some(args.data_dir.join("builders")),
            )?,
            max_unfinished_runs: max_unfinished(args.max_unfinished_runs),
            callback_apply_within: std::time::Duration::from_millis(args.callback_apply_ms),
            advertise_url: None,
        };
        let executor = ExecutorConfig {
            listen: args.executor_listen,
            address: None,
            pull: false,
            admin_urls: Vec::new(),
            app_name: "default".to_owned(),
            data_dir: args.data_dir.join("executor"),
            handlers_dir: args.handlers_dir,
            access_token,
            limits: RunDefaults::from_args(&args.limits)?,
            heartbeat_interval: Duration::from_secs(30),
            network: NetworkConfig::default(),
            admin_protocol: Generation::Classic,
        };
        Ok(StandaloneConfig {
            admin,
            executor,
            token_files: vec![admin_token_file, access_token_file],
        })
    }
}

/// What `wasmjob backup` copies, and where to.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    /// The SQLite database file to copy.
    pub database: PathBuf,
    /// The copy to write; it did not exist when checked.
    pub to: PathBuf,
}

impl BackupConfig {
    /// Checks `wasmjob backup`'s flags: a SQLite database that is there, and a new file.
    pub fn from_args(args: BackupArgs) -> anyhow::Result<BackupConfig> {
        let database = match (args.data_dir, args.database_url) {
            (Some(data_dir), None) => data_dir.join(DATABASE_FILE),
            (None, Some(url)) => sqlite_file(&url)?,
            _ => anyhow::bail!("give --data-dir or --database-url"),
        };
        if !database.is_file() {
            anyhow::bail!("{} is not a database file", database.display());
        }
        if args.to.exists() {
            anyhow::bail!("{} exists already: back up into a new file", args.to.display());
        }
        Ok(BackupConfig { database, to: args.to })
    }
}

/// The file of a `sqlite:PATH[?query]` URL; a PostgreSQL URL is refused, never echoed (it may
/// hold a password).
fn sqlite_file(url: &str) -> anyhow::Result<PathBuf> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        anyhow::bail!(
            "--database-url is a PostgreSQL database: back it up with pg_dump \
             (`pg_dump --format=custom --file=wasmjob.dump URL`) and restore it with pg_restore"
        );
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        anyhow::bail!(
            "--database-url is a MySQL database: back it up with mysqldump \
             (`mysqldump --single-transaction DATABASE > wasmjob.sql`) and restore it with mysql"
        );
    }
    let Some(path) = url.strip_prefix("sqlite:") else {
        anyhow::bail!(
            "--database-url: use sqlite:PATH (for PostgreSQL, pg_dump; for MySQL, mysqldump)"
        );
    };
    let path = path.trim_start_matches("//");
    let file = path.split_once('?').map_or(path, |(file, _)| file);
    if file.is_empty() || file == ":memory:" {
        anyhow::bail!("--database-url: an in-memory database has nothing to back up");
    }
    Ok(PathBuf::from(file))
}

/// Refuses a missing, short or well-known token.
pub fn check_token(flag: &str, token: Option<String>) -> anyhow::Result<String> {
    let Some(token) = token else {
        anyhow::bail!(
            "{flag} is required, or its _file form: there is no default token (use at least {MIN_TOKEN_LEN} random characters)"
        );
    };
    let token = token.trim().to_owned();
    if token.len() < MIN_TOKEN_LEN {
        anyhow::bail!("{flag} is too short: use at least {MIN_TOKEN_LEN} random characters");
    }
    let lower = token.to_ascii_lowercase();
    if WELL_KNOWN_TOKENS.contains(&lower.as_str()) || token.chars().all(|c| token.starts_with(c)) {
        anyhow::bail!("{flag} is a well-known value: use a random token");
    }
    Ok(token)
}

/// Reads the token in `path`, or creates it (random, mode 0600) on first start.
fn stored_token(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => return check_token(&path.display().to_string(), Some(text)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    }
    let token = hex::encode(rand::random::<[u8; 32]>());
    write_private(path, &token).with_context(|| format!("writing {}", path.display()))?;
    Ok(token)
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

fn executor_policy(entries: &[String]) -> anyhow::Result<AddressPolicy> {
    AddressPolicy::parse(entries).map_err(|reason| anyhow::anyhow!("--executor-allow: {reason}"))
}

#[cfg(test)]
mod tests;
