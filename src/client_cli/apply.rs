//! `wasmjob export`, `wasmjob diff -f FILE` and `wasmjob apply -f FILE [--prune] [--dry-run]`:
//! the cluster as a file kept in git, through the API.
//!
//! `export` reads the admin into a [`Document`]; with `--components DIR` it also saves each
//! active component as `DIR/<sha256>.wasm` and names it by path, so the file recreates the jobs
//! on another admin. `diff` and `apply` read the admin the same way, let `manifest::plan`
//! compare, print the diff, and `apply` carries the plan out step by step. Each step is one
//! call; the admin checks every field, and its refusal stops the apply with the step named.
//! Applying a file the admin already matches changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::manifest::{
    self, AlarmDoc, CalendarDoc, ComponentRef, Current, CurrentJob, Document, Format, GroupDoc,
    JobDoc, Step,
};
use super::table::encode;
use super::{Api, ClientError, ExitKind};
use crate::cli::client::{ApplyArgs, DiffArgs, DocumentFormat, ExportArgs};

/// `wasmjob export`.
pub(super) async fn export(api: &Api, args: ExportArgs) -> Result<(), ClientError> {
    let format = match (args.format, &args.output) {
        (Some(format), _) => format.into(),
        (None, Some(path)) => Format::of_path(path),
        (None, None) => Format::Toml,
    };
    let current = read_current(api).await?;
    let mut document = Document {
        groups: current.groups.iter().map(|(_, group)| group.clone()).collect(),
        calendars: current.calendars.clone(),
        jobs: current.jobs.iter().map(|job| job.doc.clone()).collect(),
        alarms: current.alarms.iter().flatten().map(|(_, alarm)| alarm.clone()).collect(),
        ..Document::default()
    };
    if current.alarms.is_none() {
        eprintln!("note: alarms left out: this token may not read them (they are for admins)");
    }
    if let Some(folder) = &args.components {
        let base = match &args.output {
            Some(output) => output.parent().map(Path::to_path_buf).unwrap_or_default(),
            None => PathBuf::new(),
        };
        save_components(api, &current, &mut document, folder, &base).await?;
    }
    document.groups.sort_by(|a, b| a.app_name.cmp(&b.app_name));
    document.calendars.sort_by(|a, b| a.name.cmp(&b.name));
    document.jobs.sort_by_key(JobDoc::key);
    document.alarms.sort_by(|a, b| a.name.cmp(&b.name));
    let text = manifest::render(&document, format)
        .map_err(|error| ClientError::new(ExitKind::Unavailable, error))?;
    match &args.output {
        Some(path) => std::fs::write(path, text).map_err(|error| {
            ClientError::new(ExitKind::Usage, format!("{}: {error}", path.display()))
        }),
        None => api.write(&text),
    }
}

/// `wasmjob diff -f FILE`: the diff only; exits 8 when the admin and the file differ.
pub(super) async fn diff(api: &Api, args: DiffArgs) -> Result<(), ClientError> {
    let file = read_document(&args.document.file, args.document.format)?;
    let current = read_current(api).await?;
    let plan = planned(&file, &current, args.prune)?;
    api.write(&plan.render())?;
    if plan.is_empty() {
        Ok(())
    } else {
        Err(ClientError::new(ExitKind::Differs, "the admin differs from the document"))
    }
}

/// `wasmjob apply -f FILE`: the diff, then the changes.
pub(super) async fn apply(api: &Api, args: ApplyArgs) -> Result<(), ClientError> {
    let file = read_document(&args.document.file, args.document.format)?;
    let current = read_current(api).await?;
    let plan = planned(&file, &current, args.prune)?;
    api.write(&plan.render())?;
    if args.dry_run || plan.is_empty() {
        return Ok(());
    }
    carry_out_plan(api, &plan, &file, &current).await?;
    api.line(&format!("applied {} changes", plan.steps.len()))
}

