//! What a run of a workflow node carries of its upstream nodes: their outputs, in the trigger's
//! `workflowInputs` for a wasmjob executor, or in `executorParams` for an XXL-JOB executor.

use serde::{Deserialize, Serialize};

/// How an XXL-JOB executor's handler gets a workflow node's inputs: `executorParams` is the
/// node's parameter, then a line starting with this and the inputs as JSON (the list of
/// [`NodeOutputParam`]).
pub const WORKFLOW_INPUTS_LINE: &str = "wasmjob-workflow-inputs: ";

/// One upstream node's output: `{"node": "extract", "jobId": 3, "state": "succeeded",
/// "outputs": [{"shard": 0, "message": "…"}]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeOutputParam {
    /// The node's name.
    pub node: String,
    /// The job it ran.
    pub job_id: i64,
    /// `succeeded`, `failed` or `skipped`.
    pub state: String,
    /// Each shard whose run succeeded, with its message.
    pub outputs: Vec<ShardOutputParam>,
}

/// One shard's output: `{"shard": 0, "message": "…"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShardOutputParam {
    /// The shard's index.
    pub shard: u32,
    /// The `ok` message of its run.
    pub message: String,
}
