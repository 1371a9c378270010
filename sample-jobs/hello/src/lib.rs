//! `hello`: the smallest well-behaved job.
//!
//! Contract: param = a name (empty means `world`). Logs one line `hello, <name>` at info
//! level through the `log` import and returns `Ok("hello, <name>")`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use wasmjob::job::log::{Level, log};

struct Hello;

impl Guest for Hello {
    fn run(t: Trigger) -> Result<String, String> {
        let name = if t.param.is_empty() { "world" } else { t.param.as_str() };
        let msg = format!("hello, {name}");
        log(Level::Info, &msg);
        Ok(msg)
    }
}

export!(Hello);
