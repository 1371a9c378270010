//! `/api/v1/users` (admins) and `/api/v1/tokens` (each user's own personal API tokens).
//!
//! Passwords and tokens are never answered back, except a new token once, at its creation.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use serde::{Deserialize, Serialize};

use super::auth::{API_TOKEN_PREFIX, Actor};
use super::error::{ApiError, ResultExt};
use super::error::{
    BadRequest, Conflict, Forbidden, Internal, NotFound, TooLarge, Unauthorized, Unprocessable,
    UnsupportedMediaType,
};
use super::extract::{Json, Path};
use super::rfc3339;
use crate::access::Role;
use crate::admin::accounts::{
    check_password, check_user_name, hash_password, new_secret, secret_hash,
};
use crate::admin::{AppState, now_ms};
use crate::storage::{ApiToken, User};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/users", get(list_users).post(create_user))
        .route("/users/{id}", get(get_user).put(update_user).delete(delete_user))
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}", delete(delete_token))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateUser {
    name: String,
    password: String,
    role: String,
    #[serde(default)]
    group_ids: Vec<i64>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateUser {
    role: String,
    #[serde(default)]
    group_ids: Vec<i64>,
    password: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UserResponse {
    id: i64,
    name: String,
    role: &'static str,
    group_ids: Vec<i64>,
    created_at: Option<String>,
}

impl From<User> for UserResponse {
    fn from(user: User) -> UserResponse {
        UserResponse {
            id: user.id,
            name: user.name,
            role: user.role.as_str(),
            group_ids: user.group_ids,
            created_at: rfc3339(user.created_at_ms),
        }
    }
}

/// Lists console users.
#[utoipa::path(get, path = "/users", tag = "users", responses(
    (status = 200, body = Vec<UserResponse>), Unauthorized, Forbidden, Internal,
))]
async fn list_users(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<UserResponse>>, ApiError> {
    let users = state.db.list_users().await?;
    Ok(axum::Json(users.into_iter().map(UserResponse::from).collect()))
}

/// Shows one user.
#[utoipa::path(get, path = "/users/{id}", tag = "users", params(("id" = i64, Path)), responses(
    (status = 200, body = UserResponse), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn get_user(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<axum::Json<UserResponse>, ApiError> {
    let user = state.db.get_user(id).await?.ok_or_else(|| user_not_found(id))?;
    Ok(axum::Json(user.into()))
}

/// Creates a user.
#[utoipa::path(post, path = "/users", tag = "users", request_body = CreateUser, responses(
    (status = 201, body = UserResponse), BadRequest, Unauthorized, Forbidden, Conflict, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_user(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<CreateUser>,
) -> Result<(StatusCode, axum::Json<UserResponse>), ApiError> {
    let invalid = |message: String| ApiError::bad_request("invalid_user", message);
    let name = body.name.trim();
    check_user_name(name).map_err(invalid)?;
    check_password(&body.password).map_err(invalid)?;
    let (role, group_ids) = role_and_groups(&state, &body.role, body.group_ids).await?;
    let hash = hash_password(&body.password).await?;
    let user = state
        .db
        .create_user(name, &hash, role, &group_ids, now_ms())
        .await
        .on_constraint(|| format!("a user called `{name}` exists already"))?;
    let user = UserResponse::from(user);
    actor.audit(&state, "user.create", format!("user {}", user.name), None, Some(&user)).await;
    Ok((StatusCode::CREATED, axum::Json(user)))
}

/// Changes a user's role and groups, and its password if given.
#[utoipa::path(put, path = "/users/{id}", tag = "users", params(("id" = i64, Path)), request_body = UpdateUser, responses(
    (status = 200, body = UserResponse), BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn update_user(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
    Json(body): Json<UpdateUser>,
) -> Result<axum::Json<UserResponse>, ApiError> {
    let before =
        UserResponse::from(state.db.get_user(id).await?.ok_or_else(|| user_not_found(id))?);
    let (role, group_ids) = role_and_groups(&state, &body.role, body.group_ids).await?;
    if let Some(password) = &body.password {
        check_password(password)
            .map_err(|message| ApiError::bad_request("invalid_user", message))?;
        let hash = hash_password(password).await?;
        state.db.set_user_password(id, &hash, now_ms()).await?;
    }
    let user = state.db.set_user_role(id, role, &group_ids, now_ms()).await?;
    let user = UserResponse::from(user.ok_or_else(|| user_not_found(id))?);
    actor
        .audit(&state, "user.update", format!("user {}", user.name), Some(&before), Some(&user))
        .await;
    Ok(axum::Json(user))
}

/// Deletes a user (not oneself).
#[utoipa::path(delete, path = "/users/{id}", tag = "users", params(("id" = i64, Path)), responses(
    (status = 204, description = "Deleted."), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn delete_user(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    if actor.principal.user_id == Some(id) {
        return Err(ApiError::bad_request("invalid_user", "you cannot delete your own account"));
    }
    let before =
        UserResponse::from(state.db.get_user(id).await?.ok_or_else(|| user_not_found(id))?);
    if !state.db.delete_user(id).await? {
        return Err(user_not_found(id));
    }
    actor.audit(&state, "user.delete", format!("user {}", before.name), Some(&before), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Parses a role; an operator needs at least one existing group, the others none.
async fn role_and_groups(
    state: &AppState,
    role: &str,
    group_ids: Vec<i64>,
) -> Result<(Role, Vec<i64>), ApiError> {
    let invalid = |message: String| ApiError::bad_request("invalid_user", message);
    let role: Role = role.parse().map_err(|error| invalid(format!("role: {error}")))?;
    match role {
        Role::Operator if group_ids.is_empty() => {
            return Err(invalid("group_ids: an operator needs at least one group".to_owned()));
        }
        Role::Operator => {}
        _ if !group_ids.is_empty() => {
            return Err(invalid(format!("group_ids: only an operator has groups, not {role}")));
        }
        _ => {}
    }
    for id in &group_ids {
        if state.db.get_group(*id).await?.is_none() {
            return Err(invalid(format!("group_ids: group {id} does not exist")));
        }
    }
    Ok((role, group_ids))
}

fn user_not_found(id: i64) -> ApiError {
    ApiError::not_found("user_not_found", format!("user {id}"))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    name: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TokenResponse {
    id: i64,
    name: String,
    created_at: Option<String>,
    last_used_at: Option<String>,
    /// Only in the answer to its creation.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

impl From<ApiToken> for TokenResponse {
    fn from(token: ApiToken) -> TokenResponse {
        TokenResponse {
            id: token.id,
            name: token.name,
            created_at: rfc3339(token.created_at_ms),
            last_used_at: rfc3339(token.last_used_at_ms),
            token: None,
        }
    }
}

fn own_user(actor: &Actor) -> Result<i64, ApiError> {
    actor.principal.user_id.ok_or_else(|| {
        ApiError::bad_request("no_user", "the operator token belongs to no user and has no tokens")
    })
}

/// Lists the caller's personal API tokens (without their secrets).
#[utoipa::path(get, path = "/tokens", tag = "users", responses(
    (status = 200, body = Vec<TokenResponse>), BadRequest, Unauthorized, Internal,
))]
async fn list_tokens(
    State(state): State<AppState>,
    actor: Actor,
) -> Result<axum::Json<Vec<TokenResponse>>, ApiError> {
    let tokens = state.db.list_api_tokens(own_user(&actor)?).await?;
    Ok(axum::Json(tokens.into_iter().map(TokenResponse::from).collect()))
}

/// Creates a personal API token for the caller; its secret is in this answer only.
#[utoipa::path(post, path = "/tokens", tag = "users", request_body = CreateToken, responses(
    (status = 201, body = TokenResponse), BadRequest, Unauthorized, Forbidden, TooLarge,
    UnsupportedMediaType, Unprocessable, Internal,
))]
async fn create_token(
    State(state): State<AppState>,
    actor: Actor,
    Json(body): Json<CreateToken>,
) -> Result<(StatusCode, axum::Json<TokenResponse>), ApiError> {
    let user_id = own_user(&actor)?;
    let name = body.name.trim();
    if name.is_empty() || name.len() > 100 || name.contains('\0') {
        return Err(ApiError::bad_request("invalid_token", "name: 1 to 100 characters"));
    }
    let secret = new_secret(API_TOKEN_PREFIX);
    let token = state.db.create_api_token(user_id, name, &secret_hash(&secret), now_ms()).await?;
    let token = TokenResponse::from(token);
    actor.audit(&state, "token.create", format!("token {}", token.id), None, Some(&token)).await;
    Ok((StatusCode::CREATED, axum::Json(TokenResponse { token: Some(secret), ..token })))
}

/// Deletes one of the caller's personal API tokens.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "users", params(("id" = i64, Path)), responses(
    (status = 204, description = "Deleted."), BadRequest, Unauthorized, Forbidden, NotFound, Internal,
))]
async fn delete_token(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    if !state.db.delete_api_token(own_user(&actor)?, id).await? {
        return Err(ApiError::not_found("token_not_found", format!("token {id}")));
    }
    actor.audit::<TokenResponse>(&state, "token.delete", format!("token {id}"), None, None).await;
    Ok(StatusCode::NO_CONTENT)
}
