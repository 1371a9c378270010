//! Test support: a fresh PostgreSQL or MySQL database per test (created on the server the
//! `WASMJOB_TEST_*_URL` variables name, dropped after), for this crate's tests and `tests/`.

use std::time::Duration;

use sqlx::AnyPool;

/// Creates an empty database on the server of `WASMJOB_TEST_POSTGRES_URL` and returns its
/// URL, or `None` when the variable is unset (PostgreSQL tests are then skipped).
pub async fn postgres_database(label: &str) -> anyhow::Result<Option<String>> {
    #[expect(clippy::disallowed_methods, reason = "test configuration, read only by tests")]
    let Ok(server_url) = std::env::var("WASMJOB_TEST_POSTGRES_URL") else {
        return Ok(None);
    };
    let label: String = label.chars().filter(char::is_ascii_alphanumeric).take(20).collect();
    let name = format!("wasmjob_test_{label}_{:08x}", rand::random::<u32>());
    let base = server_url.rsplit_once('/').map_or(server_url.as_str(), |(base, _)| base);
    let url = format!("{base}/{name}");
    create_postgres_database(&url).await?;
    Ok(Some(url))
}

/// Creates the database `url` names (made by [`postgres_database`] and dropped since) on
/// the server of `WASMJOB_TEST_POSTGRES_URL`.
pub async fn create_postgres_database(url: &str) -> anyhow::Result<()> {
    #[expect(clippy::disallowed_methods, reason = "test configuration, read only by tests")]
    let server_url = std::env::var("WASMJOB_TEST_POSTGRES_URL")?;
    let name = url.rsplit_once('/').map_or(url, |(_, name)| name);
    sqlx::any::install_default_drivers();
    let server = AnyPool::connect(&server_url).await?;
    // Concurrent CREATE DATABASE statements contend for the template database
    // ("source database is being accessed by other users"): try again a few times.
    let mut attempt = 0;
    loop {
        match sqlx::query(&format!("create database {name}")).execute(&server).await {
            Ok(_) => break,
            Err(error) if attempt < 20 => {
                attempt += 1;
                tracing::debug!(%error, "create database {name}: retrying");
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
    server.close().await;
    Ok(())
}

/// Drops a database made by [`postgres_database`], closing whatever still uses it.
pub async fn drop_postgres_database(url: &str) -> anyhow::Result<()> {
    let Some((base, name)) = url.rsplit_once('/') else { return Ok(()) };
    #[expect(clippy::disallowed_methods, reason = "test configuration, read only by tests")]
    let server_url =
        std::env::var("WASMJOB_TEST_POSTGRES_URL").unwrap_or_else(|_| format!("{base}/postgres"));
    let server = AnyPool::connect(&server_url).await?;
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&server).await?;
    server.close().await;
    Ok(())
}

/// Creates an empty database (`utf8mb4`, binary collation without padding) on the server of
/// `WASMJOB_TEST_MYSQL_URL` and returns its URL, or `None` when the variable is unset
/// (MySQL tests are then skipped).
pub async fn mysql_database(label: &str) -> anyhow::Result<Option<String>> {
    #[expect(clippy::disallowed_methods, reason = "test configuration, read only by tests")]
    let Ok(server_url) = std::env::var("WASMJOB_TEST_MYSQL_URL") else {
        return Ok(None);
    };
    let label: String = label.chars().filter(char::is_ascii_alphanumeric).take(20).collect();
    let name = format!("wasmjob_test_{label}_{:08x}", rand::random::<u32>());
    let server_url = server_url.trim_end_matches('/');
    let base = match server_url.split_once("://") {
        Some((_, rest)) if rest.contains('/') => {
            server_url.rsplit_once('/').map_or(server_url, |(base, _)| base)
        }
        _ => server_url,
    };
    sqlx::any::install_default_drivers();
    let server = AnyPool::connect(base).await?;
    sqlx::query(&format!("create database {name} character set utf8mb4 collate utf8mb4_nopad_bin"))
        .execute(&server)
        .await?;
    server.close().await;
    Ok(Some(format!("{base}/{name}")))
}

/// Runs `sql` (written as the storage layer's statements are, see `query.rs`) on `pool`,
/// translated for MySQL when the pool is MySQL's: for tests that read the database as the
/// admin left it.
pub async fn fetch_all(
    pool: &AnyPool,
    sql: &str,
    args: &[i64],
) -> Result<Vec<sqlx::any::AnyRow>, sqlx::Error> {
    let mut query = super::query::query(sql);
    for arg in args {
        query = query.bind(*arg);
    }
    query.fetch_all(pool).await
}

/// Drops a database made by [`mysql_database`].
pub async fn drop_mysql_database(url: &str) -> anyhow::Result<()> {
    let Some((base, name)) = url.rsplit_once('/') else { return Ok(()) };
    let server = AnyPool::connect(base).await?;
    sqlx::query(&format!("drop database if exists {name}")).execute(&server).await?;
    server.close().await;
    Ok(())
}
