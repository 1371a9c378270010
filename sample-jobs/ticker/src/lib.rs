//! `ticker`: a job that logs lines spread over time, for following a log as it grows.
//!
//! Contract: param = `<count>,<ms>` (empty or unparsable parts mean 5 and 100). Logs
//! `tick <i> of <count>` at info for i = 1..=count, sleeping `<ms>` milliseconds after each
//! line but the last, and returns `Ok("ticked <count> times")`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use std::time::Duration;
use wasmjob::job::log::{Level, log};

struct Ticker;

impl Guest for Ticker {
    fn run(t: Trigger) -> Result<String, String> {
        let mut parts = t.param.split(',');
        let count: u32 = parts.next().and_then(|p| p.trim().parse().ok()).unwrap_or(5);
        let ms: u64 = parts.next().and_then(|p| p.trim().parse().ok()).unwrap_or(100);
        for i in 1..=count {
            log(Level::Info, &format!("tick {i} of {count}"));
            if i < count {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        Ok(format!("ticked {count} times"))
    }
}

export!(Ticker);
