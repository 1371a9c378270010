//! The comparison of a document with what an admin holds: the steps that make the admin match
//! it, in an order each can be carried out in, and the diff a person reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::{AlarmDoc, CalendarDoc, ComponentRef, Document, GroupDoc, JobDoc, Versions};

/// What an admin holds, as documents, with the ids the API needs.
#[derive(Debug, Clone, Default)]
pub struct Current {
    pub groups: Vec<(i64, GroupDoc)>,
    pub calendars: Vec<CalendarDoc>,
    pub jobs: Vec<CurrentJob>,
    /// The alarms, or `None` when the caller may not read them (they are for admins).
    pub alarms: Option<Vec<(i64, AlarmDoc)>>,
}

/// A job as the admin holds it.
#[derive(Debug, Clone)]
pub struct CurrentJob {
    pub id: i64,
    /// The job, with its active component's sha256 or its active source.
    pub doc: JobDoc,
    /// Each version's number and the sha256 of its component.
    pub versions: Vec<(i64, String)>,
}

/// One thing a plan changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateGroup(GroupDoc),
    UpdateGroup {
        id: i64,
        doc: GroupDoc,
    },
    CreateCalendar(CalendarDoc),
    UpdateCalendar(CalendarDoc),
    /// A job's fields, created (id `None`) or updated; `children` changes come later.
    PutJob {
        id: Option<i64>,
        doc: Box<JobDoc>,
    },
    /// A job's child jobs, once every job exists.
    SetChildren {
        key: String,
    },
    /// Activates version `version` of the job, which has the wanted sha256 already.
    Activate {
        key: String,
        version: i64,
    },
    /// Uploads the component at `path`, or the job's source.
    Upload {
        key: String,
    },
    Start {
        key: String,
    },
    Stop {
        key: String,
    },
    CreateAlarm(AlarmDoc),
    UpdateAlarm {
        id: i64,
        doc: AlarmDoc,
    },
    DeleteAlarm {
        id: i64,
        name: String,
    },
    DeleteJob {
        id: i64,
        key: String,
    },
    DeleteCalendar {
        name: String,
    },
}

/// A change, as a person reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// `+` create, `~` update, `-` delete, `=` unchanged, `!` not in the document and kept.
    pub sign: char,
    /// `job billing/nightly`.
    pub what: String,
    /// `field: old → new`, one each.
    pub fields: Vec<String>,
}

/// What applying a document does.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub lines: Vec<Line>,
    pub unchanged: usize,
}

impl Plan {
    /// Whether the admin matches the document already.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The diff, a line per change with its fields indented, and a count.
    pub fn render(&self) -> String {
        self.rendered(false)
    }

    /// The diff with a `=` line for each thing that stays as it is.
    pub fn render_all(&self) -> String {
        self.rendered(true)
    }

    fn rendered(&self, unchanged: bool) -> String {
        let mut text = String::new();
        for line in self.lines.iter().filter(|line| unchanged || line.sign != '=') {
            let _ = writeln!(text, "{} {}", line.sign, line.what);
            for field in &line.fields {
                let _ = writeln!(text, "    {field}");
            }
        }
        let count = |sign: char| self.lines.iter().filter(|l| l.sign == sign).count();
        let _ = writeln!(
            text,
            "{} to create, {} to change, {} to delete, {} unchanged",
            count('+'),
            count('~'),
            count('-'),
            self.unchanged
        );
        text
    }

    /// Counts `what` as unchanged.
    fn keep(&mut self, what: String) {
        self.unchanged += 1;
        self.lines.push(Line { sign: '=', what, fields: Vec::new() });
    }
}

/// The sha256 a document's component names: its own, or its file's (`files` maps a path to the
/// sha256 of its bytes, read beforehand).
fn wanted_sha256(
    component: &ComponentRef,
    files: &BTreeMap<String, String>,
) -> Result<String, String> {
    let of_file = component.path.as_ref().map(|path| files.get(path).cloned().unwrap_or_default());
    match (&component.sha256, of_file) {
        (Some(named), Some(file)) if *named != file => Err(format!(
            "the file `{}` has sha256 {file}, the document says {named}",
            component.path.as_deref().unwrap_or_default()
        )),
        (Some(named), _) => Ok(named.clone()),
        (None, Some(file)) => Ok(file),
        (None, None) => Err("a component needs a path or a sha256".to_owned()),
    }
}

