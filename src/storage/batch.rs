//! Group commit for the run lifecycle's writes: claims, lease renewals, targets, transitions
//! and new runs from many tasks queue up and commit together.
//!
//! One task per [`Db`] takes every write waiting in the queue (up to [`MAX_BATCH`]), runs each in
//! a savepoint of one transaction, commits, and only then answers each caller. A write that
//! fails rolls back its own savepoint and gets its own error; the others still commit. A caller
//! is told its write happened only once it is committed, so batching changes when things
//! commit, never what commits together: each write (a transition with its follow-up runs, say)
//! is still all or nothing.

use sqlx::{AnyConnection, AnyPool};
use tokio::sync::{mpsc, oneshot};

use super::runs::{self, Claim, NewRun};
use super::{Db, Result, StorageError};
use crate::lifecycle::Transition;
use crate::model::RunRecord;

/// The most writes committed together.
const MAX_BATCH: usize = 256;

/// One queued write.
#[derive(Debug)]
pub(super) enum Write {
    CreateRuns {
        runs: Vec<NewRun>,
        now_ms: i64,
    },
    Claim {
        id: i64,
        owner: String,
        now_ms: i64,
        lease_until_ms: i64,
    },
    Renew {
        id: i64,
        owner: String,
        fence: i64,
        lease_until_ms: i64,
    },
    Target {
        id: i64,
        owner: String,
        fence: i64,
        address: String,
    },
    Apply {
        id: i64,
        transition: Transition,
        lease: Option<(String, i64)>,
        fuel_used: Option<i64>,
        follow_ups: Vec<NewRun>,
        now_ms: i64,
    },
}

/// What a write returned.
#[derive(Debug)]
pub(super) enum Written {
    Ids(Vec<Option<i64>>),
    Claim(Option<Claim>),
    Done(bool),
    Applied(Option<(RunRecord, Vec<i64>)>),
}

impl Written {
    /// The error for an answer of the wrong kind (a bug in this module).
    pub(super) fn unexpected(&self) -> StorageError {
        StorageError::Batch(format!("unexpected answer {self:?}"))
    }
}

type Request = (Write, oneshot::Sender<Result<Written>>);

/// The sending side of the queue; the committing task ends when every sender is gone.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Request>,
}

impl Batcher {
    /// Starts the committing task on `pool`.
    pub(super) fn start(pool: AnyPool) -> Batcher {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(commit_loop(pool, receiver));
        Batcher { queue }
    }
}

impl Db {
    /// Queues `write` and waits until it is committed.
    pub(super) async fn batch(&self, write: Write) -> Result<Written> {
        let (reply, answer) = oneshot::channel();
        if self.batcher.queue.send((write, reply)).is_err() {
            return Err(StorageError::Batch("the database is closed".to_owned()));
        }
        answer.await.unwrap_or_else(|_| Err(StorageError::Batch("the commit was abandoned".into())))
    }
}

async fn commit_loop(pool: AnyPool, mut receiver: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        commit(&pool, std::mem::take(&mut batch)).await;
    }
}

async fn commit(pool: &AnyPool, batch: Vec<Request>) {
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(error) => {
            let message = format!("starting a transaction: {error}");
            for (_, reply) in batch {
                let _ = reply.send(Err(StorageError::Batch(message.clone())));
            }
            return;
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    for (write, reply) in batch {
        let answer = match sqlx::Connection::begin(&mut *tx).await {
            Ok(mut savepoint) => match execute(&mut savepoint, &write).await {
                Ok(written) => savepoint.commit().await.map(|()| written).map_err(Into::into),
                Err(error) => {
                    let _ = savepoint.rollback().await;
                    Err(error)
                }
            },
            Err(error) => Err(error.into()),
        };
        answers.push((reply, answer));
    }
    match tx.commit().await {
        Ok(()) => {
            for (reply, answer) in answers {
                let _ = reply.send(answer);
            }
        }
        Err(error) => {
            let message = format!("committing: {error}");
            for (reply, _) in answers {
                let _ = reply.send(Err(StorageError::Batch(message.clone())));
            }
        }
    }
}

async fn execute(conn: &mut AnyConnection, write: &Write) -> Result<Written> {
    Ok(match write {
        Write::CreateRuns { runs, now_ms } => {
            let mut ids = Vec::with_capacity(runs.len());
            for run in runs {
                ids.push(runs::insert_run(conn, run, *now_ms).await?);
            }
            Written::Ids(ids)
        }
        Write::Claim { id, owner, now_ms, lease_until_ms } => {
            Written::Claim(runs::claim(conn, *id, owner, *now_ms, *lease_until_ms).await?)
        }
        Write::Renew { id, owner, fence, lease_until_ms } => {
            Written::Done(runs::renew(conn, *id, owner, *fence, *lease_until_ms).await?)
        }
        Write::Target { id, owner, fence, address } => {
            Written::Done(runs::target(conn, *id, owner, *fence, address).await?)
        }
        Write::Apply { id, transition, lease, fuel_used, follow_ups, now_ms } => {
            let lease = lease.as_ref().map(|(owner, fence)| (owner.as_str(), *fence));
            Written::Applied(
                runs::apply(conn, *id, transition, lease, *fuel_used, follow_ups, *now_ms).await?,
            )
        }
    })
}
