//! `/api/v1/jobs/{id}/versions`: upload a component, or Python or JavaScript source (it becomes
//! the active version), list the history, read a version's source and the diff of two, activate
//! an older or newer version (rollback), and download a version's component (what
//! `wasmjob export --components` keeps, so that a file can recreate the job elsewhere).
//!
//! An upload is checked before any version exists: size (413, enforced while reading, so an
//! oversized body is never buffered), for source the language against the job's glue type and a
//! build by `admin::builders` (its error is a 422 with the builder's message), then
//! `runtime::validate` of the component on a bounded compile worker with a time limit. The same
//! bytes uploaded twice share one stored blob, and are compiled once per admin process. A source
//! version keeps its text and the sha256 of the component it was built into; executors only ever
//! get the component.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::auth::Actor;
use super::error::ApiError;
use super::error::{
    BadRequest, Binary, Forbidden, Internal, NotFound, TooLarge, Unauthorized, Unprocessable,
    UnsupportedMediaType,
};
use super::extract::{Path, Query};
use super::rfc3339;
use crate::admin::builders::{self, BuildError};
use crate::admin::{AppState, now_ms};
use crate::model::{Job, JobVersion, Language};
use crate::storage::NewVersion;

/// The longest an upload may take to compile.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest source text accepted.
const MAX_SOURCE_BYTES: usize = 1024 * 1024;

pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/jobs/{id}/versions",
            get(list_versions)
                .post(upload_version)
                .layer(DefaultBodyLimit::max(state.config.max_module_bytes)),
        )
        .route("/jobs/{id}/versions/{version}/activate", post(activate_version))
        .route("/jobs/{id}/versions/{version}/source", get(get_version_source))
        .route("/jobs/{id}/versions/{version}/component", get(get_version_component))
        .route("/jobs/{id}/versions/{from}/diff/{to}", get(diff_versions))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct VersionResponse {
    version: i64,
    sha256: String,
    size: i64,
    remark: String,
    created_at: Option<String>,
    active: bool,
    /// `wasm`, `python` or `javascript`: what the version was uploaded as.
    language: &'static str,
    /// Whether `…/versions/{v}/source` has its text.
    has_source: bool,
}

