//! `wasmjob workflow list|get|create|update|delete|trigger|runs|run|kill|retry`: workflows and
//! their runs through `/api/v1`.
//!
//! A workflow is handled as the JSON document the API takes. `get` prints it without what the
//! admin adds (its id, author and times), so that what `get` prints `create` and `update` take
//! back: a workflow is exported and imported as a file. Nothing the admin checks is checked here
//! (a cycle, an unknown node, a job of another group): the admin's refusal, with its reason, is
//! the error.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::table::{cell, encode, render_table};
use super::{Api, ClientError, ExitKind};
use crate::cli::client::WorkflowCommand;

/// The fields of the document `POST /workflows` and `PUT /workflows/{id}` take (they refuse
/// others).
const WORKFLOW_BODY_FIELDS: &[&str] = &[
    "name",
    "group_id",
    "nodes",
    "edges",
    "schedule_type",
    "schedule_conf",
    "time_zone",
    "misfire_strategy",
];
const WORKFLOW_COLUMNS: &[&str] = &["id", "name", "group_id", "nodes"];
const WORKFLOW_RUN_COLUMNS: &[&str] = &["id", "state", "trigger_type", "created_at", "ended_at"];
/// The fields of a workflow run shown above its nodes.
const RUN_FIELDS: &[&str] = &["id", "workflow_id", "name", "state", "created_at", "ended_at"];
const NODE_COLUMNS: &[&str] = &["name", "job_id", "state", "round", "log_ids", "reason"];

/// Runs one `wasmjob workflow` command.
pub(super) async fn workflow(api: &Api, command: WorkflowCommand) -> Result<(), ClientError> {
    match command {
        WorkflowCommand::List { group_id } => {
            let path = match group_id {
                Some(group_id) => format!("/workflows?group_id={group_id}"),
                None => "/workflows".to_owned(),
            };
            let list = api.call("GET", &path, None).await?;
            if api.json {
                return api.print_json(&list);
            }
            // The table counts the nodes rather than showing them.
            let rows: Vec<Value> = items(&list["items"])
                .map(|workflow| {
                    let nodes = workflow["nodes"].as_array().map_or(0, Vec::len);
                    json!({"id": workflow["id"], "name": workflow["name"],
                        "group_id": workflow["group_id"], "nodes": nodes})
                })
                .collect();
            api.table(&Value::Array(rows), WORKFLOW_COLUMNS)
        }
        WorkflowCommand::Get { id } => {
            let workflow = api.call("GET", &format!("/workflows/{id}"), None).await?;
            if api.json {
                return api.print_json(&workflow);
            }
            api.print_json(&document(&workflow))
        }
        WorkflowCommand::Create { file } => {
            let body = read_document(&file)?;
            let created = api.call("POST", "/workflows", Some(body)).await?;
            if api.json {
                return api.print_json(&created);
            }
            api.line(&cell(&created["id"]))
        }
        WorkflowCommand::Update { id, file } => {
            let body = read_document(&file)?;
            let updated = api.call("PUT", &format!("/workflows/{id}"), Some(body)).await?;
            if api.json {
                return api.print_json(&updated);
            }
            api.line(&format!("workflow {id} updated"))
        }
        WorkflowCommand::Delete { id } => {
            api.call("DELETE", &format!("/workflows/{id}"), None).await?;
            api.done(&format!("workflow {id} deleted"))
        }
        WorkflowCommand::Trigger { id } => {
            let path = format!("/workflows/{id}/trigger");
            let triggered = api.call("POST", &path, Some(json!({}))).await?;
            if api.json {
                return api.print_json(&triggered);
            }
            api.line(&cell(&triggered["workflow_run_id"]))
        }
        WorkflowCommand::Start { id } => {
            let started = api.call("POST", &format!("/workflows/{id}/start"), None).await?;
            if api.json {
                return api.print_json(&started);
            }
            api.line(&format!("workflow {id} started: next fire {}", cell(&started["next_fire"])))
        }
        WorkflowCommand::Stop { id } => {
            api.call("POST", &format!("/workflows/{id}/stop"), None).await?;
            api.done(&format!("workflow {id} stopped"))
        }
        WorkflowCommand::Runs { id } => {
            let list = api.call("GET", &format!("/workflows/{id}/runs"), None).await?;
            if api.json {
                return api.print_json(&list);
            }
            api.table(&list["items"], WORKFLOW_RUN_COLUMNS)
        }
        WorkflowCommand::Run { run_id } => {
            show_run(api, &api.call("GET", &format!("/workflow-runs/{run_id}"), None).await?)
        }
        WorkflowCommand::Kill { run_id } => {
            let path = format!("/workflow-runs/{run_id}/kill");
            let killed = api.call("POST", &path, Some(json!({}))).await?;
            if api.json {
                return api.print_json(&killed);
            }
            let runs_killed = killed["runs_killed"].as_i64().unwrap_or(0);
            api.line(&format!("workflow run {run_id} killed: {runs_killed} runs asked to stop"))
        }
        WorkflowCommand::Retry { run_id, node_name } => {
            let path = format!("/workflow-runs/{run_id}/nodes/{}/retry", encode(&node_name));
            show_run(api, &api.call("POST", &path, Some(json!({}))).await?)
        }
    }
}

