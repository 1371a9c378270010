//! Kept-alive HTTP/1.1 connections to peers addressed as `http://IP:port`: how an admin posts
//! to executors, most of which register so. A call writes its request and reads the reply on the
//! caller's own task, over a connection it holds alone: no general HTTP client's layers (its URL
//! handling, redirect and retry services, connection pool keyed by URL), and no connection task
//! between the caller and the socket, which cost a hand-over and a wake-up each way per call.
//!
//! Each address has a stack of idle connections; a call takes one, or connects when there is
//! none, and gives it back once it has read the whole reply and the reply lets it be kept
//! (HTTP/1.1 without `Connection: close`, a framed body, nothing after it). A connection is
//! never shared by two calls at once, so the caller's window of calls in flight to a peer
//! (`admin::dispatch::sender`) bounds its connections too. Requests are not pipelined: an
//! XXL-JOB 2.x executor answers a connection's requests from a pool of threads, in any order.
//!
//! A kept connection that the peer closed while it was idle is found when it is taken (its
//! socket reads the end of the stream, or bytes nobody asked for) and dropped, and the call
//! takes another: its request never left. A request that may have left is never sent twice. A
//! refused connection, or a kept one whose first write failed, sent nothing ([`Failure::sent`]
//! is false); any other failure may have delivered the request.

use foldhash::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long connecting may take (a peer that is down refuses at once; one that is gone may not
/// answer at all).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The most idle connections kept to one address: the admin's window of single triggers in
/// flight to one executor.
const IDLE_PER_ADDRESS: usize = 64;
/// The most bytes a reply's head (status line and headers) may take.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a reply may have.
const MAX_HEADERS: usize = 64;
/// How much room a read asks for at least: a reply to a trigger fits, in an allocation small
/// enough for the allocator's per-thread cache; a larger one grows the buffer by doubling.
const READ_BYTES: usize = 1024;

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

/// A request, written out: its head and its body, as they go on the wire.
pub(super) struct Request {
    bytes: Vec<u8>,
}

/// A connection and what was read from it past the last reply (nothing, on a kept one).
struct Connection {
    stream: TcpStream,
    buffer: BytesMut,
}

/// The idle connections of every address.
#[derive(Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<SocketAddr, Vec<Connection>>>,
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
        request: Request,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (mut connection, kept) = match self.take(to) {
                Some(connection) => (connection, true),
                None => (connect(to, deadline).await?, false),
            };
            let exchange = exchange(&mut connection, &request.bytes, max_bytes);
            let (reply, keep) = match tokio::time::timeout_at(deadline, exchange).await {
                Err(_) => {
                    let reason = format!("no answer within {timeout:?}");
                    return Err(Failure { reason, sent: true });
                }
                // A kept connection the peer closed meanwhile: the request never left.
                Ok(Err(Failure { sent: false, .. })) if kept => continue,
                Ok(Err(failure)) => return Err(failure),
                Ok(Ok(done)) => done,
            };
            if keep {
                self.give_back(to, connection);
            }
            return Ok(reply);
        }
    }

    /// An idle connection to `to` that is still open.
    fn take(&self, to: SocketAddr) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.get_mut(&to)?;
        let open = std::iter::from_fn(|| stack.pop()).find(idle_and_open);
        if stack.is_empty() {
            idle.remove(&to);
        }
        open
    }

    /// Keeps `connection` for the next call to `to`, if there is room.
    fn give_back(&self, to: SocketAddr, connection: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.entry(to).or_default();
        if stack.len() < IDLE_PER_ADDRESS {
            stack.push(connection);
        }
    }
}

