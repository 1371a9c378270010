//! Failpoints: named places in a run's lifecycle where a fault test makes the process die.
//!
//! The fault tests start the real binary with `--failpoints` (or `WASMJOB_FAILPOINTS`), a list
//! such as `dispatch.after_send=abort@3,callback.mid_batch=abort`, and the process aborts when
//! the named point is reached (on its n-th hit with `@n`). Aborting at a chosen point is the
//! same as a `SIGKILL` there: nothing after it runs, nothing is flushed, no destructor runs.
//! Without the flag every point is a single relaxed atomic load.
//!
//! The list is process-wide and set once at start: the points sit deep in the admin and the
//! executor, and threading a test-only value through every layer would cost more than it says.
//! This module does not simulate slow or failing IO; tests that need that use real peers.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();

struct Point {
    /// Abort on this hit (1 = the first).
    abort_on: u64,
    hits: AtomicU64,
}

/// A `--failpoints` list that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid failpoint `{0}`: expected NAME=abort or NAME=abort@N (N ≥ 1)")]
pub struct FailpointError(String);

/// Arms the failpoints in `spec` for the life of the process; an empty spec arms nothing.
/// Only the first call has an effect.
pub fn configure(spec: &str) -> Result<(), FailpointError> {
    let mut points = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let invalid = || FailpointError(item.to_owned());
        let (name, action) = item.split_once('=').ok_or_else(invalid)?;
        let abort_on = match action.trim() {
            "abort" => 1,
            other => other
                .strip_prefix("abort@")
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n >= 1)
                .ok_or_else(invalid)?,
        };
        points.insert(name.trim().to_owned(), Point { abort_on, hits: AtomicU64::new(0) });
    }
    if !points.is_empty() {
        tracing::warn!("failpoints armed: {spec}");
    }
    let _ = POINTS.set(points);
    Ok(())
}

/// Passes the failpoint `name`: aborts the process if it is armed and due.
pub fn hit(name: &str) {
    let Some(point) = POINTS.get().and_then(|points| points.get(name)) else { return };
    let hits = point.hits.fetch_add(1, Ordering::Relaxed) + 1;
    if hits == point.abort_on {
        tracing::warn!("failpoint {name}: aborting the process (hit {hits})");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_are_refused() {
        for bad in ["x", "x=crash", "x=abort@0", "x=abort@y"] {
            assert!(configure(bad).is_err(), "{bad}");
        }
        // Unarmed points cost nothing and do nothing.
        hit("nowhere");
    }
}
