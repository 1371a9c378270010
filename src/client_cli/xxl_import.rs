//! `wasmjob import xxl-job --from mysql://…/xxl_job [--dry-run]`: an XXL-JOB admin's executor
//! groups and jobs, read from its database, made into a document and applied through the API
//! like `wasmjob apply`.
//!
//! Each job records the XXL-JOB id it came from in its description (`Imported from XXL-JOB job
//! 12.`), so a second import finds it again, even renamed, and changes nothing when nothing
//! changed. What cannot run here is imported stopped with the reason in its description:
//! `GLUE_GROOVY`, `GLUE_SHELL`, `GLUE_PHP`, `GLUE_POWERSHELL` and `GLUE_PYTHON2` sources. A
//! `GLUE_PYTHON` or `GLUE_NODEJS` job becomes a `GLUE_PYTHON` or `GLUE_JAVASCRIPT` job whose
//! source history is uploaded as its versions, oldest first; a source the admin cannot build
//! leaves the job stopped, with the builder's error in its description. `BEAN` jobs keep their
//! handler names, so the same XXL-JOB executors keep running them. [`convert`] is pure, and its
//! cases are a table (`xxl_import/tests.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::apply::{File, Ids, carry_out_plan, job_body, read_current, source_type};
use super::manifest::{self, Current, Document, GroupDoc, JobDoc};
use super::{Api, ClientError, ExitKind};
use crate::cli::client::ImportXxlArgs;
use crate::storage::xxl_job::{XxlDatabase, read_xxl_job};

/// The start of an imported job's description; the XXL-JOB id follows.
const MARKER: &str = "Imported from XXL-JOB job ";
/// What a description says after a source that did not build.
const NOT_BUILT: &str = "did not build";

/// An XXL-JOB database as a document, with what the document cannot say.
#[derive(Debug, Default)]
pub(super) struct Converted {
    pub(super) document: Document,
    /// Jobs here that record an XXL-JOB id whose job now has another group or name: their id
    /// here and the job as it is to be.
    pub(super) renames: Vec<(i64, JobDoc)>,
    /// Source jobs whose XXL-JOB source is not their active version here.
    pub(super) builds: Vec<Build>,
    /// A line per thing imported otherwise than as it was, or not at all.
    pub(super) notes: Vec<String>,
}

/// A source job's versions to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Build {
    pub(super) key: String,
    /// The sources, oldest first; the last is the active one in XXL-JOB.
    pub(super) sources: Vec<String>,
    /// Whether XXL-JOB schedules it, so that it is started once built.
    pub(super) start: bool,
}

