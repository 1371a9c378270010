//! Kept-alive HTTP/1.1 connections to peers addressed as `http://IP:port`: how an admin posts
//! to executors, most of which register so, without a general HTTP client's layers (its URL
//! handling, redirect and retry services, connection pool keyed by URL) on every trigger.
//!
//! Each address has a stack of idle connections; a call takes one, or connects when there is
//! none, and gives it back once it has read the whole reply. A connection is never shared by two
//! calls at once, so the caller's window of calls in flight to a peer (`admin::dispatch::sender`)
//! bounds its connections too. A call on a kept connection that the peer had closed meanwhile
//! is sent on another only when hyper returns the request unsent; a request that may have left
//! is never sent twice. Nothing else is retried: a refused connection means nothing was sent
//! ([`Failure::sent`] is false), any other failure that it may have arrived.

use foldhash::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;

use super::text::causes;

/// How long connecting may take (a peer that is down refuses at once; one that is gone may not
/// answer at all).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The most idle connections kept to one address: the admin's window of single triggers in
/// flight to one executor.
const IDLE_PER_ADDRESS: usize = 64;

/// What a call was answered.
pub(super) struct Reply {
    pub(super) status: u16,
    /// Whether it carried a `Location` header.
    pub(super) redirect: bool,
    /// The body, whole, or `None` when it passed the cap.
    pub(super) body: Option<Bytes>,
}

/// Why a call has no reply.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) reason: String,
    /// Whether the request may have reached the peer (false: the connection failed).
    pub(super) sent: bool,
}

/// The idle connections of every address.
#[derive(Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<SocketAddr, Vec<SendRequest<Full<Bytes>>>>>,
}

/// The address of `base` when it is `http://IP:port` with nothing after but a `/`.
pub(super) fn plain_address(base: &str) -> Option<SocketAddr> {
    let authority = base.strip_prefix("http://")?;
    authority.strip_suffix('/').unwrap_or(authority).parse().ok()
}

impl Connections {
    /// Sends `request` to `to` and reads its reply, of at most `max_bytes`, within `timeout`.
    pub(super) async fn send(
        &self,
        to: SocketAddr,
        mut request: hyper::Request<Full<Bytes>>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let late = || Failure { reason: format!("no answer within {timeout:?}"), sent: true };
        loop {
            let (mut sender, kept) = match self.take(to) {
                Some(sender) => (sender, true),
                None => (connect(to, deadline).await?, false),
            };
            let sent = tokio::time::timeout_at(deadline, sender.try_send_request(request));
            let reply = match sent.await {
                Err(_) => return Err(late()),
                Ok(Ok(reply)) => reply,
                Ok(Err(mut error)) => match error.take_message() {
                    // A kept connection the peer closed meanwhile: the request never left.
                    Some(unsent) if kept => {
                        request = unsent;
                        continue;
                    }
                    unsent => {
                        let reason = causes(&error.into_error());
                        return Err(Failure { reason, sent: unsent.is_none() });
                    }
                },
            };
            let status = reply.status().as_u16();
            let redirect = reply.headers().contains_key(hyper::header::LOCATION);
            let read = Limited::new(reply.into_body(), max_bytes).collect();
            let body = match tokio::time::timeout_at(deadline, read).await {
                Err(_) => return Err(late()),
                Ok(Ok(body)) => Some(body.to_bytes()),
                Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => None,
                Ok(Err(error)) => return Err(Failure { reason: error.to_string(), sent: true }),
            };
            if body.is_some() {
                self.give_back(to, sender);
            }
            return Ok(Reply { status, redirect, body });
        }
    }

    /// An idle connection to `to` that is still open.
    fn take(&self, to: SocketAddr) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.get_mut(&to)?;
        let open = std::iter::from_fn(|| stack.pop()).find(|sender| !sender.is_closed());
        if stack.is_empty() {
            idle.remove(&to);
        }
        open
    }

    /// Keeps `sender`'s connection for the next call to `to`, if there is room.
    fn give_back(&self, to: SocketAddr, sender: SendRequest<Full<Bytes>>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.entry(to).or_default();
        if stack.len() < IDLE_PER_ADDRESS {
            stack.push(sender);
        }
    }
}

