//! The SQLite group commit's own connection, on its own thread.
//!
//! Through sqlx, each statement of a transaction, and each row it returns, is a hop between the
//! async task and the connection's thread; under load a hop waits for that thread to be
//! scheduled, and a group commit of a dozen runs made twenty of them. Here the committing task
//! hands the whole transaction to this thread in one call ([`SqliteWriter::run`]), which runs
//! every statement and answers once. The statements are the ones the sqlx path runs
//! ([`super::statement`]).
//!
//! The group commit, the scheduler's fires (`fires.rs`) and the admin's beats (`partitions.rs`)
//! write here ([`SqliteWriter::write`]), each only while it holds the sqlx writer pool's one
//! connection, so this connection and that pool never write at the same time: writers still
//! queue instead of sleeping in SQLite's busy handler. A hot read may come here too, between
//! two commits ([`SqliteWriter::fetch_all`]).
//!
//! In WAL mode a connection empties its page cache when it finds that another connection has
//! committed since its own last transaction. With the fires and the beats committed through
//! the sqlx writer, this connection read its pages again from the files about twice a second.
//! The writes left on the sqlx writer (an edit through the API, an executor's registration, a
//! sweep, a claim or a transition that the group commit does not regroup) are rare in the
//! steady state, and the cache is larger than SQLite's 2 MB default ([`CACHE_KIB`]).

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use sqlx::AnyPool;
use tokio::sync::oneshot;

use super::statement::{Exec, Row, Statement};
use super::{Result, StorageError};

type Work = Box<dyn FnOnce(&mut Connection) + Send>;

/// The page cache of the writer's connection, in KiB: the pages of the runs and their indexes
/// that the group commit touches again and again. Under workload (x) of `cargo bench --bench e2e`
/// at 2,000 jobs a second, with the default 2 MB the writer read pages back from the files (the
/// kernel's copies) even between other connections' commits; 8 MiB cost as little CPU as
/// 32 MiB, for 5 MB of memory, not 25 (docs/performance.md).
const CACHE_KIB: i64 = 8 * 1024;

/// The handle of the writer thread; the thread ends, closing its connection, when the handle is
/// dropped.
pub(super) struct SqliteWriter {
    work: std::sync::mpsc::Sender<Work>,
}

impl SqliteWriter {
    /// Opens the database at `path` (created and migrated already) with the settings of the
    /// sqlx connections, and starts the thread.
    pub(super) fn open(path: &Path) -> anyhow::Result<SqliteWriter> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags)?;
        // As on the sqlx connections (`Db::connect`): sqlx turns foreign keys on by default.
        conn.pragma_update(None, "foreign_keys", "on")?;
        conn.pragma_update(None, "synchronous", "full")?;
        conn.pragma_update(None, "temp_store", "memory")?;
        conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
        conn.pragma_update(None, "wal_autocheckpoint", super::CHECKPOINT_PAGES)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // One prepared statement per shape: the batch sizes are powers of two.
        conn.set_prepared_statement_cache_capacity(128);
        let (work, queue) = std::sync::mpsc::channel::<Work>();
        std::thread::Builder::new().name("wasmjob-sqlite-writer".to_owned()).spawn(move || {
            for work in queue {
                // A panic ends that call alone (its caller hears nothing and reports an error):
                // what it left open is rolled back, and the thread goes on with the next.
                let ran = std::panic::catch_unwind(AssertUnwindSafe(|| work(&mut conn)));
                if ran.is_err() && !conn.is_autocommit() {
                    let _ = conn.execute_batch("rollback");
                }
            }
        })?;
        Ok(SqliteWriter { work })
    }

    /// Runs `work` on the writer's connection and returns what it returned; `None` if it
    /// panicked.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        let work: Work = Box::new(move |conn| {
            let _ = reply.send(work(conn));
        });
        self.work.send(work).ok()?;
        answer.await.ok()
    }

    /// Runs `work` as one transaction on the writer's connection, holding `pool` (the sqlx
    /// writer pool of one connection) meanwhile so that nothing else writes; `work`'s error, or
    /// an error if it panicked, rolls it back. `work` builds its statements' future over an
    /// [`Exec::Sqlite`] and passes it to [`ready`].
    pub(super) async fn write<T: Send + 'static>(
        &self,
        pool: &AnyPool,
        work: impl FnOnce(&mut Exec<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let held = pool.acquire().await?;
        let ran =
            self.run(move |conn| transaction(conn, |conn| work(&mut Exec::Sqlite(conn)))).await;
        drop(held);
        ran.unwrap_or_else(|| Err(panicked()))
    }

    /// Runs `statement`, a read, on the writer's connection, between two group commits.
    pub(super) async fn fetch_all(&self, statement: Statement<'static>) -> Result<Vec<Row>> {
        let read = self.run(move |conn| ready(Exec::Sqlite(conn).fetch_all(&statement))).await;
        read.unwrap_or_else(|| Err(panicked()))
    }
}