impl VersionResponse {
    fn new(version: JobVersion, active: Option<i64>) -> VersionResponse {
        VersionResponse {
            active: active == Some(version.version),
            version: version.version,
            sha256: version.sha256,
            size: version.size,
            remark: version.remark,
            created_at: rfc3339(version.created_at_ms),
            language: version.language.as_str(),
            has_source: version.has_source,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct UploadQuery {
    #[serde(default)]
    remark: String,
}

/// Uploads a component; it becomes the job's active version.
#[utoipa::path(post, path = "/jobs/{id}/versions", tag = "versions", params(("id" = i64, Path), UploadQuery),
    request_body(content(
        (inline(Binary) = "application/wasm"),
        (String = "text/x-python"),
        (String = "text/javascript"),
    )), responses(
    (status = 201, body = VersionResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn upload_version(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Query(query): Query<UploadQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<VersionResponse>), ApiError> {
    let language = upload_language(&headers)?;
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(format!(
            "the module is larger than the limit of {} bytes",
            state.config.max_module_bytes
        )),
        _ => ApiError::bad_request("invalid_body", rejection.body_text()),
    })?;
    if query.remark.len() > 1000 {
        return Err(ApiError::bad_request("invalid_query", "remark: at most 1000 characters"));
    }
    let job = find_job(&state, id).await?;
    actor.require_group(job.spec.group_id)?;
    check_language(&job, language)?;
    let (component, source) = match language {
        Language::Wasm => (body, None),
        _ => {
            let source = source_text(&body)?;
            let built = builders::build(&state.config.builders, language, &source)
                .await
                .map_err(build_error)?;
            (Bytes::from(built), Some(source))
        }
    };
    if component.len() > state.config.max_module_bytes {
        return Err(ApiError::TooLarge(format!(
            "the built component has {} bytes, more than the limit of {} bytes",
            component.len(),
            state.config.max_module_bytes
        )));
    }
    // A component built here from source is as large as its interpreter (12 to 18 MB) and may
    // take longer to compile than an upload is given; the build's time limit bounds it instead.
    let compile_timeout = match language {
        Language::Wasm => COMPILE_TIMEOUT,
        _ => state.config.builders.timeout.max(COMPILE_TIMEOUT),
    };
    let info = validate(&state, component.clone(), compile_timeout).await?;
    let new = NewVersion {
        sha256: &info.sha256,
        bytes: &component,
        remark: &query.remark,
        language,
        source: source.as_deref(),
        keep: i64::from(state.config.max_versions_per_job),
    };
    let version = state.db.add_job_version(id, new, now_ms()).await?;
    state.cache.forget_job(id);
    tracing::info!(job.id = id, module.sha256 = %info.sha256, "job {id}: version {} uploaded", version.version);
    let active = Some(version.version);
    let version = VersionResponse::new(version, active);
    actor.audit(&state, "version.upload", format!("job {id}"), None, Some(&version)).await;
    Ok((StatusCode::CREATED, axum::Json(version)))
}

/// What an upload is, by its content type (parameters such as `charset` are allowed).
fn upload_language(headers: &HeaderMap) -> Result<Language, ApiError> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.as_str() {
        "" | "application/wasm" | "application/octet-stream" => Ok(Language::Wasm),
        "text/x-python" => Ok(Language::Python),
        "text/javascript" => Ok(Language::Javascript),
        _ => Err(ApiError::UnsupportedMediaType(format!(
            "upload a component as application/wasm, Python source as text/x-python or \
             JavaScript source as text/javascript, not `{essence}`"
        ))),
    }
}

/// Refuses an upload whose language is not its job's.
fn check_language(job: &Job, language: Language) -> Result<(), ApiError> {
    match job.spec.glue_type.language() {
        Some(expected) if expected == language => Ok(()),
        Some(expected) => Err(ApiError::bad_request(
            "wrong_glue_type",
            format!(
                "a {} job takes {} uploads, not {}",
                job.spec.glue_type,
                expected.as_str(),
                language.as_str()
            ),
        )),
        None => Err(ApiError::bad_request(
            "wrong_glue_type",
            format!("a {} job has no uploaded versions", job.spec.glue_type),
        )),
    }
}

/// The body as source text: UTF-8, not empty, not larger than [`MAX_SOURCE_BYTES`].
fn source_text(body: &[u8]) -> Result<String, ApiError> {
    if body.len() > MAX_SOURCE_BYTES {
        return Err(ApiError::TooLarge(format!(
            "the source is larger than the limit of {MAX_SOURCE_BYTES} bytes"
        )));
    }
    let text = std::str::from_utf8(body)
        .map_err(|error| ApiError::bad_request("invalid_body", format!("source: {error}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request("invalid_body", "the source is empty"));
    }
    if text.contains('\0') {
        return Err(ApiError::bad_request("invalid_body", "the source contains a NUL character"));
    }
    Ok(text.to_owned())
}

fn build_error(error: BuildError) -> ApiError {
    match error {
        BuildError::Host(error) => ApiError::Internal(error.context("building a source version")),
        error => ApiError::Unprocessable { code: error.code(), message: error.to_string() },
    }
}

async fn find_job(state: &AppState, id: i64) -> Result<Job, ApiError> {
    state
        .db
        .get_job(id)
        .await?
        .ok_or_else(|| ApiError::not_found("job_not_found", format!("job {id}")))
}

async fn validate(
    state: &AppState,
    bytes: Bytes,
    timeout: Duration,
) -> Result<crate::runtime::ModuleInfo, ApiError> {
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let seen = state.validated_modules.lock().is_ok_and(|validated| validated.contains(&sha256));
    if seen {
        return Ok(crate::runtime::ModuleInfo { sha256, size: bytes.len(), imports: Vec::new() });
    }
    // The slot moves into the compile thread: a compile that outlives its request's time limit
    // keeps its slot until it really ends, so hostile uploads cannot pile up compiles.
    let slot = state
        .compile_slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let validator = state.validator.clone();
    let compile = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        validator.validate(&bytes)
    });
    match tokio::time::timeout(timeout, compile).await {
        Err(_) => Err(ApiError::Unprocessable {
            code: "compile_timeout",
            message: format!("the module did not compile within {} s", timeout.as_secs()),
        }),
        Ok(Err(join)) => Err(ApiError::Internal(join.into())),
        Ok(Ok(Err(error))) => {
            Err(ApiError::Unprocessable { code: error.code(), message: error.to_string() })
        }
        Ok(Ok(Ok(info))) => {
            if let Ok(mut validated) = state.validated_modules.lock() {
                validated.insert(info.sha256.clone());
            }
            Ok(info)
        }
    }
}

/// Lists a job's versions.
#[utoipa::path(get, path = "/jobs/{id}/versions", tag = "versions", params(("id" = i64, Path)), responses(
    (status = 200, body = Vec<VersionResponse>), BadRequest, Unauthorized, NotFound, Internal,
))]
async fn list_versions(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<Vec<VersionResponse>>, ApiError> {
    let job = find_job(&state, id).await?;
    let versions = state.db.list_job_versions(id).await?;
    Ok(axum::Json(
        versions.into_iter().map(|v| VersionResponse::new(v, job.active_version)).collect(),
    ))
}

/// Makes a version the job's active one (a rollback, or forward again).
#[utoipa::path(post, path = "/jobs/{id}/versions/{version}/activate", tag = "versions",
    params(("id" = i64, Path), ("version" = i64, Path)), responses(
    (status = 200, body = VersionResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn activate_version(
    State(state): State<AppState>,
    actor: Actor,
    Path((id, version)): Path<(i64, i64)>,
) -> Result<axum::Json<VersionResponse>, ApiError> {
    let job = find_job(&state, id).await?;
    actor.require_group(job.spec.group_id)?;
    if !state.db.activate_job_version(id, version, now_ms()).await? {
        return Err(ApiError::not_found(
            "version_not_found",
            format!("version {version} of job {id}"),
        ));
    }
    state.cache.forget_job(id);
    let found = state.db.get_job_version(id, version).await?;
    let found = found.ok_or_else(|| {
        ApiError::not_found("version_not_found", format!("version {version} of job {id}"))
    })?;
    let activated = VersionResponse::new(found, Some(version));
    let before = serde_json::json!({"active_version": job.active_version});
    let after = serde_json::json!({"active_version": version});
    actor.audit(&state, "version.activate", format!("job {id}"), Some(&before), Some(&after)).await;
    Ok(axum::Json(activated))
}

/// The source text of a `GLUE_PYTHON` or `GLUE_JAVASCRIPT` version.
#[utoipa::path(get, path = "/jobs/{id}/versions/{version}/source", tag = "versions",
    params(("id" = i64, Path), ("version" = i64, Path)), responses(
    (status = 200, description = "The source.", content_type = "text/plain; charset=utf-8", body = String),
    BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_version_source(
    State(state): State<AppState>,
    Path((id, version)): Path<(i64, i64)>,
) -> Result<impl IntoResponse, ApiError> {
    let source = version_source(&state, id, version).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], source))
}

/// The component of a version, as executors get it: the uploaded bytes, or what a source
/// version was built into.
#[utoipa::path(get, path = "/jobs/{id}/versions/{version}/component", tag = "versions",
    params(("id" = i64, Path), ("version" = i64, Path)), responses(
    (status = 200, description = "The component.", content((inline(Binary) = "application/wasm"))),
    BadRequest, Unauthorized, NotFound, Internal,
))]
async fn get_version_component(
    State(state): State<AppState>,
    Path((id, version)): Path<(i64, i64)>,
) -> Result<impl IntoResponse, ApiError> {
    find_job(&state, id).await?;
    let not_found =
        || ApiError::not_found("version_not_found", format!("version {version} of job {id}"));
    let found = state.db.get_job_version(id, version).await?.ok_or_else(not_found)?;
    let bytes = state.db.get_module(&found.sha256).await?.ok_or_else(not_found)?;
    Ok(([(header::CONTENT_TYPE, "application/wasm")], bytes))
}