/// What makes the admin's `current` state match `document`: steps in the order they can be
/// carried out, and the diff. With `prune`, what the document does not have is deleted, else
/// kept and listed. `files` holds the sha256 of each component file the document names.
pub fn plan(
    document: &Document,
    current: &Current,
    files: &BTreeMap<String, String>,
    prune: bool,
) -> Result<Plan, String> {
    let mut plan = Plan::default();
    check_references(document, current)?;

    // Groups.
    let groups: BTreeMap<&str, &(i64, GroupDoc)> =
        current.groups.iter().map(|entry| (entry.1.app_name.as_str(), entry)).collect();
    for wanted in &document.groups {
        let what = format!("group {}", wanted.app_name);
        match groups.get(wanted.app_name.as_str()) {
            None => {
                plan.lines.push(created(&what, wanted));
                plan.steps.push(Step::CreateGroup(wanted.clone()));
            }
            Some((id, have)) => {
                let fields = differences(have, wanted);
                if fields.is_empty() {
                    plan.keep(what);
                } else {
                    plan.lines.push(Line { sign: '~', what, fields });
                    plan.steps.push(Step::UpdateGroup { id: *id, doc: wanted.clone() });
                }
            }
        }
    }

    // Calendars.
    let calendars: BTreeMap<&str, &CalendarDoc> =
        current.calendars.iter().map(|c| (c.name.as_str(), c)).collect();
    for wanted in &document.calendars {
        let what = format!("calendar {}", wanted.name);
        match calendars.get(wanted.name.as_str()) {
            None => {
                plan.lines.push(created(&what, wanted));
                plan.steps.push(Step::CreateCalendar(wanted.clone()));
            }
            Some(have) => {
                let fields = differences(*have, wanted);
                if fields.is_empty() {
                    plan.keep(what);
                } else {
                    plan.lines.push(Line { sign: '~', what, fields });
                    plan.steps.push(Step::UpdateCalendar(wanted.clone()));
                }
            }
        }
    }

    // Jobs: fields first, then children, then versions, then started or stopped.
    // Two jobs of one name in a group are refused above when the document names them.
    let jobs: BTreeMap<String, &CurrentJob> =
        current.jobs.iter().map(|job| (job.doc.key(), job)).collect();
    let mut children = Vec::new();
    let mut versions = Vec::new();
    let mut running = Vec::new();
    for wanted in &document.jobs {
        let key = wanted.key();
        let what = format!("job {key}");
        let have = jobs.get(key.as_str()).copied();
        let mut fields = Vec::new();
        // The fields the API takes, compared without children, versions and `running`.
        let bare = |job: &JobDoc| JobDoc {
            children: Vec::new(),
            component: None,
            source: None,
            source_path: None,
            running: false,
            ..job.clone()
        };
        let put = match have {
            None => true,
            Some(have) => {
                fields.extend(differences(&bare(&have.doc), &bare(wanted)));
                !fields.is_empty()
            }
        };
        if put {
            plan.steps.push(Step::PutJob { id: have.map(|h| h.id), doc: Box::new(wanted.clone()) });
        }
        let have_children = have.map(|h| h.doc.children.clone()).unwrap_or_default();
        if sorted(&have_children) != sorted(&wanted.children) {
            fields.push(format!(
                "children: {} → {}",
                show(&have_children.join(", ")),
                show(&wanted.children.join(", "))
            ));
            children.push(Step::SetChildren { key: key.clone() });
        }
        if let Some(step) = version_step(wanted, have, files, &mut fields)? {
            versions.push(step);
        }
        let was_running = have.is_some_and(|h| h.doc.running);
        if was_running != wanted.running {
            fields.push(format!("running: {was_running} → {}", wanted.running));
            let step = if wanted.running {
                Step::Start { key: key.clone() }
            } else {
                Step::Stop { key: key.clone() }
            };
            running.push(step);
        }
        match have {
            None => {
                let mut lines = summary(wanted);
                lines.extend(
                    fields
                        .into_iter()
                        .filter(|f| f.starts_with("component:") || f.starts_with("source:")),
                );
                plan.lines.push(Line { sign: '+', what, fields: lines });
            }
            Some(_) if fields.is_empty() => plan.keep(what),
            Some(_) => plan.lines.push(Line { sign: '~', what, fields }),
        }
    }
    plan.steps.extend(children);
    plan.steps.extend(versions);
    plan.steps.extend(running);

    // Alarms: the admin's list is needed to compare, so a caller who may not read it may not
    // name alarms.
    match &current.alarms {
        None if !document.alarms.is_empty() => {
            return Err("the document has alarms, and this token may not read the admin's \
                        alarms (they are for admins)"
                .to_owned());
        }
        None => {}
        Some(alarms) => {
            let by_name: BTreeMap<&str, &(i64, AlarmDoc)> =
                alarms.iter().map(|entry| (entry.1.name.as_str(), entry)).collect();
            for wanted in &document.alarms {
                let what = format!("alarm {}", wanted.name);
                match by_name.get(wanted.name.as_str()) {
                    None => {
                        if wanted.secret.is_none() {
                            return Err(format!(
                                "alarm `{}`: a new alarm needs its `secret`",
                                wanted.name
                            ));
                        }
                        plan.lines
                            .push(created(&what, &AlarmDoc { secret: None, ..wanted.clone() }));
                        plan.steps.push(Step::CreateAlarm(wanted.clone()));
                    }
                    Some((id, have)) => {
                        let fields =
                            differences(have, &AlarmDoc { secret: None, ..wanted.clone() });
                        if fields.is_empty() {
                            plan.keep(what);
                        } else {
                            plan.lines.push(Line { sign: '~', what, fields });
                            plan.steps.push(Step::UpdateAlarm { id: *id, doc: wanted.clone() });
                        }
                    }
                }
            }
        }
    }

    // What the document does not have: deleted with `prune` (alarms, then jobs, then calendars,
    // which jobs name), else listed. Groups are never deleted: the API has no such change.
    let not_in_document = |what: String, delete: Option<Step>, plan: &mut Plan| {
        let kept = |why: &str| format!("not in the document: kept ({why})");
        match delete {
            Some(step) if prune => {
                plan.lines.push(Line { sign: '-', what, fields: Vec::new() });
                plan.steps.push(step);
            }
            Some(_) => {
                plan.lines.push(Line { sign: '!', what, fields: vec![kept("--prune deletes it")] })
            }
            None => plan.lines.push(Line {
                sign: '!',
                what,
                fields: vec![kept("groups are not deleted")],
            }),
        }
    };
    let named: BTreeSet<&str> = document.alarms.iter().map(|a| a.name.as_str()).collect();
    for (id, alarm) in current.alarms.iter().flatten() {
        if !named.contains(alarm.name.as_str()) {
            let delete = Step::DeleteAlarm { id: *id, name: alarm.name.clone() };
            not_in_document(format!("alarm {}", alarm.name), Some(delete), &mut plan);
        }
    }
    let named: BTreeSet<String> = document.jobs.iter().map(JobDoc::key).collect();
    for job in &current.jobs {
        let key = job.doc.key();
        if !named.contains(&key) {
            let what = format!("job {key}");
            not_in_document(what, Some(Step::DeleteJob { id: job.id, key }), &mut plan);
        }
    }
    let named: BTreeSet<&str> = document.calendars.iter().map(|c| c.name.as_str()).collect();
    for calendar in &current.calendars {
        if !named.contains(calendar.name.as_str()) {
            let delete = Step::DeleteCalendar { name: calendar.name.clone() };
            not_in_document(format!("calendar {}", calendar.name), Some(delete), &mut plan);
        }
    }
    let named: BTreeSet<&str> = document.groups.iter().map(|g| g.app_name.as_str()).collect();
    for (_, group) in &current.groups {
        if !named.contains(group.app_name.as_str()) {
            not_in_document(format!("group {}", group.app_name), None, &mut plan);
        }
    }
    Ok(plan)
}

