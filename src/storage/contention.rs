//! Contention: telling a moment's contention (a deadlock's victim, a lock wait that timed out)
//! from other failures, and sending a single statement that met one again.

use super::{Result, StorageError};

impl StorageError {
    /// Whether the statement failed for a moment's contention, and the same statement sent again
    /// may succeed: a deadlock's victim, a serialization failure or a lock wait that timed out
    /// (PostgreSQL, MySQL, MariaDB), a busy SQLite file, no connection free in time.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::Sqlx(sqlx::Error::PoolTimedOut) => true,
            StorageError::Sqlx(sqlx::Error::Database(error)) => {
                let mysql_number = error
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(sqlx::mysql::MySqlDatabaseError::number);
                // 40001: serialization failure (MySQL's deadlock, 1213, says it too); 40P01:
                // PostgreSQL's deadlock; 1205: MySQL's lock wait timeout.
                matches!(error.code().as_deref(), Some("40001" | "40P01"))
                    || matches!(mysql_number, Some(1205 | 1213))
            }
            StorageError::Sqlite(error) => matches!(
                error.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }

    /// Whether sending the same statement again at once may succeed: contention between
    /// statements, but not a pool with no connection free, whose every try would wait out the
    /// pool's whole acquire timeout again.
    fn is_worth_resending(&self) -> bool {
        self.is_transient() && !matches!(self, StorageError::Sqlx(sqlx::Error::PoolTimedOut))
    }

    /// A busy SQLite file's error: contention, for the tests of what callers make of it.
    #[cfg(test)]
    pub(crate) fn busy() -> StorageError {
        StorageError::sqlite(rusqlite::ffi::SQLITE_BUSY)
    }

    /// A SQLite error with result code `code`, as rusqlite reports one, for tests.
    #[cfg(test)]
    pub(crate) fn sqlite(code: std::ffi::c_int) -> StorageError {
        StorageError::Sqlite(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None))
    }
}

/// Runs `statement` until it succeeds or fails for more than a moment's contention between
/// statements ([`StorageError::is_transient`], less a pool with no connection free), at most [`TRANSIENT_TRIES`] times: for a single statement,
/// which a deadlock aborts whole, so that sending it again is safe.
pub(super) async fn retrying_transient<T, F, Fut>(mut statement: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 1;
    loop {
        match statement().await {
            Err(error) if error.is_worth_resending() && tries < TRANSIENT_TRIES => {
                tracing::debug!(%error, "a statement met contention: sending it again");
                tokio::time::sleep(std::time::Duration::from_millis(10 << tries)).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

/// How many times [`retrying_transient`] sends a statement.
pub(super) const TRANSIENT_TRIES: u32 = 4;
