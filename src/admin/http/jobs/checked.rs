//! A job body's fields, each checked: the spec to store, or a 400 naming the field.

use super::{JobBody, parse_schedule};
use crate::admin::AppState;
use crate::admin::http::auth::Actor;
use crate::admin::http::error::ApiError;
use crate::model::{DEFAULT_ALARM_SILENCE_SECS, DEFAULT_MISFIRE_THRESHOLD_MS, GlueType};
use crate::model::{
    JobSpec, MAX_RETRY_INTERVAL_SECS, RetryBackoff, RouteStrategy, ShardingStrategy,
};
use crate::model::{MAX_CHILD_JOBS, MAX_CONCURRENT_RUNS_CAP, ScheduleType};
use crate::routing::sharding::{MAX_SHARDING_TOTAL_COUNT, parse_item_parameters};
use crate::schedule::Schedule;

/// The shortest misfire threshold: the scheduler commits fires up to a second ahead and passes
/// at least every second, so a shorter one would call ordinary fires late.
const MIN_MISFIRE_THRESHOLD_MS: i64 = 1_000;
/// The longest misfire threshold: one day.
const MAX_MISFIRE_THRESHOLD_MS: i64 = 86_400_000;
/// The longest alarm silence window: one day.
const MAX_ALARM_SILENCE_SECS: i64 = 86_400;
/// The longest description of a job.
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 2_000;
/// The longest owner of a job.
pub(crate) const MAX_OWNER_CHARS: usize = 200;

