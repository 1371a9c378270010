//! The only place with SQL: a [`Db`] handle over SQLite, PostgreSQL or MySQL/MariaDB, one
//! function per query.
//!
//! Queries are written once in the SQL PostgreSQL and SQLite both accept (`$1` placeholders,
//! `returning`, `on conflict`) and run through sqlx's `Any` driver by `query.rs`, which
//! translates them for MySQL and MariaDB; where no translation fits, the function branches on
//! [`Dialect`]. On SQLite the group commit's batches run on a connection of their
//! own (`sqlite_writer.rs`), the same statements in one call to its thread. Migrations are per
//! dialect under `migrations/`, applied at connect.
//! Times are milliseconds since the Unix epoch, passed in by the caller: nothing here reads a clock.
//!
//! This module does not decide anything (when to fire, where to route): it stores and returns
//! `model` types, and it enforces the database-level guarantees (one run per fire).

mod alarms;
mod audit;
mod backfills;
pub mod backup;
mod batch;
mod calendars;
mod callbacks;
mod caps;
mod contention;
mod fires;
mod groups;
mod job_rows;
mod jobs;
mod modules;
mod mysql_writes;
mod partitions;
mod query;
mod queued;
mod registry;
mod reports;
mod run_inserts;
mod run_writes;
mod runs;
mod sqlite_writer;
mod statement;
mod users;
mod workflow_runs;
mod workflows;
pub mod xxl_job;

use std::str::FromStr;

use anyhow::Context;
use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Row};

pub use self::alarms::{
    AlarmDelivery, AlarmEvent, AlarmWebhook, DeliveryOutcome, EXECUTOR_LOST, NewAlarmWebhook,
    RUN_FAILED, Settle,
};
pub use self::audit::{AuditEntry, AuditPage, AuditRecord};
pub use self::backfills::{NewBackfill, Release};
pub use self::calendars::CalendarDelete;
pub use self::callbacks::{InboxEntry, RecordedCallback};
pub use self::caps::CappedClaim;
pub use self::fires::{Fire, Fired};
pub use self::job_rows::{DueJob, JobStamp};
pub use self::jobs::JobUpdate;
pub use self::modules::NewVersion;
pub use self::partitions::{AdminRecord, AdminSession, Beat};
pub use self::registry::{Peer, RegisteredPeer};
pub use self::reports::{DAY_MS, DayCounts};
pub use self::runs::{Claim, NewRun, RunFilter, RunPage};
pub use self::users::{ApiToken, LoginLocks, Session, User};
pub use self::workflow_runs::{MAX_OUTPUT_MESSAGE_BYTES, NodeRetry, StartingNode};
pub use self::workflows::{NodeInput, NodeRecord, Workflow, WorkflowRun, WorkflowSchedule};

/// A pooled connection of PostgreSQL or MySQL idle longer than this is pinged before use.
const PING_IF_IDLE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// On SQLite, how many pages the WAL holds before the commit that passes it copies them back into
/// the database file (a checkpoint, with a sync of both files). The commit's writer does it, so
/// writes queue behind it: at SQLite's default of 1,000 pages, under load that was every few
/// hundred runs. At 8,000 (a WAL of about 32 MiB, whose file is kept for reuse) a page written
/// again and again between two checkpoints is copied once.
const CHECKPOINT_PAGES: u32 = 8_000;

/// Which database is behind a [`Db`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: the embedded, single-admin store.
    Sqlite,
    /// PostgreSQL: the store shared by several admins.
    Postgres,
    /// MySQL or MariaDB (InnoDB): shared by several admins, as PostgreSQL is.
    Mysql,
}

impl Dialect {
    /// Whether several admins may share the database (a server, not a file).
    pub fn is_shared(self) -> bool {
        self != Dialect::Sqlite
    }
}

/// Why a storage call failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database failed or refused the statement.
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
    /// SQLite failed or refused a statement on the group commit's own connection.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// A row holds a value the code cannot read (a strategy name it does not know).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A write queued for group commit did not commit.
    #[error("group commit: {0}")]
    Batch(String),
}

impl StorageError {
    /// Whether this is a unique or foreign-key violation, and of which constraint if known.
    pub fn is_constraint_violation(&self) -> bool {
        match self {
            StorageError::Sqlx(sqlx::Error::Database(error)) => {
                error.is_unique_violation() || error.is_foreign_key_violation()
            }
            StorageError::Sqlite(error) => {
                error.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation)
            }
            _ => false,
        }
    }
}

