//! Pulling runs (`--pull`): the executor opens a long poll to each of its admins
//! (`POST /api/pull`), answers each call it is handed through its own executor API, in process,
//! and posts the replies back (`POST /api/pull/answers`). No admin connects to it, so it needs
//! no reachable port: it registers `pull://{name}` instead of a URL.
//!
//! Every admin gets its own poll, because each admin hands out only the calls its own dispatcher
//! makes: a pull executor must be given every admin's URL, or a name that resolves to every
//! admin (a headless Service's), since each address an admin URL's host name resolves to gets a
//! poll of its own, and the answers go back to the address the calls came from. A call is
//! answered exactly as it would be over HTTP: the same router, the same token check, the same
//! journal before `/run` answers.
//! A lost connection loses no run: the calls an admin could not hand over were not delivered,
//! and those handed over and not answered are judged by the admin as an unanswered push is.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::Instrument;

use crate::protocol::pull::{
    MAX_POLL_PAUSE, MAX_POLL_WAIT, PULL_PATHS, PULL_SCHEME, Parcel, PullAnswer,
};
use crate::protocol::pull::{PullAnswers, PullPoll};
use crate::protocol::{self, ACCESS_TOKEN_HEADER, APP_NAME_HEADER, MAX_REPLY_BYTES};

/// How long a poll may take beyond the admin's wait before it is given up.
const POLL_SLACK: Duration = Duration::from_secs(10);

/// How many times a batch of answers is posted before it is given up (its callers then judge
/// the calls as unanswered).
const ANSWER_TRIES: usize = 3;

/// How often the admins' host names are resolved again, to poll admins that came and stop
/// polling those that went.
const RESOLVE_EVERY: Duration = Duration::from_secs(10);

/// The longest an answer's post may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

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

/// One admin to poll: an admin URL, and the address its host name resolved to (`None` when the
/// URL names an IP, or when the name does not resolve now).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Target {
    url: String,
    at: Option<SocketAddr>,
}

/// The admins behind `url`: one per address its host name resolves to (a headless Service's
/// name resolves to every admin pod), or the URL itself when it names an IP. `None` when the
/// name does not resolve now.
async fn targets(url: &str) -> Option<Vec<Target>> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?;
    let port = parsed.port_or_known_default()?;
    if host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok() {
        return Some(vec![Target { url: url.to_owned(), at: None }]);
    }
    let found = tokio::net::lookup_host((host, port)).await.ok()?;
    let mut found: Vec<Target> =
        found.map(|at| Target { url: url.to_owned(), at: Some(at) }).collect();
    found.sort();
    found.dedup();
    (!found.is_empty()).then_some(found)
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
    /// CA certificates trusted besides the webpki roots.
    pub(super) ca_file: Option<PathBuf>,
}

impl Puller {
    /// A client that reaches `target`'s admin only, its timeout covering a whole poll. Its TLS
    /// still checks the URL's host name.
    fn client(&self, target: &Target) -> anyhow::Result<protocol::Client> {
        let resolve = match (target.at, reqwest::Url::parse(&target.url)) {
            (Some(at), Ok(url)) => url.host_str().map(|host| (host.to_owned(), at)),
            _ => None,
        };
        let options = protocol::ClientOptions {
            ca_file: self.ca_file.clone(),
            resolve,
            ..Default::default()
        };
        protocol::Client::with_options(&self.access_token, MAX_POLL_WAIT + POLL_SLACK, &options)
    }

