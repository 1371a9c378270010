//! Workflows (`crate::workflow`): `/workflows` to create, list, read, change and delete them,
//! `POST /workflows/{id}/trigger` to run one, `GET /workflows/{id}/runs` and
//! `GET /workflow-runs/{id}` for their runs with each node's state, and
//! `POST /workflow-runs/{id}/kill` and `/nodes/{name}/retry` to stop a run or retry a node.
//!
//! Every node's job must be of the workflow's group, so a caller allowed to change that group's
//! jobs may trigger every node.

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::auth::Actor;
use super::error::{
    ApiError, BadRequest, Conflict, Forbidden, Internal, NotFound, Overloaded, TooLarge,
    Unauthorized, Unprocessable, UnsupportedMediaType,
};
use super::extract::{Json, Path};
use super::rfc3339;
use crate::admin::AppState;
use crate::admin::admission::AdmitError;
use crate::model::TriggerType;
use crate::storage::{NodeRecord, NodeRetry, Workflow, WorkflowRun};
use crate::workflow::{self, Condition, EdgeSpec, NodeSpec, WorkflowSpec};

/// The most workflows a list shows.
const LIST_LIMIT: i64 = 1_000;
/// The most runs of a workflow a list shows.
const RUNS_LIMIT: i64 = 100;
/// The longest workflow name, in characters.
const MAX_NAME_CHARS: usize = 200;
/// The longest node parameter, in bytes (a job's own limit).
const MAX_PARAM_BYTES: usize = 64 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/workflows", get(list_workflows).post(create_workflow))
        .route("/workflows/{id}", get(get_workflow).put(update_workflow).delete(delete_workflow))
        .route("/workflows/{id}/trigger", post(trigger_workflow))
        .route("/workflows/{id}/runs", get(list_workflow_runs))
        .route("/workflow-runs/{id}", get(get_workflow_run))
        .route("/workflow-runs/{id}/kill", post(kill_workflow_run))
        .route("/workflow-runs/{id}/nodes/{name}/retry", post(retry_workflow_node))
}

/// A workflow as the API takes it and gives it: the same document for import and export.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct WorkflowBody {
    /// A human name, 1 to 200 characters.
    #[schema(example = "nightly-etl")]
    name: String,
    /// The group of the workflow and of every node's job.
    group_id: i64,
    /// The nodes, 1 to 200, each with a unique name.
    nodes: Vec<NodeBody>,
    /// The edges between nodes, by name.
    #[serde(default)]
    edges: Vec<EdgeBody>,
}

/// A node: a job of the workflow's group.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NodeBody {
    /// Unique within the workflow.
    #[schema(example = "extract")]
    name: String,
    /// The job it runs.
    job_id: i64,
    /// The parameter of its runs; absent for the job's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    param: Option<String>,
    /// Whether the outputs of its upstream nodes go to its job (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pass_inputs: Option<bool>,
}

/// An edge: `to` waits for `from`, and runs on the end of `from` that `condition` names.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct EdgeBody {
    from: String,
    to: String,
    /// `on_success` (the default), `on_failure` or `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "on_success")]
    condition: Option<String>,
}

/// A stored workflow.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct WorkflowResponse {
    id: i64,
    #[serde(flatten)]
    workflow: WorkflowBody,
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
    /// `MANUAL`.
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
    let spec = checked(&state, body).await?;
    let workflow = state.db.create_workflow(&spec, &actor.principal.name, now()).await?;
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
    let spec = checked(&state, body).await?;
    let after = state.db.update_workflow(id, &spec, now()).await?;
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
    match state.admission.admit(1).await {
        Ok(()) => {}
        Err(AdmitError::Overloaded(overloaded)) => {
            crate::metrics::admin().admission_refused("trigger");
            return Err(ApiError::Overloaded(overloaded.to_string()));
        }
        Err(AdmitError::Internal(error)) => return Err(error.into()),
    }
    let run_id = state
        .dispatcher
        .trigger_workflow(&workflow, TriggerType::Manual, &actor.principal.name)
        .await
        .map_err(ApiError::Internal)?;
    let triggered = TriggeredResponse { workflow_run_id: run_id };
    actor.audit(&state, "workflow.trigger", format!("workflow {id}"), None, Some(&triggered)).await;
    Ok((StatusCode::CREATED, axum::Json(triggered)))
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