/// Checks every field of a job body; the parsed schedule comes along. `actor` must be allowed
/// to trigger each child job, since a success of this one runs them.
pub(super) async fn validate(
    state: &AppState,
    actor: &Actor,
    body: JobBody,
) -> Result<(JobSpec, Schedule), ApiError> {
    fn field<T: std::str::FromStr>(
        name: &str,
        value: Option<String>,
        default: T,
    ) -> Result<T, ApiError>
    where
        T::Err: std::fmt::Display,
    {
        match value {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|e| ApiError::bad_request("invalid_job", format!("{name}: {e}"))),
        }
    }
    let invalid = |message: &str| ApiError::bad_request("invalid_job", message.to_owned());
    let texts = [
        ("name", Some(&body.name)),
        ("schedule_conf", Some(&body.schedule_conf)),
        ("param", Some(&body.param)),
        ("handler", body.handler.as_ref()),
        ("alarm_email", body.alarm_email.as_ref()),
        ("time_zone", body.time_zone.as_ref()),
        ("sharding_item_parameters", Some(&body.sharding_item_parameters)),
        ("description", Some(&body.description)),
        ("owner", Some(&body.owner)),
    ];
    for (field, text) in texts {
        if text.is_some_and(|text| text.contains('\0')) {
            return Err(invalid(&format!("{field}: NUL characters are not allowed")));
        }
    }
    let name = body.name.trim().to_owned();
    if name.is_empty() || name.len() > 200 {
        return Err(invalid("name: 1 to 200 characters"));
    }
    let schedule_type: ScheduleType =
        field("schedule_type", Some(body.schedule_type), ScheduleType::None)?;
    let time_zone = body.time_zone.filter(|zone| !zone.trim().is_empty());
    let schedule = parse_schedule(schedule_type, &body.schedule_conf, time_zone.as_deref())?;
    let glue_type = field("glue_type", body.glue_type, GlueType::GlueWasm)?;
    let handler = body.handler.filter(|handler| !handler.is_empty());
    if glue_type == GlueType::Bean && handler.is_none() {
        return Err(invalid("handler: a BEAN job needs the handler's name"));
    }
    let handler_chars = |c: char| c.is_ascii_alphanumeric() || "-_.:$@#".contains(c);
    if handler
        .as_deref()
        .is_some_and(|h| h.len() > 255 || h.contains("..") || !h.chars().all(handler_chars))
    {
        return Err(invalid(
            "handler: a name of at most 255 letters, digits and `-_.:$@#`, not a path",
        ));
    }
    if !(0..=86_400 * 7).contains(&body.timeout_secs) {
        return Err(invalid("timeout_secs: 0 (none) to 604800"));
    }
    if !(0..=100).contains(&body.retry_count) {
        return Err(invalid("retry_count: 0 to 100"));
    }
    for (name, secs) in [
        ("retry_interval_secs", body.retry_interval_secs),
        ("retry_max_interval_secs", body.retry_max_interval_secs),
    ] {
        if !(0..=MAX_RETRY_INTERVAL_SECS).contains(&secs) {
            return Err(invalid(&format!("{name}: 0 to {MAX_RETRY_INTERVAL_SECS} (one day)")));
        }
    }
    if body.retry_max_interval_secs > 0 && body.retry_max_interval_secs < body.retry_interval_secs {
        return Err(invalid(
            "retry_max_interval_secs: at least retry_interval_secs, or 0 for no cap but a day",
        ));
    }
    let retry_backoff = field("retry_backoff", body.retry_backoff, RetryBackoff::Fixed)?;
    if !(0..=MAX_CONCURRENT_RUNS_CAP).contains(&body.max_concurrent_runs) {
        return Err(invalid(&format!(
            "max_concurrent_runs: 0 (no cap) to {MAX_CONCURRENT_RUNS_CAP}"
        )));
    }
    if body.fuel_limit.is_some_and(|fuel| fuel <= 0) {
        return Err(invalid("fuel_limit: must be positive"));
    }
    if body.memory_limit_mb.is_some_and(|mb| !(1..=4096).contains(&mb)) {
        return Err(invalid("memory_limit_mb: 1 to 4096"));
    }
    let alarm_silence_secs = body.alarm_silence_secs.unwrap_or(DEFAULT_ALARM_SILENCE_SECS);
    if !(0..=MAX_ALARM_SILENCE_SECS).contains(&alarm_silence_secs) {
        return Err(invalid(&format!(
            "alarm_silence_secs: 0 (alarm on every failure) to {MAX_ALARM_SILENCE_SECS} (one day)"
        )));
    }
    if body.param.len() > 64 * 1024 {
        return Err(invalid("param: at most 64 KiB"));
    }
    if body.description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(invalid(&format!("description: at most {MAX_DESCRIPTION_CHARS} characters")));
    }
    let owner = body.owner.trim().to_owned();
    if owner.chars().count() > MAX_OWNER_CHARS {
        return Err(invalid(&format!("owner: at most {MAX_OWNER_CHARS} characters")));
    }
    let misfire_threshold_ms = body.misfire_threshold_ms.unwrap_or(DEFAULT_MISFIRE_THRESHOLD_MS);
    if !(MIN_MISFIRE_THRESHOLD_MS..=MAX_MISFIRE_THRESHOLD_MS).contains(&misfire_threshold_ms) {
        return Err(invalid(&format!(
            "misfire_threshold_ms: {MIN_MISFIRE_THRESHOLD_MS} to {MAX_MISFIRE_THRESHOLD_MS} (one day)"
        )));
    }
    let route_strategy = field("route_strategy", body.route_strategy, RouteStrategy::First)?;
    let sharding_strategy =
        field("sharding_strategy", body.sharding_strategy, ShardingStrategy::AverageAllocation)?;
    let sharding_total_count = u32::try_from(body.sharding_total_count)
        .ok()
        .filter(|total| *total <= MAX_SHARDING_TOTAL_COUNT)
        .ok_or_else(|| {
            invalid(&format!("sharding_total_count: 0 (not sharded) to {MAX_SHARDING_TOTAL_COUNT}"))
        })?;
    let sharding_item_parameters = body.sharding_item_parameters.trim().to_owned();
    if sharding_total_count == 0 && !sharding_item_parameters.is_empty() {
        return Err(invalid("sharding_item_parameters: set sharding_total_count to shard the job"));
    }
    if sharding_total_count > 0 && route_strategy == RouteStrategy::ShardingBroadcast {
        return Err(invalid(
            "sharding_total_count: a job shards by items or by SHARDING_BROADCAST, not both",
        ));
    }
    parse_item_parameters(&sharding_item_parameters, sharding_total_count)
        .map_err(|error| invalid(&format!("sharding_item_parameters: {error}")))?;
    if state.db.get_group(body.group_id).await?.is_none() {
        return Err(ApiError::bad_request(
            "invalid_job",
            format!("group_id: group {} does not exist", body.group_id),
        ));
    }
    if body.child_job_ids.len() > MAX_CHILD_JOBS {
        return Err(invalid(&format!("child_job_ids: at most {MAX_CHILD_JOBS} jobs")));
    }
    let mut children = std::collections::HashSet::new();
    for child in &body.child_job_ids {
        if !children.insert(*child) {
            return Err(invalid(&format!("child_job_ids: job {child} is listed twice")));
        }
        let Some(child_job) = state.db.get_job(*child).await? else {
            return Err(invalid(&format!("child_job_ids: job {child} does not exist")));
        };
        // The same rule as `POST /jobs/{id}/trigger`: a job's success runs its children.
        if !actor.principal.may_change_group(child_job.spec.group_id) {
            return Err(ApiError::forbidden(format!(
                "child_job_ids: {} `{}` may not trigger job {child} of group {}",
                actor.principal.role, actor.principal.name, child_job.spec.group_id
            )));
        }
    }
    let job = JobSpec {
        group_id: body.group_id,
        name,
        schedule_type,
        schedule_conf: body.schedule_conf.trim().to_owned(),
        time_zone,
        misfire_strategy: field(
            "misfire_strategy",
            body.misfire_strategy,
            crate::model::MisfireStrategy::DoNothing,
        )?,
        route_strategy,
        block_strategy: field(
            "block_strategy",
            body.block_strategy,
            crate::model::BlockStrategy::SerialExecution,
        )?,
        timeout_secs: body.timeout_secs,
        retry_count: body.retry_count,
        retry_interval_secs: body.retry_interval_secs,
        retry_backoff,
        retry_max_interval_secs: body.retry_max_interval_secs,
        glue_type,
        handler,
        param: body.param,
        child_job_ids: body.child_job_ids,
        alarm_email: body.alarm_email,
        alarm_silence_secs,
        fuel_limit: body.fuel_limit,
        memory_limit_mb: body.memory_limit_mb,
        misfire_threshold_ms,
        sharding_total_count: i64::from(sharding_total_count),
        sharding_item_parameters,
        sharding_strategy,
        max_concurrent_runs: body.max_concurrent_runs,
        calendar: crate::admin::http::calendars::job_calendar(state, body.calendar).await?,
        description: body.description,
        owner,
    };
    Ok((job, schedule))
}
