//! The HTTP client of the admin⇄executor protocol: the admin calls executors with it, and
//! executors call their admins.
//!
//! It carries the access token and turns a reply into the envelope's payload or a
//! [`ProtocolError`]. It knows nothing of jobs or runs: callers decide what a reply means.
//!
//! It trusts nothing it is answered with. Redirects are never followed (a redirect would carry
//! the access token, and a trigger's parameters, wherever the peer points). A reply body is read
//! as a stream and given up past [`MAX_REPLY_BYTES`], within the client's timeout, which covers
//! the whole exchange, body included. A reply that is not the envelope is shown to operators
//! only as a short [`excerpt`] with control characters removed, and so is a peer's failure
//! message. An admin's client also carries the executor [`AddressPolicy`]: it refuses to call an
//! address the policy does not allow, resolves host names itself and connects only to the
//! resolved addresses the policy allows, and ignores proxy settings (a proxy would connect on
//! its behalf, unchecked).
//!
//! A stream (an executor's pushed log, [`Client::get_lines`]) goes through the same client, by
//! the same rules: it has no overall time limit, since it lasts as long as what it follows, but
//! its head must come within the client's timeout, each read within an idle timeout, and each
//! line within a cap.
//!
//! A call to a pull executor (`pull://…`) is not HTTP: it waits in the admin's
//! [`super::pull::PullHub`] until the executor polls for it, and its answer is read as an HTTP
//! reply's would be.
//!
//! An admin's call to an executor addressed as `http://IP:port` goes over the admin's own
//! kept-alive connections ([`super::keepalive`]), and any other through reqwest; both are read by
//! the same rules, and a reply that is not the protocol is told the same way ([`refused`]).
//!
//! TLS is rustls with the webpki roots, plus the certificates of an optional CA file.
//!
//! It is the one HTTP client the admin calls executors with: `tests/tidy.rs` refuses another
//! `reqwest` client outside the few it lists, none of which calls an executor.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use super::keepalive::{self, Connections, Failure, Reply};
use super::pull::{PullError, PullHub, is_pull_address};
use super::text::{JoinedUrl, causes, excerpt, join_url};
use super::{ACCESS_TOKEN_HEADER, APP_NAME_HEADER, ReturnT};
use crate::netpolicy::AddressPolicy;

/// The largest reply body read from a peer (a page of a run's log is at most 256 KiB of text).
pub const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// Why a protocol call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The peer could not be reached or did not answer in time.
    #[error("{url}: {}", causes(source))]
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
        /// A sanitized excerpt of the body, or what was wrong with it.
        body: String,
    },
    /// The peer answered with a failure envelope.
    #[error("{url}: {msg} (code {code})")]
    Refused {
        /// What was called.
        url: String,
        /// The envelope's code.
        code: i32,
        /// A sanitized excerpt of the envelope's message.
        msg: String,
    },
    /// The address is not one this client may call; nothing was sent.
    #[error("{reason}")]
    NotAllowed {
        /// Why.
        reason: String,
    },
    /// A call on a kept-alive connection (`keepalive.rs`) that had no reply: the connection
    /// failed (nothing was sent unless `sent`), or the peer did not answer in time.
    #[error("{url}: {reason}")]
    Connection {
        /// What was called.
        url: String,
        /// What went wrong.
        reason: String,
        /// Whether the request may have reached the peer.
        sent: bool,
    },
    /// A pull executor that does not poll this admin now: nothing was delivered.
    #[error("{url}: the pull executor is not connected to this admin")]
    NotConnected {
        /// What was called.
        url: String,
    },
}

impl ProtocolError {
    /// Whether the call surely delivered nothing because its peer could not be reached (a
    /// refused connection, a pull executor not connected), as opposed to a call that may have
    /// arrived.
    pub fn unreachable(&self) -> bool {
        match self {
            ProtocolError::Transport { source, .. } => source.is_connect(),
            ProtocolError::Connection { sent, .. } => !sent,
            ProtocolError::NotConnected { .. } => true,
            _ => false,
        }
    }
}