/// Why [`Db::schema_check`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The database did not answer.
    #[error("the database did not answer: {0}")]
    Unavailable(sqlx::Error),
    /// The applied migrations are not this build's (versions listed; equal versions with a
    /// different checksum list alike).
    #[error("applied migrations {applied:?} are not this build's {expected:?}")]
    Differs {
        /// The versions applied to the database.
        applied: Vec<i64>,
        /// The versions this build applies.
        expected: Vec<i64>,
    },
}

/// The result of a storage call.
pub type Result<T> = std::result::Result<T, StorageError>;

/// A connection pool and its dialect. Cheap to clone.
///
/// On SQLite, which lets one connection write at a time, writes go through a pool of one
/// connection: writers queue in the pool instead of sleeping in SQLite's busy handler, and
/// reads keep the other connections. On PostgreSQL and MySQL both are the same pool. The run lifecycle's
/// hot-path writes are group-committed (`batch.rs`).
#[derive(Clone)]
pub struct Db {
    pool: AnyPool,
    writer: AnyPool,
    batcher: batch::Batcher,
    /// On SQLite, the group commit's own connection (`sqlite_writer.rs`), which the batcher
    /// holds too.
    sqlite_writer: Option<std::sync::Arc<sqlite_writer::SqliteWriter>>,
    dialect: Dialect,
}

