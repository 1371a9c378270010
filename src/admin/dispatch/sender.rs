//! Posting triggers to executors.
//!
//! A wasmjob executor speaks `/runs`, the batch extension: every trigger waiting for the same
//! executor goes in one request, and the executor makes all of their acceptances durable with
//! one journal sync. Each executor has a queue; its task takes whatever waits (up to
//! [`MAX_BATCH`] triggers or about [`MAX_BATCH_BYTES`] of parameters) and posts it, with at most
//! [`BATCHES_IN_FLIGHT`] requests at once, so a burst batches itself and a lone trigger goes at
//! once. An executor that does not speak `/runs` (an XXL-JOB executor answers that it has no such
//! mapping; an older wasmjob executor answers 404) gets one `/run` per trigger, and is asked
//! again only after [`PLAIN_FOR`]. A request that no executor answered leaves every trigger in it
//! unconfirmed, exactly as a single `/run` would. An executor known to be an XXL-JOB executor
//! (`peers.rs`) gets single triggers from the start, at `/trigger` for a 3.5 executor.
//!
//! A trigger with `notBefore` (a scheduled run sent ahead of its instant) goes at once only to an
//! executor known to hold it until then; to any other, at its instant and without the field.
//!
//! It does not decide what an answer means for a run: `send_to_executor` does.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::peers::{PeerKind, Peers};
use crate::protocol::{self, ProtocolError, ReturnT, TriggerParam};

/// The most triggers in one `/runs` request.
const MAX_BATCH: usize = 256;
/// A batch stops growing once its parameters pass this many bytes.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// The most `/runs` requests in flight to one executor.
const BATCHES_IN_FLIGHT: usize = 4;
/// The most single `/run` requests in flight to one executor.
const RUNS_IN_FLIGHT: usize = 64;
/// How long an executor that refused `/runs` gets single `/run`s before it is asked again.
const PLAIN_FOR: Duration = Duration::from_secs(600);
/// A queue idle this long ends (its executor may be gone for good).
const IDLE: Duration = Duration::from_secs(60);

/// Why a trigger was not confirmed.
#[derive(Debug)]
pub(super) enum PostError {
    /// The executor answered and did not take it.
    Refused(String),
    /// Nothing reached the executor (the connection was refused).
    Unreachable(String),
    /// The request may have reached the executor, and no answer came.
    NoAnswer(String),
}

type Waiting = (TriggerParam, oneshot::Sender<Result<Option<String>, PostError>>);