/// The error of a call to the writer that panicked: what it did is rolled back.
pub(super) fn panicked() -> StorageError {
    StorageError::Batch("the SQLite writer failed on this call (a panic)".to_owned())
}

/// The output of `future`, which must not wait: on the writer's thread every statement is done
/// when its call returns, so a future of statements there is ready at its first poll.
pub(super) fn ready<T>(future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => {
            Err(StorageError::Batch("a statement on the SQLite writer waited".to_owned()))
        }
    }
}

/// Runs `statement`, which returns nothing, in a savepoint of the transaction on `conn`: kept
/// when it changed `rows` rows, undone when it changed fewer (or failed). Whether it was kept.
/// SQLite gathers the rows a statement returns in a temporary table, most of what returning a
/// row costs; a statement whose rows are known when each matched runs so, and runs again
/// returning them when one did not.
pub(super) fn changed_all(
    conn: &mut Connection,
    statement: &Statement<'_>,
    rows: usize,
) -> Result<bool> {
    conn.prepare_cached("savepoint counted")?.execute([])?;
    let changed = conn
        .prepare_cached(&statement.sql)
        .and_then(|mut prepared| prepared.execute(rusqlite::params_from_iter(&statement.args)));
    let all = matches!(changed, Ok(count) if count == rows);
    if !all {
        conn.prepare_cached("rollback to counted")?.execute([])?;
    }
    conn.prepare_cached("release counted")?.execute([])?;
    changed?;
    Ok(all)
}

/// Runs a transaction on `conn`: `work` between `begin immediate` and `commit`, rolled back
/// when it fails.
pub(super) fn transaction<T>(
    conn: &mut Connection,
    work: impl FnOnce(&mut Connection) -> Result<T>,
) -> Result<T> {
    conn.execute_batch("begin immediate")?;
    match work(conn).and_then(|done| Ok(conn.execute_batch("commit").map(|()| done)?)) {
        Ok(done) => Ok(done),
        Err(error) => {
            // Nothing to roll back when the commit itself rolled back.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("rollback");
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_panics_fails_alone_and_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writer.db");
        Connection::open(&path).unwrap().execute_batch("create table t (x integer)").unwrap();
        let writer = SqliteWriter::open(&path).unwrap();
        let panicked = writer
            .run(|conn| {
                conn.execute_batch("begin immediate; insert into t values (1)").unwrap();
                std::panic::panic_any("a bug in a batch");
            })
            .await;
        assert!(panicked.is_none());
        let after = writer
            .run(|conn| {
                let open = !conn.is_autocommit();
                let rows: i64 = conn.query_row("select count(*) from t", [], |row| row.get(0))?;
                Ok::<_, rusqlite::Error>((open, rows))
            })
            .await;
        assert_eq!(after.unwrap().unwrap(), (false, 0), "rolled back, and the thread goes on");
    }

    /// The SQLite that sqlx and this connection share is built as `.cargo/config.toml` says:
    /// no count of its memory, whose lock every allocation took, and a page cache per
    /// connection without a lock.
    #[test]
    fn sqlite_is_built_without_memory_statistics_or_a_shared_page_cache() {
        let conn = Connection::open_in_memory().unwrap();
        let mut statement = conn.prepare("pragma compile_options").unwrap();
        let options = statement.query_map([], |row| row.get::<_, String>(0)).unwrap();
        let options = options.collect::<rusqlite::Result<Vec<_>>>().unwrap();
        assert!(options.iter().any(|option| option == "DEFAULT_MEMSTATUS=0"), "{options:?}");
        assert!(!options.iter().any(|option| option == "ENABLE_MEMORY_MANAGEMENT"), "{options:?}");
    }
}
