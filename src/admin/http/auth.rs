//! Who is calling the operator API, and whether the route lets them.
//!
//! A request is authenticated by, in this order: `Authorization: Bearer` with the operator token
//! (an admin) or a user's personal API token; or the console's session cookie. A change made
//! with the session cookie must carry the session's CSRF token in `X-CSRF-Token`: the cookie is
//! `SameSite=Strict` already, and the token closes what that leaves open. Then the route's
//! [`Need`](crate::access::Need) is checked; handlers that change a job check its group through
//! [`Actor::require_group`].

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::ApiError;
use crate::access::constant_time_eq;
use crate::access::{Principal, api_need};
use crate::admin::accounts::{self, cookie, principal, secret_hash};
use crate::admin::{AppState, now_ms};
use crate::storage::AuditEntry;

/// The console's session cookie.
pub const SESSION_COOKIE: &str = "wasmjob_session";
/// The header a cookie-authenticated change carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// What personal API tokens start with, so a leaked one is recognisable.
pub const API_TOKEN_PREFIX: &str = "wjt_";

/// The middleware of `/api/v1`: authenticates, checks the route's need, and leaves the
/// [`Principal`] in the request for [`Actor`].
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let principal = match resolve(&state, request.method(), request.headers()).await {
        Ok(principal) => principal,
        Err(error) => return error.into_response(),
    };
    let route = request.extensions().get::<MatchedPath>().map_or("", MatchedPath::as_str);
    let route = route.strip_prefix("/api/v1").unwrap_or(route);
    if !principal.meets(api_need(request.method().as_str(), route)) {
        return ApiError::forbidden(format!(
            "{} `{}` may not {} {route}",
            principal.role,
            principal.name,
            request.method()
        ))
        .into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The principal behind a request's bearer token or session cookie.
pub async fn resolve(
    state: &AppState,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Principal, ApiError> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    if let Some(token) = bearer {
        if constant_time_eq(token.as_bytes(), state.config.admin_token.as_bytes()) {
            return Ok(Principal::operator_token());
        }
        if token.starts_with(API_TOKEN_PREFIX) {
            let user = state.db.get_api_token_user(&secret_hash(token), now_ms()).await?;
            return user.as_ref().map(principal).ok_or(ApiError::Unauthorized);
        }
        return Err(ApiError::Unauthorized);
    }
    let Some(token) = cookie(headers, SESSION_COOKIE) else { return Err(ApiError::Unauthorized) };
    let session = state.db.get_session(&secret_hash(token), now_ms()).await?;
    let session = session.ok_or(ApiError::Unauthorized)?;
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let csrf = headers.get(CSRF_HEADER).and_then(|value| value.to_str().ok()).unwrap_or("");
    if !safe && !constant_time_eq(csrf.as_bytes(), session.csrf_token.as_bytes()) {
        return Err(ApiError::Forbidden {
            code: "csrf_failed",
            message: format!(
                "a change made with the session cookie needs its token in {CSRF_HEADER}"
            ),
        });
    }
    Ok(principal(&session.user))
}

/// The caller of a handler: who, and from which address.
pub struct Actor {
    /// Who.
    pub principal: Principal,
    /// The client's address, when the server knows it.
    pub source: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let principal =
            parts.extensions.get::<Principal>().cloned().ok_or(ApiError::Unauthorized)?;
        Ok(Actor { principal, source: source(parts) })
    }
}

/// The client's address, when the server was started with connection info.
pub fn source(parts: &Parts) -> String {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip().to_string())
        .unwrap_or_default()
}

impl Actor {
    /// Refuses unless the caller may change jobs of group `group_id`.
    pub fn require_group(&self, group_id: i64) -> Result<(), ApiError> {
        if self.principal.may_change_group(group_id) {
            return Ok(());
        }
        Err(ApiError::forbidden(format!(
            "{} `{}` may not change jobs of group {group_id}",
            self.principal.role, self.principal.name
        )))
    }

    /// The audit entry of the caller doing `action` on `target` (the thing `after`), for a
    /// write that records it in its own transaction.
    pub fn audit_entry<T: Serialize>(
        &self,
        action: &str,
        target: String,
        after: Option<&T>,
    ) -> AuditEntry {
        let after = after.and_then(|value| serde_json::to_string(value).ok());
        accounts::entry(&self.principal, &self.source, action, target, None, after)
    }

    /// Records in the audit log that the caller did `action` on `target`.
    pub async fn audit<T: Serialize>(
        &self,
        state: &AppState,
        action: &str,
        target: String,
        before: Option<&T>,
        after: Option<&T>,
    ) {
        let json = |value: Option<&T>| value.and_then(|value| serde_json::to_string(value).ok());
        accounts::audit(
            &state.db,
            &self.principal,
            &self.source,
            action,
            target,
            json(before),
            json(after),
        )
        .await;
    }
}
