//! Executor groups (XXL-JOB's `xxl_job_group`).

use super::query::query;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Db, Result, parse_column, split_list};
use crate::model::{AddressType, Group};

const COLUMNS: &str = "id, app_name, title, address_type, addresses, max_concurrent_runs";

impl Db {
    /// Creates a group; a duplicate `app_name` is a constraint violation.
    pub async fn create_group(
        &self,
        app_name: &str,
        title: &str,
        address_type: AddressType,
        addresses: &[String],
        max_concurrent_runs: i64,
        now_ms: i64,
    ) -> Result<Group> {
        let row = query(&format!(
            "insert into groups (app_name, title, address_type, addresses, max_concurrent_runs,
                created_at, updated_at)
             values ($1, $2, $3, $4, $5, $6, $6) returning {COLUMNS}"
        ))
        .bind(app_name)
        .bind(title)
        .bind(address_type.as_str())
        .bind(addresses.join(","))
        .bind(max_concurrent_runs)
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        group_from_row(&row)
    }

    /// Replaces group `id`'s title, addresses and cap (its `app_name` stays: executors register
    /// under it). `None` when there is no such group.
    pub async fn update_group(
        &self,
        id: i64,
        title: &str,
        address_type: AddressType,
        addresses: &[String],
        max_concurrent_runs: i64,
        now_ms: i64,
    ) -> Result<Option<Group>> {
        let row = query(&format!(
            "update groups set title = $1, address_type = $2, addresses = $3,
                max_concurrent_runs = $4, updated_at = $5
             where id = $6 returning {COLUMNS}"
        ))
        .bind(title)
        .bind(address_type.as_str())
        .bind(addresses.join(","))
        .bind(max_concurrent_runs)
        .bind(now_ms)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(group_from_row).transpose()
    }

    /// Creates the group `app_name` unless it exists, and returns it either way.
    pub async fn ensure_group(&self, app_name: &str, title: &str, now_ms: i64) -> Result<Group> {
        query(
            "insert into groups (app_name, title, address_type, addresses, created_at, updated_at)
             values ($1, $2, 'AUTO', '', $3, $3) on conflict (app_name) do nothing",
        )
        .bind(app_name)
        .bind(title)
        .bind(now_ms)
        .execute(self.writer())
        .await?;
        let row = query(&format!("select {COLUMNS} from groups where app_name = $1"))
            .bind(app_name)
            .fetch_one(self.writer())
            .await?;
        group_from_row(&row)
    }

    /// The group `id`, if it exists.
    pub async fn get_group(&self, id: i64) -> Result<Option<Group>> {
        let row = query(&format!("select {COLUMNS} from groups where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(group_from_row).transpose()
    }

    /// All groups, by id.
    pub async fn list_groups(&self) -> Result<Vec<Group>> {
        let rows = query(&format!("select {COLUMNS} from groups order by id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(group_from_row).collect()
    }
}

fn group_from_row(row: &AnyRow) -> Result<Group> {
    let addresses: String = row.try_get("addresses")?;
    Ok(Group {
        id: row.try_get("id")?,
        app_name: row.try_get("app_name")?,
        title: row.try_get("title")?,
        address_type: parse_column(row, "address_type")?,
        addresses: split_list(&addresses).map(str::to_owned).collect(),
        max_concurrent_runs: row.try_get("max_concurrent_runs")?,
    })
}
