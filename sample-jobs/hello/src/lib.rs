//! `hello`: the smallest well-behaved job.
//!
//! Contract: param = a name (empty means `world`). Logs one line `hello, <name>` at info
//! level through the `log` import and returns `Ok("hello, <name>")`. A run of a sharded job
//! also logs `item <n>: <parameter>` for each of its sharding items and returns
//! `Ok("hello, <name>; items <n>=<parameter>,…")`, so a test can see which items it got.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use wasmjob::job::log::{Level, log};

struct Hello;

impl Guest for Hello {
    fn run(t: Trigger) -> Result<String, String> {
        let name = if t.param.is_empty() { "world" } else { t.param.as_str() };
        let msg = format!("hello, {name}");
        log(Level::Info, &msg);
        if t.sharding_items.is_empty() {
            return Ok(msg);
        }
        let mut items = Vec::with_capacity(t.sharding_items.len());
        for item in &t.sharding_items {
            log(Level::Info, &format!("item {}: {}", item.item, item.parameter));
            items.push(format!("{}={}", item.item, item.parameter));
        }
        Ok(format!("{msg}; items {}", items.join(",")))
    }
}

export!(Hello);
