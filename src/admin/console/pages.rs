//! The console's pages: each reads what it shows through `storage` and renders one template.
//!
//! Pages only read. The forms and buttons on them change things through the operator API
//! (see `console.js`), so nothing here checks a role beyond hiding what a role cannot use and
//! refusing the admin-only pages.

use axum::extract::{Query, State};
use axum::response::Html;
use chrono::{DateTime, Utc};
use minijinja::context;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{PageError, Signed, job_form, render, text};
use crate::access::Role;
use crate::admin::dispatch::Peer;
use crate::admin::http::extract::Path;
use crate::admin::http::logs::{Bound, LIST_COUNT_CAP, parse_time_bound};
use crate::admin::{AppState, now_ms};
use crate::model::{Job, RunRecord, RunState};
use crate::netpolicy::is_pull_address;
use crate::protocol::REGISTRY_GROUP_EXECUTOR;
use crate::storage::{DayCounts, RunFilter};

/// Every template, by name.
pub const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("error.html", include_str!("templates/error.html")),
    ("login.html", include_str!("templates/login.html")),
    ("dashboard.html", include_str!("templates/dashboard.html")),
    ("jobs.html", include_str!("templates/jobs.html")),
    ("job_fields.html", include_str!("templates/job_fields.html")),
    ("job_form.html", include_str!("templates/job_form.html")),
    ("run_rows.html", include_str!("templates/run_rows.html")),
    ("job.html", include_str!("templates/job.html")),
    ("job_backfills.html", include_str!("templates/job_backfills.html")),
    ("runs.html", include_str!("templates/runs.html")),
    ("run.html", include_str!("templates/run.html")),
    ("executors.html", include_str!("templates/executors.html")),
    ("users.html", include_str!("templates/users.html")),
    ("audit.html", include_str!("templates/audit.html")),
    ("tokens.html", include_str!("templates/tokens.html")),
    ("versions.html", include_str!("templates/versions.html")),
    ("workflows.html", include_str!("templates/workflows.html")),
    ("workflow.html", include_str!("templates/workflow.html")),
    ("workflow_run.html", include_str!("templates/workflow_run.html")),
];

pub(super) type Page = Result<Html<String>, PageError>;

/// What every page's frame needs: who is signed in, their token, which tab is open.
pub(super) fn frame(signed: &Signed, tab: &str) -> Value {
    json!({
        "user": signed.principal.name,
        "role": signed.principal.role.as_str(),
        "is_admin": signed.principal.role == Role::Admin,
        "has_user": signed.principal.user_id.is_some(),
        "csrf": signed.csrf_token,
        "tab": tab,
    })
}

pub(super) fn time(ms: i64) -> String {
    if ms <= 0 {
        return String::new();
    }
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|time| time.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

pub async fn dashboard(State(state): State<AppState>, signed: Signed) -> Page {
    let now = now_ms();
    let jobs = state.db.list_jobs(None).await?;
    let running = jobs.iter().filter(|job| job.running).count();
    let mut online = 0;
    for group in state.db.list_groups().await? {
        online += state.cache.online_addresses(&group, now).await?.len();
    }
    let midnight = now - now.rem_euclid(DAY_MS);
    let week_start = midnight - 6 * DAY_MS;
    let by_day = state.db.report_days(week_start, now).await?;
    let today = by_day.last().cloned().unwrap_or_default();
    let runs_today: Vec<Value> = [
        ("success", today.success),
        ("failed", today.failed),
        ("timed_out", today.timed_out),
        ("killed", today.killed),
        ("lost", today.lost),
        ("skipped", today.skipped),
        ("running", today.running),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(state, n)| json!({"state": state, "count": n}))
    .collect();
    let failed = |d: &DayCounts| d.failed + d.timed_out + d.lost;
    let tallest = by_day.iter().map(|day| day.success.max(failed(day))).max().unwrap_or(0).max(1);
    let days: Vec<Value> = (0..7)
        .map(|index| {
            let day_ms = week_start + index * DAY_MS;
            let found = by_day.iter().find(|day| day.day_ms == day_ms);
            let (succeeded, failed, total) = found.map_or((0, 0, 0), |d| (d.success, failed(d), d.total));
            let label = DateTime::<Utc>::from_timestamp_millis(day_ms).map(|d| d.format("%m-%d").to_string());
            json!({
                "label": label.unwrap_or_default(), "succeeded": succeeded, "failed": failed, "total": total,
                "x": 20 + index * 90, "ok_height": succeeded * 110 / tallest, "bad_height": failed * 110 / tallest,
            })
        })
        .collect();
    let mut failing = Vec::new();
    for (job_id, failures) in state.db.top_failing_jobs(now - 7 * DAY_MS, 5).await? {
        let name = jobs.iter().find(|job| job.id == job_id).map(|job| job.spec.name.clone());
        failing.push(json!({"id": job_id, "name": name.unwrap_or_default(), "failures": failures}));
    }
    render(
        "dashboard.html",
        context! {
            frame => frame(&signed, "dashboard"), jobs => jobs.len(), running, online, runs_today, days, failing,
        },
    )
}

/// A day's milliseconds.
const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Deserialize)]
pub struct JobFilter {
    group_id: Option<String>,
    name: Option<String>,
    state: Option<String>,
}

