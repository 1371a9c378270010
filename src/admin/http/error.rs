//! The operator API's one error type: a status code and `{"code","message"}`.
//!
//! Client errors carry a stable snake_case code and a message meant for the caller; they are
//! not logged. Internal errors (database, bugs) are logged once here and answered with a generic
//! 500 that leaks nothing.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use self::responses::{
    BadGateway, BadRequest, Binary, Conflict, Forbidden, Internal, NotFound, Overloaded, TooLarge,
    Unauthorized, Unprocessable, UnsupportedMediaType,
};
use crate::storage::StorageError;

mod responses;

/// An error answer of the operator API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or a field is invalid.
    #[error("{message}")]
    BadRequest {
        /// The stable code.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// 401: no or wrong token.
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// 403: authenticated, but not allowed (role, group, or a missing CSRF token).
    #[error("{message}")]
    Forbidden {
        /// The stable code: `forbidden` or `csrf_failed`.
        code: &'static str,
        /// What was refused.
        message: String,
    },
    /// 404: the named thing does not exist.
    #[error("{0}")]
    NotFound(String, &'static str),
    /// 409: it conflicts with what exists.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is too large.
    #[error("{0}")]
    TooLarge(String),
    /// 415: the body is not of the expected type.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422: well-formed, but not acceptable (a module that is not a job component).
    #[error("{message}")]
    Unprocessable {
        /// The stable code.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// 502: an executor did not answer as it should.
    #[error("{0}")]
    BadGateway(String),
    /// 503 with `Retry-After`: too many runs are unfinished to admit more now, or the
    /// database is busy with other writes to the same rows.
    #[error("{0}")]
    Overloaded(String),
    /// 500: our fault; logged, never shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// The body of every error answer of the operator API.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    /// A stable snake_case code: `job_not_found`, `invalid_job`, `unauthorized`, …
    #[schema(example = "job_not_found")]
    code: &'a str,
    /// What went wrong, for people.
    #[schema(example = "job 7 not found")]
    message: String,
}

impl ApiError {
    /// A 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest { code, message: message.into() }
    }

    /// A 403 with code `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::Forbidden { code: "forbidden", message: message.into() }
    }

    /// A 404 for `what` (`"job 7"`), with code `<kind>_not_found`.
    pub fn not_found(code: &'static str, what: impl Into<String>) -> ApiError {
        ApiError::NotFound(format!("{} not found", what.into()), code)
    }

    fn status_and_code(&self) -> (StatusCode, &str) {
        match self {
            ApiError::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden { code, .. } => (StatusCode::FORBIDDEN, code),
            ApiError::NotFound(_, code) => (StatusCode::NOT_FOUND, code),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Unprocessable { code, .. } => (StatusCode::UNPROCESSABLE_ENTITY, code),
            ApiError::BadGateway(_) => (StatusCode::BAD_GATEWAY, "executor_error"),
            ApiError::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<StorageError> for ApiError {
    /// A 500, unless the database refused the statement for a moment's contention (a
    /// deadlock's victim, a lock wait that timed out): then a 503 to try again after
    /// `Retry-After`.
    fn from(error: StorageError) -> ApiError {
        if error.is_transient() {
            tracing::warn!(%error, "a request met contention in the database: answered 503");
            return ApiError::Overloaded(
                "the database is busy with other writes to the same rows: try again".to_owned(),
            );
        }
        ApiError::Internal(error.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error");
                "internal error".to_owned()
            }
            other => other.to_string(),
        };
        let mut response = (status, Json(ErrorBody { code, message })).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Runs finish by the thousand a second: a second is long enough to wait.
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Turns constraint violations into 409s with a message, other storage errors into 500s.
pub trait ResultExt<T> {
    /// See the trait.
    fn on_constraint(self, message: impl FnOnce() -> String) -> Result<T, ApiError>;
}

impl<T> ResultExt<T> for Result<T, StorageError> {
    fn on_constraint(self, message: impl FnOnce() -> String) -> Result<T, ApiError> {
        self.map_err(|error| {
            if error.is_constraint_violation() {
                ApiError::Conflict(message())
            } else {
                ApiError::from(error)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_in_the_database_is_a_503_to_retry_and_other_failures_a_500() {
        let corrupt = StorageError::Corrupt("a strategy it does not know".to_owned());
        let table = [(StorageError::busy(), 503, Some("1")), (corrupt, 500, None)];
        for (error, status, retry_after) in table {
            let response = ApiError::from(error).into_response();
            assert_eq!(response.status().as_u16(), status);
            let header = response.headers().get(axum::http::header::RETRY_AFTER);
            assert_eq!(header.and_then(|value| value.to_str().ok()), retry_after);
        }
    }
}