/// Refuses a document that names what neither it nor the admin has, or a job the admin has
/// twice.
fn check_references(document: &Document, current: &Current) -> Result<(), String> {
    let groups: BTreeSet<&str> = document
        .groups
        .iter()
        .map(|g| g.app_name.as_str())
        .chain(current.groups.iter().map(|(_, g)| g.app_name.as_str()))
        .collect();
    let calendars: BTreeSet<&str> = document
        .calendars
        .iter()
        .map(|c| c.name.as_str())
        .chain(current.calendars.iter().map(|c| c.name.as_str()))
        .collect();
    let mut have = BTreeMap::new();
    for job in &current.jobs {
        *have.entry(job.doc.key()).or_insert(0) += 1;
    }
    let jobs: BTreeSet<String> =
        document.jobs.iter().map(JobDoc::key).chain(have.keys().cloned()).collect();
    for job in &document.jobs {
        let key = job.key();
        if !groups.contains(job.group.as_str()) {
            return Err(format!("job `{key}`: no group `{}` here or in the document", job.group));
        }
        if have.get(&key).is_some_and(|count| *count > 1) {
            return Err(format!(
                "job `{key}`: the admin has more than one job of this name in the group; rename \
                 all but one before applying a document that names it"
            ));
        }
        if let Some(calendar) = &job.calendar
            && !calendars.contains(calendar.as_str())
        {
            return Err(format!("job `{key}`: no calendar `{calendar}` here or in the document"));
        }
        for child in &job.children {
            if !jobs.contains(child) {
                return Err(format!("job `{key}`: no child job `{child}` here or in the document"));
            }
        }
    }
    for alarm in &document.alarms {
        if let Some(group) = &alarm.group
            && !groups.contains(group.as_str())
        {
            return Err(format!(
                "alarm `{}`: no group `{group}` here or in the document",
                alarm.name
            ));
        }
    }
    Ok(())
}

