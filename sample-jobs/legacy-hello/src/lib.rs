//! `legacy-hello`: `hello` as it was first written, built against the job world as it was first
//! released (`wit/job.wit` beside this crate is a frozen copy of it: never edit it).
//!
//! It stands for every handler users uploaded before the world grew, and must keep validating
//! and running on today's host: a change to `../../wit/job.wit` that breaks it breaks them.
//! Contract: as `hello` without sharding items: param = a name (empty means `world`); logs
//! `hello, <name>` at info level through the `log` import and returns `Ok("hello, <name>")`.

wit_bindgen::generate!({ world: "job", path: "wit" });

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
