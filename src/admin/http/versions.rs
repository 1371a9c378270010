//! `/api/v1/jobs/{id}/versions`: upload a component (it becomes the active version), list the
//! history, activate an older or newer version (rollback).
//!
//! An upload is checked before any version exists: size (413, enforced while reading, so an
//! oversized body is never buffered), then `runtime::validate` on a bounded compile worker with a
//! time limit. The same bytes uploaded twice share one stored blob, and are compiled once per
//! admin process.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::auth::Actor;
use super::error::ApiError;
use super::extract::{Path, Query};
use super::rfc3339;
use crate::admin::{AppState, now_ms};
use crate::model::{GlueType, JobVersion};

/// The longest an upload may take to compile.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(60);

pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/jobs/{id}/versions",
            get(list_versions)
                .post(upload_version)
                .layer(DefaultBodyLimit::max(state.config.max_module_bytes)),
        )
        .route("/jobs/{id}/versions/{version}/activate", post(activate_version))
}

#[derive(Debug, Serialize)]
struct VersionResponse {
    version: i64,
    sha256: String,
    size: i64,
    remark: String,
    created_at: Option<String>,
    active: bool,
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
        }
    }
}

#[derive(Debug, Deserialize)]
struct UploadQuery {
    #[serde(default)]
    remark: String,
}

async fn upload_version(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Query(query): Query<UploadQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<VersionResponse>), ApiError> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !matches!(essence, "" | "application/wasm" | "application/octet-stream") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "upload the component as application/wasm, not `{essence}`"
        )));
    }
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
    let job = state
        .db
        .get_job(id)
        .await?
        .ok_or_else(|| ApiError::not_found("job_not_found", format!("job {id}")))?;
    actor.require_group(job.spec.group_id)?;
    if job.spec.glue_type != GlueType::GlueWasm {
        return Err(ApiError::bad_request(
            "wrong_glue_type",
            "only GLUE_WASM jobs have uploaded versions",
        ));
    }
    let info = validate(&state, body.clone()).await?;
    let version =
        state.db.add_job_version(id, &info.sha256, &body, &query.remark, now_ms()).await?;
    state.dispatcher.forget_job(id);
    tracing::info!(job.id = id, module.sha256 = %info.sha256, "job {id}: version {} uploaded", version.version);
    let active = Some(version.version);
    let version = VersionResponse::new(version, active);
    actor.audit(&state, "version.upload", format!("job {id}"), None, Some(&version)).await;
    Ok((StatusCode::CREATED, axum::Json(version)))
}

async fn validate(state: &AppState, bytes: Bytes) -> Result<crate::runtime::ModuleInfo, ApiError> {
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
    match tokio::time::timeout(COMPILE_TIMEOUT, compile).await {
        Err(_) => Err(ApiError::Unprocessable {
            code: "compile_timeout",
            message: format!("the module did not compile within {} s", COMPILE_TIMEOUT.as_secs()),
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

async fn list_versions(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<Vec<VersionResponse>>, ApiError> {
    let job = state
        .db
        .get_job(id)
        .await?
        .ok_or_else(|| ApiError::not_found("job_not_found", format!("job {id}")))?;
    let versions = state.db.list_job_versions(id).await?;
    Ok(axum::Json(
        versions.into_iter().map(|v| VersionResponse::new(v, job.active_version)).collect(),
    ))
}

async fn activate_version(
    State(state): State<AppState>,
    actor: Actor,
    Path((id, version)): Path<(i64, i64)>,
) -> Result<axum::Json<VersionResponse>, ApiError> {
    let job = state
        .db
        .get_job(id)
        .await?
        .ok_or_else(|| ApiError::not_found("job_not_found", format!("job {id}")))?;
    actor.require_group(job.spec.group_id)?;
    if !state.db.activate_job_version(id, version, now_ms()).await? {
        return Err(ApiError::not_found(
            "version_not_found",
            format!("version {version} of job {id}"),
        ));
    }
    state.dispatcher.forget_job(id);
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