/// The XXL-JOB id an imported job's description records.
fn recorded_id(description: &str) -> Option<i64> {
    let rest = description.strip_prefix(MARKER)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The first 12 hex digits of a source's sha256, by which a description names it.
fn digest(source: &str) -> String {
    hex::encode(Sha256::digest(source.as_bytes())).chars().take(12).collect()
}

/// The document, renames, builds and notes that import `db` into an admin holding `current`.
pub(super) fn convert(db: &XxlDatabase, current: &Current) -> Converted {
    let mut out = Converted::default();
    let mut app_names = HashMap::new();
    for group in &db.groups {
        app_names.insert(group.id, group.app_name.clone());
        let mut doc = GroupDoc::new(&group.app_name);
        let title = group.title.trim();
        if !title.is_empty() && title != group.app_name {
            doc.title = Some(title.to_owned());
        }
        let addresses: Vec<String> = group
            .address_list
            .split(',')
            .map(|address| address.trim().trim_end_matches('/').to_owned())
            .filter(|address| !address.is_empty())
            .collect();
        if group.address_type == 1 {
            if addresses.is_empty() {
                out.notes.push(format!(
                    "group {}: entered by hand in XXL-JOB with no address: imported as AUTO",
                    group.app_name
                ));
            } else {
                doc.address_type = "MANUAL".to_owned();
                doc.addresses = addresses;
            }
        }
        out.document.groups.push(doc);
    }

    // Names: XXL-JOB allows two jobs of one name in a group; here the second gets its id.
    let mut taken: HashMap<(String, String), usize> = HashMap::new();
    for job in &db.jobs {
        let group = app_names.get(&job.job_group).cloned().unwrap_or_default();
        *taken.entry((group, clean_name(&job.name, job.id))).or_default() += 1;
    }
    let mut keys = HashMap::new();
    let mut docs = Vec::new();
    for job in &db.jobs {
        let Some(group) = app_names.get(&job.job_group) else {
            out.notes.push(format!(
                "XXL-JOB job {}: its group {} does not exist: left out",
                job.id, job.job_group
            ));
            continue;
        };
        let mut name = clean_name(&job.name, job.id);
        if taken.get(&(group.clone(), name.clone())).is_some_and(|count| *count > 1) {
            name = format!("{name} (xxl-job {})", job.id);
        }
        let doc = JobDoc::new(group, &name);
        keys.insert(job.id, doc.key());
        docs.push((job, doc));
    }

    let here: HashMap<i64, &manifest::CurrentJob> = current
        .jobs
        .iter()
        .filter_map(|have| recorded_id(&have.doc.description).map(|id| (id, have)))
        .collect();
    let history = |job_id: i64, glue_type: &str| -> Vec<String> {
        db.glue_history
            .iter()
            .filter(|glue| glue.job_id == job_id && glue.glue_type == glue_type)
            .map(|glue| glue.glue_source.clone())
            .collect()
    };
    for (job, mut doc) in docs {
        let key = doc.key();
        let have = here.get(&job.id).copied();
        let mut stopped: Option<String> = None;
        doc.owner = job.author.trim().to_owned();
        doc.alarm_email = Some(job.alarm_email.trim().to_owned()).filter(|e| !e.is_empty());
        doc.schedule_type = job.schedule_type.trim().to_owned();
        doc.schedule_conf = job.schedule_conf.trim().to_owned();
        if !job.misfire_strategy.trim().is_empty() {
            doc.misfire_strategy = job.misfire_strategy.trim().to_owned();
        }
        if !job.route_strategy.trim().is_empty() {
            doc.route_strategy = job.route_strategy.trim().to_owned();
        }
        if !job.block_strategy.trim().is_empty() {
            doc.block_strategy = job.block_strategy.trim().to_owned();
        }
        doc.timeout_secs = job.timeout_secs.max(0);
        doc.retry_count = job.retry_count.clamp(0, 100);
        doc.param = job.param.clone();
        for child in job.child_job_ids.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            match child.parse::<i64>().ok().and_then(|id| keys.get(&id)) {
                Some(child_key) if !doc.children.contains(child_key) => {
                    doc.children.push(child_key.clone())
                }
                Some(_) => {}
                None => out.notes.push(format!(
                    "job {key}: child job `{child}` is not among XXL-JOB's jobs: left out"
                )),
            }
        }
        let glue = job.glue_type.trim();
        match glue {
            "BEAN" if !job.handler.trim().is_empty() => {
                doc.glue_type = "BEAN".to_owned();
                doc.handler = Some(job.handler.trim().to_owned());
            }
            "BEAN" => stopped = Some("a BEAN job with no handler name".to_owned()),
            "GLUE_PYTHON" | "GLUE_NODEJS" => {
                doc.glue_type =
                    if glue == "GLUE_PYTHON" { "GLUE_PYTHON" } else { "GLUE_JAVASCRIPT" }
                        .to_owned();
                let active = have.and_then(|h| h.doc.source.as_ref());
                let built = active == Some(&job.glue_source);
                let failed_before = have.is_some_and(|h| {
                    h.doc.source.is_none()
                        && h.doc.description.contains(NOT_BUILT)
                        && h.doc.description.contains(&digest(&job.glue_source))
                });
                if failed_before {
                    // Built and refused before: the same source is not built again.
                    doc.description = have.map(|h| h.doc.description.clone()).unwrap_or_default();
                } else if !built && !job.glue_source.trim().is_empty() {
                    let mut sources = history(job.id, glue);
                    sources
                        .retain(|source| !source.trim().is_empty() && source != &job.glue_source);
                    // What was imported before is there already: only the later ones go up.
                    if let Some(at) = active.and_then(|a| sources.iter().position(|s| s == a)) {
                        sources.drain(..=at);
                    }
                    sources.push(job.glue_source.clone());
                    out.builds.push(Build {
                        key: key.clone(),
                        sources,
                        start: job.trigger_status == 1 && doc.schedule_type != "NONE",
                    });
                }
                doc.running = built && job.trigger_status == 1 && doc.schedule_type != "NONE";
            }
            other => {
                stopped = Some(format!(
                    "its {other} source cannot run here; rewrite it as a component or a Python \
                     or JavaScript handler (the source stays in XXL-JOB's database)"
                ));
            }
        }
        if doc.description.is_empty() {
            doc.description = format!("{MARKER}{}.", job.id);
        }
        match &stopped {
            Some(reason) => {
                doc.description = format!("{MARKER}{}. Stopped: {reason}.", job.id);
                out.notes.push(format!("job {key}: stopped: {reason}"));
                doc.running = false;
            }
            None if doc.glue_type == "BEAN" => {
                doc.running = job.trigger_status == 1 && doc.schedule_type != "NONE";
            }
            None => {}
        }
        if let Some(have) = have
            && have.doc.key() != key
        {
            out.renames.push((have.id, doc.clone()));
        }
        out.document.jobs.push(doc);
    }
    out
}

