//! Alarms end to end on 127.0.0.1: real failing runs of the `fail` sample job on a real
//! executor, webhooks received by a small axum server in the test (signatures checked with an
//! HMAC computed here), a webhook that is down and comes back, e-mail into an SMTP sink written
//! here, and a lost executor.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode as HttpStatus};
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::support::{Api, TestApp, backends, sample_job, wait_until};

const SECRET: &str = "alarm-secret-0123456789";

/// One request a receiver got: its headers and body.
#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// A webhook receiver on 127.0.0.1 that refuses (500) the first `refusals` requests.
#[derive(Clone)]
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Receiver {
    async fn start(refusals: usize) -> Receiver {
        Receiver::serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), refusals)
    }

    fn serve(listener: TcpListener, refusals: usize) -> Receiver {
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let seen = got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Received { headers, body });
                    if seen.len() <= refusals {
                        HttpStatus::INTERNAL_SERVER_ERROR
                    } else {
                        HttpStatus::OK
                    }
                }
            }),
        );
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stopped = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await
                .unwrap();
        });
        Receiver { url, got, shutdown }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Checks the request's signature with an HMAC computed here, independently of the admin's.
fn assert_signed(received: &Received) {
    let timestamp = received.header("x-wasmjob-timestamp");
    let now = chrono::Utc::now().timestamp();
    let sent: i64 = timestamp.parse().unwrap();
    assert!((now - sent).abs() < 600, "timestamp {timestamp} is far from now");
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(&received.body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(received.header("x-wasmjob-signature"), expected);
    // Any other secret or body does not verify.
    let mut other = Hmac::<Sha256>::new_from_slice(b"another-secret").unwrap();
    other.update(format!("{timestamp}.").as_bytes());
    other.update(&received.body);
    assert_ne!(received.header("x-wasmjob-signature"), hex::encode(other.finalize().into_bytes()));
}

async fn add_webhook(api: &Api, name: &str, url: &str) -> Value {
    let body = json!({"name": name, "url": url, "secret": SECRET});
    let (status, webhook) = api.post("/api/v1/alarms", body).await;
    assert_eq!(status, StatusCode::CREATED, "{webhook}");
    assert!(webhook.get("secret").is_none(), "the secret is never returned: {webhook}");
    webhook
}

/// A job running the `fail` sample job; `fields` over the defaults.
async fn failing_job(api: &Api, fields: Value) -> i64 {
    let job_id = api.create_job(fields).await;
    let (status, version) = api.upload(job_id, sample_job("fail")).await;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    job_id
}

async fn trigger(api: &Api, job_id: i64, param: &str) -> i64 {
    let (status, triggered) =
        api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
    assert_eq!(status, StatusCode::OK, "{triggered}");
    triggered["log_ids"][0].as_i64().unwrap()
}

async fn deliveries(api: &Api) -> Vec<Value> {
    let (status, list) = api.get("/api/v1/alarms/deliveries?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_alarms_a_signed_webhook_once_per_silence_window() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let receiver = Receiver::start(0).await;
        add_webhook(api, "pager", &receiver.url).await;
        // A filter on a group the job is not in: this webhook gets nothing.
        let (status, group) = api.post("/api/v1/groups", json!({"app_name": "elsewhere"})).await;
        assert_eq!(status, StatusCode::CREATED, "{group}");
        let other = Receiver::start(0).await;
        let body =
            json!({"name": "other", "url": other.url, "secret": SECRET, "group_id": group["id"]});
        assert_eq!(api.post("/api/v1/alarms", body).await.0, StatusCode::CREATED);

        // A job failing every second with a 2 s silence window: a retry first (no alarm for
        // a failure that is retried), then alarms at least 2 s apart, silenced ones between.
        let job_id = failing_job(
            api,
            json!({"name": "flaky", "schedule_type": "CRON", "schedule_conf": "* * * * * ?",
                   "param": "tick", "retry_count": 1, "alarm_silence_secs": 2}),
        )
        .await;
        assert_eq!(
            api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await.0,
            StatusCode::OK
        );
        wait_until("three alarms arrive", || async {
            (receiver.received().len() >= 3).then_some(())
        })
        .await;
        assert_eq!(
            api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await.0,
            StatusCode::OK
        );

        let db = &app.admin.as_ref().unwrap().state.db;
        // Every event is settled (sent or silenced) and every delivery delivered.
        let events = wait_until("every alarm event is settled and delivered", || async {
            let events = db.list_alarm_events(Some(job_id), 10_000).await.unwrap();
            let settled = events.iter().all(|event| event.status != "new");
            let delivered = deliveries(api).await.iter().all(|d| d["state"] == "delivered");
            (settled && delivered).then_some(events)
        })
        .await;
        let mut events = events;
        events.reverse();
        let sent: Vec<_> = events.iter().filter(|e| e.status == "sent").collect();
        let silenced: Vec<_> = events.iter().filter(|e| e.status == "silenced").collect();
        assert!(!silenced.is_empty(), "a failure every second within a 2 s window is silenced");
        for pair in sent.windows(2) {
            assert!(pair[1].created_at_ms - pair[0].created_at_ms >= 2_000, "{pair:?}");
        }
        for event in &silenced {
            let last = sent.iter().rev().find(|s| s.id < event.id).unwrap();
            assert!(event.created_at_ms - last.created_at_ms < 2_000, "{event:?} after {last:?}");
        }
        // Only final failures: every alarmed run is a retry (attempt 1) of a failed fire.
        assert!(events.iter().all(|e| e.attempt == 1 && e.state == "failed"), "{events:?}");

        // One request per sent alarm, each signed, none to the other group's webhook.
        let received = receiver.received();
        assert_eq!(received.len(), sent.len());
        assert!(other.received().is_empty());
        for (request, event) in received.iter().zip(&sent) {
            assert_signed(request);
            assert_eq!(request.header("x-wasmjob-event"), "run_failed");
            let body = request.json();
            assert_eq!(body["event_id"], event.id, "{body}");
            assert_eq!(body["kind"], "run_failed");
            assert_eq!(
                (body["job"]["id"].as_i64(), body["job"]["name"].as_str()),
                (Some(job_id), Some("flaky"))
            );
            assert_eq!(body["run"]["id"].as_i64(), event.run_id);
            assert_eq!(
                (body["run"]["state"].as_str(), body["run"]["attempt"].as_i64()),
                (Some("failed"), Some(1))
            );
            assert_eq!(body["run"]["message"], "job failed: failed on purpose: tick");
            assert_eq!(body["silenced_before"], event.silenced_before);
        }
        let counted: i64 = sent.iter().skip(1).map(|e| e.silenced_before).sum();
        let silenced_after_first = silenced.iter().filter(|e| e.id > sent[0].id).count() as i64;
        let silenced_after_last =
            silenced.iter().filter(|e| e.id > sent[sent.len() - 1].id).count() as i64;
        assert_eq!(counted, silenced_after_first - silenced_after_last);

        // The audit log has the webhook's creation, without its secret.
        let (_, audit) = api.get("/api/v1/audit?action=alarm.").await;
        assert_eq!(audit["items"][0]["action"], "alarm.create", "{audit}");
        assert!(!audit.to_string().contains(SECRET));
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_is_down_gets_the_alarm_once_it_is_back() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        // The webhook's port is closed at first.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        add_webhook(api, "down", &format!("http://{address}/hook")).await;
        let job_id = failing_job(api, json!({"name": "once", "alarm_silence_secs": 0})).await;
        let run_id = trigger(api, job_id, "now").await;
        assert_eq!(api.finished_run(run_id).await["handle_code"], 500);

        let failed = wait_until("an attempt fails", || async {
            deliveries(api).await.into_iter().find(|d| d["attempts"].as_i64() >= Some(1))
        })
        .await;
        assert_eq!(
            (failed["state"].as_str(), failed["run_id"].as_i64()),
            (Some("pending"), Some(run_id))
        );
        assert!(failed["last_error"].as_str().unwrap().contains("down"), "{failed}");

        // Back, but refusing once more with a 500: the alarm still arrives, once.
        let receiver = Receiver::serve(TcpListener::bind(address).await.unwrap(), 1);
        let delivered = wait_until("the alarm is delivered", || async {
            deliveries(api).await.into_iter().find(|d| d["state"] == "delivered")
        })
        .await;
        assert!(delivered["attempts"].as_i64().unwrap() >= 3, "{delivered}");
        let received = receiver.received();
        assert_eq!(received.len(), 2, "refused once, then delivered");
        assert_eq!(received[0].body, received[1].body, "the same alarm each time");
        assert_eq!(
            received[0].header("x-wasmjob-delivery"),
            received[1].header("x-wasmjob-delivery")
        );
        assert_signed(&received[1]);
        assert_eq!(received[1].json()["run"]["id"].as_i64(), Some(run_id));
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_executor_raises_an_alarm() {
    let app = TestApp::start(crate::support::Backend::Sqlite).await;
    let receiver = Receiver::start(0).await;
    add_webhook(&app.api, "pager", &receiver.url).await;
    // An executor whose last heartbeat is long past the online window (3 × 30 s).
    let db = &app.admin.as_ref().unwrap().state.db;
    let beat = wasmjob::admin::now_ms() - 200_000;
    db.upsert_registration(
        "EXECUTOR",
        "default",
        "http://127.0.0.1:9",
        &wasmjob::storage::Peer { kind: "wasmjob", version: "" },
        beat,
    )
    .await
    .unwrap();
    let request = wait_until("the lost executor's alarm arrives", || async {
        receiver.received().into_iter().find(|r| r.header("x-wasmjob-event") == "executor_lost")
    })
    .await;
    assert_signed(&request);
    let body = request.json();
    assert_eq!(body["executor"], json!({"app_name": "default", "address": "http://127.0.0.1:9"}));
    assert_eq!((body["job"].clone(), body["run"].clone()), (Value::Null, Value::Null));
    app.stop().await;
}

/// One message an SMTP sink received.
#[derive(Debug, Clone, Default)]
struct Mail {
    from: String,
    to: Vec<String>,
    data: String,
}

/// A minimal SMTP server on 127.0.0.1 that accepts every message.
async fn smtp_sink() -> (String, Arc<Mutex<Vec<Mail>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("smtp://{}", listener.local_addr().unwrap());
    let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
    let sink = mails.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let sink = sink.clone();
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 sink ESMTP\r\n").await.unwrap();
                let mut mail = Mail::default();
                while let Ok(Some(line)) = lines.next_line().await {
                    let upper = line.to_ascii_uppercase();
                    let reply: &[u8] = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
                        b"250 sink\r\n"
                    } else if upper.starts_with("MAIL FROM:") {
                        mail.from = line[10..].trim().to_owned();
                        b"250 OK\r\n"
                    } else if upper.starts_with("RCPT TO:") {
                        mail.to.push(line[8..].trim().to_owned());
                        b"250 OK\r\n"
                    } else if upper == "DATA" {
                        write.write_all(b"354 go on\r\n").await.unwrap();
                        while let Ok(Some(data)) = lines.next_line().await {
                            if data == "." {
                                break;
                            }
                            mail.data.push_str(&data);
                            mail.data.push('\n');
                        }
                        sink.lock().unwrap().push(std::mem::take(&mut mail));
                        b"250 queued\r\n"
                    } else if upper == "QUIT" {
                        write.write_all(b"221 bye\r\n").await.unwrap();
                        break;
                    } else {
                        b"250 OK\r\n"
                    };
                    write.write_all(reply).await.unwrap();
                }
            });
        }
    });
    (url, mails)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_mailed_to_the_jobs_alarm_email() {
    let (url, mails) = smtp_sink().await;
    let app = TestApp::start_with(crate::support::Backend::Sqlite, |config| {
        config.alarms.smtp = Some(wasmjob::config::SmtpConfig {
            url: url.clone(),
            from: "wasmjob <alarms@example.com>".to_owned(),
        });
    })
    .await;
    let api = &app.api;
    let job_id = failing_job(
        api,
        json!({"name": "nightly export", "alarm_email": "ops@example.com, oncall@example.com"}),
    )
    .await;
    let run_id = trigger(api, job_id, "disk full").await;
    let mail =
        wait_until("the alarm e-mail arrives", || async { mails.lock().unwrap().first().cloned() })
            .await;
    assert_eq!(mail.from, "<alarms@example.com>");
    assert_eq!(mail.to, ["<ops@example.com>", "<oncall@example.com>"]);
    assert!(
        mail.data.contains(&format!(
            "Subject: [wasmjob] job {job_id} nightly export: run {run_id} failed"
        )),
        "{}",
        mail.data
    );
    assert!(mail.data.contains("failed on purpose: disk full"), "{}", mail.data);
    let delivered = wait_until("the delivery is recorded", || async {
        deliveries(api)
            .await
            .into_iter()
            .find(|d| d["channel"] == "email" && d["state"] == "delivered")
    })
    .await;
    assert_eq!(delivered["target"], "ops@example.com, oncall@example.com");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_checked_and_their_secret_is_write_only() {
    let app = TestApp::start(crate::support::Backend::Sqlite).await;
    let api = &app.api;
    let refused = [
        json!({"name": "x", "url": "ftp://example.com/hook", "secret": SECRET}),
        json!({"name": "x", "url": "not a url", "secret": SECRET}),
        json!({"name": "x", "url": "https://user:pw@example.com/", "secret": SECRET}),
        json!({"name": "x", "url": "https://example.com/"}),
        json!({"name": "x", "url": "https://example.com/", "secret": "short"}),
        json!({"name": "", "url": "https://example.com/", "secret": SECRET}),
        json!({"name": "x", "url": "https://example.com/", "secret": SECRET, "group_id": 99}),
    ];
    for body in refused {
        let (status, error) = api.post("/api/v1/alarms", body.clone()).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_alarm")),
            "{body} → {error}"
        );
    }
    let (status, error) = api.post("/api/v1/alarms", json!({"name": "x"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    let created = add_webhook(api, "pager", "https://hooks.example.com/a").await;
    let (status, _) = api
        .post(
            "/api/v1/alarms",
            json!({"name": "pager", "url": "https://hooks.example.com/b", "secret": SECRET}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let id = created["id"].as_i64().unwrap();
    // An update without a secret keeps the stored one.
    let reply = api
        .http
        .put(api.url(&format!("/api/v1/alarms/{id}")))
        .bearer_auth(&api.token)
        .json(&json!({"name": "pager", "url": "https://hooks.example.com/c", "group_id": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let db = &app.admin.as_ref().unwrap().state.db;
    let stored = db.get_alarm_webhook(id).await.unwrap().unwrap();
    assert_eq!(
        (stored.url.as_str(), stored.secret.as_str(), stored.group_id),
        ("https://hooks.example.com/c", SECRET, Some(1))
    );
    let (status, listed) = api.get("/api/v1/alarms").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!listed.to_string().contains(SECRET), "{listed}");
    assert_eq!(api.get("/api/v1/alarms/99").await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.get("/api/v1/alarms/deliveries?limit=0").await.0, StatusCode::BAD_REQUEST);
    let reply = api
        .http
        .delete(api.url(&format!("/api/v1/alarms/{id}")))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::NO_CONTENT);
    assert_eq!(api.get(&format!("/api/v1/alarms/{id}")).await.0, StatusCode::NOT_FOUND);
    app.stop().await;
}
