//! Executors that pull their work: the wire types of `POST /api/pull` and
//! `POST /api/pull/answers`, and the admin's [`PullHub`], which holds the calls to pull
//! executors until they come for them.
//!
//! A pull executor registers the address `pull://{name}` and opens no port to its admins.
//! It keeps a long poll open to each admin (`/api/pull`, held up to [`MAX_POLL_WAIT`]), which
//! answers with the calls waiting for it as [`Parcel`]s: the same paths and bodies a push
//! executor is posted (`run`, `runs`, `kill`, `log`, `beat`, `idleBeat`). The executor answers
//! each through its own executor API, in process, and posts the replies back
//! (`/api/pull/answers`). Results and heartbeats go to the admin as a push executor's do.
//!
//! To the admin's callers, a call to a pull executor is a call like any other
//! ([`super::Client::call_as`]): the reply is the executor's envelope, and what cannot be known
//! is reported as for HTTP. A call whose parcel no poll took within [`CONNECT_WAIT`] is
//! [`super::ProtocolError::NotConnected`]: nothing was delivered, as with a refused connection.
//! A parcel taken but not answered in time is a timeout: it may have been delivered, and the
//! caller treats it as unconfirmed.
//!
//! The wait for a poll is what a connect timeout is to HTTP. An executor between two polls, or
//! polling again after this admin restarted, takes the call when it comes back; only one that
//! stays away longer than it ever pauses did not get it. (A restarted admin resends the runs
//! its earlier incarnation sent: were the executor, which may run one of them, judged
//! unreachable at once, that run would end `lost` while it runs, and its place under a
//! concurrency cap would go to the next run.)

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};

pub use crate::netpolicy::{PULL_SCHEME, is_pull_address};

/// The longest an admin holds a poll open when nothing waits for the executor.
pub const MAX_POLL_WAIT: Duration = Duration::from_secs(20);

/// How long after its last poll ended an executor still counts as connected: it polls again at
/// once, so a longer silence means its connection is gone.
pub const CONNECTED_FOR: Duration = Duration::from_secs(5);

/// The longest a pull executor pauses between failed polls (its backoff's top).
pub const MAX_POLL_PAUSE: Duration = Duration::from_secs(5);

/// How long a call waits for a poll to take it: longer than an executor's longest pause
/// between polls, with time for the poll to arrive.
pub const CONNECT_WAIT: Duration = Duration::from_secs(7);

/// The most parcels one poll carries.
pub const MAX_PARCELS: usize = 256;

/// The paths an admin may ask a pull executor for.
pub const PULL_PATHS: [&str; 7] = ["run", "trigger", "runs", "kill", "log", "beat", "idleBeat"];

/// `POST /api/pull`: a pull executor asks for its calls.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullPoll {
    /// The executor's registered address, `pull://{name}`.
    pub address: String,
    /// How long the admin may hold the poll open when nothing waits (at most [`MAX_POLL_WAIT`]).
    #[serde(default)]
    pub wait_ms: u64,
}

/// One call waiting for a pull executor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parcel {
    /// Names the answer.
    pub id: u64,
    /// The executor API's path, one of [`PULL_PATHS`].
    pub path: String,
    /// The JSON body, as a push executor would be posted it.
    pub body: String,
    /// The application named in `XXL-JOB-APPNAME`, if the call names one.
    #[serde(default)]
    pub app_name: Option<String>,
}

/// A pull executor's reply to one [`Parcel`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullAnswer {
    /// The parcel's id.
    pub id: u64,
    /// The HTTP status its executor API answered with.
    pub status: u16,
    /// The body it answered with.
    pub body: String,
}

/// `POST /api/pull/answers`: a pull executor's replies.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullAnswers {
    /// The executor's registered address.
    pub address: String,
    /// Its replies, in any order.
    pub answers: Vec<PullAnswer>,
}

/// Why a call to a pull executor got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullError {
    /// No poll took the call: it was not delivered.
    NotConnected,
    /// A poll took the call, and no answer came in time: it may have been delivered.
    NoAnswer,
}

/// The calls waiting for pull executors, and the answers they wait for, on one admin.
#[derive(Debug, Default)]
pub struct PullHub {
    mailboxes: Mutex<HashMap<String, Mailbox>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Mailbox {
    queue: VecDeque<Parcel>,
    /// Woken when a parcel is queued.
    arrived: std::sync::Arc<Notify>,
    /// The callers waiting for answers, by parcel id.
    waiting: HashMap<u64, oneshot::Sender<PullAnswer>>,
    /// Polls open now.
    polling: usize,
    /// When the last poll ended; `None` before the first.
    last_poll: Option<Instant>,
}

impl Mailbox {
    fn new() -> Mailbox {
        Mailbox {
            queue: VecDeque::new(),
            arrived: std::sync::Arc::default(),
            waiting: HashMap::new(),
            polling: 0,
            last_poll: None,
        }
    }

