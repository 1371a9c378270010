//! How jobs are read: the columns of a whole job and of a due one, and the stamp that tells
//! whether a copy of a job read earlier is still current.

use crate::model::{Job, JobSpec};

use super::statement::Cells;
use super::{Result, parse_column, split_list};

pub(super) const COLUMNS: &str =
    "id, group_id, name, schedule_type, schedule_conf, time_zone, misfire_strategy,
    route_strategy, block_strategy, timeout_secs, retry_count, glue_type, handler, param,
    child_job_ids, alarm_email, fuel_limit, memory_limit_mb, misfire_threshold_ms,
    sharding_total_count, sharding_item_parameters, sharding_strategy, alarm_silence_secs, retry_interval_secs,
    retry_backoff, retry_max_interval_secs, max_concurrent_runs, running, next_fire_ms, active_version, created_at, updated_at,
    calendar, description, owner, revision";

/// The columns of a [`DueJob`].
pub(super) const DUE_COLUMNS: &str = "id, next_fire_ms, revision, updated_at";

/// What tells a copy of a job that is current from one that is not: the job's `revision`,
/// which every change a copy must see bumps, and its `updated_at`, which an admin of an earlier
/// build, still running during a rolling upgrade, sets instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobStamp {
    pub revision: i64,
    pub updated_at_ms: i64,
}

impl JobStamp {
    /// The stamp of `job` as it was read.
    pub fn of(job: &Job) -> JobStamp {
        JobStamp { revision: job.revision, updated_at_ms: job.updated_at_ms }
    }
}

/// A due job as the scheduler reads it: when it fires, and its stamp. The job itself (its
/// schedule, routing, parameters) comes from the dispatcher's copy of it, which is what sends
/// and triggers use too, when that copy has the same stamp: a row of four numbers is read per
/// fire instead of every column of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueJob {
    /// The job's id.
    pub id: i64,
    /// The fire that is due (ms since the epoch).
    pub next_fire_ms: i64,
    /// The job's stamp now.
    pub stamp: JobStamp,
}

impl DueJob {
    /// Whether `job`, a copy read earlier, is the job as it is now, but for its next fire.
    pub fn matches(&self, job: &Job) -> bool {
        job.id == self.id && JobStamp::of(job) == self.stamp
    }
}

/// The stamp of a row that has `revision` and `updated_at`.
pub(super) fn stamp_from_row(row: &impl Cells) -> Result<JobStamp> {
    let revision = row.required_int("revision")?;
    Ok(JobStamp { revision, updated_at_ms: row.required_int("updated_at")? })
}

pub(super) fn due_job_from_row(row: &impl Cells) -> Result<DueJob> {
    let (id, next_fire_ms) = (row.required_int("id")?, row.required_int("next_fire_ms")?);
    Ok(DueJob { id, next_fire_ms, stamp: stamp_from_row(row)? })
}

pub(super) fn job_from_row(row: &impl Cells) -> Result<Job> {
    let child_job_ids = row.required_text("child_job_ids")?;
    let child_job_ids = split_list(&child_job_ids)
        .map(|id| {
            id.parse().map_err(|_| super::StorageError::Corrupt(format!("child_job_ids: `{id}`")))
        })
        .collect::<Result<Vec<i64>>>()?;
    Ok(Job {
        id: row.required_int("id")?,
        spec: JobSpec {
            group_id: row.required_int("group_id")?,
            name: row.required_text("name")?,
            schedule_type: parse_column(row, "schedule_type")?,
            schedule_conf: row.required_text("schedule_conf")?,
            time_zone: row.text("time_zone")?,
            misfire_strategy: parse_column(row, "misfire_strategy")?,
            route_strategy: parse_column(row, "route_strategy")?,
            block_strategy: parse_column(row, "block_strategy")?,
            timeout_secs: row.required_int("timeout_secs")?,
            retry_count: row.required_int("retry_count")?,
            glue_type: parse_column(row, "glue_type")?,
            handler: row.text("handler")?,
            param: row.required_text("param")?,
            child_job_ids,
            alarm_email: row.text("alarm_email")?,
            fuel_limit: row.int("fuel_limit")?,
            memory_limit_mb: row.int("memory_limit_mb")?,
            misfire_threshold_ms: row.required_int("misfire_threshold_ms")?,
            sharding_total_count: row.required_int("sharding_total_count")?,
            sharding_item_parameters: row.required_text("sharding_item_parameters")?,
            sharding_strategy: parse_column(row, "sharding_strategy")?,
            alarm_silence_secs: row.required_int("alarm_silence_secs")?,
            retry_interval_secs: row.required_int("retry_interval_secs")?,
            retry_backoff: parse_column(row, "retry_backoff")?,
            retry_max_interval_secs: row.required_int("retry_max_interval_secs")?,
            max_concurrent_runs: row.required_int("max_concurrent_runs")?,
            calendar: row.text("calendar")?,
            description: row.required_text("description")?,
            owner: row.required_text("owner")?,
        },
        running: row.required_int("running")? == 1,
        next_fire_ms: row.required_int("next_fire_ms")?,
        active_version: row.int("active_version")?,
        created_at_ms: row.required_int("created_at")?,
        updated_at_ms: row.required_int("updated_at")?,
        revision: row.required_int("revision")?,
    })
}
