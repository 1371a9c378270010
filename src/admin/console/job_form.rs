//! The job form's fields: one row per field of the API's job body (`http/jobs.rs`), which the
//! new-job page and the job page both render through `job_fields.html`.
//!
//! A row names the field as the API does. That name is the input's `name` and `id`, the catalog
//! keys of its label (`field.NAME`) and help (`help.NAME`), and the start of the API's refusals
//! of it (`NAME: …`), by which the script shows a refusal beside its field. The script sends
//! each input as the type its `data-type` says (`console.js`, `formBody`).
//!
//! The bounds of the number inputs repeat the API's, so that the browser refuses what the API
//! would; `console::job_form::every_number_on_the_job_form_has_the_apis_bounds` holds them
//! equal. The API stays the judge: this file does not validate anything.
//!
//! To add a job field, add its row to its section in [`sections`], then `field.NAME` and
//! `help.NAME` to both catalogs (`i18n/en.json`, `i18n/zh.json`). A choice of a model enum
//! lists its `ALL` with [`spellings`] and labels each value under a catalog prefix of its own
//! (`sharding.CONSISTENT_HASH`); the i18n test finds those keys through the row. The browser
//! tests (`tests/console_browser/job_fields.rs`) set every field a job has, so they ask for a
//! value of the new one too.

use serde_json::{Value, json};

use crate::model::{
    BlockStrategy, DEFAULT_ALARM_SILENCE_SECS, DEFAULT_MISFIRE_THRESHOLD_MS, GlueType, JobSpec,
    MAX_CONCURRENT_RUNS_CAP, MAX_RETRY_INTERVAL_SECS, MisfireStrategy, RetryBackoff, RouteStrategy,
    ScheduleType, ShardingStrategy,
};
use crate::routing::sharding::MAX_SHARDING_TOTAL_COUNT;

/// A part of the form, with a legend (`job_section.KEY`) and its fields in order.
pub struct Section {
    /// The catalog key's last part.
    pub key: &'static str,
    /// The fields, in the order they are shown.
    pub fields: Vec<JobField>,
}

/// One field of the job form.
pub struct JobField {
    /// The API's name of the field.
    pub name: &'static str,
    /// How it is edited.
    pub input: Input,
    /// Its value on the new-job form, as the input shows it: the API's default.
    pub default: String,
    /// Its value on a job's form, as the input shows it.
    pub value: fn(&JobSpec) -> String,
}