/// A new connection to `to`, its task spawned; a failure to connect sent nothing.
async fn connect(
    to: SocketAddr,
    deadline: tokio::time::Instant,
) -> Result<SendRequest<Full<Bytes>>, Failure> {
    let unsent = |reason: String| Failure { reason, sent: false };
    let by = deadline.min(tokio::time::Instant::now() + CONNECT_TIMEOUT);
    let stream = match tokio::time::timeout_at(by, tokio::net::TcpStream::connect(to)).await {
        Err(_) => return Err(unsent(format!("connecting to {to} timed out"))),
        Ok(Err(error)) => return Err(unsent(format!("connecting to {to}: {error}"))),
        Ok(Ok(stream)) => stream,
    };
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| unsent(format!("connecting to {to}: {}", causes(&error))))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the connection to {to} ended");
        }
    });
    Ok(sender)
}

/// `POST {path}` of `body` (JSON) to `to`, with the access token and, when given, the
/// application's name (XXL-JOB 3.5 wants it).
pub(super) fn request(
    to: SocketAddr,
    path: &str,
    body: Vec<u8>,
    access_token: &str,
    app_name: Option<&str>,
) -> Result<hyper::Request<Full<Bytes>>, Failure> {
    let cannot = |error: &dyn std::fmt::Display| Failure {
        reason: format!("the request cannot be made: {error}"),
        sent: false,
    };
    let relative = path.trim_start_matches('/');
    let uri = match path.len() - relative.len() {
        1 => hyper::Uri::try_from(path),
        _ => {
            let mut absolute = String::with_capacity(relative.len() + 1);
            absolute.push('/');
            absolute.push_str(relative);
            hyper::Uri::try_from(absolute)
        }
    };
    let mut request = hyper::Request::new(Full::new(Bytes::from(body)));
    *request.method_mut() = hyper::Method::POST;
    *request.uri_mut() = uri.map_err(|error| cannot(&error))?;
    let value = |text: &str| HeaderValue::from_str(text).map_err(|error| cannot(&error));
    let headers = request.headers_mut();
    let host = HeaderValue::try_from(host(to)).map_err(|error| cannot(&error))?;
    headers.insert(hyper::header::HOST, host);
    headers.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ACCESS_TOKEN, value(access_token)?);
    if let Some(app_name) = app_name {
        headers.insert(APP_NAME, value(app_name)?);
    }
    Ok(request)
}

/// [`super::ACCESS_TOKEN_HEADER`] as a header's name (names are sent in lowercase).
const ACCESS_TOKEN: HeaderName = HeaderName::from_static("xxl-job-access-token");
/// [`super::APP_NAME_HEADER`] as a header's name.
const APP_NAME: HeaderName = HeaderName::from_static("xxl-job-appname");

/// The `Host` of a request to `to`: `127.0.0.1:9999`, `[::1]:9999`. An IPv4 address is written
/// digit by digit, without the formatting machinery that its `Display` goes through.
fn host(to: SocketAddr) -> String {
    match to {
        SocketAddr::V4(v4) => {
            let mut text = String::with_capacity(21);
            for (index, octet) in v4.ip().octets().into_iter().enumerate() {
                if index > 0 {
                    text.push('.');
                }
                push_decimal(&mut text, u32::from(octet));
            }
            text.push(':');
            push_decimal(&mut text, u32::from(v4.port()));
            text
        }
        SocketAddr::V6(_) => to.to_string(),
    }
}