impl Db {
    /// Connects to `url` (`sqlite:PATH` or `postgres://…`), creating a SQLite file and its
    /// directory if needed, and applies the migrations.
    pub async fn connect(url: &str) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let (dialect, url, file) = if let Some(path) = url.strip_prefix("sqlite:") {
            let (url, file) = sqlite_url(path)?;
            (Dialect::Sqlite, url, Some(file))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Dialect::Postgres, url.to_owned(), None)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            (Dialect::Mysql, url.replacen("mariadb://", "mysql://", 1), None)
        } else {
            anyhow::bail!(
                "unsupported database URL `{}`: use sqlite:PATH, postgres://… or mysql://…",
                redact(url)
            );
        };
        let max_connections = match dialect {
            Dialect::Sqlite => 4,
            Dialect::Postgres | Dialect::Mysql => 10,
        };
        // A server's connection can drop while it sits in the pool (a restart, a failover, an
        // idle timeout), so one idle for a while is pinged before it is handed out. One in
        // steady use is not: the pool pings every connection as it is given back, so a hot
        // connection was seen alive moments ago, and a ping at each acquire was a round trip
        // before each of the admin's hundreds of queries a second. A SQLite connection is a
        // file handle in this process, which cannot drop as a socket can: it is never pinged.
        let options = AnyPoolOptions::new().test_before_acquire(false);
        let options = options.before_acquire(move |connection, meta| {
            Box::pin(async move {
                if dialect.is_shared() && meta.idle_for > PING_IF_IDLE_FOR {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        });
        let options = options.after_connect(move |connection, _| {
            Box::pin(async move {
                if dialect == Dialect::Sqlite {
                    // In WAL mode, FULL syncs the WAL at every commit, so a commit answered
                    // survives a power cut or kernel crash too: a run id handed out is never
                    // handed out again, which executors' journals rely on (under NORMAL a lost
                    // commit's ids came back for other runs). The group commit makes that one
                    // sync per batch of writes. Writers wait for each other instead of failing.
                    sqlx::query("pragma synchronous = full").execute(&mut *connection).await?;
                    sqlx::query("pragma busy_timeout = 5000").execute(&mut *connection).await?;
                    // Statement journals (a multi-row write's undo) in memory, not in a
                    // temporary file made and removed by every transaction.
                    sqlx::query("pragma temp_store = memory").execute(&mut *connection).await?;
                    sqlx::query(&format!("pragma wal_autocheckpoint = {CHECKPOINT_PAGES}"))
                        .execute(&mut *connection)
                        .await?;
                }
                if dialect == Dialect::Mysql {
                    // PostgreSQL's isolation, which the statements are written for: each
                    // statement sees what committed before it, and InnoDB locks the rows it
                    // changes without the gap locks of REPEATABLE READ. String literals mean
                    // what they say, as in standard SQL, and a value too long for its column
                    // is refused, never cut, whatever the server's own mode.
                    sqlx::query("set session transaction isolation level read committed")
                        .execute(&mut *connection)
                        .await?;
                    sqlx::query(
                        "set session sql_mode = \
                         concat(@@sql_mode, ',NO_BACKSLASH_ESCAPES,STRICT_ALL_TABLES')",
                    )
                    .execute(&mut *connection)
                    .await?;
                }
                Ok(())
            })
        });
        let pool = match options.clone().max_connections(max_connections).connect(&url).await {
            Ok(pool) => pool,
            Err(error) => {
                let error = anyhow::Error::new(Unavailable(error));
                return Err(error.context(format!("connecting to {}", redact(&url))));
            }
        };
        if dialect == Dialect::Sqlite {
            // WAL lets the scheduler write while the API reads; it is a property of the file,
            // so setting it once per connect is enough.
            sqlx::query("pragma journal_mode = wal").execute(&pool).await?;
        }
        migrate(&pool, dialect).await?;
        let writer = match dialect {
            Dialect::Sqlite => options
                .max_connections(1)
                .connect(&url)
                .await
                .with_context(|| format!("connecting to {}", redact(&url)))?,
            Dialect::Postgres | Dialect::Mysql => pool.clone(),
        };
        let sqlite_writer = match file {
            Some(file) => Some(std::sync::Arc::new(
                sqlite_writer::SqliteWriter::open(&file)
                    .with_context(|| format!("opening {} for the group commit", file.display()))?,
            )),
            None => None,
        };
        let batcher = batch::Batcher::start(writer.clone(), sqlite_writer.clone());
        Ok(Db { pool, writer, batcher, sqlite_writer, dialect })
    }

    /// The pool writes go through.
    fn writer(&self) -> &AnyPool {
        &self.writer
    }

    /// The dialect behind this handle.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Whether the database answers and holds exactly the migrations this build applies
    /// (same versions, same checksums): `Ok` if so, else what differs. A readiness check; the
    /// schema can change under a running admin only when another admin of the database, of
    /// another build, migrates it.
    pub async fn schema_check(&self) -> std::result::Result<(), SchemaError> {
        let rows = sqlx::query(
            "select version, checksum from _sqlx_migrations where success order by version",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(SchemaError::Unavailable)?;
        let mut applied = Vec::with_capacity(rows.len());
        for row in &rows {
            let version: i64 = row.try_get("version").map_err(SchemaError::Unavailable)?;
            let checksum: Vec<u8> = row.try_get("checksum").map_err(SchemaError::Unavailable)?;
            applied.push((version, checksum));
        }
        let expected: Vec<(i64, Vec<u8>)> = migrator(self.dialect)
            .iter()
            .map(|migration| (migration.version, migration.checksum.to_vec()))
            .collect();
        if applied == expected {
            return Ok(());
        }
        let versions = |list: &[(i64, Vec<u8>)]| list.iter().map(|(v, _)| *v).collect::<Vec<_>>();
        Err(SchemaError::Differs { applied: versions(&applied), expected: versions(&expected) })
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }
}

/// The migrations this build applies, per dialect: the schema it expects.
static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("migrations/postgres");
static MYSQL_MIGRATIONS: Migrator = sqlx::migrate!("migrations/mysql");

/// The database did not answer a connection (not listening, not created yet, login refused):
/// trying again later may work. [`Db::connect`]'s error holds it then, under its context
/// (`error.downcast_ref::<Unavailable>()`).
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer: {0}")]
pub struct Unavailable(sqlx::Error);

/// Applies the migrations `pool` lacks, unless the database is newer than this build.
///
/// sqlx's migrator takes a session-level advisory lock on PostgreSQL (`pg_advisory_lock`) for
/// the whole run, so admins started together apply each migration once, one after the other
/// (`tests::migrations_are_applied_once_by_admins_started_together`); SQLite's database is one
/// admin's. Before it applies anything, the migrator compares the database's applied migrations
/// with this build's: one this build does not know means a newer build migrated the database,
/// and this one stops there, having changed nothing.
async fn migrate(pool: &AnyPool, dialect: Dialect) -> anyhow::Result<()> {
    // sqlx's migrator locks MySQL with `GET_LOCK(name, -1)`, which MariaDB answers with null
    // and no lock: admins started together then each applied the first migration. The lock
    // is taken here, on a connection of its own, held until the migrator is done.
    let mut lock = None;
    if dialect == Dialect::Mysql {
        let mut conn = pool.acquire().await?;
        let row =
            query::query("select get_lock(concat('wasmjob.migrate.', database()), 600) as locked")
                .fetch_one(&mut *conn)
                .await?;
        if row.try_get::<Option<i64>, _>("locked")? != Some(1) {
            anyhow::bail!(
                "another admin held the migration lock for 10 minutes; nothing was changed"
            );
        }
        lock = Some(conn);
    }
    let migrated = migrate_locked(pool, dialect).await;
    if let Some(mut conn) = lock {
        query::query("select release_lock(concat('wasmjob.migrate.', database())) as released")
            .fetch_one(&mut *conn)
            .await?;
    }
    migrated
}

/// [`migrate`], once no other admin migrates.
async fn migrate_locked(pool: &AnyPool, dialect: Dialect) -> anyhow::Result<()> {
    let migrator = migrator(dialect);
    match migrator.run(pool).await {
        Ok(()) => Ok(()),
        Err(sqlx::migrate::MigrateError::VersionMissing(version)) => {
            let description =
                query::query("select description from _sqlx_migrations where version = $1")
                    .bind(version)
                    .fetch_optional(pool)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|row| row.try_get::<String, _>("description").ok())
                    .unwrap_or_default();
            let known = migrator.iter().map(|migration| migration.version).max().unwrap_or(0);
            anyhow::bail!(
                "the database's schema is newer than this build of wasmjob ({}): it has \
                 migration {version:04} ({description}), and this build knows migrations up to \
                 {known:04}. A newer wasmjob migrated it; run that version (or newer) instead. \
                 Nothing was changed.",
                env!("CARGO_PKG_VERSION")
            )
        }
        Err(error) => Err(anyhow::Error::new(error).context("migrating the database")),
    }
}

fn migrator(dialect: Dialect) -> &'static Migrator {
    match dialect {
        Dialect::Sqlite => &SQLITE_MIGRATIONS,
        Dialect::Postgres => &POSTGRES_MIGRATIONS,
        Dialect::Mysql => &MYSQL_MIGRATIONS,
    }
}