/// Carries out `plan`'s steps one by one, made against `current` for `file`; the first refusal
/// stops it, naming its step.
pub(super) async fn carry_out_plan(
    api: &Api,
    plan: &manifest::Plan,
    file: &File,
    current: &Current,
) -> Result<(), ClientError> {
    let mut ids = Ids::of(current);
    let wanted: HashMap<String, &JobDoc> =
        file.document.jobs.iter().map(|job| (job.key(), job)).collect();
    let have: HashMap<String, &CurrentJob> =
        current.jobs.iter().map(|job| (job.doc.key(), job)).collect();
    for step in &plan.steps {
        carry_out(api, step, file, &wanted, &have, &mut ids).await.map_err(|error| {
            ClientError::new(error.kind, format!("{}: {}", step_name(step), error.message))
        })?;
    }
    Ok(())
}

/// A document read from its file, with where its relative paths start and the sha256 of each
/// component file it names.
pub(super) struct File {
    pub(super) document: Document,
    pub(super) base: PathBuf,
    pub(super) sha256s: BTreeMap<String, String>,
}

fn read_document(path: &Path, format: Option<DocumentFormat>) -> Result<File, ClientError> {
    let usage = |message: String| ClientError::new(ExitKind::Usage, message);
    let stdin = path == Path::new("-");
    let text = if stdin {
        std::io::read_to_string(std::io::stdin()).map_err(|e| usage(format!("stdin: {e}")))?
    } else {
        std::fs::read_to_string(path).map_err(|e| usage(format!("{}: {e}", path.display())))?
    };
    let format = format.map_or_else(|| Format::of_path(path), Format::from);
    let mut document = manifest::parse(&text, format).map_err(|error| {
        ClientError::new(ExitKind::Invalid, format!("{}: {error}", path.display()))
    })?;
    let base = if stdin {
        PathBuf::new()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    for job in &mut document.jobs {
        if let Some(source) = &job.source_path {
            let text = std::fs::read_to_string(base.join(source)).map_err(|error| {
                usage(format!("job `{}`: source_path `{source}`: {error}", job.key()))
            })?;
            job.source = Some(text);
        }
    }
    let mut sha256s = BTreeMap::new();
    for job in &document.jobs {
        if let Some(component) = job.component.as_ref().and_then(|c| c.path.as_ref()) {
            let bytes = std::fs::read(base.join(component)).map_err(|error| {
                usage(format!("job `{}`: component `{component}`: {error}", job.key()))
            })?;
            sha256s.insert(component.clone(), hex::encode(Sha256::digest(&bytes)));
        }
    }
    Ok(File { document, base, sha256s })
}

fn planned(file: &File, current: &Current, prune: bool) -> Result<manifest::Plan, ClientError> {
    manifest::plan(&file.document, current, &file.sha256s, prune)
        .map_err(|error| ClientError::new(ExitKind::Invalid, error))
}

/// The ids of what the admin has, by name, as the steps create more.
pub(super) struct Ids {
    groups: HashMap<String, i64>,
    jobs: HashMap<String, i64>,
}

impl Ids {
    pub(super) fn of(current: &Current) -> Ids {
        Ids {
            groups: current.groups.iter().map(|(id, g)| (g.app_name.clone(), *id)).collect(),
            jobs: current.jobs.iter().map(|job| (job.doc.key(), job.id)).collect(),
        }
    }

    fn group(&self, app_name: &str) -> Result<i64, ClientError> {
        self.groups
            .get(app_name)
            .copied()
            .ok_or_else(|| ClientError::new(ExitKind::NotFound, format!("no group `{app_name}`")))
    }

    pub(super) fn job(&self, key: &str) -> Result<i64, ClientError> {
        self.jobs
            .get(key)
            .copied()
            .ok_or_else(|| ClientError::new(ExitKind::NotFound, format!("no job `{key}`")))
    }
}

fn step_name(step: &Step) -> String {
    match step {
        Step::CreateGroup(group) => format!("creating group {}", group.app_name),
        Step::UpdateGroup { doc, .. } => format!("changing group {}", doc.app_name),
        Step::CreateCalendar(calendar) => format!("creating calendar {}", calendar.name),
        Step::UpdateCalendar(calendar) => format!("changing calendar {}", calendar.name),
        Step::PutJob { id: None, doc } => format!("creating job {}", doc.key()),
        Step::PutJob { id: Some(_), doc } => format!("changing job {}", doc.key()),
        Step::SetChildren { key } => format!("setting the children of job {key}"),
        Step::Activate { key, version } => format!("activating version {version} of job {key}"),
        Step::Upload { key } => format!("uploading a version of job {key}"),
        Step::Start { key } => format!("starting job {key}"),
        Step::Stop { key } => format!("stopping job {key}"),
        Step::CreateAlarm(alarm) => format!("creating alarm {}", alarm.name),
        Step::UpdateAlarm { doc, .. } => format!("changing alarm {}", doc.name),
        Step::DeleteAlarm { name, .. } => format!("deleting alarm {name}"),
        Step::DeleteJob { key, .. } => format!("deleting job {key}"),
        Step::DeleteCalendar { name } => format!("deleting calendar {name}"),
    }
}

async fn carry_out(
    api: &Api,
    step: &Step,
    file: &File,
    wanted: &HashMap<String, &JobDoc>,
    have: &HashMap<String, &CurrentJob>,
    ids: &mut Ids,
) -> Result<(), ClientError> {
    let job_of = |key: &str| {
        wanted.get(key).copied().ok_or_else(|| {
            ClientError::new(ExitKind::Invalid, format!("job `{key}` is not in the document"))
        })
    };
    match step {
        Step::CreateGroup(group) => {
            let created = api.call("POST", "/groups", Some(group_body(group))).await?;
            ids.groups.insert(group.app_name.clone(), created["id"].as_i64().unwrap_or_default());
        }
        Step::UpdateGroup { id, doc } => {
            api.call("PUT", &format!("/groups/{id}"), Some(group_body(doc))).await?;
        }
        Step::CreateCalendar(calendar) => {
            api.call("POST", "/calendars", Some(json!(calendar))).await?;
        }
        Step::UpdateCalendar(calendar) => {
            let path = format!("/calendars/{}", encode(&calendar.name));
            api.call("PUT", &path, Some(json!(calendar))).await?;
        }
        Step::PutJob { id, doc } => {
            // Children that exist already and stay; the rest once every job exists, so that no
            // intermediate state closes a cycle the final one does not have.
            let before = have.get(&doc.key()).map(|h| h.doc.children.clone()).unwrap_or_default();
            let kept: Vec<String> =
                doc.children.iter().filter(|child| before.contains(child)).cloned().collect();
            let body = job_body(doc, &kept, ids)?;
            match id {
                None => {
                    let created = api.call("POST", "/jobs", Some(body)).await?;
                    ids.jobs.insert(doc.key(), created["id"].as_i64().unwrap_or_default());
                }
                Some(id) => {
                    api.call("PUT", &format!("/jobs/{id}"), Some(body)).await?;
                }
            }
        }
        Step::SetChildren { key } => {
            let doc = job_of(key)?;
            let body = job_body(doc, &doc.children, ids)?;
            api.call("PUT", &format!("/jobs/{}", ids.job(key)?), Some(body)).await?;
        }
        Step::Activate { key, version } => {
            let path = format!("/jobs/{}/versions/{version}/activate", ids.job(key)?);
            api.call("POST", &path, Some(json!({}))).await?;
        }
        Step::Upload { key } => {
            let doc = job_of(key)?;
            let (content_type, body) = match (&doc.component, &doc.source) {
                (Some(ComponentRef { path: Some(path), .. }), _) => {
                    let bytes = std::fs::read(file.base.join(path)).map_err(|error| {
                        ClientError::new(ExitKind::Usage, format!("{path}: {error}"))
                    })?;
                    ("application/wasm", bytes)
                }
                (_, Some(source)) => (source_type(doc), source.clone().into_bytes()),
                _ => return Err(ClientError::new(ExitKind::Invalid, "nothing to upload")),
            };
            let path = format!("/jobs/{}/versions?remark=wasmjob%20apply", ids.job(key)?);
            let request = api.request("POST", &path).header("content-type", content_type);
            api.upload(request.body(body)).await?;
        }
        Step::Start { key } => {
            api.call("POST", &format!("/jobs/{}/start", ids.job(key)?), Some(json!({}))).await?;
        }
        Step::Stop { key } => {
            api.call("POST", &format!("/jobs/{}/stop", ids.job(key)?), Some(json!({}))).await?;
        }
        Step::CreateAlarm(alarm) => {
            api.call("POST", "/alarms", Some(alarm_body(alarm, ids)?)).await?;
        }
        Step::UpdateAlarm { id, doc } => {
            api.call("PUT", &format!("/alarms/{id}"), Some(alarm_body(doc, ids)?)).await?;
        }
        Step::DeleteAlarm { id, .. } => {
            api.call("DELETE", &format!("/alarms/{id}"), None).await?;
        }
        Step::DeleteJob { id, .. } => {
            api.call("DELETE", &format!("/jobs/{id}"), None).await?;
        }
        Step::DeleteCalendar { name } => {
            api.call("DELETE", &format!("/calendars/{}", encode(name)), None).await?;
        }
    }
    Ok(())
}

fn group_body(group: &GroupDoc) -> Value {
    let mut body = json!({
        "app_name": group.app_name,
        "address_type": group.address_type,
        "addresses": group.addresses,
        "max_concurrent_runs": group.max_concurrent_runs,
    });
    if let Some(title) = &group.title {
        body["title"] = json!(title);
    }
    body
}

/// The content type a source job's versions are uploaded as.
pub(super) fn source_type(job: &JobDoc) -> &'static str {
    if job.glue_type == "GLUE_PYTHON" { "text/x-python" } else { "text/javascript" }
}

