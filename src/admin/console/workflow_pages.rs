//! The workflow pages: the list, with a form for a new workflow's document; one workflow (its
//! graph, its document to edit, its runs, and the buttons to trigger, start, stop or delete
//! it); one workflow run (its graph coloured by each node's state, its nodes with their runs,
//! and the buttons to kill it or retry a failed node). A running workflow run's page reloads
//! itself every two seconds until the run ends.
//!
//! As everywhere in the console, pages only read; the forms and buttons go through the API.

use std::collections::HashMap;

use axum::extract::State;
use minijinja::context;
use serde_json::{Value, json};

use super::dag::{self, Look};
use super::pages::{Page, frame, time};
use super::{PageError, Signed, render, text};
use crate::admin::AppState;
use crate::admin::http::extract::Path;
use crate::admin::http::workflows::document::body_of;
use crate::storage::Workflow;
use crate::workflow::{Graph, WorkflowSpec};

/// The most workflows the list shows, and runs a workflow's page shows.
const LIST_LIMIT: i64 = 1_000;
const RUNS_LIMIT: i64 = 50;

pub async fn workflows(State(state): State<AppState>, signed: Signed) -> Page {
    let groups = state.db.list_groups().await?;
    let group_name =
        |id: i64| groups.iter().find(|g| g.id == id).map_or("", |g| g.app_name.as_str());
    let workflows: Vec<Value> = state
        .db
        .list_workflows(None, LIST_LIMIT)
        .await?
        .into_iter()
        .map(|workflow| {
            json!({
                "id": workflow.id, "name": workflow.spec.name,
                "group": group_name(workflow.spec.group_id), "nodes": workflow.spec.nodes.len(),
                "schedule": schedule_text(&workflow), "running": workflow.running,
                "next_fire": time(workflow.next_fire_ms),
            })
        })
        .collect();
    let example = json!({
        "name": "nightly-etl", "group_id": groups.first().map_or(1, |g| g.id),
        "nodes": [{"name": "extract", "job_id": 1}, {"name": "load", "job_id": 2}],
        "edges": [{"from": "extract", "to": "load"}],
    });
    let example = serde_json::to_string_pretty(&example).unwrap_or_default();
    render("workflows.html", context! { frame => frame(&signed, "workflows"), workflows, example })
}

pub async fn workflow(State(state): State<AppState>, signed: Signed, Path(id): Path<i64>) -> Page {
    let workflow = state.db.get_workflow(id).await?;
    let workflow = workflow.ok_or(PageError::NotFound("error.workflow_not_found", id))?;
    let graph = graph_of(&workflow.spec)?;
    let svg = dag::svg(&graph, &[], &text("workflow.graph"));
    let runs: Vec<Value> = state
        .db
        .list_workflow_runs(id, RUNS_LIMIT)
        .await?
        .into_iter()
        .map(|run| {
            json!({
                "id": run.id, "state": run.state.as_str(), "trigger_type": run.trigger_type.as_str(),
                "created": time(run.created_at_ms), "ended": time(run.ended_at_ms),
            })
        })
        .collect();
    let document = document(&workflow);
    let may_change = signed.principal.may_change_group(workflow.spec.group_id);
    let view = json!({
        "id": workflow.id, "name": workflow.spec.name, "schedule": schedule_text(&workflow),
        "has_schedule": workflow.schedule.schedule_type != crate::model::ScheduleType::None,
        "running": workflow.running, "next_fire": time(workflow.next_fire_ms),
    });
    render(
        "workflow.html",
        context! {
            frame => frame(&signed, "workflows"), workflow => view, document, runs, may_change,
            svg => minijinja::Value::from_safe_string(svg),
        },
    )
}

pub async fn workflow_run(
    State(state): State<AppState>,
    signed: Signed,
    Path(id): Path<i64>,
) -> Page {
    let run = state.db.get_workflow_run(id).await?;
    let run = run.ok_or(PageError::NotFound("error.workflow_run_not_found", id))?;
    let graph = graph_of(&run.spec)?;
    let records = state.db.workflow_nodes(id).await?;
    let runs = state.db.workflow_node_runs(id).await?;
    let mut logs: HashMap<(i64, i64), Vec<Value>> = HashMap::new();
    for node_run in &runs {
        let Some(of) = node_run.node else { continue };
        logs.entry((of.node, of.round)).or_default().push(json!({
            "id": node_run.id, "state": node_run.state.as_str(), "shard": node_run.shard_index,
            "attempt": node_run.attempt,
        }));
    }
    let mut looks = Vec::with_capacity(graph.node_count());
    let mut nodes = Vec::with_capacity(graph.node_count());
    for (index, spec) in graph.nodes().iter().enumerate() {
        let record = records.iter().find(|record| record.node == index);
        let state = match record {
            Some(record) if record.starting => "starting".to_owned(),
            Some(record) => record.state.as_str().to_owned(),
            None => "waiting".to_owned(),
        };
        let round = record.map_or(0, |record| record.round);
        let of_node = logs.remove(&(index as i64, round)).unwrap_or_default();
        let link =
            of_node.first().and_then(|log| log["id"].as_i64()).map(|log| format!("/runs/{log}"));
        looks.push(Look { state: Some(state.clone()), link });
        nodes.push(json!({
            "name": spec.name, "path_name": path_segment(&spec.name), "job_id": spec.job_id,
            "state": state, "round": round,
            "reason": record.map(|record| record.reason.clone()).unwrap_or_default(),
            "output": record.map(|record| output_text(&record.output)).unwrap_or_default(),
            "logs": of_node,
        }));
    }
    let svg = dag::svg(&graph, &looks, &text("workflow.graph"));
    let may_change = signed.principal.may_change_group(run.spec.group_id);
    let view = json!({
        "id": run.id, "workflow_id": run.workflow_id, "name": run.spec.name,
        "state": run.state.as_str(), "trigger_type": run.trigger_type.as_str(),
        "created": time(run.created_at_ms), "ended": time(run.ended_at_ms),
    });
    render(
        "workflow_run.html",
        context! {
            frame => frame(&signed, "workflows"), run => view, nodes, may_change,
            svg => minijinja::Value::from_safe_string(svg),
        },
    )
}

/// The graph of a stored document (checked when it was stored).
fn graph_of(spec: &WorkflowSpec) -> Result<Graph, PageError> {
    Graph::of_stored(spec).map_err(|error| PageError::Internal(anyhow::anyhow!("{error}")))
}

/// `workflow` as the document the API gives and takes, for the editor.
fn document(workflow: &Workflow) -> String {
    let body = body_of(workflow.spec.clone(), workflow.schedule.clone());
    serde_json::to_string_pretty(&body).unwrap_or_default()
}

fn schedule_text(workflow: &Workflow) -> String {
    let schedule = &workflow.schedule;
    format!("{} {}", schedule.schedule_type.as_str(), schedule.schedule_conf).trim().to_owned()
}

/// A node's stored output as a line: each shard's message after its index.
fn output_text(output: &str) -> String {
    let shards: Vec<Value> = serde_json::from_str(output).unwrap_or_default();
    let parts: Vec<String> = shards
        .iter()
        .map(|shard| {
            format!("{}: {}", shard["shard"], shard["message"].as_str().unwrap_or_default())
        })
        .collect();
    parts.join("; ")
}

/// `name` as one segment of a URL path: every byte but unreserved ones percent-encoded.
fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