/// The step that gives a job the component or source the document names, if it has another.
fn version_step(
    wanted: &JobDoc,
    have: Option<&CurrentJob>,
    files: &BTreeMap<String, String>,
    fields: &mut Vec<String>,
) -> Result<Option<Step>, String> {
    let key = wanted.key();
    match wanted.versions() {
        Versions::None => Ok(None),
        Versions::Source => {
            let Some(source) = &wanted.source else { return Ok(None) };
            let active = have.and_then(|h| h.doc.source.as_ref());
            if active == Some(source) {
                return Ok(None);
            }
            let lines = source.lines().count();
            fields.push(format!(
                "source: {} → {lines} lines, uploaded",
                match active {
                    Some(old) => format!("{} lines", old.lines().count()),
                    None => "none".to_owned(),
                }
            ));
            Ok(Some(Step::Upload { key }))
        }
        Versions::Component => {
            let Some(component) = &wanted.component else { return Ok(None) };
            let sha256 =
                wanted_sha256(component, files).map_err(|e| format!("job `{key}`: {e}"))?;
            let active = have.and_then(|h| h.doc.component.as_ref()).and_then(|c| c.sha256.clone());
            if active.as_deref() == Some(sha256.as_str()) {
                return Ok(None);
            }
            let old = active.as_deref().map_or("none".to_owned(), short);
            let held = have.and_then(|h| h.versions.iter().rev().find(|(_, s)| *s == sha256));
            let (how, step) = match (held, &component.path) {
                (Some((version, _)), _) => (
                    format!("version {version} activated"),
                    Step::Activate { key, version: *version },
                ),
                (None, Some(path)) => (format!("uploaded from {path}"), Step::Upload { key }),
                (None, None) => {
                    return Err(format!(
                        "job `{key}`: component {} is not among the job's versions here; give \
                         its `path`",
                        short(&sha256)
                    ));
                }
            };
            fields.push(format!("component: {old} → {}, {how}", short(&sha256)));
            Ok(Some(step))
        }
    }
}

/// `sha256:` and the first 12 digits.
fn short(sha256: &str) -> String {
    format!("sha256:{}", sha256.get(..12).unwrap_or(sha256))
}

fn sorted(items: &[String]) -> Vec<&String> {
    let mut items: Vec<&String> = items.iter().collect();
    items.sort();
    items
}

/// A new thing's line: its fields that are not defaults.
fn created<T: Serialize>(what: &str, wanted: &T) -> Line {
    Line { sign: '+', what: what.to_owned(), fields: fields_of(wanted) }
}

/// A new job's fields that are not defaults, but for its key.
fn summary(job: &JobDoc) -> Vec<String> {
    let mut fields = fields_of(job);
    fields.retain(|f| !f.starts_with("group:") && !f.starts_with("name:"));
    fields
}

fn fields_of<T: Serialize>(value: &T) -> Vec<String> {
    let Ok(Value::Object(map)) = serde_json::to_value(value) else { return Vec::new() };
    map.iter()
        .filter(|(key, _)| !matches!(key.as_str(), "component" | "source" | "source_path"))
        .map(|(key, value)| format!("{key}: {}", shown(value)))
        .collect()
}

/// The fields in which `have` and `wanted` differ, as `field: old → new`. A field left out of
/// one side is at its default there.
fn differences<T: Serialize>(have: &T, wanted: &T) -> Vec<String> {
    let (Ok(Value::Object(have)), Ok(Value::Object(wanted))) =
        (serde_json::to_value(have), serde_json::to_value(wanted))
    else {
        return Vec::new();
    };
    let keys: BTreeSet<&String> = have.keys().chain(wanted.keys()).collect();
    let mut fields = Vec::new();
    for key in keys {
        let (old, new) = (have.get(key), wanted.get(key));
        if old != new {
            let side = |value: Option<&Value>| value.map_or("(default)".to_owned(), shown);
            fields.push(format!("{key}: {} → {}", side(old), side(new)));
        }
    }
    fields
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => show(text),
        other => other.to_string(),
    }
}

/// A text as a quoted string, shortened past 60 characters.
fn show(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(60).collect();
    if chars.next().is_some() { format!("{:?}…", head) } else { format!("{head:?}") }
}
