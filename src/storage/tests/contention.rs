//! Contention: a deadlock's victim is told apart from other failures, and a single statement
//! that met one is sent again.

use super::*;
use crate::storage::contention::{TRANSIENT_TRIES, retrying_transient};

#[tokio::test]
async fn a_statement_is_sent_again_only_while_it_meets_contention() {
    let table = [
        // (failures before success, each failure's code, calls made, succeeded)
        (0, rusqlite::ffi::SQLITE_BUSY, 1, true),
        (2, rusqlite::ffi::SQLITE_BUSY, 3, true),
        (3, rusqlite::ffi::SQLITE_LOCKED, 4, true),
        (9, rusqlite::ffi::SQLITE_BUSY, TRANSIENT_TRIES, false),
        (9, rusqlite::ffi::SQLITE_CONSTRAINT, 1, false),
        (9, rusqlite::ffi::SQLITE_CORRUPT, 1, false),
    ];
    for (failures, code, calls, succeeded) in table {
        let made = std::sync::atomic::AtomicU32::new(0);
        let outcome = retrying_transient(|| async {
            let call = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if call < failures { Err(StorageError::sqlite(code)) } else { Ok(call) }
        })
        .await;
        let case = format!("{failures} failures of {code}");
        assert_eq!(made.into_inner(), calls, "{case}");
        assert_eq!(outcome.is_ok(), succeeded, "{case}");
    }
    // No pool connection free in time is contention to the caller (a 503), but the statement is
    // not sent again: every try would wait out the pool's whole acquire timeout.
    let made = std::sync::atomic::AtomicU32::new(0);
    let outcome: Result<()> = retrying_transient(|| async {
        made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(StorageError::Sqlx(sqlx::Error::PoolTimedOut))
    })
    .await;
    assert_eq!(made.into_inner(), 1);
    assert!(outcome.unwrap_err().is_transient());
}

#[tokio::test]
async fn a_deadlocks_victim_is_transient_and_other_failures_are_not() {
    each_backend("deadlock", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let first = db.create_job(&new_job(group.id), 10).await.unwrap().id;
        let second = db.create_job(&new_job(group.id), 10).await.unwrap().id;
        let constraint = db.create_group("default", "Again", AddressType::Auto, &[], 0, 10).await;
        assert!(!constraint.unwrap_err().is_transient(), "a unique violation is not transient");
        if db.dialect() == Dialect::Sqlite {
            // One writer at a time: a SQLite file has no deadlocks between statements.
            return;
        }
        // Two transactions lock the two jobs' rows in opposite orders.
        let touch =
            |id: i64| format!("update jobs set updated_at = updated_at + 1 where id = {id}");
        let (touch_first, touch_second) = (touch(first), touch(second));
        let mut one = db.writer().begin().await.unwrap();
        let mut other = db.writer().begin().await.unwrap();
        sqlx::query(&touch_first).execute(&mut *one).await.unwrap();
        sqlx::query(&touch_second).execute(&mut *other).await.unwrap();
        let (one_done, other_done) =
            tokio::join!(sqlx::query(&touch_second).execute(&mut *one), async {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                sqlx::query(&touch_first).execute(&mut *other).await
            });
        let failed: Vec<StorageError> =
            [one_done.err(), other_done.err()].into_iter().flatten().map(Into::into).collect();
        assert_eq!(failed.len(), 1, "one of the two is the deadlock's victim: {failed:?}");
        assert!(failed[0].is_transient(), "{:?}", failed[0]);
        // Let go of the winner's locks (the victim's transaction is rolled back already).
        one.rollback().await.unwrap_or_default();
        other.rollback().await.unwrap_or_default();
        // The stop that the victim's statement stood for goes through once sent.
        assert!(db.set_job_running(first, None, 20).await.unwrap());
    })
    .await;
}
