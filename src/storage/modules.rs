//! Module blobs by sha256 and the versions of each job that point at them, with the source text
//! of versions uploaded as Python or JavaScript.

use super::query::query;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Db, Result};
use crate::model::{JobVersion, Language};

const VERSION_COLUMNS: &str = "job_id, version, sha256, size, remark, created_at, language,
    cast(case when source is null then 0 else 1 end as bigint) as has_source";

/// A version to add: the component and, for a source upload, the text it was built from.
#[derive(Debug, Clone, Copy)]
pub struct NewVersion<'a> {
    /// The component's sha256, lowercase hex.
    pub sha256: &'a str,
    /// The component's bytes.
    pub bytes: &'a [u8],
    /// The operator's remark.
    pub remark: &'a str,
    /// What it was uploaded as.
    pub language: Language,
    /// The source text, for a version uploaded as source.
    pub source: Option<&'a str>,
    /// How many versions of the job to keep, this one included; older ones are deleted.
    pub keep: i64,
}

impl Db {
    /// Stores the module `new.bytes` under its sha256 unless it is there already (same bytes,
    /// same blob), appends it as the next version of job `job_id`, makes that version active, and
    /// deletes the job's versions older than the newest `new.keep` (never the active one).
    pub async fn add_job_version(
        &self,
        job_id: i64,
        new: NewVersion<'_>,
        now_ms: i64,
    ) -> Result<JobVersion> {
        let NewVersion { sha256, bytes, remark, language, source, keep } = new;
        let mut tx = self.writer().begin().await?;
        query(
            "insert into modules (sha256, size, bytes, created_at) values ($1, $2, $3, $4)
             on conflict (sha256) do nothing",
        )
        .bind(sha256)
        .bind(bytes.len() as i64)
        .bind(bytes)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        let row = query(&format!(
            "insert into job_versions (job_id, version, sha256, size, remark, created_at, language, source)
             select $1, coalesce(max(version), 0) + 1, $2, $3, $4, $5, $6, $7 from job_versions where job_id = $1
             returning {VERSION_COLUMNS}"
        ))
        .bind(job_id)
        .bind(sha256)
        .bind(bytes.len() as i64)
        .bind(remark)
        .bind(now_ms)
        .bind(language.as_str())
        .bind(source)
        .fetch_one(&mut *tx)
        .await?;
        let version = version_from_row(&row)?;
        query("update jobs set active_version = $1, updated_at = $2, revision = revision + 1 where id = $3")
            .bind(version.version)
            .bind(now_ms)
            .bind(job_id)
            .execute(&mut *tx)
            .await?;
        query(
            "delete from job_versions where job_id = $1 and version <= $2
             and version <> (select active_version from jobs where id = $1)",
        )
        .bind(job_id)
        .bind(version.version - keep.max(1))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    /// Versions of job `job_id`, newest first.
    pub async fn list_job_versions(&self, job_id: i64) -> Result<Vec<JobVersion>> {
        let rows = query(&format!(
            "select {VERSION_COLUMNS} from job_versions where job_id = $1 order by version desc"
        ))
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(version_from_row).collect()
    }

    /// Version `version` of job `job_id`, if it exists.
    pub async fn get_job_version(&self, job_id: i64, version: i64) -> Result<Option<JobVersion>> {
        let row = query(&format!(
            "select {VERSION_COLUMNS} from job_versions where job_id = $1 and version = $2"
        ))
        .bind(job_id)
        .bind(version)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(version_from_row).transpose()
    }

    /// The source text of version `version` of job `job_id`: `None` when the version does not
    /// exist, `Some(None)` when it was uploaded as a component.
    pub async fn get_job_version_source(
        &self,
        job_id: i64,
        version: i64,
    ) -> Result<Option<Option<String>>> {
        let row = query("select source from job_versions where job_id = $1 and version = $2")
            .bind(job_id)
            .bind(version)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| Ok(row.try_get("source")?)).transpose()
    }

    /// Makes an existing version active (a rollback, or a roll forward). Whether it exists.
    pub async fn activate_job_version(
        &self,
        job_id: i64,
        version: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let done = query(
            "update jobs set active_version = $1, updated_at = $2, revision = revision + 1
             where id = $3 and exists (select 1 from job_versions where job_id = $3 and version = $1)",
        )
        .bind(version)
        .bind(now_ms)
        .bind(job_id)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The bytes of module `sha256`, if stored.
    pub async fn get_module(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        let row = query("select bytes from modules where sha256 = $1")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| Ok(row.try_get("bytes")?)).transpose()
    }

    /// On MySQL, the largest statement the server takes (`max_allowed_packet`), which bounds
    /// the module a statement can store; `None` elsewhere.
    pub async fn largest_statement_bytes(&self) -> Result<Option<u64>> {
        if self.dialect != super::Dialect::Mysql {
            return Ok(None);
        }
        let row =
            query("select cast(@@max_allowed_packet as bigint) as n").fetch_one(&self.pool).await?;
        Ok(Some(u64::try_from(row.try_get::<i64, _>("n")?).unwrap_or(0)))
    }

    /// How many module blobs are stored (the same bytes count once).
    pub async fn count_modules(&self) -> Result<i64> {
        let row = query("select count(*) as n from modules").fetch_one(&self.pool).await?;
        Ok(row.try_get("n")?)
    }
}

fn version_from_row(row: &AnyRow) -> Result<JobVersion> {
    Ok(JobVersion {
        job_id: row.try_get("job_id")?,
        version: row.try_get("version")?,
        sha256: row.try_get("sha256")?,
        size: row.try_get("size")?,
        remark: row.try_get("remark")?,
        created_at_ms: row.try_get("created_at")?,
        language: row.try_get::<String, _>("language")?.parse().unwrap_or(Language::Wasm),
        has_source: row.try_get::<i64, _>("has_source")? == 1,
    })
}