    fn connected(&self) -> bool {
        self.polling > 0 || self.last_poll.is_some_and(|at| at.elapsed() < CONNECTED_FOR)
    }
}

/// Ends a poll's count when the poll ends, answered or dropped with its connection.
struct Polling<'h> {
    hub: &'h PullHub,
    address: &'h str,
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        if let Ok(mut mailboxes) = self.hub.mailboxes.lock()
            && let Some(mailbox) = mailboxes.get_mut(self.address)
        {
            mailbox.polling = mailbox.polling.saturating_sub(1);
            mailbox.last_poll = Some(Instant::now());
        }
    }
}

impl PullHub {
    /// Queues a call for the pull executor at `address` and waits up to `timeout` for its
    /// answer: [`PullError::NotConnected`] if no poll took it within [`CONNECT_WAIT`] (or
    /// `timeout`, if shorter).
    pub async fn call(
        &self,
        address: &str,
        path: &str,
        body: String,
        app_name: Option<&str>,
        timeout: Duration,
    ) -> Result<PullAnswer, PullError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (reply, mut answer) = oneshot::channel();
        {
            let mut mailboxes = self.mailboxes.lock().map_err(|_| PullError::NotConnected)?;
            // The executor may not have polled this admin yet: the call waits for it.
            let mailbox = mailboxes.entry(address.to_owned()).or_insert_with(Mailbox::new);
            let app_name = app_name.map(str::to_owned);
            mailbox.queue.push_back(Parcel { id, path: path.to_owned(), body, app_name });
            mailbox.waiting.insert(id, reply);
            mailbox.arrived.notify_one();
        }
        let connect_wait = CONNECT_WAIT.min(timeout);
        match tokio::time::timeout(connect_wait, &mut answer).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(_)) => return Err(self.give_up(address, id)),
            Err(_) if self.take_back(address, id) => return Err(PullError::NotConnected),
            Err(_) => {}
        }
        match tokio::time::timeout(timeout.saturating_sub(connect_wait), answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) | Err(_) => Err(self.give_up(address, id)),
        }
    }

    /// Takes call `id` back if no poll took its parcel yet: it was not delivered.
    fn take_back(&self, address: &str, id: u64) -> bool {
        let Ok(mut mailboxes) = self.mailboxes.lock() else { return false };
        let Some(mailbox) = mailboxes.get_mut(address) else { return false };
        let queued = mailbox.queue.len();
        mailbox.queue.retain(|parcel| parcel.id != id);
        if mailbox.queue.len() == queued {
            return false;
        }
        mailbox.waiting.remove(&id);
        true
    }

    /// Forgets call `id`: not delivered if its parcel was still queued ([`PullHub::take_back`]),
    /// else taken and unanswered.
    fn give_up(&self, address: &str, id: u64) -> PullError {
        if self.take_back(address, id) {
            return PullError::NotConnected;
        }
        if let Ok(mut mailboxes) = self.mailboxes.lock()
            && let Some(mailbox) = mailboxes.get_mut(address)
        {
            mailbox.waiting.remove(&id);
        }
        PullError::NoAnswer
    }

    /// The calls waiting for the executor at `address`, as soon as there is one, or none after
    /// `wait` (at most [`MAX_POLL_WAIT`]).
    pub async fn poll(&self, address: &str, wait: Duration) -> Vec<Parcel> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_POLL_WAIT);
        let arrived = {
            let Ok(mut mailboxes) = self.mailboxes.lock() else { return Vec::new() };
            let mailbox = mailboxes.entry(address.to_owned()).or_insert_with(Mailbox::new);
            mailbox.polling += 1;
            mailbox.arrived.clone()
        };
        let _polling = Polling { hub: self, address };
        loop {
            {
                let Ok(mut mailboxes) = self.mailboxes.lock() else { return Vec::new() };
                if let Some(mailbox) = mailboxes.get_mut(address)
                    && !mailbox.queue.is_empty()
                {
                    let take = mailbox.queue.len().min(MAX_PARCELS);
                    let parcels: Vec<Parcel> = mailbox.queue.drain(..take).collect();
                    if !mailbox.queue.is_empty() {
                        // Another poll open now takes the rest.
                        mailbox.arrived.notify_one();
                    }
                    return parcels;
                }
            }
            if tokio::time::timeout_at(deadline, arrived.notified()).await.is_err() {
                return Vec::new();
            }
        }
    }

    /// Hands each of `answers` from the executor at `address` to its caller; those no caller
    /// waits for any more are dropped.
    pub fn answer(&self, address: &str, answers: Vec<PullAnswer>) {
        let Ok(mut mailboxes) = self.mailboxes.lock() else { return };
        let Some(mailbox) = mailboxes.get_mut(address) else { return };
        for answer in answers {
            if let Some(reply) = mailbox.waiting.remove(&answer.id) {
                let _ = reply.send(answer);
            }
        }
    }

    /// Whether the executor at `address` polls this admin now.
    pub fn is_connected(&self, address: &str) -> bool {
        self.mailboxes
            .lock()
            .is_ok_and(|mailboxes| mailboxes.get(address).is_some_and(Mailbox::connected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_waits_for_a_poll_and_its_answer() {
        let hub = std::sync::Arc::new(PullHub::default());
        let address = "pull://a";
        // Nobody has polled: nothing is delivered.
        let refused = hub.call(address, "run", "{}".into(), None, Duration::from_millis(50)).await;
        assert_eq!(refused.unwrap_err(), PullError::NotConnected);
        // A poll with nothing waiting ends empty at its wait.
        assert!(hub.poll(address, Duration::from_millis(10)).await.is_empty());
        assert!(hub.is_connected(address));
        let executor = {
            let hub = hub.clone();
            tokio::spawn(async move {
                let parcels = hub.poll(address, Duration::from_secs(5)).await;
                assert_eq!(parcels.len(), 1);
                assert_eq!((parcels[0].path.as_str(), parcels[0].body.as_str()), ("kill", "{}"));
                assert_eq!(parcels[0].app_name.as_deref(), Some("app"));
                let answer =
                    PullAnswer { id: parcels[0].id, status: 200, body: r#"{"code":200}"#.into() };
                hub.answer(address, vec![answer]);
            })
        };
        let answer =
            hub.call(address, "kill", "{}".into(), Some("app"), Duration::from_secs(5)).await;
        assert_eq!(answer.unwrap().body, r#"{"code":200}"#);
        executor.await.unwrap();
    }

    #[tokio::test]
    async fn a_call_no_poll_took_was_not_delivered_and_one_taken_is_unconfirmed() {
        let hub = std::sync::Arc::new(PullHub::default());
        let address = "pull://b";
        assert!(hub.poll(address, Duration::from_millis(1)).await.is_empty());
        // Connected a moment ago, but nobody takes the parcel: not delivered.
        let untaken = hub.call(address, "run", "{}".into(), None, Duration::from_millis(50)).await;
        assert_eq!(untaken.unwrap_err(), PullError::NotConnected);
        // Taken and never answered: it may have arrived.
        let taker = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.poll(address, Duration::from_secs(5)).await.len() })
        };
        let taken = hub.call(address, "run", "{}".into(), None, Duration::from_millis(300)).await;
        assert_eq!(taken.unwrap_err(), PullError::NoAnswer);
        assert_eq!(taker.await.unwrap(), 1);
        // A late answer finds no caller and is dropped.
        hub.answer(address, vec![PullAnswer { id: 2, status: 200, body: String::new() }]);
    }

    #[tokio::test]
    async fn a_call_made_before_the_executor_polls_again_is_taken_when_it_does() {
        // As after this admin's restart: the executor has not polled it yet.
        let hub = std::sync::Arc::new(PullHub::default());
        let address = "pull://d";
        assert!(!hub.is_connected(address));
        let executor = {
            let hub = hub.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let parcels = hub.poll(address, Duration::from_secs(5)).await;
                let answer = PullAnswer { id: parcels[0].id, status: 200, body: "took".into() };
                hub.answer(address, vec![answer]);
            })
        };
        let answer = hub.call(address, "run", "{}".into(), None, Duration::from_secs(5)).await;
        assert_eq!(answer.unwrap().body, "took");
        executor.await.unwrap();
        // A call not taken within the wait is taken back: a later poll does not get it.
        let untaken = hub.call(address, "run", "{}".into(), None, Duration::from_millis(50)).await;
        assert_eq!(untaken.unwrap_err(), PullError::NotConnected);
        assert!(hub.poll(address, Duration::from_millis(10)).await.is_empty());
    }

    #[tokio::test]
    async fn a_dropped_poll_still_counts_as_connected_only_for_a_while() {
        let hub = std::sync::Arc::new(PullHub::default());
        let address = "pull://c";
        let poll = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.poll(address, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(hub.is_connected(address));
        poll.abort();
        let _ = poll.await;
        let mailboxes = hub.mailboxes.lock().unwrap();
        assert_eq!(mailboxes[address].polling, 0, "the dropped poll is no longer counted");
    }

    #[test]
    fn a_pull_address_is_told_by_its_scheme() {
        assert!(is_pull_address("pull://host-1a2b"));
        assert!(!is_pull_address("http://127.0.0.1:9999"));
    }
}
