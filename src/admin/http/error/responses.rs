//! Types that only describe: the error answers of the operator API as the document lists them
//! (one type per status of [`ApiError`](crate::admin::http::error::ApiError), each with the one
//! error body, for the `responses(..)` of `#[utoipa::path]`), and raw binary bodies.
//!
//! `ApiError` makes the answers and handlers read bodies as bytes, so none of these is built.
#![expect(dead_code, reason = "the types describe answers in the document and are never built")]

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use super::ErrorBody;

/// 400: the path, query or body is malformed or a field is invalid (codes such as
/// `invalid_path`, `invalid_query`, `malformed_json`, `invalid_job`).
#[derive(IntoResponses)]
#[response(status = 400)]
pub struct BadRequest(ErrorBody<'static>);

/// 401: no credentials, or wrong ones (`unauthorized`).
#[derive(IntoResponses)]
#[response(status = 401)]
pub struct Unauthorized(ErrorBody<'static>);

/// 403: the caller may not do this (`forbidden`), or a change made with the session cookie
/// lacks its CSRF token (`csrf_failed`).
#[derive(IntoResponses)]
#[response(status = 403)]
pub struct Forbidden(ErrorBody<'static>);

/// 404: the named thing does not exist (`job_not_found`, `log_not_found`, …).
#[derive(IntoResponses)]
#[response(status = 404)]
pub struct NotFound(ErrorBody<'static>);

/// 409: it conflicts with what exists (`conflict`).
#[derive(IntoResponses)]
#[response(status = 409)]
pub struct Conflict(ErrorBody<'static>);

/// 413: the body is too large (`too_large`).
#[derive(IntoResponses)]
#[response(status = 413)]
pub struct TooLarge(ErrorBody<'static>);

/// 415: the body is not of the expected type (`unsupported_media_type`).
#[derive(IntoResponses)]
#[response(status = 415)]
pub struct UnsupportedMediaType(ErrorBody<'static>);

/// 422: well-formed, but not acceptable: a JSON field of the wrong type (`invalid_field`), a
/// module that is not a job component.
#[derive(IntoResponses)]
#[response(status = 422)]
pub struct Unprocessable(ErrorBody<'static>);

/// 500: our fault, logged on the server (`internal`).
#[derive(IntoResponses)]
#[response(status = 500)]
pub struct Internal(ErrorBody<'static>);

/// 502: the run's executor did not answer as it should (`executor_error`).
#[derive(IntoResponses)]
#[response(status = 502)]
pub struct BadGateway(ErrorBody<'static>);

/// 503: too many runs are unfinished to admit another now (`overloaded`); `Retry-After` says
/// when to try again.
#[derive(IntoResponses)]
#[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait")))]
pub struct Overloaded(ErrorBody<'static>);

/// A request body of raw bytes (a WebAssembly component).
pub struct Binary;

impl PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}

impl ToSchema for Binary {}
