//! Reading an XXL-JOB admin's MySQL or MariaDB database, for `wasmjob import xxl-job`: its
//! executor groups, its jobs and their GLUE source history, in whichever generation's table
//! layout it has. It only reads.
//!
//! The layouts that differ, told apart by `xxl_job_info`'s columns:
//! - 2.2: `job_cron` holds a cron expression; there is no `schedule_type`, `schedule_conf` or
//!   `misfire_strategy`;
//! - 2.3 to 3.4: `schedule_type`, `schedule_conf`, `misfire_strategy`; `job_desc` names the job
//!   and `xxl_job_group.title` the group;
//! - 3.5: `xxl_job_info.name` and `xxl_job_group.name` replace `job_desc` and `title`.

use anyhow::Context as _;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, Row};

/// Which table layout a database has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XxlLayout {
    /// 2.2: `job_cron`.
    V2_2,
    /// 2.3 to 3.4: `schedule_type` and `job_desc`.
    V2_3,
    /// 3.5: `name` instead of `job_desc` and `title`.
    V3_5,
}

impl XxlLayout {
    /// The XXL-JOB versions with this layout.
    pub fn versions(self) -> &'static str {
        match self {
            XxlLayout::V2_2 => "2.2",
            XxlLayout::V2_3 => "2.3 to 3.4",
            XxlLayout::V3_5 => "3.5",
        }
    }
}

/// A row of `xxl_job_group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XxlGroup {
    pub id: i64,
    pub app_name: String,
    pub title: String,
    /// 0: executors register themselves; 1: `address_list` is entered by hand.
    pub address_type: i64,
    /// Comma-separated executor addresses.
    pub address_list: String,
}

/// A row of `xxl_job_info`, with the 2.2 `job_cron` read as a `CRON` schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XxlJob {
    pub id: i64,
    pub job_group: i64,
    /// `job_desc`, or 3.5's `name`.
    pub name: String,
    pub author: String,
    pub alarm_email: String,
    pub schedule_type: String,
    pub schedule_conf: String,
    pub misfire_strategy: String,
    pub route_strategy: String,
    pub handler: String,
    pub param: String,
    pub block_strategy: String,
    pub timeout_secs: i64,
    pub retry_count: i64,
    pub glue_type: String,
    pub glue_source: String,
    /// Comma-separated ids of the jobs run after each success.
    pub child_job_ids: String,
    /// 1: scheduled; 0: stopped.
    pub trigger_status: i64,
}

/// A row of `xxl_job_logglue`: an earlier GLUE source of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XxlGlue {
    pub id: i64,
    pub job_id: i64,
    pub glue_type: String,
    pub glue_source: String,
    pub glue_remark: String,
}

/// What an XXL-JOB database holds that an import takes.
#[derive(Debug, Clone)]
pub struct XxlDatabase {
    pub layout: XxlLayout,
    pub groups: Vec<XxlGroup>,
    pub jobs: Vec<XxlJob>,
    /// Earlier sources, oldest first.
    pub glue_history: Vec<XxlGlue>,
}

/// Reads the XXL-JOB database at `url` (`mysql://user:password@host:3306/xxl_job`).
pub async fn read_xxl_job(url: &str) -> anyhow::Result<XxlDatabase> {
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(url)
        .await
        .context("connecting to the XXL-JOB database")?;
    let result = read(&pool).await;
    pool.close().await;
    result
}

