//! The cluster as one document: groups, calendars, jobs and alarm webhooks, in TOML or YAML,
//! and the pure comparison of a document with what an admin holds.
//!
//! A document names things, never ids: a group by its `app_name`, a calendar and an alarm by
//! their names, a job by its group and name (`group/name`, which is unambiguous because an
//! `app_name` has no `/`). A field left out takes the value the API gives it when left out, so
//! the document a `wasmjob export` writes lists only what differs from those defaults.
//!
//! `plan.rs` compares a document with the admin's [`Current`] state and says what to create,
//! update and delete, field by field; `apply.rs` carries it out. It is pure, so its cases are a
//! table (`manifest/tests.rs`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::{
    BlockStrategy, DEFAULT_ALARM_SILENCE_SECS, DEFAULT_MISFIRE_THRESHOLD_MS, GlueType,
    MisfireStrategy, RetryBackoff, RouteStrategy, ScheduleType, ShardingStrategy,
};

/// The one version of the document's format so far.
pub const FORMAT_VERSION: u32 = 1;

/// A cluster's groups, calendars, jobs and alarm webhooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// The document format's version: 1.
    pub version: u32,
    /// Executor groups, by `app_name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupDoc>,
    /// Business calendars, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calendars: Vec<CalendarDoc>,
    /// Jobs, by group and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobDoc>,
    /// Alarm webhooks, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<AlarmDoc>,
}

impl Default for Document {
    fn default() -> Document {
        Document {
            version: FORMAT_VERSION,
            groups: Vec::new(),
            calendars: Vec::new(),
            jobs: Vec::new(),
            alarms: Vec::new(),
        }
    }
}

/// An executor group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupDoc {
    /// The name its executors register under: letters, digits, `-`, `_` and `.`.
    pub app_name: String,
    /// Shown in the console; the `app_name` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `AUTO` (executors register themselves; the default) or `MANUAL` (`addresses`).
    #[serde(default = "auto", skip_serializing_if = "is_auto")]
    pub address_type: String,
    /// The executors of a `MANUAL` group, as http(s) URLs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The most runs of the group's jobs dispatching or running at once; 0 is no cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_concurrent_runs: i64,
}

/// A business calendar, as `POST /calendars` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CalendarDoc {
    pub name: String,
    /// The IANA time zone its rules are read in; UTC when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_dates: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annual_dates: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weekdays: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub daily_windows: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cron: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_dates: Vec<String>,
}

/// A job: the fields of `POST /jobs`, with its group, child jobs and calendar by name, whether
/// it is started, and its component or source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobDoc {
    /// The `app_name` of its group.
    pub group: String,
    /// Its name, unique in its group as far as documents go.
    pub name: String,
    /// What it is for, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Who answers for it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// Whether the schedule fires (`POST /jobs/{id}/start`); a job is created stopped.
    #[serde(default, skip_serializing_if = "is_false")]
    pub running: bool,
    /// `NONE` (the default: manual only), `CRON`, `FIX_RATE`, `FIX_DELAY` or `ONCE`.
    #[serde(default = "schedule_none", skip_serializing_if = "is_schedule_none")]
    pub schedule_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schedule_conf: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    #[serde(default = "misfire_default", skip_serializing_if = "is_misfire_default")]
    pub misfire_strategy: String,
    #[serde(default = "misfire_threshold_default", skip_serializing_if = "is_threshold_default")]
    pub misfire_threshold_ms: i64,
    #[serde(default = "route_default", skip_serializing_if = "is_route_default")]
    pub route_strategy: String,
    #[serde(default = "block_default", skip_serializing_if = "is_block_default")]
    pub block_strategy: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timeout_secs: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_count: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_interval_secs: i64,
    #[serde(default = "backoff_default", skip_serializing_if = "is_backoff_default")]
    pub retry_backoff: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_max_interval_secs: i64,
    /// `GLUE_WASM` (the default), `GLUE_PYTHON`, `GLUE_JAVASCRIPT` or `BEAN`.
    #[serde(default = "glue_default", skip_serializing_if = "is_glue_default")]
    pub glue_type: String,
    /// The handler's name, for `BEAN` jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub param: String,
    /// Jobs run after each success of this one, as `group/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm_email: Option<String>,
    #[serde(default = "silence_default", skip_serializing_if = "is_silence_default")]
    pub alarm_silence_secs: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mb: Option<i64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sharding_total_count: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sharding_item_parameters: String,
    #[serde(default = "sharding_default", skip_serializing_if = "is_sharding_default")]
    pub sharding_strategy: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_concurrent_runs: i64,
    /// The active component of a `GLUE_WASM` job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentRef>,
    /// The active source of a `GLUE_PYTHON` or `GLUE_JAVASCRIPT` job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The active source in a file of its own, relative to the document's folder, instead of
    /// `source`: reviewed as code, and read into `source` when the document is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
}