/// Whether an idle connection has nothing to read: not the end of its stream (the peer closed
/// it), not bytes nobody asked for, not an error. No system call is made unless the socket was
/// reported readable since the last read.
fn idle_and_open(connection: &Connection) -> bool {
    let mut probe = [0u8; 1];
    matches!(connection.stream.try_read(&mut probe),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
}

/// A new connection to `to`; a failure to connect sent nothing.
async fn connect(to: SocketAddr, deadline: tokio::time::Instant) -> Result<Connection, Failure> {
    let unsent = |reason: String| Failure { reason, sent: false };
    let by = deadline.min(tokio::time::Instant::now() + CONNECT_TIMEOUT);
    let stream = match tokio::time::timeout_at(by, TcpStream::connect(to)).await {
        Err(_) => return Err(unsent(format!("connecting to {to} timed out"))),
        Ok(Err(error)) => return Err(unsent(format!("connecting to {to}: {error}"))),
        Ok(Ok(stream)) => stream,
    };
    let _ = stream.set_nodelay(true);
    Ok(Connection { stream, buffer: BytesMut::new() })
}

/// Writes `request` on `connection` and reads the reply, its body up to `max_bytes`; with it,
/// whether the connection may carry another call.
async fn exchange(
    connection: &mut Connection,
    request: &[u8],
    max_bytes: usize,
) -> Result<(Reply, bool), Failure> {
    let mut written = 0;
    while written < request.len() {
        match connection.stream.write(&request[written..]).await {
            Ok(0) => return Err(broken("the connection took no more bytes", written > 0)),
            Ok(count) => written += count,
            Err(error) => return Err(broken(&error.to_string(), written > 0)),
        }
    }
    let head = loop {
        let head = read_head(connection).await?;
        // An interim reply (`100 Continue`) comes before the reply.
        if !(100..200).contains(&head.status) || head.status == 101 {
            break head;
        }
    };
    let body = match head.framing {
        Framing::Empty => Some(Bytes::new()),
        Framing::Length(length) if length > max_bytes => None,
        Framing::Length(length) => {
            fill(connection, length).await?;
            Some(connection.buffer.split_to(length).freeze())
        }
        Framing::Chunked => read_chunked(connection, max_bytes).await?,
        Framing::UntilClose => read_until_close(connection, max_bytes).await?,
    };
    let keep = head.keep_alive
        && body.is_some()
        && head.framing != Framing::UntilClose
        && connection.buffer.is_empty();
    Ok((Reply { status: head.status, redirect: head.redirect, body }, keep))
}

/// A failure once the request was on its way: `sent` when some of it may have left.
fn broken(reason: &str, sent: bool) -> Failure {
    Failure { reason: reason.to_owned(), sent }
}

/// How a reply's body ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Framing {
    /// It has none (`204`, `304`, an interim reply).
    Empty,
    /// `Content-Length` bytes.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Where the peer closes the connection.
    UntilClose,
}

/// What the head of a reply says.
struct Head {
    status: u16,
    redirect: bool,
    framing: Framing,
    /// Whether the connection may carry another call after this reply.
    keep_alive: bool,
}

/// Reads a reply's head off `connection`, leaving what follows it in its buffer.
async fn read_head(connection: &mut Connection) -> Result<Head, Failure> {
    loop {
        if let Some((head, length)) = parse_head(&connection.buffer)? {
            connection.buffer.advance(length);
            return Ok(head);
        }
        if connection.buffer.len() > MAX_HEAD_BYTES {
            return Err(broken(&format!("a reply's head passed {MAX_HEAD_BYTES} bytes"), true));
        }
        read_more(connection).await?;
    }
}

