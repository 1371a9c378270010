//! The executor-facing API of XXL-JOB (`/api/registry`, `/api/registryRemove`, `/api/callback`)
//! plus wasmjob's module download (`GET /api/modules/{sha256}`), served under both `/api` and
//! `/xxl-job-admin/api` so that XXL-JOB executors configured with either base path work.
//!
//! A pull executor keeps `POST /api/pull` open for the calls waiting for it and posts their
//! replies to `POST /api/pull/answers` (`protocol::pull`).
//!
//! Calls must carry the access token; without it nothing happens and the answer is a `code 500`
//! envelope (the protocol's way), or a 401 for the module download.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::error::ApiError;
use super::extract::Path;
use crate::access::constant_time_eq;
use crate::admin::dispatch::{Applied, Peer};
use crate::admin::{AppState, now_ms};
use crate::netpolicy;
use crate::protocol::pull::{Parcel, PullAnswers, PullPoll};
use crate::protocol::{
    ACCESS_TOKEN_HEADER, APP_NAME_HEADER, CALLBACK_BUSY, MAX_EXECUTOR_BODY_BYTES, ProtocolJson,
    REGISTRY_GROUP_EXECUTOR, RegistryParam, ReturnT, parse_callbacks,
};
use crate::storage;
use std::time::Duration;

pub fn router(state: &AppState) -> Router<AppState> {
    let api = Router::new()
        .route("/registry", post(registry))
        .route("/registryRemove", post(registry_remove))
        .route("/callback", post(callback))
        .route("/modules/{sha256}", get(get_module))
        .route("/pull", post(pull))
        .route("/pull/answers", post(pull_answers))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_access_token))
        // Read only once the token passed: an executor's largest beat and callback batch, and
        // an XXL-JOB executor's batch after an outage, fit (axum's default is 2 MB).
        .layer(DefaultBodyLimit::max(MAX_EXECUTOR_BODY_BYTES));
    Router::new().nest("/api", api.clone()).nest("/xxl-job-admin/api", api)
}

async fn require_access_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let given = request.headers().get(ACCESS_TOKEN_HEADER);
    if given.is_some_and(|token| {
        constant_time_eq(token.as_bytes(), state.config.access_token.as_bytes())
    }) {
        return next.run(request).await;
    }
    if request.method() == axum::http::Method::GET {
        return ApiError::Unauthorized.into_response();
    }
    axum::Json(ReturnT::fail("The access token is wrong.")).into_response()
}

fn check_registry(state: &AppState, param: &RegistryParam) -> Result<(), String> {
    if param.registry_group != REGISTRY_GROUP_EXECUTOR {
        return Err(format!("registryGroup `{}`: only EXECUTOR is accepted", param.registry_group));
    }
    if param.registry_key.is_empty() || param.registry_key.len() > 64 {
        return Err("registryKey: the application name, 1 to 64 characters".to_owned());
    }
    let value = &param.registry_value;
    if value.len() > 255 {
        return Err("registryValue: an address of at most 255 characters".to_owned());
    }
    if let Some(version) = &param.version
        && (version.len() > 64 || version.chars().any(char::is_control))
    {
        return Err("version: at most 64 characters, none of them a control character".to_owned());
    }
    if netpolicy::is_pull_address(value) {
        return netpolicy::check_pull_address(value.trim_end_matches('/'))
            .map_err(|reason| format!("registryValue {reason}"));
    }
    let policy = &state.config.network.executor_policy;
    policy.check_address(value).map(|_| ()).map_err(|reason| format!("registryValue {reason}"))
}

async fn registry(
    State(state): State<AppState>,
    headers: HeaderMap,
    ProtocolJson(param): ProtocolJson<RegistryParam>,
) -> axum::Json<ReturnT<String>> {
    if let Err(reason) = check_registry(&state, &param) {
        return axum::Json(ReturnT::fail(reason));
    }
    let address = param.registry_value.trim_end_matches('/');
    // What speaks at this address: a wasmjob executor lists its held runs, an XXL-JOB 3.5
    // executor names its application in a header, older XXL-JOB executors do neither. It is
    // stored with the registration, so that every admin of the database knows it, restarted too.
    let names_app = headers.get(APP_NAME_HEADER).is_some_and(|name| !name.is_empty());
    let holds = param.holds_triggers == Some(true);
    let peer =
        Peer::from_registration(&param.registry_key, param.held_runs.is_some(), names_app, holds);
    let stored = storage::Peer {
        kind: peer.stored_kind(),
        version: param.version.as_deref().unwrap_or_default(),
    };
    if let Err(error) = state
        .db
        .upsert_registration(
            REGISTRY_GROUP_EXECUTOR,
            &param.registry_key,
            address,
            &stored,
            now_ms(),
        )
        .await
    {
        tracing::error!(%error, "registry failed");
        return axum::Json(ReturnT::fail("registry failed: internal error"));
    }
    state.cache.forget_online(&param.registry_key);
    state.dispatcher.note_peer(address, peer);
    if let Some(held) = &param.held_runs {
        match state.dispatcher.reconcile(address, held).await {
            Ok(0) => {}
            Ok(lost) => {
                tracing::warn!("executor {address} no longer holds {lost} of its runs: lost")
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "reconciling {address} failed")
            }
        }
    }
    axum::Json(ReturnT::success())
}