/// The send queues of every executor.
pub(super) struct Senders {
    client: protocol::Client,
    /// What each executor speaks: the single trigger's route and `XXL-JOB-APPNAME`.
    peers: Arc<Peers>,
    queues: Mutex<HashMap<String, mpsc::UnboundedSender<Waiting>>>,
    /// Executors that do not speak `/runs`, until when.
    plain: Mutex<HashMap<String, Instant>>,
    /// Per executor, the single `/run`s it may have in flight at once.
    windows: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Senders {
    pub(super) fn new(client: protocol::Client, peers: Arc<Peers>) -> Arc<Senders> {
        Arc::new(Senders {
            client,
            peers,
            queues: Mutex::default(),
            plain: Mutex::default(),
            windows: Mutex::default(),
        })
    }

    /// Posts `param` to the executor at `address`: `content` of its answer (wasmjob executors say
    /// whether the run is new or where it already is), or why it was not confirmed.
    pub(super) async fn post(
        self: &Arc<Self>,
        address: &str,
        mut param: TriggerParam,
    ) -> Result<Option<String>, PostError> {
        let peer = self.peers.get(address);
        // Only an executor known to hold early triggers gets one: any other would start it at
        // once, so it is posted at its instant, without `notBefore`.
        if !peer.as_ref().is_some_and(|peer| peer.holds_triggers)
            && let Some(at_ms) = param.not_before.take()
        {
            let wait = u64::try_from(at_ms - crate::admin::now_ms()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        // XXL-JOB executors have no `/runs`: they get single triggers from the start.
        let xxl_job = peer.is_some_and(|peer| peer.kind != PeerKind::Wasmjob);
        if xxl_job || self.is_plain(address) {
            return self.post_one(address, &param).await;
        }
        let (reply, answer) = oneshot::channel();
        self.enqueue(address, (param, reply));
        answer.await.unwrap_or_else(|_| Err(PostError::NoAnswer("the sender stopped".to_owned())))
    }

    fn is_plain(&self, address: &str) -> bool {
        let Ok(plain) = self.plain.lock() else { return false };
        plain.get(address).is_some_and(|until| *until > Instant::now())
    }

    fn enqueue(self: &Arc<Self>, address: &str, waiting: Waiting) {
        let Ok(mut queues) = self.queues.lock() else {
            let _ = waiting.1.send(Err(PostError::NoAnswer("send queues poisoned".to_owned())));
            return;
        };
        let queue = queues.entry(address.to_owned()).or_insert_with(|| {
            let (queue, receiver) = mpsc::unbounded_channel();
            tokio::spawn(self.clone().drain(address.to_owned(), receiver));
            queue
        });
        // The queue's task ends only under this lock, once its queue is empty and removed.
        if let Err(mpsc::error::SendError((_, reply))) = queue.send(waiting) {
            let _ = reply.send(Err(PostError::NoAnswer("the send queue ended".to_owned())));
        }
    }

    /// The task of `address`'s queue: posts what waits, batch by batch, until idle.
    async fn drain(
        self: Arc<Self>,
        address: String,
        mut receiver: mpsc::UnboundedReceiver<Waiting>,
    ) {
        let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        let mut held: Option<Waiting> = None;
        loop {
            let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
            let mut batch: Vec<Waiting> = held.take().into_iter().collect();
            if batch.is_empty() {
                match tokio::time::timeout(IDLE, receiver.recv()).await {
                    Ok(Some(waiting)) => batch.push(waiting),
                    Ok(None) => return,
                    Err(_) => {
                        if self.retire(&address, &receiver) {
                            return;
                        }
                        continue;
                    }
                }
            }
            let mut bytes = batch[0].0.executor_params.len();
            while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                let Ok(waiting) = receiver.try_recv() else { break };
                bytes += waiting.0.executor_params.len();
                if bytes > MAX_BATCH_BYTES {
                    held = Some(waiting);
                    break;
                }
                batch.push(waiting);
            }
            let this = self.clone();
            let address = address.clone();
            tokio::spawn(async move {
                this.post_batch(&address, batch).await;
                drop(permit);
            });
        }
    }

    /// Removes `address`'s idle queue; false if something arrived meanwhile.
    fn retire(&self, address: &str, receiver: &mpsc::UnboundedReceiver<Waiting>) -> bool {
        let Ok(mut queues) = self.queues.lock() else { return true };
        if !receiver.is_empty() {
            return false;
        }
        queues.remove(address);
        true
    }

    async fn post_batch(self: &Arc<Self>, address: &str, batch: Vec<Waiting>) {
        let mut body = Vec::with_capacity(512 * batch.len());
        let written = protocol::write_json_list(batch.iter().map(|(param, _)| param), &mut body);
        let answer = match written {
            Ok(()) => {
                self.client.call_written::<Vec<ReturnT<String>>>(address, "runs", body, None).await
            }
            Err(error) => Err(ProtocolError::unwritable(protocol::excerpt(address), &error)),
        };
        match answer {
            Ok(Some(replies)) if replies.len() == batch.len() => {
                for ((_, reply), answer) in batch.into_iter().zip(replies) {
                    let answer = if answer.code == 200 {
                        Ok(answer.into_payload())
                    } else {
                        Err(PostError::Refused(protocol::excerpt(&answer.msg.unwrap_or_default())))
                    };
                    let _ = reply.send(answer);
                }
            }
            Ok(_) => {
                // Code 200 without one answer per trigger: nobody can tell which were taken.
                let error = format!("{address} answered /runs without one reply per run");
                for (_, reply) in batch {
                    let _ = reply.send(Err(PostError::NoAnswer(error.clone())));
                }
            }
            // The address is not allowed: nothing was sent.
            Err(error @ ProtocolError::NotAllowed { .. }) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(PostError::Refused(error.to_string())));
                }
            }
            // It answered, and not with `/runs`: nothing in the batch was taken. One by one.
            Err(error @ (ProtocolError::Refused { .. } | ProtocolError::BadReply { .. })) => {
                tracing::info!(%error, "{address} does not take /runs: sending single /run");
                if let Ok(mut plain) = self.plain.lock() {
                    plain.insert(address.to_owned(), Instant::now() + PLAIN_FOR);
                }
                let singles = batch.into_iter().map(|(param, reply)| async move {
                    let _ = reply.send(self.post_one(address, &param).await);
                });
                futures_join_all(singles).await;
            }
            Err(error) => {
                let unreachable = error.unreachable();
                let message = error.to_string();
                for (_, reply) in batch {
                    let _ = reply.send(Err(if unreachable {
                        PostError::Unreachable(message.clone())
                    } else {
                        PostError::NoAnswer(message.clone())
                    }));
                }
            }
        }
    }

    /// One `/run`, within the executor's window of single requests.
    async fn post_one(
        &self,
        address: &str,
        param: &TriggerParam,
    ) -> Result<Option<String>, PostError> {
        let window = self.window(address);
        let _in_flight = window.acquire().await;
        // XXL-JOB 3.5 executors take triggers at `/trigger` and want their application named.
        let peer = self.peers.get(address);
        let path = peer.as_ref().map_or("run", |peer| peer.generation().trigger_path());
        let app_name = peer.as_ref().and_then(|peer| peer.app_name_header());
        let mut body = Vec::with_capacity(512);
        if let Err(error) = param.write_json(&mut body) {
            let error = ProtocolError::unwritable(protocol::excerpt(address), &error);
            return Err(PostError::Refused(error.to_string()));
        }
        match self.client.call_written::<String>(address, path, body, app_name).await {
            Ok(reply) => Ok(reply),
            Err(
                error @ (ProtocolError::Refused { .. }
                | ProtocolError::BadReply { .. }
                | ProtocolError::NotAllowed { .. }),
            ) => Err(PostError::Refused(error.to_string())),
            Err(error) if error.unreachable() => Err(PostError::Unreachable(error.to_string())),
            Err(error) => Err(PostError::NoAnswer(error.to_string())),
        }
    }

    /// The in-flight window of single `/run`s to `address`.
    fn window(&self, address: &str) -> Arc<Semaphore> {
        let Ok(mut windows) = self.windows.lock() else {
            return Arc::new(Semaphore::new(RUNS_IN_FLIGHT));
        };
        windows
            .entry(address.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(RUNS_IN_FLIGHT)))
            .clone()
    }
}

/// Runs `futures` concurrently to their ends.
async fn futures_join_all<F: Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        pending.retain_mut(|future| future.as_mut().poll(cx).is_pending());
        if pending.is_empty() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
}
