//! What `GET /readyz` answers on the admin and on the executor: a list of named checks, each
//! passed or failed with the reason, as `200` when every check passed and `503` otherwise, with
//! the same JSON body both ways ([`ReadinessBody`]). And [`Pulse`]: when a loop last completed
//! its work (a scheduler pass, a registration), which a check compares with the clock.
//!
//! `/healthz` is not this: it says only that the process answers, and a process that is not
//! ready (its database down, its admin unreachable) is still alive and must not be restarted
//! for it. This module decides nothing about what is checked: the admin and the executor list
//! their own checks, and read no clock here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// When a loop last completed its work, in milliseconds since the epoch; shared by the loop,
/// which beats, and the readiness check, which reads it.
#[derive(Debug, Default)]
pub struct Pulse {
    last_ms: AtomicI64,
}

impl Pulse {
    /// Records that the loop completed its work at `now_ms`.
    pub fn beat(&self, now_ms: i64) {
        self.last_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Forgets the last beat: the work failed, and the check fails until the next beat.
    pub fn clear(&self) {
        self.last_ms.store(0, Ordering::Relaxed);
    }

    /// `Ok` when the last beat is at most `max_age_ms` old at `now_ms`; else why not, in words
    /// that name the work (`what`: "the scheduler loop completed a pass").
    pub fn check(&self, what: &str, max_age_ms: i64, now_ms: i64) -> Result<(), String> {
        let last_ms = self.last_ms.load(Ordering::Relaxed);
        if last_ms == 0 {
            return Err(format!("{what} not yet (or not since its last failure)"));
        }
        let age_ms = now_ms - last_ms;
        if age_ms > max_age_ms {
            return Err(format!(
                "{what} {:.1} s ago, more than {:.1} s",
                age_ms as f64 / 1000.0,
                max_age_ms as f64 / 1000.0
            ));
        }
        Ok(())
    }
}

/// The checks of one `/readyz` call, in the order they were made.
#[derive(Debug, Default)]
pub struct Readiness {
    checks: Vec<(&'static str, Result<(), String>)>,
}

impl Readiness {
    /// Adds the outcome of the check `name`.
    pub fn check(&mut self, name: &'static str, outcome: Result<(), String>) {
        self.checks.push((name, outcome));
    }

    /// Whether every check passed (and there was one).
    pub fn is_ready(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|(_, outcome)| outcome.is_ok())
    }

    /// The JSON body.
    pub fn body(&self) -> ReadinessBody {
        let checks = self
            .checks
            .iter()
            .map(|(name, outcome)| {
                let said = match outcome {
                    Ok(()) => "ok".to_owned(),
                    Err(reason) => reason.clone(),
                };
                ((*name).to_owned(), said)
            })
            .collect();
        let failed = self
            .checks
            .iter()
            .filter(|(_, outcome)| outcome.is_err())
            .map(|(name, _)| (*name).to_owned())
            .collect();
        ReadinessBody { ready: self.is_ready(), checks, failed }
    }
}

impl IntoResponse for Readiness {
    fn into_response(self) -> Response {
        let status = if self.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        (status, Json(self.body())).into_response()
    }
}

/// What `/readyz` answers, ready or not.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReadinessBody {
    /// Whether every check passed (the status is then 200, else 503).
    pub ready: bool,
    /// Every check by name: `ok`, or why it failed.
    pub checks: BTreeMap<String, String>,
    /// The names of the checks that failed.
    pub failed: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pulse_is_recent_or_says_how_old_it_is() {
        let pulse = Pulse::default();
        let check = |now_ms| pulse.check("it ran", 5_000, now_ms);
        assert_eq!(check(10_000), Err("it ran not yet (or not since its last failure)".into()));
        pulse.beat(10_000);
        assert_eq!(check(15_000), Ok(()));
        assert_eq!(check(16_300), Err("it ran 6.3 s ago, more than 5.0 s".into()));
        pulse.clear();
        assert!(check(10_001).is_err());
    }

    #[test]
    fn ready_only_when_every_check_passed() {
        let mut readiness = Readiness::default();
        assert!(!readiness.is_ready(), "no check is no readiness");
        readiness.check("database", Ok(()));
        assert!(readiness.is_ready());
        readiness.check("scheduler", Err("stalled".into()));
        let body = serde_json::to_value(readiness.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "ready": false,
                "checks": {"database": "ok", "scheduler": "stalled"},
                "failed": ["scheduler"],
            })
        );
    }
}
