//! `joiner`: a workflow node that reads what its upstream nodes returned.
//!
//! Contract: reads the `workflow` import's inputs and returns `Ok` with one entry per upstream
//! node, in the workflow's order, separated by `; `: `<node>/<state>: <shard>=<message>,…`
//! (its shards in order), or `Ok("no inputs")` when there are none. Logs each entry at info.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use wasmjob::job::log::{Level, log};
use wasmjob::job::workflow;

struct Joiner;

impl Guest for Joiner {
    fn run(_: Trigger) -> Result<String, String> {
        let inputs = workflow::inputs();
        if inputs.is_empty() {
            return Ok("no inputs".to_owned());
        }
        let mut entries = Vec::with_capacity(inputs.len());
        for input in &inputs {
            let shards: Vec<String> = input
                .outputs
                .iter()
                .map(|output| format!("{}={}", output.shard, output.message))
                .collect();
            let entry = format!("{}/{}: {}", input.node, input.state, shards.join(","));
            log(Level::Info, &entry);
            entries.push(entry);
        }
        Ok(entries.join("; "))
    }
}

export!(Joiner);
