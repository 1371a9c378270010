//! Pulling runs (`--pull`): the executor opens a long poll to each of its admins
//! (`POST /api/pull`), answers each call it is handed through its own executor API, in process,
//! and posts the replies back (`POST /api/pull/answers`). No admin connects to it, so it needs
//! no reachable port: it registers `pull://{name}` instead of a URL.
//!
//! Every admin gets its own poll, because each admin hands out only the calls its own dispatcher
//! makes: a pull executor must be given every admin's URL. A call is answered exactly as it would
//! be over HTTP: the same router, the same token check, the same journal before `/run` answers.
//! A lost connection loses no run: the calls an admin could not hand over were not delivered,
//! and those handed over and not answered are judged by the admin as an unanswered push is.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::protocol::pull::{MAX_POLL_WAIT, PULL_PATHS, PULL_SCHEME, Parcel, PullAnswer};
use crate::protocol::pull::{PullAnswers, PullPoll};
use crate::protocol::{self, ACCESS_TOKEN_HEADER, APP_NAME_HEADER, MAX_REPLY_BYTES};

/// How long a poll may take beyond the admin's wait before it is given up.
const POLL_SLACK: Duration = Duration::from_secs(10);

/// The longest pause between failed polls.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How many times a batch of answers is posted before it is given up (its callers then judge
/// the calls as unanswered).
const ANSWER_TRIES: usize = 3;

/// This executor's pull address: `address` if given, or `pull://{host}-{id}` with an id kept in
/// `data_dir`, so that a restarted executor is the same executor to its admins (they reconcile
/// its runs by address).
pub(super) fn address(given: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(address) = given {
        return Ok(address.to_owned());
    }
    let file = data_dir.join("pull-id");
    let id = match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => id.trim().to_owned(),
        _ => {
            let id = hex::encode(rand::random::<[u8; 4]>());
            std::fs::create_dir_all(data_dir)?;
            std::fs::write(&file, &id)?;
            id
        }
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(64)
        .collect();
    let name = if host.is_empty() { id } else { format!("{host}-{id}") };
    let address = format!("{PULL_SCHEME}{name}");
    crate::netpolicy::check_pull_address(&address).map_err(anyhow::Error::msg)?;
    Ok(address)
}

/// What the pull loops share.
#[derive(Clone)]
pub(super) struct Puller {
    /// The executor API, called in process.
    pub(super) api: Router,
    /// This executor's pull address.
    pub(super) address: String,
    /// Its application name.
    pub(super) app_name: String,
    /// The admin⇄executor token.
    pub(super) access_token: Arc<str>,
    /// A client whose timeout covers a whole poll.
    pub(super) polls: protocol::Client,
    /// The executor's client, for the answers.
    pub(super) calls: protocol::Client,
}

impl Puller {
    /// A client for polls: its timeout covers the admin's wait.
    pub(super) fn poll_client(
        access_token: &str,
        ca_file: Option<&Path>,
    ) -> anyhow::Result<protocol::Client> {
        let options = protocol::ClientOptions {
            ca_file: ca_file.map(Path::to_path_buf),
            ..Default::default()
        };
        protocol::Client::with_options(access_token, MAX_POLL_WAIT + POLL_SLACK, &options)
    }

    /// Polls `admin_url` and answers what it hands over until `stop`.
    pub(super) async fn run(self, admin_url: String, stop: CancellationToken) {
        let (answered, answers) = mpsc::unbounded_channel();
        let poster = tokio::spawn(self.clone().post_answers(admin_url.clone(), answers));
        let mut backoff = Duration::from_millis(200);
        let mut failing = false;
        loop {
            let poll = PullPoll {
                address: self.address.clone(),
                wait_ms: u64::try_from(MAX_POLL_WAIT.as_millis()).unwrap_or(u64::MAX),
            };
            let called = self.polls.call_as::<_, Vec<Parcel>>(
                &admin_url,
                "api/pull",
                &poll,
                Some(&self.app_name),
            );
            let polled = tokio::select! {
                polled = called => polled,
                () = stop.cancelled() => break,
            };
            match polled {
                Ok(parcels) => {
                    if failing {
                        tracing::info!("pulling from {admin_url} again");
                        failing = false;
                    }
                    backoff = Duration::from_millis(200);
                    for parcel in parcels.unwrap_or_default() {
                        let this = self.clone();
                        let answered = answered.clone();
                        tokio::spawn(async move {
                            let _ = answered.send(this.answer(parcel).await);
                        });
                    }
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "pulling from {admin_url} failed; trying again");
                        failing = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = stop.cancelled() => break,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        drop(answered);
        let _ = poster.await;
    }

    /// The executor API's reply to `parcel`.
    async fn answer(&self, parcel: Parcel) -> PullAnswer {
        let id = parcel.id;
        if !PULL_PATHS.contains(&parcel.path.as_str()) {
            let body = format!("`{}` is not a path an admin may ask for", parcel.path);
            return PullAnswer { id, status: 404, body };
        }
        let mut request = Request::post(format!("/{}", parcel.path))
            .header(ACCESS_TOKEN_HEADER, &*self.access_token)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(app_name) = &parcel.app_name {
            request = request.header(APP_NAME_HEADER, app_name);
        }
        let request = match request.body(Body::from(parcel.body)) {
            Ok(request) => request,
            Err(error) => return PullAnswer { id, status: 400, body: error.to_string() },
        };
        let Ok(reply) = self.api.clone().oneshot(request).await;
        let status = reply.status().as_u16();
        match axum::body::to_bytes(reply.into_body(), MAX_REPLY_BYTES).await {
            Ok(bytes) => PullAnswer { id, status, body: String::from_utf8_lossy(&bytes).into() },
            Err(error) => PullAnswer { id, status: 500, body: error.to_string() },
        }
    }

    /// Posts the answers as they come, each batch what is ready at once.
    async fn post_answers(
        self,
        admin_url: String,
        mut answers: mpsc::UnboundedReceiver<PullAnswer>,
    ) {
        while let Some(first) = answers.recv().await {
            let mut batch = vec![first];
            while let Ok(answer) = answers.try_recv() {
                batch.push(answer);
            }
            let body = PullAnswers { address: self.address.clone(), answers: batch };
            for attempt in 1..=ANSWER_TRIES {
                let sent = self
                    .calls
                    .call_as::<_, String>(
                        &admin_url,
                        "api/pull/answers",
                        &body,
                        Some(&self.app_name),
                    )
                    .await;
                match sent {
                    Ok(_) => break,
                    Err(error) if attempt == ANSWER_TRIES => {
                        tracing::warn!(%error, "{} answers to {admin_url} given up", body.answers.len());
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
}