pub async fn jobs(
    State(state): State<AppState>,
    signed: Signed,
    Query(filter): Query<JobFilter>,
) -> Page {
    let group_id = filter.group_id.as_deref().and_then(|id| id.parse::<i64>().ok());
    let name = filter.name.unwrap_or_default();
    let wanted = filter.state.unwrap_or_default();
    let groups = state.db.list_groups().await?;
    let jobs: Vec<Value> = state
        .db
        .list_jobs(group_id)
        .await?
        .into_iter()
        .filter(|job| job.spec.name.to_lowercase().contains(&name.trim().to_lowercase()))
        .filter(|job| match wanted.as_str() {
            "running" => job.running,
            "stopped" => !job.running,
            _ => true,
        })
        .map(|job| {
            let group = groups.iter().find(|g| g.id == job.spec.group_id).map_or("", |g| g.app_name.as_str());
            json!({
                "id": job.id, "name": job.spec.name, "group": group,
                "schedule": format!("{} {}", job.spec.schedule_type.as_str(), job.spec.schedule_conf),
                "running": job.running, "next_fire": time(job.next_fire_ms),
                "version": job.active_version,
                "may_change": signed.principal.may_change_group(job.spec.group_id),
            })
        })
        .collect();
    let groups: Vec<Value> =
        groups.iter().map(|g| json!({"id": g.id, "name": g.app_name})).collect();
    render(
        "jobs.html",
        context! { frame => frame(&signed, "jobs"), jobs, groups, group_id, name, state => wanted },
    )
}

async fn writable_groups(state: &AppState, signed: &Signed) -> Result<Vec<Value>, PageError> {
    Ok(state
        .db
        .list_groups()
        .await?
        .iter()
        .filter(|group| signed.principal.may_change_group(group.id))
        .map(|group| json!({"id": group.id, "name": group.app_name, "title": group.title}))
        .collect())
}

pub async fn new_job(State(state): State<AppState>, signed: Signed) -> Page {
    if signed.principal.role == Role::Viewer {
        return Err(PageError::Forbidden("error.viewer_create"));
    }
    let groups = writable_groups(&state, &signed).await?;
    let form = job_form::form_view(None, &groups);
    render("job_form.html", context! { frame => frame(&signed, "jobs"), form })
}

/// What the job and versions pages show of a job besides its form.
fn job_view(job: &Job) -> Value {
    json!({
        "id": job.id, "name": job.spec.name, "glue_type": job.spec.glue_type.as_str(),
        "param": job.spec.param,
        "running": job.running, "next_fire": time(job.next_fire_ms), "active_version": job.active_version,
    })
}

pub async fn job(State(state): State<AppState>, signed: Signed, Path(id): Path<i64>) -> Page {
    let job = state.db.get_job(id).await?.ok_or(PageError::NotFound("error.job_not_found", id))?;
    let may_change = signed.principal.may_change_group(job.spec.group_id);
    let mut groups = writable_groups(&state, &signed).await?;
    if !may_change && let Some(group) = state.db.get_group(job.spec.group_id).await? {
        groups.push(json!({"id": group.id, "name": group.app_name, "title": group.title}));
    }
    let filter =
        RunFilter { job_id: Some(id), limit: 10, count_up_to: Some(0), ..RunFilter::default() };
    let runs: Vec<Value> = state.db.list_runs(&filter).await?.items.iter().map(run_view).collect();
    let mut backfills = Vec::new();
    for backfill in state.db.list_backfills(id, 20).await? {
        let progress = state.db.backfill_progress(&backfill).await?;
        backfills.push(json!({
            "id": backfill.id, "state": backfill.state.as_str(), "reason": backfill.reason,
            "from": time(backfill.from_ms), "to": time(backfill.to_ms), "total": backfill.total,
            "done": progress.done, "failed": progress.failed, "skipped": progress.skipped,
            "running": progress.running, "remaining": progress.remaining(),
            "finished": progress.done + progress.failed + progress.skipped,
        }));
    }
    render(
        "job.html",
        context! {
            frame => frame(&signed, "jobs"), job => job_view(&job),
            form => job_form::form_view(Some(&job.spec), &groups), runs, may_change, backfills,
        },
    )
}