/// A job as `POST /jobs` and `PUT /jobs/{id}` take it, with `children` as its child jobs.
pub(super) fn job_body(job: &JobDoc, children: &[String], ids: &Ids) -> Result<Value, ClientError> {
    let child_job_ids =
        children.iter().map(|child| ids.job(child)).collect::<Result<Vec<i64>, _>>()?;
    Ok(json!({
        "group_id": ids.group(&job.group)?,
        "name": job.name,
        "description": job.description,
        "owner": job.owner,
        "schedule_type": job.schedule_type,
        "schedule_conf": job.schedule_conf,
        "time_zone": job.time_zone,
        "calendar": job.calendar,
        "misfire_strategy": job.misfire_strategy,
        "misfire_threshold_ms": job.misfire_threshold_ms,
        "route_strategy": job.route_strategy,
        "block_strategy": job.block_strategy,
        "timeout_secs": job.timeout_secs,
        "retry_count": job.retry_count,
        "retry_interval_secs": job.retry_interval_secs,
        "retry_backoff": job.retry_backoff,
        "retry_max_interval_secs": job.retry_max_interval_secs,
        "glue_type": job.glue_type,
        "handler": job.handler,
        "param": job.param,
        "child_job_ids": child_job_ids,
        "alarm_email": job.alarm_email,
        "alarm_silence_secs": job.alarm_silence_secs,
        "fuel_limit": job.fuel_limit,
        "memory_limit_mb": job.memory_limit_mb,
        "sharding_total_count": job.sharding_total_count,
        "sharding_item_parameters": job.sharding_item_parameters,
        "sharding_strategy": job.sharding_strategy,
        "max_concurrent_runs": job.max_concurrent_runs,
    }))
}

