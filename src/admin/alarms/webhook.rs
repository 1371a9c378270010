//! The webhook channel: the alarm's JSON body, its HMAC-SHA256 signature, and the POST.
//!
//! The receiver checks `X-Wasmjob-Signature: sha256=<hex>`, the HMAC-SHA256 under the webhook's
//! secret of `<X-Wasmjob-Timestamp>.<body>` (the timestamp in Unix seconds, a dot, the body's
//! bytes), and refuses a timestamp far from its clock, so a captured request cannot be replayed
//! later. The body's shape is documented in the README.
//!
//! The client follows the protocol client's rules: no redirect is followed, a reply is read up
//! to a few KiB and shown only as an excerpt, and every call times out. Any answer but a 2xx is
//! a failed attempt, tried again later.

use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::DeliveryError;
use crate::admin::http::rfc3339;
use crate::model::Job;
use crate::protocol::excerpt;
use crate::storage::{AlarmEvent, AlarmWebhook};

/// The most bytes of a receiver's reply read (for the error message).
const MAX_REPLY_BYTES: usize = 4096;

/// `sha256=<hex>`: the HMAC-SHA256 under `secret` of `timestamp`, a dot, and `body`.
pub(super) fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC accepts a key of any length, so this cannot fail.
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The JSON body of `event`'s alarm; `job` is its job if it still exists.
pub(super) fn body(event: &AlarmEvent, job: Option<&Job>) -> Value {
    let job = match (event.job_id, job) {
        (Some(_), Some(job)) => {
            json!({"id": job.id, "name": job.spec.name, "group_id": job.spec.group_id})
        }
        (Some(id), None) => json!({"id": id, "name": null, "group_id": null}),
        (None, _) => Value::Null,
    };
    let run = match event.run_id {
        Some(id) => json!({
            "id": id,
            "state": event.state,
            "attempt": event.attempt,
            "message": event.message,
            "executor_address": event.executor_address,
        }),
        None => Value::Null,
    };
    let executor = if event.app_name.is_empty() {
        Value::Null
    } else {
        json!({"app_name": event.app_name, "address": event.executor_address})
    };
    json!({
        "event_id": event.id,
        "kind": event.kind,
        "time": rfc3339(event.created_at_ms),
        "message": event.message,
        "job": job,
        "run": run,
        "executor": executor,
        "silenced_before": event.silenced_before,
    })
}

/// Posts alarms to webhooks.
pub(super) struct Poster {
    http: reqwest::Client,
}

impl Poster {
    /// A poster that also trusts the CA certificates in `ca_file`.
    pub(super) fn new(ca_file: Option<&Path>) -> anyhow::Result<Poster> {
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(3))
            .redirect(reqwest::redirect::Policy::none())
            .use_rustls_tls();
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
            for certificate in reqwest::Certificate::from_pem_bundle(&pem)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        Ok(Poster { http: builder.build()? })
    }

    /// Posts `body` to `webhook`, signed; `Ok` on a 2xx answer.
    pub(super) async fn post(
        &self,
        webhook: &AlarmWebhook,
        delivery_id: i64,
        kind: &str,
        body: &Value,
    ) -> Result<(), DeliveryError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|error| DeliveryError::Permanent(format!("encoding the body: {error}")))?;
        let timestamp = chrono::Utc::now().timestamp();
        let sent = self
            .http
            .post(&webhook.url)
            .header("content-type", "application/json")
            .header("user-agent", concat!("wasmjob/", env!("CARGO_PKG_VERSION")))
            .header("x-wasmjob-event", kind)
            .header("x-wasmjob-delivery", delivery_id.to_string())
            .header("x-wasmjob-timestamp", timestamp.to_string())
            .header("x-wasmjob-signature", signature(&webhook.secret, timestamp, &bytes))
            .body(bytes)
            .send()
            .await;
        let mut reply = sent.map_err(|error| {
            DeliveryError::Transient(format!("posting to webhook {}: {error}", webhook.name))
        })?;
        let status = reply.status();
        if status.is_success() {
            return Ok(());
        }
        let mut text = Vec::new();
        while text.len() < MAX_REPLY_BYTES {
            match reply.chunk().await {
                Ok(Some(chunk)) => text.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let what = if status.is_redirection() { "a redirect, not followed" } else { "refused" };
        Err(DeliveryError::Transient(format!(
            "webhook {} {what}: {status} {}",
            webhook.name,
            excerpt(&String::from_utf8_lossy(&text))
        )))
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_timestamp_dot_body() {
        let cases: [(&str, i64, &[u8]); 3] = [
            ("s3cret", 1_700_000_000, br#"{"kind":"run_failed"}"#),
            ("", 0, b""),
            ("key", 1, b"hello"),
        ];
        let out: String = cases
            .iter()
            .map(|(secret, timestamp, body)| {
                format!("{secret:?} {timestamp}: {}\n", signature(secret, *timestamp, body))
            })
            .collect();
        // Checked against Python's `hmac.new(secret, f"{timestamp}.".encode() + body, sha256)`.
        expect![[r#"
            "s3cret" 1700000000: sha256=f1eae1e612011ee27c12aebb7cf56c85213452cb189ffb661546081c8eeb86e8
            "" 0: sha256=b849d5a581847b281957065739df36df2463d1977ea8d6e1e4e6cf33fadc68c3
            "key" 1: sha256=9233658ef5e21fe59dba8abb099c978547d7626f87090a6a585c26a2a98a91f8
        "#]]
        .assert_eq(&out);
    }
}