/// A job's versions: upload (or, for a GLUE source job, the source editor), history, source,
/// diff and activation. Which versions have source the script learns from the API, so the page
/// offers source actions exactly where the API has source.
pub async fn versions(State(state): State<AppState>, signed: Signed, Path(id): Path<i64>) -> Page {
    let job = state.db.get_job(id).await?.ok_or(PageError::NotFound("error.job_not_found", id))?;
    let may_change = signed.principal.may_change_group(job.spec.group_id);
    let versions: Vec<Value> = state
        .db
        .list_job_versions(id)
        .await?
        .into_iter()
        .map(|v| json!({
            "version": v.version, "sha256": v.sha256, "size": v.size, "remark": v.remark,
            "created_at": time(v.created_at_ms), "active": job.active_version == Some(v.version),
        }))
        .collect();
    // The content type a GLUE source job's text is saved with, and its language's name.
    let (source_type, source_language) = match job.spec.glue_type.as_str() {
        "GLUE_PYTHON" => (Some("text/x-python"), "Python"),
        "GLUE_JAVASCRIPT" => (Some("text/javascript"), "JavaScript"),
        _ => (None, ""),
    };
    render(
        "versions.html",
        context! {
            frame => frame(&signed, "jobs"), job => job_view(&job), versions, may_change,
            source_type, source_language,
        },
    )
}

fn run_view(run: &RunRecord) -> Value {
    json!({
        "id": run.id, "job_id": run.job_id, "state": run.state.as_str(),
        "trigger_type": run.trigger_type.as_str(), "trigger_time": time(run.trigger_time_ms),
        "executor": run.executor_address.clone().unwrap_or_default(), "param": run.param,
        "trigger_code": run.trigger_code, "trigger_msg": run.trigger_msg,
        "handle_time": time(run.handle_time_ms), "handle_code": run.handle_code, "handle_msg": run.handle_msg,
        "shard": format!("{}/{}", run.shard_index, run.shard_total), "attempt": run.attempt,
        "version": run.version, "fuel_used": run.fuel_used, "dispatched_at": time(run.dispatched_at_ms),
        "started_at": time(run.started_at_ms), "parent_run_id": run.parent_run_id,
        "ended": run.state.is_terminal(),
        // A pending run waits for its instant: a retry waits out its job's retry interval.
        "due_at": if run.state == RunState::Pending { time(run.trigger_time_ms) } else { String::new() },
    })
}

#[derive(Debug, Deserialize)]
pub struct RunQuery {
    job_id: Option<String>,
    state: Option<String>,
    from: Option<String>,
    to: Option<String>,
    page: Option<String>,
}

pub async fn runs(
    State(state): State<AppState>,
    signed: Signed,
    Query(query): Query<RunQuery>,
) -> Page {
    const PAGE_SIZE: i64 = 50;
    let job_id = query.job_id.as_deref().and_then(|id| id.trim().parse::<i64>().ok());
    let run_state = query.state.as_deref().and_then(|s| s.parse::<RunState>().ok());
    let page =
        query.page.as_deref().and_then(|p| p.parse::<i64>().ok()).unwrap_or(1).clamp(1, 100_000);
    // A time the API would refuse is shown beside its field, and the list is not narrowed by it.
    let from = query.from.unwrap_or_default();
    let to = query.to.unwrap_or_default();
    let bound = |value: &str, bound| match value.trim() {
        "" => (None, String::new()),
        value => match parse_time_bound(value, bound) {
            Ok(ms) => (Some(ms), String::new()),
            Err(_) => (None, text("runs.bad_time")),
        },
    };
    let (from_ms, from_error) = bound(&from, Bound::From);
    let (to_ms, to_error) = bound(&to, Bound::To);
    let filter = RunFilter {
        job_id,
        state: run_state,
        from_ms,
        to_ms,
        limit: PAGE_SIZE,
        offset: (page - 1) * PAGE_SIZE,
        count_up_to: Some(LIST_COUNT_CAP),
    };
    let found = state.db.list_runs(&filter).await?;
    let runs: Vec<Value> = found.items.iter().map(run_view).collect();
    let states: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
    // Past the count's cap the pages are not counted: a next page is offered while one follows.
    let pages = if found.total_capped {
        page + i64::from(found.has_more)
    } else {
        ((found.total + PAGE_SIZE - 1) / PAGE_SIZE).max(page + i64::from(found.has_more))
    };
    let total =
        if found.total_capped { format!("{}+", found.total) } else { found.total.to_string() };
    // The filter again, for the links to the other pages.
    let mut kept = url::form_urlencoded::Serializer::new(String::new());
    if let Some(job_id) = job_id {
        kept.append_pair("job_id", &job_id.to_string());
    }
    if let Some(run_state) = run_state {
        kept.append_pair("state", run_state.as_str());
    }
    for (name, value) in [("from", &from), ("to", &to)] {
        if !value.trim().is_empty() {
            kept.append_pair(name, value.trim());
        }
    }
    let kept = kept.finish();
    let query = if kept.is_empty() { String::new() } else { format!("&{kept}") };
    render(
        "runs.html",
        context! {
            frame => frame(&signed, "runs"), runs, states, total, page, pages,
            capped => found.total_capped,
            job_id, state => run_state.map(|s| s.as_str()), from, to, from_error, to_error, query,
        },
    )
}

