//! `chatty`: a job that writes many log lines, and some stdout.
//!
//! Contract: param = N (empty or unparsable means 10). Writes N lines `line <i>`
//! (i = 1..=N) at info through the `log` import and, for every 10th line (i % 10 == 0),
//! one line `stdout <i>` to stdout with `println!` (to exercise stdout capture).
//! Returns `Ok("wrote <N> lines")`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use wasmjob::job::log::{Level, log};

struct Chatty;

impl Guest for Chatty {
    fn run(t: Trigger) -> Result<String, String> {
        let n: u64 = t.param.trim().parse().unwrap_or(10);
        for i in 1..=n {
            log(Level::Info, &format!("line {i}"));
            if i % 10 == 0 {
                println!("stdout {i}");
            }
        }
        Ok(format!("wrote {n} lines"))
    }
}

export!(Chatty);