/// How a [`Client`] connects, beyond its token and timeout.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// PEM certificates trusted as roots besides the webpki roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// For an admin's client: the executor addresses it may call.
    pub policy: Option<AddressPolicy>,
    /// For an admin's client: where calls to pull executors wait for them.
    pub pull: Option<Arc<PullHub>>,
    /// A host name and the address to connect to for it instead of resolving it (a pull
    /// executor's poll of one admin among those a name resolves to). TLS still checks the name.
    pub resolve: Option<(String, SocketAddr)>,
    /// Calls to `http://IP:port` go over kept-alive connections of this client's own
    /// (`keepalive.rs`), not through the general HTTP client.
    pub keep_alive: bool,
}

/// An HTTP client for the protocol, carrying the access token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    access_token: String,
    policy: Option<Arc<AddressPolicy>>,
    /// Calls to `pull://` addresses go here.
    pull: Option<Arc<PullHub>>,
    /// The limit on a whole call, or on a stream's head.
    timeout: Duration,
    /// The URLs called, parsed.
    urls: Arc<ParsedUrls>,
    /// [`ClientOptions::keep_alive`]'s connections.
    connections: Option<Arc<Connections>>,
}

/// The URLs a client has called, parsed once: a run's send would otherwise parse its executor's
/// URL again every time. Shared by the clones of a [`Client`]; emptied when it reaches
/// [`ParsedUrls::MOST`], so a changing set of executors cannot grow it without bound.
#[derive(Debug, Default)]
struct ParsedUrls(Mutex<HashMap<String, reqwest::Url>>);

impl ParsedUrls {
    const MOST: usize = 4096;

    /// `url` parsed, or `None` when it does not parse (the caller sends the text, and the
    /// HTTP client says what is wrong with it).
    fn get(&self, url: &str) -> Option<reqwest::Url> {
        let mut urls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(parsed) = urls.get(url) {
            return Some(parsed.clone());
        }
        let parsed = reqwest::Url::parse(url).ok()?;
        if urls.len() >= Self::MOST {
            urls.clear();
        }
        urls.insert(url.to_owned(), parsed.clone());
        Some(parsed)
    }
}

/// A reply read as lines ([`Client::get_lines`]).
pub struct Lines {
    url: String,
    reply: reqwest::Response,
    buffer: Vec<u8>,
    max_line: usize,
    idle: Duration,
}

impl Client {
    /// A client that sends `access_token` with every call and gives up after `timeout`.
    pub fn new(access_token: &str, timeout: Duration) -> anyhow::Result<Client> {
        Client::with_options(access_token, timeout, &ClientOptions::default())
    }

    /// A client as [`Client::new`], with a CA file and an address policy.
    pub fn with_options(
        access_token: &str,
        timeout: Duration,
        options: &ClientOptions,
    ) -> anyhow::Result<Client> {
        // The timeout is set per call (`RequestBuilder::timeout`): a stream has none overall.
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .redirect(reqwest::redirect::Policy::none())
            .use_rustls_tls();
        if let Some(path) = &options.ca_file {
            for certificate in read_ca_file(path)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        if let Some((host, at)) = &options.resolve {
            builder = builder.resolve(host, *at);
        }
        let policy = options.policy.clone().map(Arc::new);
        if let Some(policy) = &policy {
            builder = builder.no_proxy().dns_resolver(Arc::new(CheckedResolver(policy.clone())));
        }
        let http = builder.build()?;
        let pull = options.pull.clone();
        let access_token = access_token.to_owned();
        let connections = options.keep_alive.then(Arc::default);
        Ok(Client { http, access_token, policy, pull, timeout, urls: Arc::default(), connections })
    }

    /// The hub calls to pull executors wait in, if this client calls them.
    pub fn pull_hub(&self) -> Option<&Arc<PullHub>> {
        self.pull.as_ref()
    }

    /// Refuses `base` when this client has a policy that does not allow it.
    fn check(&self, base: &str) -> Result<(), ProtocolError> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        policy.check_address(base).map(|_| ()).map_err(|reason| ProtocolError::NotAllowed {
            reason: format!("not calling {}: {reason}", excerpt(base)),
        })
    }

    /// `POST {base}/{path}` with `body`; the envelope's payload, or why there is none.
    pub async fn call<B: Serialize + ?Sized, T: serde::de::DeserializeOwned + Clone>(
        &self,
        base: &str,
        path: &str,
        body: &B,
    ) -> Result<Option<T>, ProtocolError> {
        self.call_as(base, path, body, None).await
    }