pub async fn run(State(state): State<AppState>, signed: Signed, Path(id): Path<i64>) -> Page {
    let run = state.db.get_run(id).await?.ok_or(PageError::NotFound("error.run_not_found", id))?;
    let job = state.db.get_job(run.job_id).await?;
    let may_kill = job.as_ref().map_or(signed.principal.role == Role::Admin, |job| {
        signed.principal.may_change_group(job.spec.group_id)
    });
    let job_name = job.map(|job| job.spec.name).unwrap_or_default();
    render(
        "run.html",
        context! { frame => frame(&signed, "runs"), run => run_view(&run), job_name, may_kill },
    )
}

pub async fn executors(State(state): State<AppState>, signed: Signed) -> Page {
    let now = now_ms();
    let mut groups = Vec::new();
    for group in state.db.list_groups().await? {
        let online = state.cache.online_addresses(&group, now).await?;
        groups.push(json!({
            "id": group.id, "name": group.app_name, "title": group.title,
            "address_type": group.address_type.as_str(), "online": online,
        }));
    }
    let window_ms =
        3 * i64::try_from(state.config.heartbeat_interval.as_millis()).unwrap_or(30_000);
    let executors: Vec<Value> = state
        .db
        .list_registrations(REGISTRY_GROUP_EXECUTOR)
        .await?
        .into_iter()
        .map(|row| json!({
            "app_name": row.app_name, "address": row.address, "last_beat": time(row.updated_at_ms),
            "online": now - row.updated_at_ms <= window_ms,
            "protocol": Peer::shown_kind(&row.peer_kind), "version": row.version,
            "mode": if is_pull_address(&row.address) { "pull" } else { "push" },
        }))
        .collect();
    render("executors.html", context! { frame => frame(&signed, "executors"), groups, executors })
}

fn admin_only(signed: &Signed) -> Result<(), PageError> {
    if signed.principal.role == Role::Admin {
        return Ok(());
    }
    Err(PageError::Forbidden("error.admin_only"))
}

pub async fn users(State(state): State<AppState>, signed: Signed) -> Page {
    admin_only(&signed)?;
    let groups = state.db.list_groups().await?;
    let users: Vec<Value> = state
        .db
        .list_users()
        .await?
        .into_iter()
        .map(|user| {
            let names: Vec<&str> = user
                .group_ids
                .iter()
                .filter_map(|id| groups.iter().find(|g| g.id == *id).map(|g| g.app_name.as_str()))
                .collect();
            json!({
                "id": user.id, "name": user.name, "role": user.role.as_str(), "groups": names.join(", "),
                "created_at": time(user.created_at_ms), "is_me": signed.principal.user_id == Some(user.id),
            })
        })
        .collect();
    let groups: Vec<Value> =
        groups.iter().map(|g| json!({"id": g.id, "name": g.app_name})).collect();
    render("users.html", context! { frame => frame(&signed, "users"), users, groups })
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
}

pub async fn audit(
    State(state): State<AppState>,
    signed: Signed,
    Query(query): Query<AuditQuery>,
) -> Page {
    admin_only(&signed)?;
    let actor = query.actor.filter(|a| !a.trim().is_empty());
    let action = query.action.filter(|a| !a.trim().is_empty());
    let page = state.db.list_audit(actor.as_deref(), action.as_deref(), 200, 0).await?;
    let entries: Vec<Value> = page
        .items
        .into_iter()
        .map(|record| json!({
            "id": record.id, "at": time(record.at_ms), "actor": record.entry.actor,
            "source": record.entry.source, "action": record.entry.action, "target": record.entry.target,
            "before": record.entry.before_json.unwrap_or_default(),
            "after": record.entry.after_json.unwrap_or_default(),
        }))
        .collect();
    render(
        "audit.html",
        context! { frame => frame(&signed, "audit"), entries, total => page.total, actor, action },
    )
}

pub async fn tokens(State(state): State<AppState>, signed: Signed) -> Page {
    let Some(user_id) = signed.principal.user_id else {
        return Err(PageError::Forbidden("error.no_tokens"));
    };
    let tokens: Vec<Value> = state
        .db
        .list_api_tokens(user_id)
        .await?
        .into_iter()
        .map(|token| {
            json!({
                "id": token.id, "name": token.name, "created_at": time(token.created_at_ms),
                "last_used_at": time(token.last_used_at_ms),
            })
        })
        .collect();
    render("tokens.html", context! { frame => frame(&signed, "tokens"), tokens })
}