async fn read(pool: &MySqlPool) -> anyhow::Result<XxlDatabase> {
    let columns = |table: &'static str| async move {
        let rows = sqlx::query(
            "select cast(column_name as char) as name from information_schema.columns
             where table_schema = database() and table_name = ?",
        )
        .bind(table)
        .fetch_all(pool)
        .await?;
        rows.iter().map(|row| row.try_get::<String, _>("name")).collect::<Result<Vec<_>, _>>()
    };
    let info = columns("xxl_job_info").await?;
    if info.is_empty() {
        anyhow::bail!("the database has no table xxl_job_info: is it XXL-JOB's?");
    }
    let has = |name: &str| info.iter().any(|column| column.eq_ignore_ascii_case(name));
    let layout = if has("job_cron") {
        XxlLayout::V2_2
    } else if has("job_desc") {
        XxlLayout::V2_3
    } else if has("name") {
        XxlLayout::V3_5
    } else {
        anyhow::bail!("xxl_job_info has neither job_cron, job_desc nor name: an unknown layout");
    };
    let title = if layout == XxlLayout::V3_5 { "name" } else { "title" };
    let groups = sqlx::query(&format!(
        "select cast(id as signed) as id, app_name, coalesce({title}, '') as title,
            cast(address_type as signed) as address_type, coalesce(address_list, '') as address_list
         from xxl_job_group order by id"
    ))
    .fetch_all(pool)
    .await
    .context("reading xxl_job_group")?
    .iter()
    .map(|row| {
        Ok(XxlGroup {
            id: row.try_get("id")?,
            app_name: row.try_get("app_name")?,
            title: row.try_get("title")?,
            address_type: row.try_get("address_type")?,
            address_list: row.try_get("address_list")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let (name, schedule) = match layout {
        XxlLayout::V2_2 => (
            "job_desc",
            "case when coalesce(job_cron, '') = '' then 'NONE' else 'CRON' end as schedule_type,
             coalesce(job_cron, '') as schedule_conf, 'DO_NOTHING' as misfire_strategy",
        ),
        XxlLayout::V2_3 | XxlLayout::V3_5 => (
            if layout == XxlLayout::V2_3 { "job_desc" } else { "name" },
            "schedule_type, coalesce(schedule_conf, '') as schedule_conf, misfire_strategy",
        ),
    };
    let jobs = sqlx::query(&format!(
        "select cast(id as signed) as id, cast(job_group as signed) as job_group,
            {name} as name, coalesce(author, '') as author, coalesce(alarm_email, '') as alarm_email,
            {schedule}, coalesce(executor_route_strategy, '') as route_strategy,
            coalesce(executor_handler, '') as handler, coalesce(executor_param, '') as param,
            coalesce(executor_block_strategy, '') as block_strategy,
            cast(executor_timeout as signed) as timeout_secs,
            cast(executor_fail_retry_count as signed) as retry_count, glue_type,
            coalesce(glue_source, '') as glue_source, coalesce(child_jobid, '') as child_job_ids,
            cast(trigger_status as signed) as trigger_status
         from xxl_job_info order by id"
    ))
    .fetch_all(pool)
    .await
    .context("reading xxl_job_info")?
    .iter()
    .map(|row| {
        Ok(XxlJob {
            id: row.try_get("id")?,
            job_group: row.try_get("job_group")?,
            name: row.try_get("name")?,
            author: row.try_get("author")?,
            alarm_email: row.try_get("alarm_email")?,
            schedule_type: row.try_get("schedule_type")?,
            schedule_conf: row.try_get("schedule_conf")?,
            misfire_strategy: row.try_get("misfire_strategy")?,
            route_strategy: row.try_get("route_strategy")?,
            handler: row.try_get("handler")?,
            param: row.try_get("param")?,
            block_strategy: row.try_get("block_strategy")?,
            timeout_secs: row.try_get("timeout_secs")?,
            retry_count: row.try_get("retry_count")?,
            glue_type: row.try_get("glue_type")?,
            glue_source: row.try_get("glue_source")?,
            child_job_ids: row.try_get("child_job_ids")?,
            trigger_status: row.try_get("trigger_status")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let glue_history = if columns("xxl_job_logglue").await?.is_empty() {
        Vec::new()
    } else {
        sqlx::query(
            "select cast(id as signed) as id, cast(job_id as signed) as job_id,
                coalesce(glue_type, '') as glue_type, coalesce(glue_source, '') as glue_source,
                coalesce(glue_remark, '') as glue_remark
             from xxl_job_logglue order by id",
        )
        .fetch_all(pool)
        .await
        .context("reading xxl_job_logglue")?
        .iter()
        .map(|row| {
            Ok(XxlGlue {
                id: row.try_get("id")?,
                job_id: row.try_get("job_id")?,
                glue_type: row.try_get("glue_type")?,
                glue_source: row.try_get("glue_source")?,
                glue_remark: row.try_get("glue_remark")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?
    };
    Ok(XxlDatabase { layout, groups, jobs, glue_history })
}