/// How a field is edited, and so what the script sends for it.
pub enum Input {
    /// One line of text, sent as a string (`required`: the browser asks for one).
    Text { required: bool, max_len: Option<u32>, placeholder: &'static str },
    /// One line of text, sent as `null` when empty.
    OptionalText { placeholder: &'static str },
    /// Lines of text, sent as a string.
    Lines,
    /// A whole number from `min` to `max`; when `optional`, an empty input is sent as `null`,
    /// which the API reads as its default.
    Number { min: i64, max: Option<i64>, optional: bool },
    /// One of a model enum's spellings; each shown as the catalog's `labels` + spelling, or as
    /// the spelling itself without `labels`.
    Choice { values: Vec<String>, labels: Option<&'static str> },
    /// The job's group, one of those the person may change.
    Group,
    /// Job ids, comma-separated, sent as a list.
    JobIds,
}

/// The form's sections and fields, in the order they are shown.
pub fn sections() -> Vec<Section> {
    vec![
        Section {
            key: "basics",
            fields: vec![
                row("group_id", Input::Group, "", |job| job.group_id.to_string()),
                row(
                    "name",
                    Input::Text { required: true, max_len: Some(200), placeholder: "" },
                    "",
                    |job| job.name.clone(),
                ),
                row("description", Input::Lines, "", |job| job.description.clone()),
                row(
                    "owner",
                    Input::Text { required: false, max_len: Some(200), placeholder: "" },
                    "",
                    |job| job.owner.clone(),
                ),
            ],
        },
        Section {
            key: "schedule",
            fields: vec![
                row(
                    "schedule_type",
                    choice(ScheduleType::ALL, "schedule_type."),
                    ScheduleType::Cron,
                    |job| job.schedule_type.to_string(),
                ),
                row(
                    "schedule_conf",
                    Input::Text { required: false, max_len: None, placeholder: "0 0/5 * * * ?" },
                    "",
                    |job| job.schedule_conf.clone(),
                ),
                row("time_zone", Input::OptionalText { placeholder: "UTC" }, "", |job| {
                    job.time_zone.clone().unwrap_or_default()
                }),
                row("calendar", Input::OptionalText { placeholder: "" }, "", |job| {
                    job.calendar.clone().unwrap_or_default()
                }),
                row(
                    "misfire_strategy",
                    choice(MisfireStrategy::ALL, "misfire."),
                    MisfireStrategy::DoNothing,
                    |job| job.misfire_strategy.to_string(),
                ),
                row(
                    "misfire_threshold_ms",
                    Input::Number { min: 1_000, max: Some(86_400_000), optional: true },
                    DEFAULT_MISFIRE_THRESHOLD_MS,
                    |job| job.misfire_threshold_ms.to_string(),
                ),
            ],
        },
        Section {
            key: "execution",
            fields: vec![
                row(
                    "route_strategy",
                    choice(RouteStrategy::ALL, "route."),
                    RouteStrategy::First,
                    |job| job.route_strategy.to_string(),
                ),
                row(
                    "block_strategy",
                    choice(BlockStrategy::ALL, "block."),
                    BlockStrategy::SerialExecution,
                    |job| job.block_strategy.to_string(),
                ),
                row("max_concurrent_runs", number(0, MAX_CONCURRENT_RUNS_CAP), 0, |job| {
                    job.max_concurrent_runs.to_string()
                }),
                row("timeout_secs", number(0, 604_800), 0, |job| job.timeout_secs.to_string()),
                row(
                    "glue_type",
                    Input::Choice { values: spellings(GlueType::ALL), labels: None },
                    GlueType::GlueWasm,
                    |job| job.glue_type.to_string(),
                ),
                row("handler", Input::OptionalText { placeholder: "" }, "", |job| {
                    job.handler.clone().unwrap_or_default()
                }),
                row("fuel_limit", Input::Number { min: 1, max: None, optional: true }, "", |job| {
                    job.fuel_limit.map(|fuel| fuel.to_string()).unwrap_or_default()
                }),
                row(
                    "memory_limit_mb",
                    Input::Number { min: 1, max: Some(4096), optional: true },
                    "",
                    |job| job.memory_limit_mb.map(|mb| mb.to_string()).unwrap_or_default(),
                ),
                row("param", Input::Lines, "", |job| job.param.clone()),
            ],
        },
        Section {
            key: "retries",
            fields: vec![
                row("retry_count", number(0, 100), 0, |job| job.retry_count.to_string()),
                row("retry_interval_secs", number(0, MAX_RETRY_INTERVAL_SECS), 0, |job| {
                    job.retry_interval_secs.to_string()
                }),
                row(
                    "retry_backoff",
                    choice(RetryBackoff::ALL, "retry_backoff."),
                    RetryBackoff::Fixed,
                    |job| job.retry_backoff.to_string(),
                ),
                row("retry_max_interval_secs", number(0, MAX_RETRY_INTERVAL_SECS), 0, |job| {
                    job.retry_max_interval_secs.to_string()
                }),
            ],
        },
        Section {
            key: "sharding",
            fields: vec![
                row("sharding_total_count", number(0, MAX_SHARDING_TOTAL_COUNT.into()), 0, |job| {
                    job.sharding_total_count.to_string()
                }),
                row(
                    "sharding_item_parameters",
                    Input::Text {
                        required: false,
                        max_len: None,
                        placeholder: "0=Beijing,1=Shanghai",
                    },
                    "",
                    |job| job.sharding_item_parameters.clone(),
                ),
                row(
                    "sharding_strategy",
                    choice(ShardingStrategy::ALL, "sharding."),
                    ShardingStrategy::AverageAllocation,
                    |job| job.sharding_strategy.to_string(),
                ),
            ],
        },
        Section {
            key: "children_and_alarms",
            fields: vec![
                row("child_job_ids", Input::JobIds, "", |job| {
                    let ids: Vec<String> = job.child_job_ids.iter().map(i64::to_string).collect();
                    ids.join(",")
                }),
                row(
                    "alarm_email",
                    Input::OptionalText { placeholder: "ops@example.com" },
                    "",
                    |job| job.alarm_email.clone().unwrap_or_default(),
                ),
                row(
                    "alarm_silence_secs",
                    Input::Number { min: 0, max: Some(86_400), optional: true },
                    DEFAULT_ALARM_SILENCE_SECS,
                    |job| job.alarm_silence_secs.to_string(),
                ),
            ],
        },
    ]
}

/// What `job_fields.html` renders: each section with its fields, holding `job`'s values (the
/// defaults without one) and, for the group, `groups` (`{"id", "name"}`) as its choices.
pub fn form_view(job: Option<&JobSpec>, groups: &[Value]) -> Value {
    let sections: Vec<Value> = sections()
        .into_iter()
        .map(|section| {
            let fields: Vec<Value> =
                section.fields.iter().map(|field| field_view(field, job, groups)).collect();
            json!({"key": section.key, "fields": fields})
        })
        .collect();
    Value::Array(sections)
}

/// The spellings of a model enum's values, for [`Input::Choice`].
pub fn spellings<T: std::fmt::Display>(all: &[T]) -> Vec<String> {
    all.iter().map(T::to_string).collect()
}

fn field_view(field: &JobField, job: Option<&JobSpec>, groups: &[Value]) -> Value {
    let value = job.map_or_else(|| field.default.clone(), field.value);
    let mut view = json!({"name": field.name, "value": value});
    let extra = match &field.input {
        Input::Text { required, max_len, placeholder } => json!({
            "kind": "text", "required": required, "maxlength": max_len, "placeholder": placeholder,
        }),
        Input::OptionalText { placeholder } => {
            json!({"kind": "text", "data_type": "opt", "placeholder": placeholder})
        }
        Input::Lines => json!({"kind": "lines"}),
        Input::Number { min, max, optional } => json!({
            "kind": "number", "min": min, "max": max,
            "data_type": if *optional { "opt-int" } else { "int" },
        }),
        Input::Choice { values, labels } => {
            let choices: Vec<Value> = values
                .iter()
                .map(|value| match labels {
                    Some(prefix) => json!({"value": value, "key": format!("{prefix}{value}")}),
                    None => json!({"value": value, "text": value}),
                })
                .collect();
            json!({"kind": "choice", "choices": choices})
        }
        Input::Group => {
            let choices: Vec<Value> = groups
                .iter()
                .map(|group| json!({"value": group["id"].to_string(), "text": group["name"]}))
                .collect();
            json!({"kind": "choice", "data_type": "int", "choices": choices})
        }
        Input::JobIds => json!({
            "kind": "text", "data_type": "ids", "pattern": "[0-9 ,]*", "placeholder": "12,15",
        }),
    };
    if let (Some(view), Value::Object(extra)) = (view.as_object_mut(), extra) {
        view.extend(extra);
    }
    view
}

fn row(
    name: &'static str,
    input: Input,
    default: impl ToString,
    value: fn(&JobSpec) -> String,
) -> JobField {
    JobField { name, input, default: default.to_string(), value }
}

/// A whole number the API requires, from `min` to `max`.
fn number(min: i64, max: i64) -> Input {
    Input::Number { min, max: Some(max), optional: false }
}

fn choice<T: std::fmt::Display>(all: &[T], labels: &'static str) -> Input {
    Input::Choice { values: spellings(all), labels: Some(labels) }
}
