//! The workflow document as the API takes and gives it (the console's editor shows the same),
//! and its checks: names, parameters, the schedule, then `workflow::validate` against the jobs
//! as stored.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::super::error::ApiError;
use crate::admin::AppState;
use crate::model::{MisfireStrategy, ScheduleType};
use crate::schedule::Schedule;
use crate::storage::WorkflowSchedule;
use crate::workflow::{self, Condition, EdgeSpec, NodeSpec, WorkflowSpec};

/// The longest workflow name, in characters.
pub(super) const MAX_NAME_CHARS: usize = 200;
/// The longest node parameter, in bytes (a job's own limit).
pub(super) const MAX_PARAM_BYTES: usize = 64 * 1024;

/// A workflow as the API takes it and gives it: the same document for import and export.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::admin) struct WorkflowBody {
    /// A human name, 1 to 200 characters.
    #[schema(example = "nightly-etl")]
    pub(super) name: String,
    /// The group of the workflow and of every node's job.
    pub(super) group_id: i64,
    /// The nodes, 1 to 200, each with a unique name.
    pub(super) nodes: Vec<NodeBody>,
    /// The edges between nodes, by name.
    #[serde(default)]
    pub(super) edges: Vec<EdgeBody>,
    /// When it fires on its own once started: `NONE` (the default: only when triggered),
    /// `CRON` or `FIX_RATE`, as a job's.
    #[serde(default = "no_schedule")]
    #[schema(example = "CRON")]
    pub(super) schedule_type: String,
    /// The Quartz cron expression (with seconds), or the rate in seconds.
    #[serde(default)]
    #[schema(example = "0 0 2 * * ?")]
    pub(super) schedule_conf: String,
    /// The IANA time zone of a cron schedule; UTC without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) time_zone: Option<String>,
    /// `DO_NOTHING` (the default) or `FIRE_ONCE_NOW`: what a fire missed by more than 5 s does.
    #[serde(default = "do_nothing")]
    pub(super) misfire_strategy: String,
}

/// A node: a job of the workflow's group.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::admin) struct NodeBody {
    /// Unique within the workflow.
    #[schema(example = "extract")]
    pub(super) name: String,
    /// The job it runs.
    pub(super) job_id: i64,
    /// The parameter of its runs; absent for the job's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) param: Option<String>,
    /// Whether the outputs of its upstream nodes go to its job (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) pass_inputs: Option<bool>,
}

/// An edge: `to` waits for `from`, and runs on the end of `from` that `condition` names.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::admin) struct EdgeBody {
    pub(super) from: String,
    pub(super) to: String,
    /// `on_success` (the default), `on_failure` or `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "on_success")]
    pub(super) condition: Option<String>,
}

/// `body` as a spec, checked: its name and parameters, then `workflow::validate` with its jobs'
/// groups as stored now.
pub(super) async fn checked(
    state: &AppState,
    body: WorkflowBody,
) -> Result<WorkflowSpec, ApiError> {
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

/// The schedule `body` gives, checked as a job's is; `FIX_DELAY` is refused.
pub(super) fn schedule_of(body: &WorkflowBody) -> Result<WorkflowSchedule, ApiError> {
    let schedule_type: ScheduleType = body.schedule_type.parse().map_err(|error| {
        ApiError::bad_request("invalid_schedule", format!("schedule_type: {error}"))
    })?;
    if schedule_type == ScheduleType::FixDelay {
        return Err(ApiError::bad_request(
            "invalid_schedule",
            "schedule_type: FIX_DELAY is a job's only; a workflow takes NONE, CRON or FIX_RATE",
        ));
    }
    let misfire_strategy: MisfireStrategy = body.misfire_strategy.parse().map_err(|error| {
        ApiError::bad_request("invalid_schedule", format!("misfire_strategy: {error}"))
    })?;
    let texts = [Some(&body.schedule_conf), body.time_zone.as_ref()];
    if texts.into_iter().flatten().any(|text| text.contains('\0')) {
        return Err(ApiError::bad_request(
            "invalid_schedule",
            "schedule_conf and time_zone hold no NUL character",
        ));
    }
    let time_zone = body.time_zone.clone().filter(|zone| !zone.trim().is_empty());
    Schedule::parse(schedule_type, &body.schedule_conf, time_zone.as_deref())
        .map_err(|error| ApiError::bad_request("invalid_schedule", error.to_string()))?;
    Ok(WorkflowSchedule {
        schedule_type,
        schedule_conf: body.schedule_conf.clone(),
        time_zone,
        misfire_strategy,
    })
}

/// The first fire of `schedule` after `now_ms`, if it has one.
pub(super) fn next_fire(schedule: &WorkflowSchedule, now_ms: i64) -> Option<i64> {
    let parsed = Schedule::parse(
        schedule.schedule_type,
        &schedule.schedule_conf,
        schedule.time_zone.as_deref(),
    );
    parsed.ok().and_then(|schedule| schedule.next_after(now_ms))
}

pub(super) fn no_schedule() -> String {
    "NONE".to_owned()
}

pub(super) fn do_nothing() -> String {
    "DO_NOTHING".to_owned()
}

pub(in crate::admin) fn body_of(spec: WorkflowSpec, schedule: WorkflowSchedule) -> WorkflowBody {
    WorkflowBody {
        schedule_type: schedule.schedule_type.as_str().to_owned(),
        schedule_conf: schedule.schedule_conf,
        time_zone: schedule.time_zone,
        misfire_strategy: schedule.misfire_strategy.as_str().to_owned(),
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

pub(in crate::admin) fn edge_body(edge: EdgeSpec) -> EdgeBody {
    let condition = (edge.condition != Condition::default()).then(|| edge.condition.to_string());
    EdgeBody { from: edge.from, to: edge.to, condition }
}

pub(super) fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_workflow", message)
}