/// A workflow run as its fields, then its nodes as a table (or its JSON).
fn show_run(api: &Api, run: &Value) -> Result<(), ClientError> {
    if api.json {
        return api.print_json(run);
    }
    api.write(&run_text(run))
}

fn run_text(run: &Value) -> String {
    let width = RUN_FIELDS.iter().map(|field| field.len()).max().unwrap_or(0);
    let mut text = String::new();
    for field in RUN_FIELDS {
        let line = format!("{field:<width$}  {}", cell(&run[*field]));
        text.push_str(line.trim_end());
        text.push('\n');
    }
    let header: Vec<String> = NODE_COLUMNS.iter().map(|column| column.to_uppercase()).collect();
    let rows: Vec<Vec<String>> = items(&run["nodes"])
        .map(|node| NODE_COLUMNS.iter().map(|column| cell(&node[*column])).collect())
        .collect();
    text.push('\n');
    text.push_str(&render_table(&header, &rows));
    text
}

/// The document of `workflow`, without the fields the admin adds.
fn document(workflow: &Value) -> Value {
    let fields: Map<String, Value> = workflow
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| WORKFLOW_BODY_FIELDS.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    Value::Object(fields)
}

/// The JSON document in `path` (`-`: standard input), which the admin checks.
fn read_document(path: &Path) -> Result<Value, ClientError> {
    let usage = |message: String| ClientError::new(ExitKind::Usage, message);
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|e| usage(format!("stdin: {e}")))?
    } else {
        std::fs::read_to_string(path).map_err(|e| usage(format!("{}: {e}", path.display())))?
    };
    serde_json::from_str(&text)
        .map_err(|error| usage(format!("{}: not JSON: {error}", path.display())))
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array().into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn a_run_shows_its_fields_then_its_nodes() {
        let run = json!({
            "id": 7, "workflow_id": 3, "group_id": 1, "name": "etl", "state": "failed",
            "trigger_type": "MANUAL", "created_by": "admin",
            "created_at": "2026-01-01T00:00:00Z", "ended_at": null,
            "nodes": [
                {"name": "extract", "job_id": 1, "state": "succeeded", "round": 1,
                    "reason": "", "log_ids": [4, 5]},
                {"name": "load", "job_id": 2, "state": "failed", "round": 2,
                    "reason": "job 2 has no active version", "log_ids": []},
                {"name": "alert", "job_id": 2, "state": "waiting", "round": 0,
                    "reason": "", "log_ids": []},
            ],
            "edges": [],
        });
        expect![[r#"
            id           7
            workflow_id  3
            name         etl
            state        failed
            created_at   2026-01-01T00:00:00Z
            ended_at

            NAME     JOB_ID  STATE      ROUND  LOG_IDS  REASON
            extract  1       succeeded  1      4,5
            load     2       failed     2               job 2 has no active version
            alert    2       waiting    0
        "#]]
        .assert_eq(&run_text(&run));
    }

    #[test]
    fn the_document_is_what_create_takes() {
        let workflow = json!({
            "id": 3, "name": "etl", "group_id": 1, "nodes": [{"name": "a", "job_id": 1}],
            "edges": [], "created_by": "admin", "created_at": null, "updated_at": null,
        });
        expect![[r#"{"edges":[],"group_id":1,"name":"etl","nodes":[{"job_id":1,"name":"a"}]}"#]]
            .assert_eq(&serde_json::to_string(&document(&workflow)).unwrap_or_default());
    }
}
