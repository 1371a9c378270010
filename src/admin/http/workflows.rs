//! Workflows (`crate::workflow`): `/workflows` to create, list, read, change and delete them,
//! `POST /workflows/{id}/trigger` to run one, `GET /workflows/{id}/runs` and
//! `GET /workflow-runs/{id}` for their runs with each node's state, and
//! `POST /workflow-runs/{id}/kill` and `/nodes/{name}/retry` to stop a run or retry a node;
//! `POST /workflows/{id}/start` and `/stop` for its schedule. The document and its checks are
//! `workflows/document.rs`.
//!
//! Every node's job must be of the workflow's group, so a caller allowed to change that group's
//! jobs may trigger every node.

use std::collections::HashMap;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::{
    ApiError, BadRequest, Conflict, Forbidden, Internal, NotFound, Overloaded, TooLarge,
    Unauthorized, Unprocessable, UnsupportedMediaType,
};
use super::extract::{Json, Path, Query};
use super::rfc3339;
use crate::admin::AppState;
use crate::model::{ScheduleType, TriggerType};
use crate::storage::{NodeRecord, NodeRetry, Workflow, WorkflowRun};

pub(in crate::admin) mod document;

use self::document::{
    EdgeBody, WorkflowBody, body_of, checked, edge_body, invalid, next_fire, schedule_of,
};

/// The most workflows a list shows.
const LIST_LIMIT: i64 = 1_000;
/// The most runs of a workflow a list shows.
const RUNS_LIMIT: i64 = 100;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/workflows", get(list_workflows).post(create_workflow))
        .route("/workflows/{id}", get(get_workflow).put(update_workflow).delete(delete_workflow))
        .route("/workflows/{id}/trigger", post(trigger_workflow))
        .route("/workflows/{id}/start", post(start_workflow))
        .route("/workflows/{id}/stop", post(stop_workflow))
        .route("/workflows/{id}/runs", get(list_workflow_runs))
        .route("/workflow-runs/{id}", get(get_workflow_run))
        .route("/workflow-runs/{id}/kill", post(kill_workflow_run))
        .route("/workflow-runs/{id}/nodes/{name}/retry", post(retry_workflow_node))
}

/// A stored workflow.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowResponse {
    id: i64,
    #[serde(flatten)]
    workflow: WorkflowBody,
    /// Started: it fires on its schedule.
    running: bool,
    /// Its next fire, while started.
    next_fire: Option<String>,
    created_by: String,
    created_at: Option<String>,
    updated_at: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowList {
    items: Vec<WorkflowResponse>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this group's workflows.
    group_id: Option<i64>,
}

/// A workflow run, without its nodes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowRunSummary {
    id: i64,
    workflow_id: i64,
    group_id: i64,
    name: String,
    /// `running`, `success`, `failed` or `killed`.
    state: String,
    /// `MANUAL`, or `CRON` and `MISFIRE` for a fire of its schedule.
    trigger_type: String,
    created_by: String,
    created_at: Option<String>,
    updated_at: Option<String>,
    ended_at: Option<String>,
}

/// A workflow run with each node's state and runs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowRunResponse {
    #[serde(flatten)]
    run: WorkflowRunSummary,
    nodes: Vec<NodeRunResponse>,
    /// The edges of the document it runs.
    edges: Vec<EdgeBody>,
}

/// One node of a workflow run.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct NodeRunResponse {
    name: String,
    job_id: i64,
    /// `waiting`, `starting` (decided, its runs being created), `running`, `succeeded`,
    /// `failed` or `skipped`.
    state: String,
    /// How many times it was started (a retry by hand starts it again).
    round: i64,
    /// Why it failed without runs, or empty.
    reason: String,
    /// Once it ended: each shard whose run succeeded, with its message.
    #[schema(value_type = Object)]
    output: serde_json::Value,
    started_at: Option<String>,
    ended_at: Option<String>,
    /// The ids of its runs in its latest round, every shard and attempt, oldest first.
    log_ids: Vec<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowRunList {
    items: Vec<WorkflowRunSummary>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TriggeredResponse {
    workflow_run_id: i64,
}

/// What a kill did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct KilledResponse {
    /// How many of its runs were asked to stop.
    runs_killed: usize,
    run: WorkflowRunResponse,
}

/// Lists the workflows, of one group with `group_id`.
#[utoipa::path(get, path = "/workflows", tag = "workflows", params(ListQuery),
    responses((status = 200, body = WorkflowList), BadRequest, Unauthorized, Internal))]