/// A component, by the path of its file (relative to the document's folder), by its sha256, or
/// both (then they must agree). By sha256 alone, the admin must hold it in the job's versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ComponentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The lowercase hex sha256 of the component's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// An alarm webhook. Its secret is never read back, so a document has it only to create the
/// webhook; it is not compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AlarmDoc {
    pub name: String,
    pub url: String,
    /// Alarms of this group's jobs only (its `app_name`); all groups when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The HMAC key the webhook's requests are signed with: needed to create it, and written
    /// when it changes anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

fn auto() -> String {
    "AUTO".to_owned()
}
fn is_auto(value: &str) -> bool {
    value == "AUTO"
}
fn is_zero(value: &i64) -> bool {
    *value == 0
}
fn is_false(value: &bool) -> bool {
    !*value
}
fn schedule_none() -> String {
    ScheduleType::None.as_str().to_owned()
}
fn is_schedule_none(value: &str) -> bool {
    value == ScheduleType::None.as_str()
}
fn misfire_default() -> String {
    MisfireStrategy::DoNothing.as_str().to_owned()
}
fn is_misfire_default(value: &str) -> bool {
    value == MisfireStrategy::DoNothing.as_str()
}
fn misfire_threshold_default() -> i64 {
    DEFAULT_MISFIRE_THRESHOLD_MS
}
fn is_threshold_default(value: &i64) -> bool {
    *value == DEFAULT_MISFIRE_THRESHOLD_MS
}
fn route_default() -> String {
    RouteStrategy::First.as_str().to_owned()
}
fn is_route_default(value: &str) -> bool {
    value == RouteStrategy::First.as_str()
}
fn block_default() -> String {
    BlockStrategy::SerialExecution.as_str().to_owned()
}
fn is_block_default(value: &str) -> bool {
    value == BlockStrategy::SerialExecution.as_str()
}
fn backoff_default() -> String {
    RetryBackoff::Fixed.as_str().to_owned()
}
fn is_backoff_default(value: &str) -> bool {
    value == RetryBackoff::Fixed.as_str()
}
fn glue_default() -> String {
    GlueType::GlueWasm.as_str().to_owned()
}
fn is_glue_default(value: &str) -> bool {
    value == GlueType::GlueWasm.as_str()
}
fn silence_default() -> i64 {
    DEFAULT_ALARM_SILENCE_SECS
}
fn is_silence_default(value: &i64) -> bool {
    *value == DEFAULT_ALARM_SILENCE_SECS
}
fn sharding_default() -> String {
    ShardingStrategy::AverageAllocation.as_str().to_owned()
}
fn is_sharding_default(value: &str) -> bool {
    value == ShardingStrategy::AverageAllocation.as_str()
}

impl JobDoc {
    /// A job of `group` named `name` with every other field at its default.
    pub fn new(group: &str, name: &str) -> JobDoc {
        JobDoc {
            group: group.to_owned(),
            name: name.to_owned(),
            description: String::new(),
            owner: String::new(),
            running: false,
            schedule_type: schedule_none(),
            schedule_conf: String::new(),
            time_zone: None,
            calendar: None,
            misfire_strategy: misfire_default(),
            misfire_threshold_ms: DEFAULT_MISFIRE_THRESHOLD_MS,
            route_strategy: route_default(),
            block_strategy: block_default(),
            timeout_secs: 0,
            retry_count: 0,
            retry_interval_secs: 0,
            retry_backoff: backoff_default(),
            retry_max_interval_secs: 0,
            glue_type: glue_default(),
            handler: None,
            param: String::new(),
            children: Vec::new(),
            alarm_email: None,
            alarm_silence_secs: DEFAULT_ALARM_SILENCE_SECS,
            fuel_limit: None,
            memory_limit_mb: None,
            sharding_total_count: 0,
            sharding_item_parameters: String::new(),
            sharding_strategy: sharding_default(),
            max_concurrent_runs: 0,
            component: None,
            source: None,
            source_path: None,
        }
    }

    /// `group/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.name)
    }

    /// Whether its versions are components by sha256 (`GLUE_WASM`), source text, or none.
    fn versions(&self) -> Versions {
        match self.glue_type.as_str() {
            "GLUE_PYTHON" | "GLUE_JAVASCRIPT" => Versions::Source,
            "BEAN" => Versions::None,
            _ => Versions::Component,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Versions {
    Component,
    Source,
    None,
}

impl GroupDoc {
    /// A group with every field but its `app_name` at its default.
    pub fn new(app_name: &str) -> GroupDoc {
        GroupDoc {
            app_name: app_name.to_owned(),
            title: None,
            address_type: auto(),
            addresses: Vec::new(),
            max_concurrent_runs: 0,
        }
    }
}

/// A document's text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    /// The format a file's name says (`.yaml`, `.yml`, else TOML).
    pub fn of_path(path: &std::path::Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Format::Yaml,
            _ => Format::Toml,
        }
    }
}