/// Appends `number` in decimal.
fn push_decimal(text: &mut String, number: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut rest = number;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    text.extend(digits[at..].iter().map(|&digit| char::from(digit)));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A request for `path` at `to`, as [`super::super::Client`] makes one.
    fn post(to: SocketAddr, path: &str) -> hyper::Request<Full<Bytes>> {
        request(to, path, b"{}".to_vec(), "token", None).unwrap()
    }

    /// A request names its host, path and headers as hyper's builder and `SocketAddr` would.
    #[test]
    fn a_request_carries_its_host_path_and_headers() {
        for to in [
            "127.0.0.1:9999",
            "10.200.0.255:80",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "[::1]:8080",
        ] {
            let to: SocketAddr = to.parse().unwrap();
            assert_eq!(host(to), to.to_string());
        }
        let to: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        for path in ["run", "/run", "//run", "beat"] {
            let request = request(to, path, b"{}".to_vec(), "token", Some("app")).unwrap();
            assert_eq!(request.method(), hyper::Method::POST);
            assert_eq!(request.uri().path(), format!("/{}", path.trim_start_matches('/')));
            let header = |name: &str| request.headers()[name].to_str().unwrap().to_owned();
            assert_eq!(header("host"), "127.0.0.1:9999");
            assert_eq!(header("content-type"), "application/json");
            assert_eq!(header(crate::protocol::ACCESS_TOKEN_HEADER), "token");
            assert_eq!(header(crate::protocol::APP_NAME_HEADER), "app");
        }
        let refused = request(to, "run", Vec::new(), "bad\ntoken", None).err().unwrap();
        assert!(refused.reason.starts_with("the request cannot be made"), "{}", refused.reason);
        assert!(!refused.sent);
        assert!(request(to, "a path with spaces", Vec::new(), "token", None).is_err());
    }

    /// A server on 127.0.0.1 answering `reply(path)` to every request, counting connections;
    /// `close_after` ends each connection after that many requests (a peer closing idle ones).
    async fn server(close_after: Option<usize>) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(stream, close_after));
            }
        });
        (address, connections)
    }

    async fn serve(mut stream: tokio::net::TcpStream, close_after: Option<usize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut served = 0;
        let mut buffer = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let Ok(read) = stream.read(&mut chunk).await else { return };
            if read == 0 {
                return;
            }
            buffer.extend_from_slice(&chunk[..read]);
            // Every request here has a 2-byte body after its head.
            while let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                if buffer.len() < end + 6 {
                    break;
                }
                let head = String::from_utf8_lossy(&buffer[..end]).to_string();
                buffer.drain(..end + 6);
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let (status, body) = match path.as_str() {
                    "/big" => ("200 OK", "x".repeat(100)),
                    "/moved" => ("302 Found\r\nlocation: http://elsewhere/", String::new()),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        ("200 OK", String::new())
                    }
                    _ => ("200 OK", format!("{{\"code\":200,\"content\":\"{path}\"}}")),
                };
                let reply =
                    format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                served += 1;
                if close_after == Some(served) {
                    return;
                }
            }
        }
    }

    #[test]
    fn only_a_bare_http_ip_and_port_is_a_plain_address() {
        let table = [
            ("http://127.0.0.1:9999", Some("127.0.0.1:9999")),
            ("http://127.0.0.1:9999/", Some("127.0.0.1:9999")),
            ("http://[::1]:9999", Some("[::1]:9999")),
            ("http://127.0.0.1", None),
            ("http://127.0.0.1:9999/xxl-job-executor", None),
            ("https://127.0.0.1:9999", None),
            ("http://executor.internal:9999", None),
            ("pull://a", None),
        ];
        for (base, address) in table {
            let parsed = plain_address(base).map(|address| address.to_string());
            assert_eq!(parsed.as_deref(), address, "{base}");
        }
    }

    #[tokio::test]
    async fn calls_one_after_another_share_one_connection() {
        let (address, connections) = server(None).await;
        let pool = Connections::default();
        for call in 0..20 {
            let path = format!("/run{call}");
            let reply = pool.send(address, post(address, &path), 1024, Duration::from_secs(5));
            let reply = reply.await.unwrap();
            assert_eq!(reply.status, 200);
            let expected = format!("{{\"code\":200,\"content\":\"{path}\"}}");
            assert_eq!(reply.body.as_deref(), Some(expected.as_bytes()));
        }
        assert_eq!(connections.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_is_not_used_again() {
        // The peer closes every connection after one reply, as an executor closing idle ones.
        let (address, connections) = server(Some(1)).await;
        let pool = Connections::default();
        for _ in 0..5 {
            let reply = pool.send(address, post(address, "/run"), 1024, Duration::from_secs(5));
            assert_eq!(reply.await.unwrap().status, 200);
            // Let the connection's task see the close.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(connections.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn a_refused_connection_sent_nothing_and_a_slow_peer_may_have_its_request() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let nobody = closed.local_addr().unwrap();
        drop(closed);
        let pool = Connections::default();
        let refused = pool.send(nobody, post(nobody, "/run"), 1024, Duration::from_secs(5)).await;
        assert!(!refused.err().unwrap().sent);
        let (address, _) = server(None).await;
        let slow = pool.send(address, post(address, "/slow"), 1024, Duration::from_millis(300));
        let failure = slow.await.err().unwrap();
        assert!(failure.sent, "{failure:?}");
    }

    #[tokio::test]
    async fn a_reply_past_the_cap_has_no_body_and_a_redirect_is_told() {
        let (address, _) = server(None).await;
        let pool = Connections::default();
        let big = pool.send(address, post(address, "/big"), 50, Duration::from_secs(5));
        let big = big.await.unwrap();
        assert_eq!((big.status, big.body), (200, None));
        let moved = pool.send(address, post(address, "/moved"), 50, Duration::from_secs(5));
        let moved = moved.await.unwrap();
        assert_eq!((moved.status, moved.redirect), (302, true));
    }
}