/// The sqlx URL of the SQLite database at `path` (`PATH[?query]`), and its file.
fn sqlite_url(path: &str) -> anyhow::Result<(String, std::path::PathBuf)> {
    let path = path.trim_start_matches("//");
    let (file, query) = path.split_once('?').unwrap_or((path, ""));
    if file.is_empty() || file == ":memory:" {
        anyhow::bail!(
            "SQLite needs a file path (sqlite:PATH): pools of in-memory databases do not share data"
        );
    }
    if let Some(parent) = std::path::Path::new(file).parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating database directory {}", parent.display()))?;
    }
    let query = if query.is_empty() { "mode=rwc".to_owned() } else { query.to_owned() };
    Ok((format!("sqlite://{file}?{query}"), std::path::PathBuf::from(file)))
}

/// Hides a password in a database URL before it is logged.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}://{user}:***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl Db {
    /// The rows `select` (`select … from table`) reads for `ids`, one query per [`BY_IDS`] ids
    /// ([`by_ids`]), each a [`Db::hot_read`].
    async fn select_by_ids(&self, select: &str, ids: &[i64]) -> Result<Vec<statement::Row>> {
        let mut rows = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(BY_IDS) {
            rows.extend(self.hot_read(|placeholder| by_ids(select, chunk, placeholder)).await?);
        }
        Ok(rows)
    }

    /// The rows of the statement `build` makes for a placeholder style, read where the hot
    /// paths read. On SQLite the group commit's connection answers, between two commits, in
    /// one call to its thread: the rows the hot paths read were just written there and its
    /// cache still holds them (a reader's starts cold after every commit and hands each row
    /// to the caller's task through a channel of its own), and it reads a row for a fraction
    /// of what sqlx's `Any` row costs. Elsewhere a connection of the pool answers.
    async fn hot_read(
        &self,
        build: impl FnOnce(fn(usize) -> String) -> statement::Statement<'static>,
    ) -> Result<Vec<statement::Row>> {
        match &self.sqlite_writer {
            Some(writer) => writer.fetch_all(build(|_| "?".to_owned())).await,
            None => {
                let mut conn = self.pool.acquire().await?;
                let statement = build(placeholder(&conn));
                statement::Exec::Sqlx(&mut conn).fetch_all(&statement).await
            }
        }
    }
}

