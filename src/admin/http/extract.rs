//! Our own extractors, so that a malformed body, path or query gets our error body.
//!
//! A JSON body's whole numbers may be written with a fraction (`400.0`, `4e2`): JSON Schema,
//! and so the API's OpenAPI document, counts them as integers, so they are taken as integers.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Number, Value};

use super::error::ApiError;

/// `axum::Json`, with rejections as [`ApiError`]s: 400 for malformed JSON, 422 for wrong fields.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(mut value) =
            axum::Json::<Value>::from_request(request, state).await.map_err(json_rejection)?;
        whole_numbers_as_integers(&mut value);
        serde_path_to_error::deserialize(value).map(Json).map_err(|error| ApiError::Unprocessable {
            code: "invalid_field",
            message: format!("Failed to deserialize the JSON body into the target type: {error}"),
        })
    }
}

/// Turns `400.0` into `400` wherever it is in `value`; other numbers stay as they are.
fn whole_numbers_as_integers(value: &mut Value) {
    match value {
        Value::Number(number) if !number.is_i64() && !number.is_u64() => {
            if let Some(whole) = number.as_f64().and_then(whole) {
                *number = Number::from(whole);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

/// The whole number `float` was written as, if it was one within i64's range. serde_json reads
/// a number of more digits than an f64 holds exactly (`2148537205316059.0`) to within about one
/// unit in its last place, not always to the f64 nearest to it: a float that close to a whole
/// number is taken for it. Below 2^40 (about 10^12) that is a tolerance of under a thousandth.
fn whole(float: f64) -> Option<i64> {
    // The range check keeps the cast exact: i64 holds every whole f64 in it.
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&float) {
        return None;
    }
    let rounded = float.round();
    let tolerance = 2.0 * float.abs() * f64::EPSILON;
    ((float - rounded).abs() <= tolerance).then_some(rounded as i64)
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let message = rejection.body_text();
    match rejection {
        JsonRejection::JsonDataError(_) => {
            ApiError::Unprocessable { code: "invalid_field", message }
        }
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(message),
        _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(message),
        _ => ApiError::bad_request("malformed_json", message),
    }
}

/// `axum::extract::Path`, with rejections as 400s.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection: PathRejection| {
                ApiError::bad_request("invalid_path", rejection.body_text())
            })
    }
}

/// `axum::extract::Query`, with rejections as 400s.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection: QueryRejection| {
                ApiError::bad_request("invalid_query", rejection.body_text())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_integers() {
        let mut value = serde_json::json!({
            "a": 400.0, "b": [1e3, -2.0, 2.5], "c": 1e19, "d": -9.2e18, "e": 7, "f": "8.0"
        });
        whole_numbers_as_integers(&mut value);
        assert_eq!(
            value.to_string(),
            r#"{"a":400,"b":[1000,-2,2.5],"c":1e+19,"d":-9200000000000000000,"e":7,"f":"8.0"}"#
        );
        // More digits than an f64 holds, read to within an ulp of the whole number written.
        let mut value: Value = serde_json::from_str(
            r#"{"group_id": -2148537205316059.0, "b": 1125899906842624.0, "c": 0.5, "d": 1e-300}"#,
        )
        .unwrap();
        whole_numbers_as_integers(&mut value);
        assert_eq!(value["group_id"], serde_json::json!(-2_148_537_205_316_059_i64));
        assert_eq!(value["b"], serde_json::json!(1_125_899_906_842_624_i64));
        assert_eq!((value["c"].as_f64(), value["d"].as_f64()), (Some(0.5), Some(1e-300)));
    }
}
