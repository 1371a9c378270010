//! Group commit for the run lifecycle's writes: claims, lease renewals, targets, transitions
//! and new runs from many tasks queue up and commit together.
//!
//! One task per [`Db`] takes every write waiting in the queue (up to [`MAX_BATCH`]), runs them in
//! one transaction, commits, and only then answers each caller. A write that fails gets its own
//! error and the others still commit: the batch is then run again with each write in its own
//! savepoint, which the common case, where nothing fails, does not pay for. A caller
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
    // Writes rarely fail, so the batch first runs as plain statements in one transaction. Only
    // if one fails is the transaction rolled back and the batch run again, each write in its
    // own savepoint, so that the failure is that write's alone (on PostgreSQL a failed
    // statement aborts the whole transaction).
    let (writes, replies): (Vec<Write>, Vec<_>) = batch.into_iter().unzip();
    let answers = match run_plain(pool, &writes).await {
        Ok(answers) => answers,
        Err(()) => run_isolated(pool, &writes).await,
    };
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
}

/// Runs every write in one transaction and commits: `Err` if a write failed (nothing is
/// committed then).
async fn run_plain(
    pool: &AnyPool,
    writes: &[Write],
) -> std::result::Result<Vec<Result<Written>>, ()> {
    let Ok(mut tx) = pool.begin().await else { return Err(()) };
    let mut answers = Vec::with_capacity(writes.len());
    for write in writes {
        match execute(&mut tx, write).await {
            Ok(written) => answers.push(Ok(written)),
            Err(_) => {
                let _ = tx.rollback().await;
                return Err(());
            }
        }
    }
    tx.commit().await.map_err(drop)?;
    Ok(answers)
}

/// Runs each write in its own savepoint of one transaction, so a failed write rolls back alone.
async fn run_isolated(pool: &AnyPool, writes: &[Write]) -> Vec<Result<Written>> {
    let failed = |message: String| {
        writes.iter().map(|_| Err(StorageError::Batch(message.clone()))).collect()
    };
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(error) => return failed(format!("starting a transaction: {error}")),
    };
    let mut answers = Vec::with_capacity(writes.len());
    for write in writes {
        let answer = match sqlx::Connection::begin(&mut *tx).await {
            Ok(mut savepoint) => match execute(&mut savepoint, write).await {
                Ok(written) => savepoint.commit().await.map(|()| written).map_err(Into::into),
                Err(error) => {
                    let _ = savepoint.rollback().await;
                    Err(error)
                }
            },
            Err(error) => Err(error.into()),
        };
        answers.push(answer);
    }
    match tx.commit().await {
        Ok(()) => answers,
        Err(error) => failed(format!("committing: {error}")),
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