async fn list_workflows(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<WorkflowList>, ApiError> {
    let workflows = state.db.list_workflows(query.group_id, LIST_LIMIT).await?;
    Ok(axum::Json(WorkflowList { items: workflows.into_iter().map(response).collect() }))
}

/// Creates a workflow. Refused with the culprit named: a cycle, an unknown node in an edge,
/// a job that does not exist or is of another group, more than 200 nodes.
#[utoipa::path(post, path = "/workflows", tag = "workflows", request_body = WorkflowBody,
    responses((status = 201, body = WorkflowResponse), BadRequest, Unauthorized, Forbidden,
    TooLarge, UnsupportedMediaType, Unprocessable, Internal))]
async fn create_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<WorkflowBody>,
) -> Result<(StatusCode, axum::Json<WorkflowResponse>), ApiError> {
    actor.require_group(body.group_id)?;
    let schedule = schedule_of(&body)?;
    let spec = checked(&state, body).await?;
    let workflow = state.db.create_workflow(&spec, &schedule, &actor.principal.name, now()).await?;
    tracing::info!(workflow.id = workflow.id, "created workflow {}", workflow.id);
    let created = response(workflow);
    let target = format!("workflow {}", created.id);
    actor.audit(&state, "workflow.create", target, None, Some(&created)).await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// Shows one workflow: the document the API took.
#[utoipa::path(get, path = "/workflows/{id}", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 200, body = WorkflowResponse), BadRequest, Unauthorized, NotFound, Internal))]
async fn get_workflow(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<WorkflowResponse>, ApiError> {
    Ok(axum::Json(response(find(&state, id).await?)))
}

/// Replaces a workflow's document. Its runs under way keep the document they started with.
#[utoipa::path(put, path = "/workflows/{id}", tag = "workflows", params(("id" = i64, Path)),
    request_body = WorkflowBody, responses((status = 200, body = WorkflowResponse), BadRequest,
    Unauthorized, Forbidden, NotFound, TooLarge, UnsupportedMediaType, Unprocessable, Internal))]
async fn update_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<WorkflowBody>,
) -> Result<axum::Json<WorkflowResponse>, ApiError> {
    let before = find(&state, id).await?;
    actor.require_group(before.spec.group_id)?;
    if body.group_id != before.spec.group_id {
        return Err(invalid(format!(
            "group_id: workflow {id} is of group {}; a workflow does not move to another group",
            before.spec.group_id
        )));
    }
    let schedule = schedule_of(&body)?;
    let spec = checked(&state, body).await?;
    // A started workflow fires on its new schedule from now; one without a further fire stops.
    let next_fire_ms = next_fire(&schedule, now()).unwrap_or(0);
    let after = state.db.update_workflow(id, &spec, &schedule, next_fire_ms, now()).await?;
    let after = response(after.ok_or_else(|| not_found(id))?);
    let before = response(before);
    let target = format!("workflow {id}");
    actor.audit(&state, "workflow.update", target, Some(&before), Some(&after)).await;
    Ok(axum::Json(after))
}

/// Deletes a workflow; its runs stay, and those under way go on.
#[utoipa::path(delete, path = "/workflows/{id}", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 204), BadRequest, Unauthorized, Forbidden, NotFound, Internal))]
async fn delete_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    let before = find(&state, id).await?;
    actor.require_group(before.spec.group_id)?;
    if !state.db.delete_workflow(id).await? {
        return Err(not_found(id));
    }
    let before = response(before);
    actor.audit(&state, "workflow.delete", format!("workflow {id}"), Some(&before), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs a workflow now: its root nodes start at once, the others as their edges allow.
#[utoipa::path(post, path = "/workflows/{id}/trigger", tag = "workflows",
    params(("id" = i64, Path)), responses((status = 201, body = TriggeredResponse), BadRequest,
    Unauthorized, Forbidden, NotFound, Internal, Overloaded))]
async fn trigger_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<(StatusCode, axum::Json<TriggeredResponse>), ApiError> {
    let workflow = find(&state, id).await?;
    actor.require_group(workflow.spec.group_id)?;
    super::admit_trigger(&state).await?;
    let run_id = state
        .dispatcher
        .trigger_workflow(&workflow, TriggerType::Manual, &actor.principal.name)
        .await
        .map_err(ApiError::Internal)?;
    let triggered = TriggeredResponse { workflow_run_id: run_id };
    actor.audit(&state, "workflow.trigger", format!("workflow {id}"), None, Some(&triggered)).await;
    Ok((StatusCode::CREATED, axum::Json(triggered)))
}

