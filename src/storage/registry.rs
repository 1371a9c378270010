//! The executor registry (XXL-JOB's `xxl_job_registry`): one row per heartbeat source.

use sqlx::Row;

use super::{Db, Result};
use crate::model::Registration;

impl Db {
    /// Records a heartbeat of `address` for `app_name` at `now_ms`.
    pub async fn upsert_registration(
        &self,
        group: &str,
        app_name: &str,
        address: &str,
        now_ms: i64,
    ) -> Result<()> {
        sqlx::query(
            "insert into registry (registry_group, registry_key, registry_value, updated_at)
             values ($1, $2, $3, $4)
             on conflict (registry_group, registry_key, registry_value)
             do update set updated_at = excluded.updated_at",
        )
        .bind(group)
        .bind(app_name)
        .bind(address)
        .bind(now_ms)
        .execute(self.writer())
        .await?;
        Ok(())
    }

    /// Forgets `address` for `app_name` (a graceful shutdown).
    pub async fn remove_registration(
        &self,
        group: &str,
        app_name: &str,
        address: &str,
    ) -> Result<()> {
        sqlx::query(
            "delete from registry where registry_group = $1 and registry_key = $2 and registry_value = $3",
        )
        .bind(group)
        .bind(app_name)
        .bind(address)
        .execute(self.writer())
        .await?;
        Ok(())
    }

    /// Addresses of `app_name` heard from at or after `since_ms`, sorted.
    pub async fn online_addresses(
        &self,
        group: &str,
        app_name: &str,
        since_ms: i64,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "select registry_value from registry
             where registry_group = $1 and registry_key = $2 and updated_at >= $3
             order by registry_value",
        )
        .bind(group)
        .bind(app_name)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("registry_value")?)).collect()
    }

    /// Every registry row of `group`, by application and address.
    pub async fn list_registrations(&self, group: &str) -> Result<Vec<Registration>> {
        let rows = sqlx::query(
            "select registry_key, registry_value, updated_at from registry
             where registry_group = $1 order by registry_key, registry_value",
        )
        .bind(group)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Registration {
                    app_name: row.try_get("registry_key")?,
                    address: row.try_get("registry_value")?,
                    updated_at_ms: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Deletes rows not heard from since `before_ms`; returns how many.
    pub async fn remove_stale_registrations(&self, before_ms: i64) -> Result<u64> {
        let done = sqlx::query("delete from registry where updated_at < $1")
            .bind(before_ms)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected())
    }
}
