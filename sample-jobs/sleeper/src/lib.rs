//! `sleeper`: a job that waits on the host clock.
//!
//! Contract: param = milliseconds to sleep (empty or unparsable means 1000). Logs
//! `sleeping <ms> ms` at info, sleeps with `std::thread::sleep` (a `wasi:clocks`
//! monotonic-clock subscription polled through `wasi:io/poll`), logs `slept <ms> ms`
//! at info and returns `Ok("slept <ms> ms")`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use std::time::Duration;
use wasmjob::job::log::{Level, log};

struct Sleeper;

impl Guest for Sleeper {
    fn run(t: Trigger) -> Result<String, String> {
        let ms: u64 = t.param.trim().parse().unwrap_or(1000);
        log(Level::Info, &format!("sleeping {ms} ms"));
        std::thread::sleep(Duration::from_millis(ms));
        let msg = format!("slept {ms} ms");
        log(Level::Info, &msg);
        Ok(msg)
    }
}

export!(Sleeper);