async fn registry_remove(
    State(state): State<AppState>,
    ProtocolJson(param): ProtocolJson<RegistryParam>,
) -> axum::Json<ReturnT<String>> {
    if let Err(reason) = check_registry(&state, &param) {
        return axum::Json(ReturnT::fail(reason));
    }
    let address = param.registry_value.trim_end_matches('/');
    match state.db.remove_registration(REGISTRY_GROUP_EXECUTOR, &param.registry_key, address).await
    {
        Ok(()) => {
            state.cache.forget_online(&param.registry_key);
            state.dispatcher.forget_peer(address);
            tracing::info!("executor {address} of `{}` deregistered", param.registry_key);
            axum::Json(ReturnT::success())
        }
        Err(error) => {
            tracing::error!(%error, "registry remove failed");
            axum::Json(ReturnT::fail("registry remove failed: internal error"))
        }
    }
}

async fn callback(State(state): State<AppState>, body: Bytes) -> axum::Json<ReturnT<String>> {
    let callbacks = match parse_callbacks(&body) {
        Ok(callbacks) => callbacks,
        Err(reason) => return axum::Json(ReturnT::fail(reason)),
    };
    for refused in &callbacks.refused {
        tracing::warn!("callback entry refused: {refused}");
    }
    let total = callbacks.results.len();
    let applied = state.dispatcher.apply_results(&body, callbacks.results).await;
    match (applied, callbacks.refused.is_empty()) {
        (Applied::All, true) => axum::Json(ReturnT::success()),
        // Not acknowledged: the executor keeps the results and sends them again, so the entries
        // that were applied are ignored the second time (a result applies once).
        (Applied::Failed, _) => axum::Json(ReturnT::fail("callback failed: internal error")),
        (Applied::Partly { recorded }, _) => axum::Json(ReturnT::fail(format!(
            "{CALLBACK_BUSY} {recorded} of {total} results recorded; send the batch again later"
        ))),
        (Applied::All, false) => axum::Json(ReturnT::fail(format!(
            "callback entries refused: {}",
            callbacks.refused.join("; ")
        ))),
    }
}

/// A pull executor's long poll: the calls waiting for it, as soon as there is one, or none after
/// its wait (or when the admin stops).
async fn pull(
    State(state): State<AppState>,
    ProtocolJson(poll): ProtocolJson<PullPoll>,
) -> Response {
    let refused = |reason: String| axum::Json(ReturnT::<String>::fail(reason)).into_response();
    if let Err(reason) = netpolicy::check_pull_address(&poll.address) {
        return refused(format!("address {reason}"));
    }
    let Some(hub) = state.dispatcher.client().pull_hub().cloned() else {
        return refused("this admin does not serve pull executors".to_owned());
    };
    let wait = Duration::from_millis(poll.wait_ms);
    let parcels = tokio::select! {
        parcels = hub.poll(&poll.address, wait) => parcels,
        () = state.shutdown.cancelled() => Vec::new(),
    };
    axum::Json(ReturnT::<Vec<Parcel>>::ok(parcels)).into_response()
}

/// A pull executor's answers to the calls it took.
async fn pull_answers(
    State(state): State<AppState>,
    ProtocolJson(answers): ProtocolJson<PullAnswers>,
) -> axum::Json<ReturnT<String>> {
    if let Err(reason) = netpolicy::check_pull_address(&answers.address) {
        return axum::Json(ReturnT::fail(format!("address {reason}")));
    }
    if let Some(hub) = state.dispatcher.client().pull_hub() {
        hub.answer(&answers.address, answers.answers);
    }
    axum::Json(ReturnT::success())
}

async fn get_module(
    State(state): State<AppState>,
    Path(sha256): Path<String>,
) -> Result<Response, ApiError> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(ApiError::bad_request(
            "invalid_path",
            "the module is named by its lowercase hex sha256",
        ));
    }
    let bytes = state.db.get_module(&sha256).await?;
    let bytes =
        bytes.ok_or_else(|| ApiError::not_found("module_not_found", format!("module {sha256}")))?;
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/wasm")], bytes).into_response())
}