/// A unified diff of two versions' source texts, from `from` to `to`.
#[utoipa::path(get, path = "/jobs/{id}/versions/{from}/diff/{to}", tag = "versions",
    params(("id" = i64, Path), ("from" = i64, Path), ("to" = i64, Path)), responses(
    (status = 200, description = "The diff.", content_type = "text/plain; charset=utf-8", body = String),
    BadRequest, Unauthorized, NotFound, Internal,
))]
async fn diff_versions(
    State(state): State<AppState>,
    Path((id, from, to)): Path<(i64, i64, i64)>,
) -> Result<impl IntoResponse, ApiError> {
    let old = version_source(&state, id, from).await?;
    let new = version_source(&state, id, to).await?;
    let diff = similar::TextDiff::from_lines(old.as_str(), new.as_str())
        .unified_diff()
        .header(&format!("v{from}"), &format!("v{to}"))
        .to_string();
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], diff))
}

/// The source text of a version, or a 404 naming what is missing.
async fn version_source(state: &AppState, id: i64, version: i64) -> Result<String, ApiError> {
    find_job(state, id).await?;
    match state.db.get_job_version_source(id, version).await? {
        Some(Some(source)) => Ok(source),
        Some(None) => Err(ApiError::NotFound(
            format!("version {version} of job {id} was uploaded as a component: it has no source"),
            "source_not_found",
        )),
        None => {
            Err(ApiError::not_found("version_not_found", format!("version {version} of job {id}")))
        }
    }
}
