//! Failpoints: named places in a run's lifecycle where a fault test makes the process die, or
//! the code there panic.
//!
//! The fault tests start the real binary with `--failpoints` (or `WASMJOB_FAILPOINTS`), a list
//! such as `dispatch.after_send=abort@3,callback.mid_batch=abort`, and the process aborts when
//! the named point is reached (on its n-th hit with `@n`). Aborting at a chosen point is the
//! same as a `SIGKILL` there: nothing after it runs, nothing is flushed, no destructor runs.
//! `panic` (or `panic@n`) panics there instead, once, for a test of what a bug's panic leaves
//! behind (locks held, work half done) while the process lives on.
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
    action: Action,
    /// Act on this hit (1 = the first).
    on_hit: u64,
    hits: AtomicU64,
}

/// What an armed point does when it is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Ends the process at once, as `SIGKILL` would.
    Abort,
    /// Panics in the code that passes it.
    Panic,
}

/// A `--failpoints` list that does not parse.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid failpoint `{0}`: expected NAME=abort, NAME=abort@N, NAME=panic or NAME=panic@N (N ≥ 1)"
)]
pub struct FailpointError(String);

/// Arms the failpoints in `spec` for the life of the process; an empty spec arms nothing.
/// Only the first call has an effect.
pub fn configure(spec: &str) -> Result<(), FailpointError> {
    let mut points = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let invalid = || FailpointError(item.to_owned());
        let (name, action) = item.split_once('=').ok_or_else(invalid)?;
        let (action, on_hit) = action.trim().split_once('@').unwrap_or((action.trim(), "1"));
        let action = match action {
            "abort" => Action::Abort,
            "panic" => Action::Panic,
            _ => return Err(invalid()),
        };
        let on_hit = on_hit.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(invalid)?;
        let point = Point { action, on_hit, hits: AtomicU64::new(0) };
        points.insert(name.trim().to_owned(), point);
    }
    if !points.is_empty() {
        tracing::warn!("failpoints armed: {spec}");
    }
    let _ = POINTS.set(points);
    Ok(())
}

/// Passes the failpoint `name`: aborts the process, or panics, if it is armed and due.
pub fn hit(name: &str) {
    let Some(point) = POINTS.get().and_then(|points| points.get(name)) else { return };
    let hits = point.hits.fetch_add(1, Ordering::Relaxed) + 1;
    if hits != point.on_hit {
        return;
    }
    match point.action {
        Action::Abort => {
            tracing::warn!("failpoint {name}: aborting the process (hit {hits})");
            std::process::abort();
        }
        Action::Panic => {
            tracing::warn!("failpoint {name}: panicking (hit {hits})");
            panic!("failpoint {name} (hit {hits})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_are_refused() {
        for bad in ["x", "x=crash", "x=abort@0", "x=abort@y", "x=panic@", "x=abort@1@2"] {
            assert!(configure(bad).is_err(), "{bad}");
        }
        // Unarmed points cost nothing and do nothing.
        hit("nowhere");
    }
}