    /// [`Client::call`], naming the application in `XXL-JOB-APPNAME` when `app_name` is given
    /// (XXL-JOB 3.5 peers refuse calls without it).
    pub async fn call_as<B: Serialize + ?Sized, T: serde::de::DeserializeOwned + Clone>(
        &self,
        base: &str,
        path: &str,
        body: &B,
        app_name: Option<&str>,
    ) -> Result<Option<T>, ProtocolError> {
        // A trigger's body is 300 to 500 bytes: written without growing its buffer, which
        // ends as large as when grown (the request holds it until the reply).
        let mut written = Vec::with_capacity(512);
        serde_json::to_writer(&mut written, body)
            .map_err(|error| ProtocolError::unwritable(JoinedUrl(base, path), &error))?;
        self.call_written(base, path, written, app_name).await
    }

    /// [`Client::call_as`] with the body already written as JSON (a trigger's, written by
    /// hand: `TriggerParam::write_json`).
    pub async fn call_written<T: serde::de::DeserializeOwned + Clone>(
        &self,
        base: &str,
        path: &str,
        body: Vec<u8>,
        app_name: Option<&str>,
    ) -> Result<Option<T>, ProtocolError> {
        if is_pull_address(base) {
            return self.call_pulled(base, path, body, app_name).await;
        }
        self.check(base)?;
        if let Some(connections) = &self.connections
            && let Some(to) = keepalive::plain_address(base)
        {
            // Written out only for an error.
            let url = JoinedUrl(base, path);
            let request = keepalive::request(to, path, body, &self.access_token, app_name);
            let reply = match request {
                Ok(request) => connections.send(to, request, MAX_REPLY_BYTES, self.timeout).await,
                Err(failure) => Err(failure),
            };
            return payload(&url, 200, &kept_reply(&url, reply)?);
        }
        let url = join_url(base, path);
        let request = match self.urls.get(&url) {
            Some(parsed) => self.http.post(parsed),
            None => self.http.post(&url),
        };
        let mut request =
            request.timeout(self.timeout).header(ACCESS_TOKEN_HEADER, &self.access_token);
        if let Some(app_name) = app_name {
            request = request.header(APP_NAME_HEADER, app_name);
        }
        let mut reply = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|source| ProtocolError::Transport { url: url.clone(), source })?;
        let status = reply.status().as_u16();
        if status != 200 {
            // Read no further than the first chunk.
            let redirect = reply.headers().contains_key(reqwest::header::LOCATION);
            let chunk = reply.chunk().await.ok().flatten().unwrap_or_default();
            return Err(refused(url, status, &chunk, redirect));
        }
        let bytes = match read_capped(&mut reply, MAX_REPLY_BYTES).await {
            Ok(bytes) => bytes,
            Err(ReadError::Transport(source)) => {
                return Err(ProtocolError::Transport { url, source });
            }
            Err(ReadError::TooLarge) => return Err(too_large(url, status)),
        };
        payload(&url, status, &bytes)
    }

    /// [`Client::call_as`] to a pull executor: the call waits in this client's [`PullHub`] until
    /// the executor polls for it and answers.
    async fn call_pulled<T: serde::de::DeserializeOwned + Clone>(
        &self,
        base: &str,
        path: &str,
        body: Vec<u8>,
        app_name: Option<&str>,
    ) -> Result<Option<T>, ProtocolError> {
        let url = join_url(base, path);
        let Some(hub) = &self.pull else {
            let reason = format!("{}: this process does not call pull executors", excerpt(&url));
            return Err(ProtocolError::NotAllowed { reason });
        };
        let body = String::from_utf8(body).map_err(|error| ProtocolError::NotAllowed {
            reason: format!("{url}: the body is not UTF-8: {error}"),
        })?;
        let answer = match hub.call(base, path, body, app_name, self.timeout).await {
            Ok(answer) => answer,
            Err(PullError::NotConnected) => return Err(ProtocolError::NotConnected { url }),
            Err(PullError::NoAnswer) => {
                let body = format!("no answer within {} s", self.timeout.as_secs());
                return Err(ProtocolError::BadReply { url, status: 0, body });
            }
        };
        if answer.status != 200 {
            let body = excerpt(&answer.body);
            return Err(ProtocolError::BadReply { url, status: answer.status, body });
        }
        payload(&url, answer.status, answer.body.as_bytes())
    }

    /// `GET {base}/{path}` of raw bytes (module downloads), at most `max_bytes`.
    pub async fn get_bytes(
        &self,
        base: &str,
        path: &str,
        max_bytes: usize,
    ) -> anyhow::Result<Vec<u8>> {
        self.check(base)?;
        let url = join_url(base, path);
        let mut reply = self
            .http
            .get(&url)
            .timeout(self.timeout)
            .header(ACCESS_TOKEN_HEADER, &self.access_token)
            .send()
            .await?
            .error_for_status()?;
        match read_capped(&mut reply, max_bytes).await {
            Ok(bytes) => Ok(bytes),
            Err(ReadError::Transport(error)) => Err(error.into()),
            Err(ReadError::TooLarge) => anyhow::bail!("{url}: more than {max_bytes} bytes"),
        }
    }

    /// `GET {base}/{path}` (the path may carry a query) of a stream of lines whose
    /// `Content-Type` starts with `content_type`. The head must come within the client's
    /// timeout; then [`Lines::next_line`] waits at most `idle` for more bytes and gives up on a
    /// line longer than `max_line`. Anything but a 200 of that type (a redirect among them, which
    /// is not followed) is a [`ProtocolError::BadReply`].
    pub async fn get_lines(
        &self,
        base: &str,
        path: &str,
        content_type: &str,
        max_line: usize,
        idle: Duration,
    ) -> Result<Lines, ProtocolError> {
        if is_pull_address(base) {
            let url = join_url(base, path);
            let body = "a pull executor pushes no stream: its pages are read".to_owned();
            return Err(ProtocolError::BadReply { url, status: 0, body });
        }
        self.check(base)?;
        let url = join_url(base, path);
        let request = self.http.get(&url).header(ACCESS_TOKEN_HEADER, &self.access_token).send();
        let reply = match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(source)) => return Err(ProtocolError::Transport { url, source }),
            Err(_) => {
                let body = format!("no answer within {} s", self.timeout.as_secs());
                return Err(ProtocolError::BadReply { url, status: 0, body });
            }
        };
        let status = reply.status().as_u16();
        let typed = reply
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(content_type.as_bytes()));
        if status != 200 || !typed {
            let body = if (300..400).contains(&status) {
                "a redirect, not followed".to_owned()
            } else {
                format!("not a stream of {content_type}")
            };
            return Err(ProtocolError::BadReply { url, status, body });
        }
        Ok(Lines { url, reply, buffer: Vec::new(), max_line, idle })
    }
}

