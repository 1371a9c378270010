//! The HTTP client of the admin⇄executor protocol: the admin calls executors with it, and
//! executors call their admins.
//!
//! It carries the access token and turns a reply into the envelope's payload or a
//! [`ProtocolError`]. It knows nothing of jobs or runs: callers decide what a reply means.

use std::time::Duration;

use serde::Serialize;

use super::{ACCESS_TOKEN_HEADER, ReturnT};

/// Why a protocol call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The peer could not be reached or did not answer in time.
    #[error("{url}: {source}")]
    Transport {
        /// What was called.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The peer answered with something that is not the envelope.
    #[error("{url}: HTTP {status}: {body}")]
    BadReply {
        /// What was called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The peer answered with a failure envelope.
    #[error("{url}: {msg} (code {code})")]
    Refused {
        /// What was called.
        url: String,
        /// The envelope's code.
        code: i32,
        /// The envelope's message.
        msg: String,
    },
}

/// An HTTP client for the protocol, carrying the access token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    access_token: String,
}

impl Client {
    /// A client that sends `access_token` with every call and gives up after `timeout`.
    pub fn new(access_token: &str, timeout: Duration) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(3))
            .build()?;
        Ok(Client { http, access_token: access_token.to_owned() })
    }

    /// `POST {base}/{path}` with `body`; the envelope's payload, or why there is none.
    pub async fn call<B: Serialize + ?Sized, T: serde::de::DeserializeOwned + Clone>(
        &self,
        base: &str,
        path: &str,
        body: &B,
    ) -> Result<Option<T>, ProtocolError> {
        let url = join_url(base, path);
        let reply = self
            .http
            .post(&url)
            .header(ACCESS_TOKEN_HEADER, &self.access_token)
            .json(body)
            .send()
            .await
            .map_err(|source| ProtocolError::Transport { url: url.clone(), source })?;
        let status = reply.status().as_u16();
        let text = reply
            .text()
            .await
            .map_err(|source| ProtocolError::Transport { url: url.clone(), source })?;
        let envelope: ReturnT<T> = match serde_json::from_str(&text) {
            Ok(envelope) if status == 200 => envelope,
            _ => {
                let body = text.chars().take(200).collect();
                return Err(ProtocolError::BadReply { url, status, body });
            }
        };
        if envelope.code != 200 {
            let msg = envelope.msg.clone().unwrap_or_default();
            return Err(ProtocolError::Refused { url, code: envelope.code, msg });
        }
        Ok(envelope.into_payload())
    }

    /// `GET {base}/{path}` of raw bytes (module downloads), at most `max_bytes`.
    pub async fn get_bytes(
        &self,
        base: &str,
        path: &str,
        max_bytes: usize,
    ) -> anyhow::Result<Vec<u8>> {
        let url = join_url(base, path);
        let mut reply = self
            .http
            .get(&url)
            .header(ACCESS_TOKEN_HEADER, &self.access_token)
            .send()
            .await?
            .error_for_status()?;
        let mut bytes = Vec::new();
        while let Some(chunk) = reply.chunk().await? {
            if bytes.len() + chunk.len() > max_bytes {
                anyhow::bail!("{url}: more than {max_bytes} bytes");
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}

/// Joins a base URL and a path with exactly one slash.
pub fn join_url(base: &str, path: &str) -> String {
    format!("{}/{}", base.trim_end_matches('/'), path.trim_start_matches('/'))
}