fn alarm_body(alarm: &AlarmDoc, ids: &Ids) -> Result<Value, ClientError> {
    let group_id = alarm.group.as_deref().map(|group| ids.group(group)).transpose()?;
    let mut body = json!({"name": alarm.name, "url": alarm.url, "group_id": group_id});
    if let Some(secret) = &alarm.secret {
        body["secret"] = json!(secret);
    }
    Ok(body)
}

/// A group as the API answers it.
#[derive(Deserialize)]
struct ApiGroup {
    id: i64,
    app_name: String,
    title: String,
    address_type: String,
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    max_concurrent_runs: i64,
}

/// A job as the API answers it: the document's fields by id, and its active version.
#[derive(Deserialize)]
struct ApiJob {
    id: i64,
    group_id: i64,
    #[serde(default)]
    child_job_ids: Vec<i64>,
    active_version: Option<i64>,
    #[serde(flatten)]
    fields: Value,
}

#[derive(Deserialize)]
struct ApiVersion {
    version: i64,
    sha256: String,
}

#[derive(Deserialize)]
struct ApiAlarm {
    id: i64,
    name: String,
    url: String,
    group_id: Option<i64>,
}

/// Reads the admin's groups, calendars, jobs (with the active component's sha256 or source
/// text) and alarms.
pub(super) async fn read_current(api: &Api) -> Result<Current, ClientError> {
    let broken = |what: &str, error: serde_json::Error| {
        ClientError::new(ExitKind::Unavailable, format!("the admin's {what}: {error}"))
    };
    let groups: Vec<ApiGroup> = serde_json::from_value(api.call("GET", "/groups", None).await?)
        .map_err(|e| broken("groups", e))?;
    let app_names: HashMap<i64, String> =
        groups.iter().map(|group| (group.id, group.app_name.clone())).collect();
    let groups = groups
        .into_iter()
        .map(|group| {
            let doc = GroupDoc {
                title: (group.title != group.app_name).then_some(group.title),
                address_type: group.address_type,
                addresses: group.addresses,
                max_concurrent_runs: group.max_concurrent_runs,
                ..GroupDoc::new(&group.app_name)
            };
            (group.id, doc)
        })
        .collect();
    let calendars: Vec<CalendarDoc> = {
        let list = api.call("GET", "/calendars", None).await?;
        let list: Vec<Value> = serde_json::from_value(list).map_err(|e| broken("calendars", e))?;
        let known = manifest::fields_of("CalendarDoc");
        list.into_iter()
            .map(|mut calendar| {
                if let Some(fields) = calendar.as_object_mut() {
                    fields.retain(|key, _| known.contains(key));
                }
                serde_json::from_value(calendar).map_err(|e| broken("calendars", e))
            })
            .collect::<Result<_, _>>()?
    };
    let jobs: Vec<ApiJob> = serde_json::from_value(api.call("GET", "/jobs", None).await?)
        .map_err(|e| broken("jobs", e))?;
    let mut keys = HashMap::new();
    let mut docs = Vec::new();
    let job_fields = manifest::fields_of("JobDoc");
    for job in jobs {
        let group =
            app_names.get(&job.group_id).cloned().unwrap_or_else(|| job.group_id.to_string());
        let doc = job_doc(&group, &job.fields, &job_fields).map_err(|e| broken("jobs", e))?;
        keys.insert(job.id, doc.key());
        docs.push((job, doc));
    }
    let mut current_jobs = Vec::new();
    for (job, mut doc) in docs {
        doc.children = job
            .child_job_ids
            .iter()
            .map(|id| keys.get(id).cloned().unwrap_or_else(|| format!("?/{id}")))
            .collect();
        let mut versions = Vec::new();
        if let Some(active) = job.active_version {
            let list = api.call("GET", &format!("/jobs/{}/versions", job.id), None).await?;
            let list: Vec<ApiVersion> =
                serde_json::from_value(list).map_err(|e| broken("versions", e))?;
            versions = list.into_iter().map(|v| (v.version, v.sha256)).collect();
            let sha256 = versions.iter().find(|(v, _)| *v == active).map(|(_, s)| s.clone());
            match doc.glue_type.as_str() {
                "GLUE_PYTHON" | "GLUE_JAVASCRIPT" => {
                    let path = format!("/jobs/{}/versions/{active}/source", job.id);
                    doc.source = Some(api.text("GET", &path).await?);
                }
                "BEAN" => {}
                _ => {
                    doc.component =
                        sha256.map(|sha256| ComponentRef { path: None, sha256: Some(sha256) })
                }
            }
        }
        current_jobs.push(CurrentJob { id: job.id, doc, versions });
    }
    let alarms = match api.call("GET", "/alarms", None).await {
        Ok(list) => {
            let list: Vec<ApiAlarm> =
                serde_json::from_value(list).map_err(|e| broken("alarms", e))?;
            let alarms = list
                .into_iter()
                .map(|alarm| {
                    let group = alarm
                        .group_id
                        .map(|id| app_names.get(&id).cloned().unwrap_or_else(|| id.to_string()));
                    let doc = AlarmDoc { name: alarm.name, url: alarm.url, group, secret: None };
                    (alarm.id, doc)
                })
                .collect();
            Some(alarms)
        }
        Err(error) if error.kind == ExitKind::Refused => None,
        Err(error) => return Err(error),
    };
    Ok(Current { groups, calendars, jobs: current_jobs, alarms })
}