/// The most ids one read by id ([`by_ids`]) reads.
const BY_IDS: usize = 512;

/// `select` (`select … from table`) of the rows of `chunk`'s ids (at most [`BY_IDS`]), with
/// placeholders `placeholder`. The list of ids is padded with nulls, which match no row, to a
/// power of two: a query's prepared statement is kept for its text, and a text for each number
/// of ids was a new statement to prepare at almost every read.
fn by_ids(
    select: &str,
    chunk: &[i64],
    placeholder: fn(usize) -> String,
) -> statement::Statement<'static> {
    let shape = chunk.len().next_power_of_two();
    let placeholders: Vec<String> = (1..=shape).map(placeholder).collect();
    let mut statement =
        statement::Statement::new(format!("{select} where id in ({})", placeholders.join(", ")));
    for id in chunk {
        statement.bind(*id);
    }
    for _ in chunk.len()..shape {
        statement.bind(None::<i64>);
    }
    statement
}

/// Reads a column holding one of the `model` strategy enums.
fn parse_column<T: FromStr>(row: &impl statement::Cells, column: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    let text = row.required_text(column)?;
    text.parse().map_err(|error: T::Err| StorageError::Corrupt(format!("{column}: {error}")))
}

/// Splits a comma-separated column into its non-empty parts.
fn split_list(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|part| !part.is_empty())
}

#[cfg(test)]
mod tests;

/// Test support: a fresh PostgreSQL or MySQL database per test, for this crate's tests and
/// `tests/`.
#[doc(hidden)]
pub mod testing;

/// Splits `rows` rows into statements of a power of two rows each, at most `max` (13 rows are
/// 8, 4 and 1), so that a handful of statement shapes serve every batch and stay prepared.
fn statement_sizes(mut rows: usize, max: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let size = 1 << rows.min(max).checked_ilog2()?;
        rows -= size;
        Some(size)
    })
}

/// The statements `rows` rows go in, as (rows, shape): [`statement_sizes`]'s split, each
/// statement of its own rows, or with `pad` statements of `max` rows and a last one of the next
/// power of two, its extra rows ones that match nothing (`max` a power of two). Padding makes one
/// statement of what the split makes up to eight for a `max` of 256 (23 rows are 16, 4, 2 and 1,
/// or one of 32): on PostgreSQL each is a round trip, which costs more than the rows that pad it.
fn statement_shapes(rows: usize, max: usize, pad: bool) -> Vec<(usize, usize)> {
    if !pad {
        return statement_sizes(rows, max).map(|size| (size, size)).collect();
    }
    let mut shapes = vec![(max, max); rows / max];
    let last = rows % max;
    if last > 0 {
        shapes.push((last, last.next_power_of_two()));
    }
    shapes
}

/// The indexes of `keys` in rounds in which no key repeats: a key's first occurrence is in the
/// first round, its second in the second, and so on.
fn distinct_rounds(keys: impl IntoIterator<Item = i64>) -> Vec<Vec<usize>> {
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    let mut seen = foldhash::HashMap::default();
    for (index, key) in keys.into_iter().enumerate() {
        let round = seen.entry(key).or_insert(0_usize);
        if *round == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*round].push(index);
        *round += 1;
    }
    rounds
}

/// Placeholder `n` of a generated `values` list (`p` from [`placeholder`]) as a value of SQL
/// type `kind`: cast where placeholders are numbered (PostgreSQL, which must know the type of
/// each column of the list), and bare on SQLite (`?`), where a value keeps the type it was
/// bound with and a cast to text copies the text (some 7 % of a run update's cost there).
fn typed(p: fn(usize) -> String, n: usize, kind: &str) -> String {
    let placeholder = p(n);
    match placeholder.as_str() {
        "?" => placeholder,
        _ => format!("cast({placeholder} as {kind})"),
    }
}

/// The placeholder of the `n`th bind (from 1) of a generated statement on `conn`: `$n` on
/// PostgreSQL, and on SQLite an anonymous `?`, because SQLite finds a numbered parameter by
/// walking all of them, which makes binding a statement of thousands of them quadratic. Each
/// placeholder must therefore appear once, in the order of the binds.
fn placeholder(conn: &sqlx::AnyConnection) -> fn(usize) -> String {
    if conn.backend_name() == <sqlx::Sqlite as sqlx::Database>::NAME {
        |_| "?".to_owned()
    } else {
        |n| format!("${n}")
    }
}