    /// Polls every admin behind `urls` until `stop`, and answers what they hand over: each
    /// URL's host name is resolved every [`RESOLVE_EVERY`], an address that appears gets a poll,
    /// and one that is gone loses its poll. A name that does not resolve for a while keeps the
    /// polls it had.
    pub(super) async fn run(self, urls: Vec<String>, stop: CancellationToken) {
        let mut polling: HashMap<Target, (CancellationToken, JoinHandle<()>)> = HashMap::new();
        loop {
            let mut wanted = HashSet::new();
            for url in &urls {
                match targets(url).await {
                    Some(found) => wanted.extend(found),
                    None => {
                        let known: Vec<Target> =
                            polling.keys().filter(|target| target.url == *url).cloned().collect();
                        if known.is_empty() {
                            wanted.insert(Target { url: url.clone(), at: None });
                        }
                        wanted.extend(known);
                    }
                }
            }
            polling.retain(|target, (token, _)| {
                let keep = wanted.contains(target);
                if !keep {
                    tracing::info!(
                        "{} at {:?} is gone: no longer pulling from it",
                        target.url,
                        target.at
                    );
                    token.cancel();
                }
                keep
            });
            for target in wanted {
                if polling.contains_key(&target) {
                    continue;
                }
                match self.client(&target) {
                    Ok(client) => {
                        let token = stop.child_token();
                        let span =
                            tracing::info_span!("pull", admin = %target.url, at = ?target.at);
                        let task = self.clone().poll(target.clone(), client, token.clone());
                        polling.insert(target, (token, tokio::spawn(task.instrument(span))));
                    }
                    Err(error) => tracing::warn!(%error, "pulling from {}", target.url),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RESOLVE_EVERY) => {}
                () = stop.cancelled() => break,
            }
        }
        for (_, (_, task)) in polling {
            let _ = task.await;
        }
    }

    /// Polls `target`'s admin through `client` and answers what it hands over until `stop`.
    async fn poll(self, target: Target, client: protocol::Client, stop: CancellationToken) {
        let admin_url = target.url;
        let (answered, answers) = mpsc::unbounded_channel();
        let poster =
            tokio::spawn(self.clone().post_answers(admin_url.clone(), client.clone(), answers));
        let mut backoff = Duration::from_millis(200);
        let mut failing = false;
        loop {
            let poll = PullPoll {
                address: self.address.clone(),
                wait_ms: u64::try_from(MAX_POLL_WAIT.as_millis()).unwrap_or(u64::MAX),
            };
            let called = client.call_as::<_, Vec<Parcel>>(
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
                    backoff = (backoff * 2).min(MAX_POLL_PAUSE);
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

    /// Posts the answers as they come, each batch what is ready at once, to the admin that
    /// handed the calls over (`client` reaches only it).
    async fn post_answers(
        self,
        admin_url: String,
        client: protocol::Client,
        mut answers: mpsc::UnboundedReceiver<PullAnswer>,
    ) {
        while let Some(first) = answers.recv().await {
            let mut batch = vec![first];
            while let Ok(answer) = answers.try_recv() {
                batch.push(answer);
            }
            let body = PullAnswers { address: self.address.clone(), answers: batch };
            for attempt in 1..=ANSWER_TRIES {
                let post = client.call_as::<_, String>(
                    &admin_url,
                    "api/pull/answers",
                    &body,
                    Some(&self.app_name),
                );
                let error = match tokio::time::timeout(ANSWER_TIMEOUT, post).await {
                    Ok(Ok(_)) => break,
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()),
                };
                if attempt == ANSWER_TRIES {
                    let count = body.answers.len();
                    tracing::warn!(%error, "{count} answers to {admin_url} given up");
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_admin_url_is_polled_at_each_address_its_name_resolves_to() {
        let ip = targets("http://127.0.0.1:8080").await.unwrap();
        assert_eq!(ip, vec![Target { url: "http://127.0.0.1:8080".into(), at: None }]);
        let v6 = targets("http://[::1]:8080/").await.unwrap();
        assert_eq!(v6[0].at, None);
        let named = targets("http://localhost:8080").await.unwrap();
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(named.iter().any(|target| target.at == Some(loopback)), "{named:?}");
        assert!(named.iter().all(|target| target.url == "http://localhost:8080"), "{named:?}");
        // The port a URL leaves out is its scheme's.
        let https = targets("https://localhost").await.unwrap();
        assert!(https.iter().all(|target| target.at.is_some_and(|at| at.port() == 443)));
    }
}