/// A job's document from the API's fields (all but its children and versions).
fn job_doc(
    group: &str,
    fields: &Value,
    known: &BTreeSet<String>,
) -> Result<JobDoc, serde_json::Error> {
    let mut fields = fields.clone();
    if let Some(map) = fields.as_object_mut() {
        // The API answers null or "" for what the document leaves out, and fields a document
        // does not have (times it sets, and whatever a newer admin adds).
        map.retain(|key, value| known.contains(key) && !value.is_null() && *value != json!(""));
        map.insert("group".into(), json!(group));
    }
    let doc: JobDoc = serde_json::from_value(fields)?;
    Ok(doc)
}

/// Saves each active component of `document`'s `GLUE_WASM` jobs as `folder/<sha256>.wasm` and
/// names it by that path, relative to `base` (the output file's folder).
async fn save_components(
    api: &Api,
    current: &Current,
    document: &mut Document,
    folder: &Path,
    base: &Path,
) -> Result<(), ClientError> {
    let usage = |message: String| ClientError::new(ExitKind::Usage, message);
    std::fs::create_dir_all(folder).map_err(|e| usage(format!("{}: {e}", folder.display())))?;
    let relative = relative_path(base, folder).map_err(usage)?;
    let ids: HashMap<String, &CurrentJob> =
        current.jobs.iter().map(|job| (job.doc.key(), job)).collect();
    for job in &mut document.jobs {
        let key = job.key();
        let Some(component) = &mut job.component else { continue };
        let Some(sha256) = component.sha256.clone() else { continue };
        let Some(have) = ids.get(&key) else { continue };
        let name = format!("{sha256}.wasm");
        let target = folder.join(&name);
        let saved =
            std::fs::read(&target).is_ok_and(|bytes| hex::encode(Sha256::digest(&bytes)) == sha256);
        if !saved {
            let Some((version, _)) = have.versions.iter().find(|(_, s)| *s == sha256) else {
                continue;
            };
            let path = format!("/jobs/{}/versions/{version}/component", have.id);
            let bytes = api.bytes("GET", &path).await?;
            std::fs::write(&target, bytes)
                .map_err(|e| usage(format!("{}: {e}", target.display())))?;
        }
        component.path = Some(relative.join(&name).to_string_lossy().into_owned());
    }
    Ok(())
}

/// `target` as a path relative to `base`, both folders that exist (an empty `base` is the
/// current folder).
fn relative_path(base: &Path, target: &Path) -> Result<PathBuf, String> {
    let canonical = |path: &Path| {
        let path = if path.as_os_str().is_empty() { Path::new(".") } else { path };
        path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))
    };
    let (base, target) = (canonical(base)?, canonical(target)?);
    let common = base.components().zip(target.components()).take_while(|(a, b)| a == b).count();
    let mut relative = PathBuf::new();
    for _ in base.components().skip(common) {
        relative.push("..");
    }
    for part in target.components().skip(common) {
        relative.push(part);
    }
    Ok(relative)
}

impl From<DocumentFormat> for Format {
    fn from(format: DocumentFormat) -> Format {
        match format {
            DocumentFormat::Toml => Format::Toml,
            DocumentFormat::Yaml => Format::Yaml,
        }
    }
}