/// `body` as a spec, checked: its name and parameters, then `workflow::validate` with its jobs'
/// groups as stored now.
async fn checked(state: &AppState, body: WorkflowBody) -> Result<WorkflowSpec, ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(format!("name: 1 to {MAX_NAME_CHARS} characters")));
    }
    // Names are stored as text, which holds no NUL on PostgreSQL.
    let names = body.nodes.iter().map(|node| &node.name);
    let ends = body.edges.iter().flat_map(|edge| [&edge.from, &edge.to]);
    if body.name.contains('\0') || names.chain(ends).any(|name| name.contains('\0')) {
        return Err(invalid("names hold no NUL character"));
    }
    let mut nodes = Vec::with_capacity(body.nodes.len());
    for (index, node) in body.nodes.into_iter().enumerate() {
        if node
            .param
            .as_ref()
            .is_some_and(|param| param.contains('\0') || param.len() > MAX_PARAM_BYTES)
        {
            return Err(invalid(format!(
                "nodes[{index}].param: at most 64 KiB, without NUL characters"
            )));
        }
        nodes.push(NodeSpec {
            name: node.name,
            job_id: node.job_id,
            param: node.param,
            pass_inputs: node.pass_inputs.unwrap_or(true),
        });
    }
    let mut edges = Vec::with_capacity(body.edges.len());
    for (index, edge) in body.edges.into_iter().enumerate() {
        let condition = match edge.condition.as_deref() {
            None => Condition::default(),
            Some(text) => text
                .parse()
                .map_err(|error| invalid(format!("edges[{index}].condition: {error}")))?,
        };
        edges.push(EdgeSpec { from: edge.from, to: edge.to, condition });
    }
    let spec = WorkflowSpec { name: name.to_owned(), group_id: body.group_id, nodes, edges };
    if state.db.get_group(spec.group_id).await?.is_none() {
        return Err(invalid(format!("group_id: group {} does not exist", spec.group_id)));
    }
    // The nodes' jobs' groups, read once each (a workflow has at most 200 nodes).
    let mut groups: HashMap<i64, Option<i64>> = HashMap::new();
    for node in spec.nodes.iter().take(workflow::MAX_NODES) {
        if let std::collections::hash_map::Entry::Vacant(entry) = groups.entry(node.job_id) {
            let job = state.db.get_job(node.job_id).await?;
            entry.insert(job.map(|job| job.spec.group_id));
        }
    }
    workflow::validate(&spec, |job_id| groups.get(&job_id).copied().flatten())
        .map_err(|error| invalid(error.to_string()))?;
    Ok(spec)
}

async fn find(state: &AppState, id: i64) -> Result<Workflow, ApiError> {
    state.db.get_workflow(id).await?.ok_or_else(|| not_found(id))
}

async fn find_run(state: &AppState, id: i64) -> Result<WorkflowRun, ApiError> {
    state.db.get_workflow_run(id).await?.ok_or_else(|| run_not_found(id))
}

fn body_of(spec: WorkflowSpec) -> WorkflowBody {
    WorkflowBody {
        name: spec.name,
        group_id: spec.group_id,
        nodes: spec
            .nodes
            .into_iter()
            .map(|node| NodeBody {
                name: node.name,
                job_id: node.job_id,
                param: node.param,
                pass_inputs: (!node.pass_inputs).then_some(false),
            })
            .collect(),
        edges: spec.edges.into_iter().map(edge_body).collect(),
    }
}

fn edge_body(edge: EdgeSpec) -> EdgeBody {
    let condition = (edge.condition != Condition::default()).then(|| edge.condition.to_string());
    EdgeBody { from: edge.from, to: edge.to, condition }
}

fn response(workflow: Workflow) -> WorkflowResponse {
    WorkflowResponse {
        id: workflow.id,
        workflow: body_of(workflow.spec),
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

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_workflow", message)
}

fn not_found(id: i64) -> ApiError {
    ApiError::not_found("workflow_not_found", format!("workflow {id}"))
}

fn run_not_found(id: i64) -> ApiError {
    ApiError::not_found("workflow_run_not_found", format!("workflow run {id}"))
}
