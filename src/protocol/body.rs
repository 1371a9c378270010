//! The executor protocol's JSON request bodies, read the same way on both of its sides (the
//! admin's executor API, the executor's API): whatever the content type says, since XXL-JOB's
//! senders do not all set it, and a body that does not read is answered in the protocol's own
//! form, `{"code":500,"msg":"invalid request body: …"}`, as XXL-JOB answers it.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::ReturnT;

/// An executor-protocol body of type `T`.
pub struct ProtocolJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ProtocolJson<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body =
            Bytes::from_request(request, state).await.map_err(IntoResponse::into_response)?;
        serde_json::from_slice(&body).map(ProtocolJson).map_err(|error| {
            Json(ReturnT::fail(format!("invalid request body: {error}"))).into_response()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::JobIdParam;

    async fn read(body: &'static str) -> Result<JobIdParam, (u16, String)> {
        let request = Request::builder().body(axum::body::Body::from(body)).unwrap();
        match ProtocolJson::<JobIdParam>::from_request(request, &()).await {
            Ok(ProtocolJson(param)) => Ok(param),
            Err(response) => {
                let status = response.status().as_u16();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
                Err((status, String::from_utf8(bytes.to_vec()).unwrap()))
            }
        }
    }

    #[tokio::test]
    async fn bodies_read_or_are_answered_in_the_protocols_form() {
        assert_eq!(read(r#"{"jobId":7}"#).await.map(|param| param.job_id), Ok(7));
        let (status, body) = read("{jobId").await.unwrap_err();
        assert_eq!(status, 200);
        assert!(body.starts_with(r#"{"code":500,"msg":"invalid request body: "#), "{body}");
    }
}
