//! `GET /healthz` and `GET /readyz`, for probes (no authentication, like XXL-JOB's admin's
//! `/actuator/health`): liveness, and whether this admin can do its work now.
//!
//! `/healthz` answers `ok` while the process serves HTTP, whatever else is wrong. `/readyz`
//! answers 200 only when the database answers within [`CHECK_TIMEOUT`] and holds exactly the
//! migrations this build applies, and the scheduler loop completed a pass in the last
//! [`SCHEDULER_MAX_AGE_MS`]; otherwise 503 with the body naming the failed checks
//! (`crate::readiness`). Until the database first answers, `admin::start` serves [`waiting`]
//! instead, whose `/readyz` says so.
//!
//! These routes read nothing of the operator API and change nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use super::error::ApiError;
use crate::admin::{AppState, now_ms};
use crate::readiness::{Readiness, ReadinessBody};
use crate::storage::SchemaError;

/// How long the database may take to answer the readiness query.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// The oldest a completed scheduler pass may be; a pass starts at least every second.
pub const SCHEDULER_MAX_AGE_MS: i64 = 5_000;

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

/// Liveness: the process answers. Never checks the database.
#[utoipa::path(get, path = "/healthz", tag = "meta", security(()), responses(
    (status = 200, description = "The process answers.", content_type = "text/plain", body = String),
))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers with this build's schema, and the scheduler loop runs.
#[utoipa::path(get, path = "/readyz", tag = "meta", security(()), responses(
    (status = 200, description = "Every check passed.", body = ReadinessBody),
    (status = 503, description = "A check failed: `failed` names it, `checks` says why.", body = ReadinessBody),
))]
async fn readyz(State(state): State<AppState>) -> Readiness {
    let mut readiness = Readiness::default();
    match tokio::time::timeout(CHECK_TIMEOUT, state.db.schema_check()).await {
        Ok(Ok(())) => {
            readiness.check("database", Ok(()));
            readiness.check("schema", Ok(()));
        }
        Ok(Err(SchemaError::Differs { applied, expected })) => {
            readiness.check("database", Ok(()));
            readiness.check(
                "schema",
                Err(format!(
                    "the database's migrations {applied:?} are not this build's {expected:?}"
                )),
            );
        }
        Ok(Err(error @ SchemaError::Unavailable(_))) => {
            readiness.check("database", Err(error.to_string()));
            readiness.check("schema", Err("not checked: the database did not answer".into()));
        }
        Err(_) => {
            let waited = CHECK_TIMEOUT.as_secs();
            readiness.check("database", Err(format!("no answer within {waited} s")));
            readiness.check("schema", Err("not checked: the database did not answer".into()));
        }
    }
    let pulse = state.scheduler_pulse.check(
        "the scheduler loop completed a pass",
        SCHEDULER_MAX_AGE_MS,
        now_ms(),
    );
    readiness.check("scheduler", pulse);
    readiness
}

/// What the admin serves while it waits for its database to answer at start: `/healthz`, a
/// `/readyz` that says why it is not ready (the last connection error), and 503 elsewhere.
pub fn waiting(last_error: Arc<Mutex<String>>) -> Router {
    let not_ready = move || {
        let last_error = last_error.clone();
        async move {
            let said = last_error.lock().map(|error| error.clone()).unwrap_or_default();
            let mut readiness = Readiness::default();
            readiness.check("database", Err(format!("waiting for the database: {said}")));
            readiness
        }
    };
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(not_ready)).fallback(
        || async {
            ApiError::Overloaded("the admin is starting: it waits for its database".to_owned())
        },
    )
}