/// A job's name as XXL-JOB has it, trimmed and at most 200 characters; its id when empty.
fn clean_name(name: &str, id: i64) -> String {
    let name: String = name.trim().chars().filter(|c| *c != '\0').take(200).collect();
    if name.is_empty() { format!("xxl-job {id}") } else { name }
}

/// `wasmjob import xxl-job`.
pub(super) async fn import(api: &Api, args: ImportXxlArgs) -> Result<(), ClientError> {
    let db = read_xxl_job(&args.from)
        .await
        .map_err(|error| ClientError::new(ExitKind::Unavailable, format!("{error:#}")))?;
    api.line(&format!(
        "XXL-JOB {} tables: {} groups, {} jobs, {} earlier sources",
        db.layout.versions(),
        db.groups.len(),
        db.jobs.len(),
        db.glue_history.len()
    ))?;
    let mut current = read_current(api).await?;
    let converted = convert(&db, &current);
    let mut simulated = current.clone();
    for (id, doc) in &converted.renames {
        if let Some(job) = simulated.jobs.iter_mut().find(|job| job.id == *id) {
            api.line(&format!("~ job {} renamed to {}", job.doc.key(), doc.key()))?;
            job.doc.group = doc.group.clone();
            job.doc.name = doc.name.clone();
        }
    }
    let plan = manifest::plan(&converted.document, &simulated, &BTreeMap::new(), false)
        .map_err(|error| ClientError::new(ExitKind::Invalid, error))?;
    api.write(&plan.render_all())?;
    for build in &converted.builds {
        api.line(&format!("build job {}: {} source versions", build.key, build.sources.len()))?;
    }
    for note in &converted.notes {
        api.line(&format!("note: {note}"))?;
    }
    if args.dry_run {
        return Ok(());
    }
    if !converted.renames.is_empty() {
        let ids = Ids::of(&current);
        for (id, doc) in &converted.renames {
            let children = current
                .jobs
                .iter()
                .find(|job| job.id == *id)
                .map(|job| job.doc.children.clone())
                .unwrap_or_default();
            let body = job_body(doc, &children, &ids)?;
            api.call("PUT", &format!("/jobs/{id}"), Some(body)).await?;
        }
        current = read_current(api).await?;
    }
    let plan = manifest::plan(&converted.document, &current, &BTreeMap::new(), false)
        .map_err(|error| ClientError::new(ExitKind::Invalid, error))?;
    let file = File {
        document: converted.document.clone(),
        base: PathBuf::new(),
        sha256s: BTreeMap::new(),
    };
    carry_out_plan(api, &plan, &file, &current).await?;
    if !converted.builds.is_empty() {
        build_sources(api, &converted).await?;
    }
    api.line(&format!(
        "imported: {} changes, {} source jobs built or tried",
        plan.steps.len(),
        converted.builds.len()
    ))
}

/// Uploads each source job's versions; a source the admin refuses leaves its job stopped with
/// the reason in its description.
async fn build_sources(api: &Api, converted: &Converted) -> Result<(), ClientError> {
    let current = read_current(api).await?;
    let ids = Ids::of(&current);
    let wanted: HashMap<String, &JobDoc> =
        converted.document.jobs.iter().map(|job| (job.key(), job)).collect();
    for build in &converted.builds {
        let Some(doc) = wanted.get(&build.key) else { continue };
        let id = ids.job(&build.key)?;
        let content_type = source_type(doc);
        let mut refused = None;
        for (at, source) in build.sources.iter().enumerate() {
            let path = format!("/jobs/{id}/versions?remark=imported%20from%20XXL-JOB");
            let request = api.request("POST", &path).header("content-type", content_type);
            match api.upload(request.body(source.clone())).await {
                Ok(_) => {}
                Err(error) if error.kind == ExitKind::Invalid => {
                    refused = Some((at + 1, error.message));
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        match refused {
            Some((at, reason)) => {
                // The description names XXL-JOB's current source, by which the next import
                // knows it was tried.
                let current = build.sources.last().map(|source| digest(source)).unwrap_or_default();
                let description = format!(
                    "{}. Stopped: its {} source {NOT_BUILT} (source sha256:{current}, version \
                     {at} of {}): {reason}",
                    doc.description.trim_end_matches('.'),
                    doc.glue_type,
                    build.sources.len()
                );
                let description: String = description.chars().take(2_000).collect();
                let changed = JobDoc { description, ..(*doc).clone() };
                let body = job_body(&changed, &doc.children, &ids)?;
                api.call("PUT", &format!("/jobs/{id}"), Some(body)).await?;
                api.line(&format!("job {}: stopped: its source {NOT_BUILT}: {reason}", build.key))?;
            }
            None if build.start => {
                api.call("POST", &format!("/jobs/{id}/start"), Some(json!({}))).await?;
            }
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