/// The body of a reply over a kept-alive connection (`keepalive.rs`) that answered 200, or why
/// there is none, as [`Client::call_as`] tells it for any other reply.
fn kept_reply(
    url: &impl std::fmt::Display,
    reply: Result<Reply, Failure>,
) -> Result<bytes::Bytes, ProtocolError> {
    let reply = match reply {
        Ok(reply) => reply,
        Err(Failure { reason, sent }) => {
            return Err(ProtocolError::Connection { url: url.to_string(), reason, sent });
        }
    };
    let status = reply.status;
    match reply.body {
        Some(body) if status == 200 => Ok(body),
        None => Err(too_large(url.to_string(), status)),
        Some(body) => Err(refused(url.to_string(), status, &body, reply.redirect)),
    }
}

/// A reply of `status` other than 200, not the protocol: what came (an excerpt of `body`), and
/// that a redirect (`redirect`: it names a location) was not followed.
fn refused(url: String, status: u16, body: &[u8], redirect: bool) -> ProtocolError {
    let body = excerpt(&String::from_utf8_lossy(body));
    let body = match redirect && (300..400).contains(&status) {
        true => format!("a redirect, not followed {body}").trim_end().to_owned(),
        false => body,
    };
    ProtocolError::BadReply { url, status, body }
}

/// A reply whose body was given up past [`MAX_REPLY_BYTES`].
fn too_large(url: String, status: u16) -> ProtocolError {
    let body = format!("the reply is larger than {MAX_REPLY_BYTES} bytes");
    ProtocolError::BadReply { url, status, body }
}

