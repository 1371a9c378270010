//! The network attack surface, with real sockets on 127.0.0.1: which executor addresses the
//! admin accepts and calls, a client that follows no redirect and reads no more than its cap,
//! foreign text shown only as a short excerpt, and TLS between admin and executor.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wasmjob::admin::{self, Admin};
use wasmjob::config::NetworkConfig;
use wasmjob::executor;
use wasmjob::netpolicy::AddressPolicy;
use wasmjob::protocol::{self, ClientOptions, ProtocolError};

use crate::support::app::{admin_config, executor_config};
use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, Api, sample_job};

/// What a [`RawServer`] answers: the whole HTTP reply, or a stream of body chunks after a head.
#[derive(Clone)]
enum Answer {
    Fixed(String),
    /// The whole reply, by the request's head.
    Routed(Arc<dyn Fn(&str) -> String + Send + Sync>),
    /// A 200 head with chunked encoding, then this chunk again and again until the peer leaves.
    Endless(Vec<u8>),
}

/// A plain HTTP/1.1 server on 127.0.0.1:0 that records each request's head and answers each
/// the same way. It stands in for an executor that is not one.
struct RawServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    /// Body bytes written by `Answer::Endless` before the peer went away.
    written: Arc<Mutex<usize>>,
}

impl RawServer {
    async fn start(answer: Answer) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(Mutex::new(0));
        let (seen, count) = (requests.clone(), written.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, count, answer) = (seen.clone(), count.clone(), answer.clone());
                tokio::spawn(serve(stream, answer, seen, count));
            }
        });
        RawServer { url, requests, written }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    answer: Answer,
    seen: Arc<Mutex<Vec<String>>>,
    written: Arc<Mutex<usize>>,
) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buffer[..n]),
        }
    }
    let head = String::from_utf8_lossy(&request).into_owned();
    seen.lock().unwrap().push(head.clone());
    match answer {
        Answer::Routed(route) => {
            let _ = stream.write_all(route(&head).as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Answer::Fixed(reply) => {
            let _ = stream.write_all(reply.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Answer::Endless(chunk) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let framed =
                [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
            // Stops when the client closes the connection, or after 1 GiB (a client that
            // buffers everything).
            while *written.lock().unwrap() < 1 << 30 {
                if stream.write_all(&framed).await.is_err() {
                    return;
                }
                *written.lock().unwrap() += framed.len();
            }
        }
    }
}

fn reply(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn start_admin(dir: &tempfile::TempDir) -> (Admin, Api) {
    wasmjob::telemetry::init_for_test();
    let database_url = format!("sqlite:{}", dir.path().join("wasmjob.db").display());
    let admin = admin::start(admin_config(database_url)).await.unwrap();
    admin.state.db.ensure_group("default", "Default", admin::now_ms()).await.unwrap();
    let api =
        Api { http: reqwest::Client::new(), base: admin.url(), token: ADMIN_TOKEN.to_owned() };
    (admin, api)
}

/// `POST {admin}/api/registry` as an executor of `default` at `address`; the envelope.
async fn register(api: &Api, address: &str) -> Value {
    let body =
        json!({"registryGroup": "EXECUTOR", "registryKey": "default", "registryValue": address});
    let reply = api
        .http
        .post(api.url("/api/registry"))
        .header(protocol::ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    reply.json().await.unwrap()
}

#[tokio::test]
async fn registration_refuses_metadata_link_local_paths_queries_and_userinfo() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, api) = start_admin(&dir).await;
    let executor = RawServer::start(Answer::Fixed(reply("200 OK", "", r#"{"code":200}"#))).await;
    let port = executor.url.rsplit(':').next().unwrap().to_owned();
    let refused = [
        ("http://169.254.169.254/".to_owned(), "169.254.169.254 is not in the executor allow-list"),
        ("http://[fe80::1]:9999/".to_owned(), "fe80::1 is not in the executor allow-list"),
        ("http://[::ffff:169.254.169.254]/".to_owned(), "is not in the executor allow-list"),
        ("http://8.8.8.8:9999/".to_owned(), "8.8.8.8 is not in the executor allow-list"),
        (format!("{}/latest/meta-data", executor.url), "scheme, host and port only (found `/`)"),
        (format!("{}?next=http://169.254.169.254/", executor.url), "scheme, host and port only"),
        (format!("{}?a=1", executor.url), "(found `?`)"),
        (format!("{}#x", executor.url), "(found `#`)"),
        (format!("http://user:pw@127.0.0.1:{port}/"), "carries no user or password"),
        (format!("http://169.254.169.254@127.0.0.1:{port}/"), "carries no user or password"),
        (
            format!("http://metadata.google.internal:{port}/"),
            "`metadata.google.internal` is not in",
        ),
        (format!("gopher://127.0.0.1:{port}/"), "only http and https are accepted"),
    ];
    for (address, reason) in &refused {
        let answer = register(&api, address).await;
        assert_eq!(answer["code"], 500, "{address}: {answer}");
        let msg = answer["msg"].as_str().unwrap();
        assert!(msg.starts_with("registryValue `") && msg.contains(reason), "{address}: {msg}");
    }
    let (_, executors) = api.get("/api/v1/executors").await;
    assert_eq!(executors.as_array().map(Vec::len), Some(0), "{executors}");
    // What an XXL-JOB executor sends is accepted, and so is a name the policy lists.
    for address in [format!("{}/", executor.url), format!("http://localhost:{port}")] {
        let answer = register(&api, &address).await;
        assert_eq!(answer["code"], 200, "{address}: {answer}");
    }
    assert!(executor.requests().is_empty(), "registration calls nobody");
    admin.stop().await;
}

/// An executor that answers every call with a redirect to another server of the attacker's.
#[tokio::test]
async fn a_redirect_from_an_executor_is_not_followed_and_the_token_goes_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, api) = start_admin(&dir).await;
    let trap = RawServer::start(Answer::Fixed(reply("200 OK", "", r#"{"code":200}"#))).await;
    let location = format!("location: {}/run\r\n", trap.url);
    let redirector =
        RawServer::start(Answer::Fixed(reply("307 Temporary Redirect", &location, ""))).await;
    assert_eq!(register(&api, &redirector.url).await["code"], 200);
    let job_id = api
        .create_job(json!({"name": "redirected", "glue_type": "BEAN", "handler": "h", "param": "secret-param"}))
        .await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    let run = api.finished_run(log_id).await;
    assert_eq!(run["trigger_code"], 500, "{run}");
    let msg = run["trigger_msg"].as_str().unwrap();
    assert!(msg.contains("HTTP 307") && msg.contains("redirect, not followed"), "{msg}");
    assert!(!redirector.requests().is_empty(), "the executor was called");
    assert!(
        trap.requests().is_empty(),
        "the redirect was followed, carrying the token and the job's parameters: {:?}",
        trap.requests()
    );
    admin.stop().await;
}

/// An executor that answers its log stream with a redirect to another server: the log stream
/// goes through the one client to executors, so the redirect is not followed (the access token
/// goes nowhere else), the admin reads the log's pages instead, and the SSE client gets its end.
#[tokio::test]
async fn a_redirected_log_stream_is_not_followed_and_the_stream_still_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, api) = start_admin(&dir).await;
    let trap = RawServer::start(Answer::Fixed(reply(
        "200 OK",
        "content-type: application/x-ndjson\r\n",
        "",
    )))
    .await;
    let location = format!("location: {}/log/stream\r\n", trap.url);
    let executor = RawServer::start(Answer::Routed(Arc::new(move |head: &str| {
        let json = "content-type: application/json\r\n";
        match head.split_whitespace().nth(1).unwrap_or("") {
            path if path.starts_with("/log/stream") => {
                reply("307 Temporary Redirect", &location, "")
            }
            "/log" => reply(
                "200 OK",
                json,
                r#"{"code":200,"content":{"fromLineNum":1,"toLineNum":0,"logContent":"","isEnd":true}}"#,
            ),
            _ => reply("200 OK", json, r#"{"code":200}"#),
        }
    })))
    .await;
    assert_eq!(register(&api, &executor.url).await["code"], 200);
    let job_id = api
        .create_job(json!({"name": "redirected log", "glue_type": "BEAN", "handler": "h"}))
        .await;
    let (_, triggered) = api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    api.wait_until("the executor accepts the run", || async {
        let (_, run) = api.get(&format!("/api/v1/logs/{log_id}")).await;
        (run["trigger_code"] == 200).then_some(())
    })
    .await;

    let mut stream = crate::support::sse::open_stream(&api, log_id, None).await;
    let asked = |what: &'static str| {
        let requests = executor.requests();
        async move { requests.iter().any(|head| head.starts_with(what)).then_some(()) }
    };
    api.wait_until("the admin asks for the pushed log", || asked("GET /log/stream")).await;
    api.wait_until("the admin reads the log's pages", || asked("POST /log ")).await;
    let result =
        json!([{"logId": log_id, "logDateTim": 0, "handleCode": 200, "handleMsg": "done"}]);
    let answer: Value = api
        .http
        .post(api.url("/api/callback"))
        .header(protocol::ACCESS_TOKEN_HEADER, ACCESS_TOKEN)
        .json(&result)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["code"], 200, "{answer}");
    let end = loop {
        let event = stream.next().await.expect("the stream ended without its end event");
        if event.event.as_deref() == Some("end") {
            break event;
        }
    };
    assert!(end.data.contains("\"handle_code\":200"), "{}", end.data);
    assert!(
        trap.requests().is_empty(),
        "the redirect was followed, carrying the access token: {:?}",
        trap.requests()
    );
    admin.stop().await;
}

#[tokio::test]
async fn an_endless_reply_is_cut_at_the_cap_not_buffered() {
    let chunk = vec![b' '; 64 * 1024];
    let executor = RawServer::start(Answer::Endless(chunk)).await;
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(60)).unwrap();
    let error = client.call::<_, String>(&executor.url, "beat", &()).await.unwrap_err();
    assert!(
        matches!(&error, ProtocolError::BadReply { body, .. } if body.contains("larger than")),
        "{error}"
    );
    // The client stopped reading near the cap: what the server could write before it noticed
    // is the cap plus the sockets' buffers, far from the gigabyte it would have sent.
    let written = *executor.written.lock().unwrap();
    assert!(written < 4 * protocol::MAX_REPLY_BYTES, "{written} bytes were read");
}

#[tokio::test]
async fn a_reply_announcing_a_huge_body_is_refused_unread() {
    let head = "HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n{\"code\":200,\"msg\":\"";
    let executor = RawServer::start(Answer::Fixed(head.to_owned())).await;
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(60)).unwrap();
    let error = client.call::<_, String>(&executor.url, "beat", &()).await.unwrap_err();
    assert!(
        matches!(&error, ProtocolError::BadReply { body, .. } if body.contains("larger than")),
        "{error}"
    );
}

#[tokio::test]
async fn foreign_text_is_shown_as_a_short_printable_excerpt() {
    let junk = format!("<html>\u{1b}[31mevil\r\nSet-Cookie: x\u{202e}{}</html>", "A".repeat(5000));
    let not_json = RawServer::start(Answer::Fixed(reply("200 OK", "", &junk))).await;
    let refusal = json!({"code": 500, "msg": format!("no\nway\u{0}{}", "B".repeat(5000))});
    let refusing = RawServer::start(Answer::Fixed(reply("200 OK", "", &refusal.to_string()))).await;
    let error_page = RawServer::start(Answer::Fixed(reply("503 Busy", "", &junk))).await;
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(10)).unwrap();
    for server in [&not_json, &refusing, &error_page] {
        let error = client.call::<_, String>(&server.url, "run", &()).await.unwrap_err();
        let text = match &error {
            ProtocolError::BadReply { body, .. } => body.clone(),
            ProtocolError::Refused { msg, .. } => msg.clone(),
            other => panic!("{other}"),
        };
        assert!(text.chars().count() <= protocol::EXCERPT_CHARS + 1, "{text}");
        assert!(!text.chars().any(|c| c.is_control() || c == '\u{202e}'), "{text:?}");
        assert!(text.contains("evil") || text.contains("noway"), "{text:?}");
    }
}

#[tokio::test]
async fn a_name_is_called_only_at_addresses_the_policy_allows() {
    let executor = RawServer::start(Answer::Fixed(reply("200 OK", "", r#"{"code":200}"#))).await;
    let port = executor.url.rsplit(':').next().unwrap().to_owned();
    let by_name = format!("http://localhost:{port}");
    let client_with = |entries: &[&str]| {
        let options = ClientOptions {
            ca_file: None,
            policy: Some(AddressPolicy::parse(entries).unwrap()),
            ..Default::default()
        };
        protocol::Client::with_options(ACCESS_TOKEN, Duration::from_secs(10), &options).unwrap()
    };
    // The name is listed, but it resolves to loopback, which this policy does not allow.
    let strict = client_with(&["10.0.0.0/8", "localhost"]);
    let error = strict.call::<_, String>(&by_name, "beat", &()).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("localhost resolves to no address the executor allow-list allows (127.0.0.1"),
        "{error}"
    );
    // An IP literal outside the policy is refused before anything is sent.
    let error = strict.call::<_, String>(&executor.url, "beat", &()).await.unwrap_err();
    assert!(matches!(error, ProtocolError::NotAllowed { .. }), "{error}");
    assert!(executor.requests().is_empty(), "{:?}", executor.requests());
    // The default policy allows both.
    let default = client_with(&wasmjob::netpolicy::DEFAULT_ALLOW.split(',').collect::<Vec<_>>());
    default.call::<_, String>(&by_name, "beat", &()).await.unwrap();
    default.call::<_, String>(&executor.url, "beat", &()).await.unwrap();
    assert_eq!(executor.requests().len(), 2);
}

#[tokio::test]
async fn a_reply_that_never_ends_is_given_up_at_the_timeout() {
    // Headers, then one byte of the body announced, and the connection held open.
    let head = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer).await;
            let _ = stream.write_all(head.as_bytes()).await;
            held.push(stream);
        }
    });
    let client = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(1)).unwrap();
    let error = client.call::<_, String>(&url, "beat", &()).await.unwrap_err();
    assert!(
        matches!(&error, ProtocolError::Transport { source, .. } if source.is_timeout()),
        "{error:?}"
    );
}