/// The head at the start of `bytes` and its length, or `None` while it is not whole.
fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, Failure> {
    let malformed =
        |error: &dyn std::fmt::Display| broken(&format!("a malformed reply: {error}"), true);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut reply = httparse::Response::new(&mut headers);
    let length = match reply.parse(bytes).map_err(|error| malformed(&error))? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(length) => length,
    };
    let status = reply.code.unwrap_or_default();
    let mut redirect = false;
    let mut content_length = None;
    let mut chunked = None;
    let mut close = false;
    let mut keep_alive = false;
    for header in reply.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("location") {
            redirect = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(header.value).ok().map(str::trim);
            let parsed = value.and_then(|value| value.parse::<usize>().ok());
            match (parsed, content_length) {
                (Some(value), None) => content_length = Some(value),
                (Some(value), Some(earlier)) if value == earlier => {}
                _ => return Err(malformed(&"its Content-Length is not one number")),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let last = header.value.rsplit(|&byte| byte == b',').next().unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in header.value.split(|&byte| byte == b',') {
                close |= token.trim_ascii().eq_ignore_ascii_case(b"close");
                keep_alive |= token.trim_ascii().eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }
    let framing = match (status, chunked, content_length) {
        (100..=199 | 204 | 304, _, _) => Framing::Empty,
        (_, Some(true), _) => Framing::Chunked,
        (_, Some(false), _) => Framing::UntilClose,
        (_, None, Some(length)) => Framing::Length(length),
        (_, None, None) => Framing::UntilClose,
    };
    // HTTP/1.1 keeps a connection unless told to close it; HTTP/1.0 closes it unless told to
    // keep it.
    let keep_alive = !close && (reply.version == Some(1) || keep_alive);
    Ok(Some((Head { status, redirect, framing, keep_alive }, length)))
}

/// Reads what comes next into `connection`'s buffer: how many bytes, none at the end of the
/// stream.
async fn read_some(connection: &mut Connection) -> Result<usize, Failure> {
    connection.buffer.reserve(READ_BYTES);
    let read = connection.stream.read_buf(&mut connection.buffer).await;
    read.map_err(|error| broken(&error.to_string(), true))
}

/// Reads more of the reply into `connection`'s buffer; the end of the stream is a failure.
async fn read_more(connection: &mut Connection) -> Result<(), Failure> {
    match read_some(connection).await? {
        0 => Err(broken("the connection closed before the reply was whole", true)),
        _ => Ok(()),
    }
}

/// Reads until `connection`'s buffer holds at least `length` bytes.
async fn fill(connection: &mut Connection, length: usize) -> Result<(), Failure> {
    while connection.buffer.len() < length {
        read_more(connection).await?;
    }
    Ok(())
}

/// A chunked body, or `None` once it passes `max_bytes` (its reading then stops there).
async fn read_chunked(
    connection: &mut Connection,
    max_bytes: usize,
) -> Result<Option<Bytes>, Failure> {
    let mut body = BytesMut::new();
    loop {
        let line = read_line(connection).await?;
        let size = line.split(|&byte| byte == b';').next().unwrap_or_default().trim_ascii();
        let size =
            std::str::from_utf8(size).ok().and_then(|hex| usize::from_str_radix(hex, 16).ok());
        let Some(size) = size else {
            return Err(broken("a malformed reply: a chunk's size is not a number", true));
        };
        if size == 0 {
            // Trailers, if any, up to an empty line.
            while !read_line(connection).await?.is_empty() {}
            return Ok(Some(body.freeze()));
        }
        if body.len().saturating_add(size) > max_bytes {
            return Ok(None);
        }
        fill(connection, size.saturating_add(2)).await?;
        body.extend_from_slice(&connection.buffer[..size]);
        if &connection.buffer[size..size + 2] != b"\r\n" {
            return Err(broken("a malformed reply: a chunk does not end its line", true));
        }
        connection.buffer.advance(size + 2);
    }
}

/// The next line of `connection`, without its `\r\n`.
async fn read_line(connection: &mut Connection) -> Result<Bytes, Failure> {
    let mut searched = 0;
    loop {
        let buffer = &connection.buffer;
        if let Some(at) = buffer[searched..].windows(2).position(|pair| pair == b"\r\n") {
            let line = connection.buffer.split_to(searched + at + 2).freeze();
            return Ok(line.slice(..line.len() - 2));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err(broken(&format!("a reply's line passed {MAX_HEAD_BYTES} bytes"), true));
        }
        searched = buffer.len().saturating_sub(1);
        read_more(connection).await?;
    }
}

/// A body that ends where the peer closes the connection, or `None` once it passes
/// `max_bytes`.
async fn read_until_close(
    connection: &mut Connection,
    max_bytes: usize,
) -> Result<Option<Bytes>, Failure> {
    loop {
        if connection.buffer.len() > max_bytes {
            return Ok(None);
        }
        if read_some(connection).await? == 0 {
            return Ok(Some(connection.buffer.split().freeze()));
        }
    }
}

/// `POST {path}` of `body` (JSON) to `to`, with the access token and, when given, the
/// application's name (XXL-JOB 3.5 wants it), written out. A path must be visible ASCII and a
/// header's value visible ASCII, spaces and tabs.
pub(super) fn request(
    to: SocketAddr,
    path: &str,
    body: Vec<u8>,
    access_token: &str,
    app_name: Option<&str>,
) -> Result<Request, Failure> {
    let cannot =
        |what: &str| Failure { reason: format!("the request cannot be made: {what}"), sent: false };
    let relative = path.trim_start_matches('/');
    if !relative.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(cannot(&format!("the path {path:?} is not visible ASCII")));
    }
    let valid =
        |value: &str| value.bytes().all(|byte| byte == b'\t' || (b' '..=b'~').contains(&byte));
    if !valid(access_token) {
        return Err(cannot("the access token is not a header's value"));
    }
    if !app_name.is_none_or(valid) {
        return Err(cannot("the application's name is not a header's value"));
    }
    let mut bytes = Vec::with_capacity(192 + relative.len() + access_token.len() + body.len());
    bytes.extend_from_slice(b"POST /");
    bytes.extend_from_slice(relative.as_bytes());
    bytes.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    push_host(&mut bytes, to);
    bytes.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
    bytes.extend_from_slice(ACCESS_TOKEN.as_bytes());
    bytes.extend_from_slice(b": ");
    bytes.extend_from_slice(access_token.as_bytes());
    if let Some(app_name) = app_name {
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(APP_NAME.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(app_name.as_bytes());
    }
    bytes.extend_from_slice(b"\r\ncontent-length: ");
    bytes.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    bytes.extend_from_slice(b"\r\n\r\n");
    bytes.extend_from_slice(&body);
    Ok(Request { bytes })
}

/// [`super::ACCESS_TOKEN_HEADER`] as it is sent (names are sent in lowercase).
const ACCESS_TOKEN: &str = "xxl-job-access-token";
/// [`super::APP_NAME_HEADER`] as it is sent.
const APP_NAME: &str = "xxl-job-appname";

/// Appends the `Host` of a request to `to`: `127.0.0.1:9999`, `[::1]:9999`. An IPv4 address is
/// written digit by digit, without the formatting machinery that its `Display` goes through.
fn push_host(out: &mut Vec<u8>, to: SocketAddr) {
    match to {
        SocketAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (index, octet) in v4.ip().octets().into_iter().enumerate() {
                if index > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(digits.format(octet).as_bytes());
            }
            out.push(b':');
            out.extend_from_slice(digits.format(v4.port()).as_bytes());
        }
        SocketAddr::V6(_) => out.extend_from_slice(to.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests;