/// The payload of a reply's envelope, or why there is none.
fn payload<T: serde::de::DeserializeOwned + Clone>(
    url: &impl std::fmt::Display,
    status: u16,
    bytes: &[u8],
) -> Result<Option<T>, ProtocolError> {
    let envelope: ReturnT<T> = match serde_json::from_slice(bytes) {
        Ok(envelope) => envelope,
        Err(_) => {
            let body = excerpt(&String::from_utf8_lossy(bytes));
            return Err(ProtocolError::BadReply { url: url.to_string(), status, body });
        }
    };
    if envelope.code != 200 {
        let msg = excerpt(envelope.msg.as_deref().unwrap_or_default());
        return Err(ProtocolError::Refused { url: url.to_string(), code: envelope.code, msg });
    }
    Ok(envelope.into_payload())
}

impl Lines {
    /// The next line, without its newline; `None` once the stream ended (a last line without
    /// its newline is dropped).
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        loop {
            if let Some(newline) = self.buffer.iter().position(|&byte| byte == b'\n') {
                let mut line: Vec<u8> = self.buffer.drain(..=newline).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.buffer.len() > self.max_line {
                let body = format!("a line longer than {} bytes", self.max_line);
                return Err(ProtocolError::BadReply { url: self.url.clone(), status: 200, body });
            }
            let chunk = match tokio::time::timeout(self.idle, self.reply.chunk()).await {
                Ok(Ok(Some(chunk))) => chunk,
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(source)) => {
                    return Err(ProtocolError::Transport { url: self.url.clone(), source });
                }
                Err(_) => {
                    let body = format!("silent for {} s", self.idle.as_secs());
                    return Err(ProtocolError::BadReply {
                        url: self.url.clone(),
                        status: 200,
                        body,
                    });
                }
            };
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

enum ReadError {
    Transport(reqwest::Error),
    TooLarge,
}

/// Reads `reply`'s body as it comes, giving up as soon as it passes `max_bytes`.
async fn read_capped(
    reply: &mut reqwest::Response,
    max_bytes: usize,
) -> Result<Vec<u8>, ReadError> {
    if reply.content_length().is_some_and(|length| length > max_bytes as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = reply.chunk().await.map_err(ReadError::Transport)? {
        if bytes.len() + chunk.len() > max_bytes {
            return Err(ReadError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The certificates of a PEM file, for a client's roots.
fn read_ca_file(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path)
        .map_err(|error| anyhow::anyhow!("reading the CA file {}: {error}", path.display()))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|error| anyhow::anyhow!("the CA file {}: {error}", path.display()))?;
    if certificates.is_empty() {
        anyhow::bail!("the CA file {} holds no PEM certificate", path.display());
    }
    Ok(certificates)
}

/// Resolves host names for an admin's client, keeping only the addresses its policy allows.
struct CheckedResolver(Arc<AddressPolicy>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> =
                resolved.iter().copied().filter(|address| policy.allows_ip(address.ip())).collect();
            if allowed.is_empty() {
                let found: Vec<String> =
                    resolved.iter().map(|address| address.ip().to_string()).collect();
                let message = format!(
                    "{name} resolves to no address the executor allow-list allows ({})",
                    found.join(", ")
                );
                return Err(message.into());
            }
            let addresses: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_urls_are_kept_and_bounded() {
        let urls = ParsedUrls::default();
        let first = urls.get("http://127.0.0.1:9999/run").expect("parses");
        assert_eq!(first.as_str(), "http://127.0.0.1:9999/run");
        assert_eq!(urls.get("http://127.0.0.1:9999/run"), Some(first));
        assert_eq!(urls.get("http://[::1"), None, "not kept, and not a panic");
        // From 1000: the URL parser drops a scheme's default port (80).
        for port in 1000..1000 + ParsedUrls::MOST + 10 {
            let url = format!("http://127.0.0.1:{port}/run");
            assert_eq!(urls.get(&url).map(String::from).as_deref(), Some(url.as_str()));
        }
        let kept = urls.0.lock().unwrap().len();
        assert!((1..=ParsedUrls::MOST).contains(&kept), "{kept} kept");
    }
}