/// A CA made for the test, and a certificate it signed for `localhost` and 127.0.0.1: the
/// paths of the CA's certificate, the server's chain and its key (PEM).
fn test_certificates(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "wasmjob test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// Admin and executor both serve https with a certificate of a CA made here, and trust that CA:
/// registration, the trigger, the module download, the result and the log page all go over TLS.
#[tokio::test]
async fn admin_and_executor_speak_tls_with_a_ca_made_in_the_test() {
    wasmjob::telemetry::init_for_test();
    // Built first: the first build blocks this test's runtime, heartbeats included.
    let hello = sample_job("hello");
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = test_certificates(dir.path());
    let network = NetworkConfig {
        executor_policy: AddressPolicy::default(),
        ca_file: Some(ca.clone()),
        serve_tls: Some((cert, key)),
    };
    let mut config = admin_config(format!("sqlite:{}", dir.path().join("wasmjob.db").display()));
    config.network = network.clone();
    let admin = admin::start(config).await.unwrap();
    admin.state.db.ensure_group("default", "Default", admin::now_ms()).await.unwrap();
    assert!(admin.url().starts_with("https://127.0.0.1:"), "{}", admin.url());
    let mut config = executor_config(&admin.url(), dir.path().join("executor"));
    config.network = network;
    let executor = executor::start(config).await.unwrap();
    assert!(executor.address.starts_with("https://127.0.0.1:"), "{}", executor.address);

    let root = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
    let http = reqwest::Client::builder().add_root_certificate(root).build().unwrap();
    let api = Api { http, base: admin.url(), token: ADMIN_TOKEN.to_owned() };
    api.wait_for_executors(1).await;
    let (_, group) = api.get("/api/v1/groups/1").await;
    assert_eq!(group["online_addresses"][0], executor.address.as_str(), "{group}");
    let job_id = api.create_job(json!({"name": "over tls"})).await;
    let (status, version) = api.upload(job_id, hello).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{version}");
    let (_, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": "tls"})).await;
    let log_id = triggered["log_ids"][0].as_i64().unwrap();
    let run = api.finished_run(log_id).await;
    assert_eq!(
        (run["handle_code"].as_i64(), run["handle_msg"].as_str()),
        (Some(200), Some("hello, tls")),
        "{run}"
    );
    assert!(api.log_content(log_id).await.contains("hello, tls"));

    // Without the CA, the executor's certificate is refused; plain HTTP gets no answer.
    let stranger = protocol::Client::new(ACCESS_TOKEN, Duration::from_secs(5)).unwrap();
    let error = stranger.call::<_, String>(&executor.address, "beat", &()).await.unwrap_err();
    assert!(format!("{error:?}").to_lowercase().contains("certificate"), "{error:?}");
    let plain = executor.address.replace("https://", "http://");
    let error = stranger.call::<_, String>(&plain, "beat", &()).await.unwrap_err();
    assert!(matches!(error, ProtocolError::Transport { .. }), "{error:?}");
    executor.stop().await;
    admin.stop().await;
}

/// `sslmode=require` in a PostgreSQL URL gives encrypted connections (rustls), checked from the
/// server's side in `pg_stat_ssl`. Skipped without a test server, or when its ssl is off.
#[tokio::test]
async fn the_admin_reaches_postgres_over_tls_when_the_url_asks() {
    #[expect(clippy::disallowed_methods, reason = "test configuration")]
    let Ok(server_url) = std::env::var("WASMJOB_TEST_POSTGRES_URL") else {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping PostgreSQL over TLS");
        return;
    };
    sqlx::any::install_default_drivers();
    let server = sqlx::AnyPool::connect(&server_url).await.unwrap();
    let ssl: String = sqlx::query_scalar("show ssl").fetch_one(&server).await.unwrap();
    if ssl != "on" {
        eprintln!("the PostgreSQL test server has ssl off: skipping PostgreSQL over TLS");
        return;
    }
    let url = wasmjob::storage::testing::postgres_database("tls").await.unwrap().unwrap();
    let name = url.rsplit('/').next().unwrap().to_owned();
    let db = wasmjob::storage::Db::connect(&format!("{url}?sslmode=require")).await.unwrap();
    db.ensure_group("default", "Default", admin::now_ms()).await.unwrap();
    let sessions: Vec<(bool, String)> = sqlx::query_as(
        "select s.ssl, coalesce(s.version, '') from pg_stat_ssl s \
         join pg_stat_activity a using (pid) where a.datname = $1",
    )
    .bind(&name)
    .fetch_all(&server)
    .await
    .unwrap();
    assert!(!sessions.is_empty(), "no session on {name}");
    assert!(
        sessions.iter().all(|(ssl, version)| *ssl && version.starts_with("TLS")),
        "{sessions:?}"
    );
    db.close().await;
    server.close().await;
    wasmjob::storage::testing::drop_postgres_database(&url).await.unwrap();
}