/// Starts a workflow: it fires on its schedule from its next fire on.
#[utoipa::path(post, path = "/workflows/{id}/start", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 200, body = WorkflowResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Conflict, Internal))]
async fn start_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<WorkflowResponse>, ApiError> {
    let workflow = find(&state, id).await?;
    actor.require_group(workflow.spec.group_id)?;
    if workflow.schedule.schedule_type == ScheduleType::None {
        return Err(ApiError::Conflict(format!(
            "workflow {id} has no schedule (NONE): trigger it, or give it one"
        )));
    }
    let Some(next_fire_ms) = next_fire(&workflow.schedule, now()) else {
        return Err(ApiError::Conflict(format!("workflow {id}'s schedule never fires again")));
    };
    let after = state.db.set_workflow_running(id, Some(next_fire_ms), now()).await?;
    let after = response(after.ok_or_else(|| not_found(id))?);
    actor.audit(&state, "workflow.start", format!("workflow {id}"), None, Some(&after)).await;
    Ok(axum::Json(after))
}

/// Stops a workflow: it no longer fires on its schedule; its runs under way go on.
#[utoipa::path(post, path = "/workflows/{id}/stop", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 200, body = WorkflowResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Internal))]
async fn stop_workflow(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<WorkflowResponse>, ApiError> {
    let workflow = find(&state, id).await?;
    actor.require_group(workflow.spec.group_id)?;
    let after = state.db.set_workflow_running(id, None, now()).await?;
    let after = response(after.ok_or_else(|| not_found(id))?);
    actor.audit(&state, "workflow.stop", format!("workflow {id}"), None, Some(&after)).await;
    Ok(axum::Json(after))
}

/// Lists a workflow's runs, newest first (at most 100).
#[utoipa::path(get, path = "/workflows/{id}/runs", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 200, body = WorkflowRunList), BadRequest, Unauthorized, Internal))]
async fn list_workflow_runs(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<WorkflowRunList>, ApiError> {
    // A deleted workflow's runs stay listed.
    let runs = state.db.list_workflow_runs(id, RUNS_LIMIT).await?;
    Ok(axum::Json(WorkflowRunList { items: runs.into_iter().map(summary).collect() }))
}

/// Shows a workflow run with each node's state, output and runs.
#[utoipa::path(get, path = "/workflow-runs/{id}", tag = "workflows", params(("id" = i64, Path)),
    responses((status = 200, body = WorkflowRunResponse), BadRequest, Unauthorized, NotFound,
    Internal))]
async fn get_workflow_run(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<WorkflowRunResponse>, ApiError> {
    let run = find_run(&state, id).await?;
    Ok(axum::Json(run_response(&state, run).await?))
}

/// Kills a running workflow run: no node starts any more, and its runs not ended are killed.
#[utoipa::path(post, path = "/workflow-runs/{id}/kill", tag = "workflows",
    params(("id" = i64, Path)), responses((status = 200, body = KilledResponse), BadRequest,
    Unauthorized, Forbidden, NotFound, Conflict, Internal))]
async fn kill_workflow_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<axum::Json<KilledResponse>, ApiError> {
    let run = find_run(&state, id).await?;
    actor.require_group(run.spec.group_id)?;
    let Some(runs_killed) =
        state.dispatcher.kill_workflow_run(id).await.map_err(ApiError::Internal)?
    else {
        return Err(ApiError::Conflict(format!(
            "workflow run {id} is {}: only a running workflow run can be killed",
            run.state
        )));
    };
    let run = run_response(&state, find_run(&state, id).await?).await?;
    let killed = KilledResponse { runs_killed, run };
    let target = format!("workflow run {id}");
    actor.audit(&state, "workflow.kill", target, None, Some(&killed.run.run)).await;
    Ok(axum::Json(killed))
}

/// Retries a failed node by hand: it starts again, with the nodes skipped because of it
/// waiting again, and the workflow run goes on from there (it runs again if it had ended).
#[utoipa::path(post, path = "/workflow-runs/{id}/nodes/{name}/retry", tag = "workflows",
    params(("id" = i64, Path), ("name" = String, Path)),
    responses((status = 200, body = WorkflowRunResponse), BadRequest, Unauthorized, Forbidden,
    NotFound, Conflict, Internal))]
