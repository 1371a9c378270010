//! The audit log: one row per state change, appended and read newest first, never changed.

use super::query::query;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::statement::{Exec, Statement};
use super::{Db, Result};

/// A state change to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Who: a user's name, or `operator-token`.
    pub actor: String,
    /// The user, if a user did it.
    pub user_id: Option<i64>,
    /// From where: the client's address, when known.
    pub source: String,
    /// What, as `noun.verb`: `job.update`, `login.failed`.
    pub action: String,
    /// On what: `job 7`, `user alice`.
    pub target: String,
    /// The thing before the change (JSON), where that is kept.
    pub before_json: Option<String>,
    /// The thing after the change (JSON), where that is kept.
    pub after_json: Option<String>,
}

/// A recorded change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Its id, increasing.
    pub id: i64,
    /// When (ms).
    pub at_ms: i64,
    /// What was recorded.
    pub entry: AuditEntry,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone)]
pub struct AuditPage {
    /// Rows matching, all pages together.
    pub total: i64,
    /// This page.
    pub items: Vec<AuditRecord>,
}

impl Db {
    /// Newest first, optionally of one actor and of actions starting with `action_prefix`.
    pub async fn list_audit(
        &self,
        actor: Option<&str>,
        action_prefix: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<AuditPage> {
        let actor = actor.unwrap_or("");
        // The prefix is matched with `substr`, so `_` and `%` in it mean themselves.
        let prefix = action_prefix.unwrap_or("");
        let filter = "($1 = '' or actor = $1) and ($2 = '' or substr(action, 1, length($2)) = $2)";
        let total: i64 = query(&format!("select count(*) as n from audit where {filter}"))
            .bind(actor)
            .bind(prefix)
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        let rows = query(&format!(
            "select id, at, actor, user_id, source, action, target, before_json, after_json
             from audit where {filter} order by id desc limit $3 offset $4"
        ))
        .bind(actor)
        .bind(prefix)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let items = rows.iter().map(record_from_row).collect::<Result<_>>()?;
        Ok(AuditPage { total, items })
    }
}

fn record_from_row(row: &AnyRow) -> Result<AuditRecord> {
    Ok(AuditRecord {
        id: row.try_get("id")?,
        at_ms: row.try_get("at")?,
        entry: AuditEntry {
            actor: row.try_get("actor")?,
            user_id: row.try_get("user_id")?,
            source: row.try_get("source")?,
            action: row.try_get("action")?,
            target: row.try_get("target")?,
            before_json: row.try_get("before_json")?,
            after_json: row.try_get("after_json")?,
        },
    })
}

/// `entry` with the ids of the runs created with it added to its after JSON (an object, or
/// none) as `log_ids`.
pub(super) fn with_log_ids(entry: &AuditEntry, ids: &[i64]) -> AuditEntry {
    let mut after = entry
        .after_json
        .as_deref()
        .and_then(|json| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json).ok()
        })
        .unwrap_or_default();
    after.insert("log_ids".to_owned(), ids.into());
    AuditEntry { after_json: Some(serde_json::Value::Object(after).to_string()), ..entry.clone() }
}

/// Appends `entries` (each with its instant) through `exec`, in a few statements.
pub(super) async fn insert_many(exec: &mut Exec<'_>, entries: &[(&AuditEntry, i64)]) -> Result<()> {
    let mut rest = entries;
    for rows in super::statement_sizes(entries.len(), 256) {
        let sql = super::statement::shaped(exec, "insert into audit", rows, || {
            let p = exec.placeholder();
            let values = (0..rows)
                .map(|row| {
                    let cells = (1..=8).map(|n| p(row * 8 + n));
                    format!("({})", cells.collect::<Vec<_>>().join(", "))
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "insert into audit (at, actor, user_id, source, action, target, before_json,
                    after_json)
                 values {values}"
            )
        });
        let mut statement = Statement::new(sql);
        for (entry, now_ms) in &rest[..rows] {
            statement
                .bind(*now_ms)
                .bind(entry.actor.as_str())
                .bind(entry.user_id)
                .bind(entry.source.as_str())
                .bind(entry.action.as_str())
                .bind(entry.target.as_str())
                .bind(entry.before_json.as_deref())
                .bind(entry.after_json.as_deref());
        }
        exec.fetch_all(&statement).await?;
        rest = &rest[rows..];
    }
    Ok(())
}
