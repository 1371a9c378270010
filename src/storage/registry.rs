//! The executor registry (XXL-JOB's `xxl_job_registry`): one row per heartbeat source, with
//! what answers at the address (its peer kind) as its last registration showed.
//!
//! The peer kind is stored as the admin spells it and read back as text: what the spellings mean
//! is the admin's business (`admin::dispatch::peers`), not storage's.

use super::query::query;
use sqlx::Row;

use super::{Db, Result};
use crate::model::Registration;

/// The latest registration of an address: for which application, and what answers there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredPeer {
    /// The application it registered for (`registryKey`).
    pub app_name: String,
    /// What answers there, as the admin spelled it; empty when unknown.
    pub peer_kind: String,
}

/// What a registration says of the executor behind an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer<'a> {
    /// What answers there, as the admin spells it (`wasmjob`, `xxl-job`, `xxl-job-3.5`).
    pub kind: &'a str,
    /// The version it reported; `""` when it reported none (XXL-JOB executors).
    pub version: &'a str,
}

impl Db {
    /// Records a heartbeat of `address` for `app_name` at `now_ms`, what answers there, and the
    /// version it reported (`""` when it reported none).
    pub async fn upsert_registration(
        &self,
        group: &str,
        app_name: &str,
        address: &str,
        peer: &Peer<'_>,
        now_ms: i64,
    ) -> Result<()> {
        query(
            "insert into registry
                 (registry_group, registry_key, registry_value, updated_at, peer_kind, version)
             values ($1, $2, $3, $4, $5, $6)
             on conflict (registry_group, registry_key, registry_value)
             do update set updated_at = excluded.updated_at, peer_kind = excluded.peer_kind,
                           version = excluded.version",
        )
        .bind(group)
        .bind(app_name)
        .bind(address)
        .bind(now_ms)
        .bind(peer.kind)
        .bind(peer.version)
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
        query(
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
        let rows = query(
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

    /// The latest registration of `address` in `group`, whatever its age; `None` if it has none
    /// (it deregistered, was forgotten, or never registered).
    pub async fn registered_peer(
        &self,
        group: &str,
        address: &str,
    ) -> Result<Option<RegisteredPeer>> {
        let row = query(
            "select registry_key, peer_kind from registry
             where registry_group = $1 and registry_value = $2
             order by updated_at desc, registry_key limit 1",
        )
        .bind(group)
        .bind(address)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(RegisteredPeer {
            app_name: row.try_get("registry_key")?,
            peer_kind: row.try_get("peer_kind")?,
        }))
    }

    /// Every registry row of `group`, by application and address.
    pub async fn list_registrations(&self, group: &str) -> Result<Vec<Registration>> {
        let rows = query(
            "select registry_key, registry_value, updated_at, peer_kind, version from registry
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
                    peer_kind: row.try_get("peer_kind")?,
                    version: row.try_get("version")?,
                })
            })
            .collect()
    }

    /// Deletes rows not heard from since `before_ms`; returns how many.
    pub async fn remove_stale_registrations(&self, before_ms: i64) -> Result<u64> {
        let done = query("delete from registry where updated_at < $1")
            .bind(before_ms)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected())
    }
}