/// Reads a document, checking its version and that it names nothing twice.
pub fn parse(text: &str, format: Format) -> Result<Document, String> {
    let document: Document = match format {
        Format::Toml => {
            let deserializer = toml::Deserializer::parse(text).map_err(|e| toml_error(text, &e))?;
            serde_path_to_error::deserialize(deserializer).map_err(|e| {
                let path = e.path().to_string();
                let error = toml_error(text, e.inner());
                if path == "." { error } else { format!("{path}: {error}") }
            })?
        }
        Format::Yaml => {
            let deserializer = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(deserializer).map_err(|e| e.to_string())?
        }
    };
    if document.version != FORMAT_VERSION {
        return Err(format!(
            "version: this wasmjob reads documents of version {FORMAT_VERSION}, not {}",
            document.version
        ));
    }
    check_document(&document)?;
    Ok(document)
}

/// A TOML error on one line: its message and where it is.
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end_matches('\n').replace('\n', "; ");
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or_default();
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
            format!("{message} (line {line}, column {column})")
        }
        None => message,
    }
}

/// Refuses a document that names a thing twice, names a child job otherwise than `group/name`,
/// or gives a job a component or source its glue type does not take.
fn check_document(document: &Document) -> Result<(), String> {
    fn unique<'a>(kind: &str, keys: impl Iterator<Item = String> + 'a) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        for key in keys {
            if !seen.insert(key.clone()) {
                return Err(format!("{kind} `{key}` is in the document twice"));
            }
        }
        Ok(())
    }
    unique("group", document.groups.iter().map(|g| g.app_name.clone()))?;
    unique("calendar", document.calendars.iter().map(|c| c.name.clone()))?;
    unique("job", document.jobs.iter().map(JobDoc::key))?;
    unique("alarm", document.alarms.iter().map(|a| a.name.clone()))?;
    for job in &document.jobs {
        for child in &job.children {
            if child.split_once('/').is_none() {
                return Err(format!(
                    "job `{}`: child `{child}` is not `group/name` (the group's app_name, a \
                     slash, the job's name)",
                    job.key()
                ));
            }
        }
        if job.source.is_some() && job.source_path.is_some() {
            return Err(format!("job `{}`: give `source` or `source_path`, not both", job.key()));
        }
        let source = job.source.as_ref().or(job.source_path.as_ref());
        match (job.versions(), &job.component, source) {
            (Versions::Component, _, Some(_)) | (Versions::None, _, Some(_)) => {
                return Err(format!(
                    "job `{}`: `source` and `source_path` are for GLUE_PYTHON and \
                     GLUE_JAVASCRIPT jobs",
                    job.key()
                ));
            }
            (Versions::Source, Some(_), _) | (Versions::None, Some(_), _) => {
                return Err(format!("job `{}`: `component` is for GLUE_WASM jobs", job.key()));
            }
            (_, Some(ComponentRef { path: None, sha256: None }), _) => {
                return Err(format!("job `{}`: `component` needs a path or a sha256", job.key()));
            }
            _ => {}
        }
        if let Some(sha256) = job.component.as_ref().and_then(|c| c.sha256.as_deref())
            && !is_sha256(sha256)
        {
            return Err(format!(
                "job `{}`: component sha256 `{sha256}` is not 64 lowercase hex digits",
                job.key()
            ));
        }
    }
    Ok(())
}

/// Whether `text` is a lowercase hex sha256.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The document's text.
pub fn render(document: &Document, format: Format) -> Result<String, String> {
    let body = match format {
        Format::Toml => toml::to_string(document).map_err(|e| e.to_string())?,
        Format::Yaml => serde_yaml_ng::to_string(document).map_err(|e| e.to_string())?,
    };
    let comment = "# wasmjob cluster document: `wasmjob apply -f FILE` makes an admin match it.\n";
    Ok(format!("{comment}{body}"))
}

/// The document's JSON Schema (draft 2020-12), from the same types the reader uses.
pub fn json_schema() -> Value {
    use utoipa::{PartialSchema, ToSchema};
    let mut definitions = Vec::new();
    Document::schemas(&mut definitions);
    let mut defs = Map::new();
    for (name, schema) in definitions {
        defs.insert(name, serde_json::to_value(schema).unwrap_or(Value::Null));
    }
    let mut root = serde_json::to_value(Document::schema()).unwrap_or(Value::Null);
    if let Some(root) = root.as_object_mut() {
        root.insert("$schema".into(), "https://json-schema.org/draft/2020-12/schema".into());
        root.insert("title".into(), "wasmjob cluster document".into());
        root.insert("$defs".into(), Value::Object(defs));
    }
    rewrite_refs(&mut root);
    root
}

/// The fields a document's `definition` (`JobDoc`, `CalendarDoc`) has, as its schema lists them.
pub fn fields_of(definition: &str) -> BTreeSet<String> {
    let schema = json_schema();
    let properties = schema["$defs"][definition]["properties"].as_object();
    properties.into_iter().flatten().map(|(key, _)| key.clone()).collect()
}

/// OpenAPI's `#/components/schemas/X` references as JSON Schema's `#/$defs/X`.
fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                match inner {
                    Value::String(target) if key == "$ref" => {
                        if let Some(name) = target.strip_prefix("#/components/schemas/") {
                            *target = format!("#/$defs/{name}");
                        }
                    }
                    _ => rewrite_refs(inner),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

mod plan;

pub use self::plan::{Current, CurrentJob, Line, Plan, Step, plan};

#[cfg(test)]
mod tests;
