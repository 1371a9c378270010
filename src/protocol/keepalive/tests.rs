//! The kept-alive connections against real sockets on 127.0.0.1, and the reading of heads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A request for `path` at `to`, as [`super::super::Client`] makes one.
fn post(to: SocketAddr, path: &str) -> Request {
    request(to, path, b"{}".to_vec(), "token", None).unwrap()
}

/// A request names its host, path and headers, and its body's length, as HTTP/1.1 wants.
#[test]
fn a_request_carries_its_host_path_and_headers() {
    for to in
        ["127.0.0.1:9999", "10.200.0.255:80", "0.0.0.0:0", "255.255.255.255:65535", "[::1]:8080"]
    {
        let to: SocketAddr = to.parse().unwrap();
        let mut host = Vec::new();
        push_host(&mut host, to);
        assert_eq!(String::from_utf8(host).unwrap(), to.to_string());
    }
    let to: SocketAddr = "127.0.0.1:9999".parse().unwrap();
    for path in ["run", "/run", "//run", "beat"] {
        let request = request(to, path, b"{\"a\":1}".to_vec(), "token", Some("app")).unwrap();
        let mut headers = [httparse::EMPTY_HEADER; 8];
        let mut parsed = httparse::Request::new(&mut headers);
        let head = parsed.parse(&request.bytes).unwrap().unwrap();
        assert_eq!(&request.bytes[head..], b"{\"a\":1}");
        assert_eq!((parsed.method, parsed.version), (Some("POST"), Some(1)));
        assert_eq!(parsed.path, Some(format!("/{}", path.trim_start_matches('/')).as_str()));
        let header = |name: &str| {
            let found = parsed.headers.iter().find(|header| header.name.eq_ignore_ascii_case(name));
            String::from_utf8(found.unwrap().value.to_vec()).unwrap()
        };
        assert_eq!(header("host"), "127.0.0.1:9999");
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("content-length"), "7");
        assert_eq!(header(crate::protocol::ACCESS_TOKEN_HEADER), "token");
        assert_eq!(header(crate::protocol::APP_NAME_HEADER), "app");
    }
    let without = request(to, "run", Vec::new(), "", None).unwrap();
    assert!(!String::from_utf8_lossy(&without.bytes).contains("appname"));
    let refused = request(to, "run", Vec::new(), "bad\ntoken", None).err().unwrap();
    assert!(refused.reason.starts_with("the request cannot be made"), "{}", refused.reason);
    assert!(!refused.sent);
    assert!(request(to, "a path with spaces", Vec::new(), "token", None).is_err());
    assert!(request(to, "run", Vec::new(), "token", Some("app\r\nx: y")).is_err());
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
            let framed = |status: &str, body: &str| {
                format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}", body.len())
            };
            let reply = match path.as_str() {
                "/big" => framed("200 OK", &"x".repeat(100)),
                "/moved" => framed("302 Found\r\nlocation: http://elsewhere/", ""),
                "/slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    framed("200 OK", "")
                }
                "/chunked" => "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                               4;name=value\r\n{\"co\r\n6\r\nde\":20\r\n1\r\n0\r\n\
                               1\r\n}\r\n0\r\nx-trailer: 1\r\n\r\n"
                    .to_owned(),
                "/continue" => {
                    format!("HTTP/1.1 100 Continue\r\n\r\n{}", framed("200 OK", "{}"))
                }
                "/close" => framed("200 OK\r\nconnection: close", "{}"),
                "/http10" => "HTTP/1.0 200 OK\r\n\r\n{}".to_owned(),
                "/garbage" => "SMTP ready\r\n\r\n".to_owned(),
                "/pieces" => {
                    // The reply a few bytes at a time, as a slow peer writes it.
                    for piece in framed("200 OK", "{\"code\":200}").as_bytes().chunks(3) {
                        if stream.write_all(piece).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    String::new()
                }
                _ => framed("200 OK", &format!("{{\"code\":200,\"content\":\"{path}\"}}")),
            };
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            if matches!(path.as_str(), "/close" | "/http10" | "/garbage") {
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

/// Replies framed every way HTTP/1.1 frames them are read whole; those that end their
/// connection are not kept, the others are.
#[tokio::test]
async fn every_framing_of_a_reply_is_read_and_only_kept_connections_are_reused() {
    let (address, connections) = server(None).await;
    let pool = Connections::default();
    // Each path twice: the connections it opened. A reply that ends its connection leaves
    // none for the next call.
    let table = [
        ("/chunked", "{\"code\":200}", 1),
        ("/continue", "{}", 0),
        ("/pieces", "{\"code\":200}", 0),
        ("/close", "{}", 1),
        ("/http10", "{}", 2),
    ];
    for (path, body, opened) in table {
        let before = connections.load(Ordering::Relaxed);
        for _ in 0..2 {
            let reply = pool.send(address, post(address, path), 1024, Duration::from_secs(5));
            let reply = reply.await.unwrap();
            assert_eq!((reply.status, reply.body.as_deref()), (200, Some(body.as_bytes())));
        }
        assert_eq!(connections.load(Ordering::Relaxed) - before, opened, "{path}");
    }
    let big = pool.send(address, post(address, "/chunked"), 5, Duration::from_secs(5));
    assert_eq!(big.await.unwrap().body, None);
    let garbage = pool.send(address, post(address, "/garbage"), 1024, Duration::from_secs(5));
    let failure = garbage.await.err().unwrap();
    assert!(failure.reason.starts_with("a malformed reply"), "{}", failure.reason);
    assert!(failure.sent);
}

/// A reply's head: its status, where its body ends and whether its connection is kept.
#[test]
fn a_head_says_how_its_body_ends_and_whether_the_connection_is_kept() {
    // A head, and its status, framing and whether it keeps its connection (`None`: not whole).
    type Expected = Option<(u16, Framing, bool)>;
    let table: [(&str, Expected); 9] = [
        ("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", Some((200, Framing::Length(12), true))),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            Some((200, Framing::Chunked, true)),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            Some((200, Framing::UntilClose, true)),
        ),
        ("HTTP/1.1 204 No Content\r\n\r\n", Some((204, Framing::Empty, true))),
        (
            "HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n",
            Some((200, Framing::Length(0), false)),
        ),
        ("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n", Some((200, Framing::Length(2), false))),
        (
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\n",
            Some((200, Framing::Length(2), true)),
        ),
        ("HTTP/1.1 500 Oops\r\n\r\n", Some((500, Framing::UntilClose, true))),
        ("HTTP/1.1 200 OK\r\ncontent-le", None),
    ];
    for (text, expected) in table {
        let parsed = parse_head(text.as_bytes()).unwrap();
        let parsed = parsed.map(|(head, length)| {
            assert_eq!(length, text.len());
            (head.status, head.framing, head.keep_alive)
        });
        assert_eq!(parsed, expected, "{text}");
    }
    for bad in [
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
    ] {
        assert!(parse_head(bad.as_bytes()).is_err(), "{bad}");
    }
}