async fn retry_workflow_node(
    State(state): State<AppState>,
    actor: Actor,
    Path((id, name)): Path<(i64, String)>,
) -> Result<axum::Json<WorkflowRunResponse>, ApiError> {
    let run = find_run(&state, id).await?;
    actor.require_group(run.spec.group_id)?;
    let Some(node) = run.spec.nodes.iter().position(|node| node.name == name) else {
        return Err(ApiError::not_found(
            "node_not_found",
            format!("node `{name}` of workflow run {id}"),
        ));
    };
    match state.dispatcher.retry_workflow_node(id, node).await.map_err(ApiError::Internal)? {
        NodeRetry::Started => {}
        NodeRetry::NoRun => return Err(run_not_found(id)),
        NodeRetry::Killed => {
            return Err(ApiError::Conflict(format!(
                "workflow run {id} was killed: nothing of it starts again"
            )));
        }
        NodeRetry::Refused(error) => return Err(ApiError::Conflict(error.to_string())),
    }
    let after = run_response(&state, find_run(&state, id).await?).await?;
    let target = format!("workflow run {id} node {name}");
    actor.audit(&state, "workflow.retry", target, None, Some(&after.run)).await;
    Ok(axum::Json(after))
}

async fn find(state: &AppState, id: i64) -> Result<Workflow, ApiError> {
    state.db.get_workflow(id).await?.ok_or_else(|| not_found(id))
}

async fn find_run(state: &AppState, id: i64) -> Result<WorkflowRun, ApiError> {
    state.db.get_workflow_run(id).await?.ok_or_else(|| run_not_found(id))
}

fn response(workflow: Workflow) -> WorkflowResponse {
    WorkflowResponse {
        id: workflow.id,
        workflow: body_of(workflow.spec, workflow.schedule),
        running: workflow.running,
        next_fire: rfc3339(workflow.next_fire_ms),
        created_by: workflow.created_by,
        created_at: rfc3339(workflow.created_at_ms),
        updated_at: rfc3339(workflow.updated_at_ms),
    }
}

fn summary(run: WorkflowRun) -> WorkflowRunSummary {
    WorkflowRunSummary {
        id: run.id,
        workflow_id: run.workflow_id,
        group_id: run.spec.group_id,
        name: run.spec.name,
        state: run.state.to_string(),
        trigger_type: run.trigger_type.to_string(),
        created_by: run.created_by,
        created_at: rfc3339(run.created_at_ms),
        updated_at: rfc3339(run.updated_at_ms),
        ended_at: rfc3339(run.ended_at_ms),
    }
}

async fn run_response(state: &AppState, run: WorkflowRun) -> Result<WorkflowRunResponse, ApiError> {
    let records = state.db.workflow_nodes(run.id).await?;
    let runs = state.db.workflow_node_runs(run.id).await?;
    let by_node: HashMap<usize, &NodeRecord> =
        records.iter().map(|record| (record.node, record)).collect();
    let mut nodes = Vec::with_capacity(run.spec.nodes.len());
    for (index, node) in run.spec.nodes.iter().enumerate() {
        let record = by_node.get(&index);
        let round = record.map_or(0, |record| record.round);
        let state = match record {
            Some(record) if record.starting => "starting".to_owned(),
            Some(record) => record.state.to_string(),
            None => "waiting".to_owned(),
        };
        let output = record
            .filter(|record| !record.output.is_empty())
            .and_then(|record| serde_json::from_str(&record.output).ok())
            .unwrap_or(serde_json::Value::Null);
        let log_ids = runs
            .iter()
            .filter(|run| run.node.is_some_and(|of| of.node == index as i64 && of.round == round))
            .map(|run| run.id)
            .collect();
        nodes.push(NodeRunResponse {
            name: node.name.clone(),
            job_id: node.job_id,
            state,
            round,
            reason: record.map(|record| record.reason.clone()).unwrap_or_default(),
            output,
            started_at: record.and_then(|record| rfc3339(record.started_at_ms)),
            ended_at: record.and_then(|record| rfc3339(record.ended_at_ms)),
            log_ids,
        });
    }
    let edges = run.spec.edges.clone().into_iter().map(edge_body).collect();
    Ok(WorkflowRunResponse { run: summary(run), nodes, edges })
}

fn now() -> i64 {
    crate::admin::now_ms()
}

fn not_found(id: i64) -> ApiError {
    ApiError::not_found("workflow_not_found", format!("workflow {id}"))
}

fn run_not_found(id: i64) -> ApiError {
    ApiError::not_found("workflow_run_not_found", format!("workflow run {id}"))
}
