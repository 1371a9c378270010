//! The operator API's OpenAPI 3.1 document, generated from the code and served at
//! `GET /api/v1/openapi.json` (for any signed-in caller, like every `/api/v1` read).
//!
//! The handlers carry `#[utoipa::path]` attributes, their DTOs derive `ToSchema` (queries
//! `IntoParams`), and [`ApiDoc`] lists the handlers. The error answers are the types of
//! `error/responses.rs`: one per status of [`ApiError`](super::error::ApiError), each with the
//! one error body. The test at
//! the bottom of this file and `tests/openapi.rs` check that the document and the router agree.
//! It describes; it validates nothing at run time.
//!
//! To add a route to the document:
//! 1. Put `#[utoipa::path(post, path = "/things/{id}", tag = "things", params(..), request_body = ..)]` on its handler, the path as routed without `/api/v1`.
//! 2. Derive `ToSchema` on its request and response DTOs (`IntoParams` on a query, with `#[into_params(parameter_in = Query)]`).
//! 3. In `responses(..)`, list the success and every error the handler and its extractors can return: `Unauthorized` always, `Forbidden` for a change (CSRF) or a role rule, `BadRequest` for a path or query, `Internal` if it reads the database.
//! 4. Add the handler to `paths(..)` of [`ApiDoc`].
//! 5. `cargo test openapi` fails while a routed method is not in the document, or the reverse.

use axum::Router;
use axum::routing::get;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::{ErrorBody, Unauthorized};
use crate::admin::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi_document))
}

/// The document: every operator route under `/api/v1`, `/metrics`, and the probes `/healthz`
/// and `/readyz` (which take no credentials).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "wasmjob operator API",
        description = "Jobs, their WebAssembly versions, runs and their logs, executors, users and the audit log. Every error answer is `{\"code\", \"message\"}` with a stable snake_case code.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    nest((path = "/api/v1", api = OperatorApi)),
    paths(super::metrics::scrape, super::health::healthz, super::health::readyz),
    components(schemas(ErrorBody<'static>)),
    modifiers(&Security),
    security(("bearer" = []), ("session" = [])),
    tags(
        (name = "jobs", description = "Jobs: create, change, schedule, trigger."),
        (name = "versions", description = "The WebAssembly components of a job."),
        (name = "runs", description = "Runs (XXL-JOB's logs): records, log content, streams, kills."),
        (name = "groups", description = "Executor groups."),
        (name = "executors", description = "The executor registry, and the admins that share the schedule."),
        (name = "schedule", description = "Schedules that are not a job's yet."),
        (name = "users", description = "Console users and personal API tokens."),
        (name = "audit", description = "The audit log."),
        (name = "alarms", description = "Alarm webhooks and the deliveries of alarms."),
        (name = "calendars", description = "Business calendars: instants jobs do not fire at."),
        (name = "workflows", description = "Workflows: DAGs of a group's jobs, and their runs."),
        (name = "report", description = "The daily report and the dashboard summary."),
        (name = "meta", description = "This document, the metrics and the probes."),
    )
)]
pub struct ApiDoc;

/// The routes under `/api/v1`, with their paths as the router routes them.
#[derive(OpenApi)]
#[openapi(paths(
    super::groups::list_groups,
    super::groups::create_group,
    super::groups::get_group,
    super::groups::update_group,
    super::jobs::list_jobs,
    super::jobs::create_job,
    super::jobs::get_job,
    super::jobs::update_job,
    super::jobs::delete_job,
    super::jobs::start_job,
    super::jobs::stop_job,
    super::jobs::trigger_job,
    super::jobs::next_fire_times,
    super::backfills::create_backfill,
    super::backfills::list_backfills,
    super::backfills::get_backfill,
    super::backfills::pause_backfill,
    super::backfills::resume_backfill,
    super::backfills::cancel_backfill,
    super::versions::list_versions,
    super::versions::upload_version,
    super::versions::activate_version,
    super::versions::get_version_source,
    super::versions::get_version_component,
    super::versions::diff_versions,
    super::logs::list_logs,
    super::logs::get_log,
    super::logs::log_content,
    super::logs::kill_run,
    super::stream::stream_log,
    super::executors::list_executors,
    super::admins::list_admins,
    super::schedule::preview_schedule,
    super::users::list_users,
    super::users::create_user,
    super::users::get_user,
    super::users::update_user,
    super::users::delete_user,
    super::users::list_tokens,
    super::users::create_token,
    super::users::delete_token,
    super::audit::list_audit,
    super::alarms::list_alarms,
    super::alarms::create_alarm,
    super::alarms::get_alarm,
    super::alarms::update_alarm,
    super::alarms::delete_alarm,
    super::alarms::list_deliveries,
    super::calendars::list_calendars,
    super::calendars::create_calendar,
    super::calendars::get_calendar,
    super::calendars::update_calendar,
    super::calendars::delete_calendar,
    super::calendars::import_ics,
    super::workflows::list_workflows,
    super::workflows::create_workflow,
    super::workflows::get_workflow,
    super::workflows::update_workflow,
    super::workflows::delete_workflow,
    super::workflows::trigger_workflow,
    super::workflows::start_workflow,
    super::workflows::stop_workflow,
    super::workflows::list_workflow_runs,
    super::workflows::get_workflow_run,
    super::workflows::kill_workflow_run,
    super::workflows::retry_workflow_node,
    super::report::get_report,
    super::report::get_dashboard,
    openapi_document,
))]
struct OperatorApi;

/// The document as JSON.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document.", content_type = "application/json", body = Object),
        Unauthorized,
    )
)]
async fn openapi_document() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(document())
}

/// The ways to authenticate: the operator token or a personal API token as a bearer token, or
/// the console's session cookie, whose changes also carry `X-CSRF-Token`.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("The operator token, or a personal API token (`wjt_…`)."))
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                super::auth::SESSION_COOKIE,
                "The console's session cookie. A change (any method but GET, HEAD and OPTIONS) \
                 made with it also carries the session's CSRF token in `X-CSRF-Token`, or is \
                 refused with 403 `csrf_failed`.",
            ))),
        );
    }
}
