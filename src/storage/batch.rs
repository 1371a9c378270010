//! Group commit for the run lifecycle's writes: claims, lease renewals, targets, transitions
//! and new runs from many tasks, and audit records, queue up and commit together. A trigger's
//! audit record is part of the write that creates its runs, with their ids.
//!
//! One task per [`Db`] takes every write waiting in the queue (up to [`MAX_BATCH`]), runs them in
//! one transaction, commits, and only then answers each caller. A write that fails gets its own
//! error and the others still commit: the batch is then run again with each write in its own
//! savepoint, which the common case, where nothing fails, does not pay for. A caller
//! is told its write happened only once it is committed, so batching changes when things
//! commit, never what commits together: each write (a transition with its follow-up runs, say)
//! is still all or nothing.

use foldhash::HashMap;
use std::sync::Arc;

use sqlx::{AnyConnection, AnyPool};
use tokio::sync::{mpsc, oneshot};

use super::audit::{self, AuditEntry};
use super::reports::Deltas;
use super::run_inserts::{self, Insert};
use super::run_writes::{self, Update};
use super::runs::{Claim, NewRun};
use super::sqlite_writer::{self, SqliteWriter};
use super::statement::Exec;
use super::workflow_runs;
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
        audit: Option<AuditEntry>,
    },
    CreateClaimed {
        runs: Vec<NewRun>,
        owner: String,
        now_ms: i64,
        lease_until_ms: i64,
        audit: Option<AuditEntry>,
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
    Audit {
        entry: AuditEntry,
        now_ms: i64,
    },
    Apply {
        /// The run as read before the transition was judged.
        run: Box<RunRecord>,
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
    Claims(Vec<Option<Claim>>),
    Done(bool),
    Applied(Option<(RunRecord, Vec<i64>)>),
}

impl Written {
    /// The error for an answer of the wrong kind (a bug in this module).
    pub(super) fn unexpected(&self) -> StorageError {
        StorageError::Batch(format!("unexpected answer {self:?}"))
    }
}

pub(super) type Request = (Write, oneshot::Sender<Result<Written>>);

/// The sending side of the queue; the committing task ends when every sender is gone.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Request>,
}

impl Batcher {
    /// Starts the committing task on `pool`, the database's writer pool, and, on SQLite, on its
    /// group commit connection `sqlite`.
    pub(super) fn start(pool: AnyPool, sqlite: Option<Arc<SqliteWriter>>) -> Batcher {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(commit_loop(pool, sqlite, receiver));
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

async fn commit_loop(
    pool: AnyPool,
    sqlite: Option<Arc<SqliteWriter>>,
    mut receiver: mpsc::UnboundedReceiver<Request>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if batch.len() >= LINGER_FROM {
            linger(&mut receiver, &mut batch).await;
        }
        commit(&pool, sqlite.as_deref(), std::mem::take(&mut batch)).await;
    }
}

/// A batch at least this large says writes are arriving faster than they commit.
const LINGER_FROM: usize = 4;
/// How many times such a batch lets the tasks ready to run add their writes before it commits.
const LINGER_ROUNDS: usize = 8;

/// Adds to `batch` the writes of the tasks that were ready to run when it was taken: yields to
/// them, takes what they queued, and again while each round brings more (at most
/// [`LINGER_ROUNDS`], up to [`MAX_BATCH`]). Under load a commit costs about the same for one
/// write as for many (on SQLite the pages the writes share go to the log once per commit, on
/// PostgreSQL the log is synced once per commit), so the writes about to arrive are better in
/// this commit than in the next; no timer is waited for, and a lone write does not wait at all.
async fn linger(receiver: &mut mpsc::UnboundedReceiver<Request>, batch: &mut Vec<Request>) {
    for _ in 0..LINGER_ROUNDS {
        tokio::task::yield_now().await;
        let before = batch.len();
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        if batch.len() == before || batch.len() >= MAX_BATCH {
            break;
        }
    }
}

/// Commits `batch` and answers each of its writes.
pub(super) async fn commit(pool: &AnyPool, sqlite: Option<&SqliteWriter>, batch: Vec<Request>) {
    // Writes rarely fail, so the batch first runs as plain statements in one transaction. Only
    // if one fails is the transaction rolled back and the batch run again, each write in its
    // own savepoint, so that the failure is that write's alone (on PostgreSQL a failed
    // statement aborts the whole transaction).
    let (writes, replies): (Vec<Write>, Vec<_>) = batch.into_iter().unzip();
    let started = std::time::Instant::now();
    // On SQLite, a batch of writes that all group runs on the group commit's own connection,
    // in one call to its thread.
    let sqlite = sqlite.filter(|_| writes.iter().all(groups));
    let (writes, plain) = match sqlite {
        Some(writer) => run_plain_sqlite(pool, writer, writes).await,
        None => {
            let plain = run_plain(pool, &writes).await;
            (writes, plain)
        }
    };
    let answers = match plain {
        Ok(answers) => answers,
        Err(()) => run_isolated(pool, &writes).await,
    };
    crate::metrics::admin().db_transaction("batch", started.elapsed());
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
}

/// [`run_plain`] on the SQLite writer's connection: the whole transaction in one call to its
/// thread, while this task holds the writer pool's connection, so that nothing else writes
/// meanwhile. Gives the writes back for [`run_isolated`] when one failed.
async fn run_plain_sqlite(
    pool: &AnyPool,
    writer: &SqliteWriter,
    writes: Vec<Write>,
) -> (Vec<Write>, std::result::Result<Vec<Result<Written>>, ()>) {
    let Ok(held) = pool.acquire().await else { return (writes, Err(())) };
    let count = writes.len();
    let ran = writer
        .run(move |conn| {
            let mut answers: Vec<Option<Written>> = writes.iter().map(|_| None).collect();
            let ran = sqlite_writer::transaction(conn, |conn| {
                sqlite_writer::ready(run_grouped(&mut Exec::Sqlite(conn), &writes, &mut answers))
            });
            (writes, ran.map(|()| answers))
        })
        .await;
    drop(held);
    match ran {
        Some((writes, Ok(answers))) => (writes, Ok(answered(answers))),
        Some((writes, Err(error))) => {
            tracing::debug!(%error, "a group commit failed: committing each write on its own");
            (writes, Err(()))
        }
        // The call panicked, and its writes are gone with it: each caller hears it.
        None => (Vec::new(), Ok((0..count).map(|_| Err(sqlite_writer::panicked())).collect())),
    }
}

/// Whether `write` is one [`run_grouped`] regroups (a creation, an audit record, a plain
/// transition), rather than one it runs on its own.
fn groups(write: &Write) -> bool {
    matches!(write, Write::CreateRuns { .. } | Write::CreateClaimed { .. } | Write::Audit { .. })
        || plain_update(write).is_some()
}

/// Each write's answer, or an error for a write that got none (a bug in [`run_grouped`]).
fn answered(answers: Vec<Option<Written>>) -> Vec<Result<Written>> {
    answers
        .into_iter()
        .map(|answer| answer.ok_or_else(|| StorageError::Batch("the write was skipped".into())))
        .collect()
}

/// Runs every write in one transaction and commits: `Err` if a write failed (nothing is
/// committed then).
///
/// Every write of a batch was waiting at once, none of them answered, so any order of them is
/// one in which they could have happened, and like writes are regrouped into one statement: the
/// new runs of every write are one insert, the audit records another; transitions without
/// consequences in the database (most are: a run sent, a run ended without a retry or
/// children) are one update per round, a run's second transition in the batch going to the
/// round after its first; the rest follow in their order, one statement each.
async fn run_plain(
    pool: &AnyPool,
    writes: &[Write],
) -> std::result::Result<Vec<Result<Written>>, ()> {
    let Ok(mut tx) = pool.begin().await else { return Err(()) };
    let mut answers: Vec<Option<Written>> = writes.iter().map(|_| None).collect();
    if run_grouped(&mut Exec::Sqlx(&mut tx), writes, &mut answers).await.is_err() {
        let _ = tx.rollback().await;
        return Err(());
    }
    tx.commit().await.map_err(drop)?;
    Ok(answered(answers))
}

/// Runs `writes` grouped (see [`run_plain`]) through `exec`, setting each one's answer. The
/// writes that do not group need a sqlx connection.
async fn run_grouped(
    exec: &mut Exec<'_>,
    writes: &[Write],
    answers: &mut [Option<Written>],
) -> Result<()> {
    let mut inserts = Vec::new();
    let mut creators = Vec::new();
    let mut entries = Vec::new();
    let mut plain = Vec::new();
    let mut others = Vec::new();
    for (index, write) in writes.iter().enumerate() {
        match write {
            Write::CreateRuns { runs, now_ms, .. } => {
                creators.push((index, runs.len(), false));
                inserts.extend(runs.iter().map(|run| Insert { run, claim: None, now_ms: *now_ms }));
            }
            Write::CreateClaimed { runs, owner, now_ms, lease_until_ms, .. } => {
                creators.push((index, runs.len(), true));
                let claim = Some((owner.as_str(), *lease_until_ms));
                inserts.extend(runs.iter().map(|run| Insert { run, claim, now_ms: *now_ms }));
            }
            Write::Audit { entry, now_ms } => {
                entries.push((entry, *now_ms));
                answers[index] = Some(Written::Done(true));
            }
            _ => match plain_update(write) {
                Some(update) => plain.push((index, update)),
                None => others.push(index),
            },
        }
    }
    run_writes::lock_in_order(exec, writes.iter().filter_map(changed_run)).await?;
    // The report's changes of the inserts and the updates are one statement, after both.
    let mut deltas = Deltas::default();
    let mut created = run_inserts::insert_many_with(exec, &inserts, &mut deltas).await?.into_iter();
    let mut trigger_entries = Vec::new();
    for (index, count, claimed) in creators {
        let runs: Vec<Option<Claim>> = created.by_ref().take(count).collect();
        if let Some((entry, now_ms)) = creation_audit(&writes[index]) {
            trigger_entries.push((audit::with_log_ids(entry, &created_ids(&runs)), now_ms));
        }
        answers[index] = Some(if claimed {
            Written::Claims(runs)
        } else {
            Written::Ids(
                runs.into_iter().map(|created| created.map(|claim| claim.run.id)).collect(),
            )
        });
    }
    entries.extend(trigger_entries.iter().map(|(entry, now_ms)| (entry, *now_ms)));
    audit::insert_many(exec, &entries).await?;
    // The workflow runs a run of this batch ended in, to decide for once their runs ended.
    let mut workflows = Vec::new();
    for round in super::distinct_rounds(plain.iter().map(|(_, update)| update.run.id)) {
        let updates: Vec<Update<'_>> = round.iter().map(|&at| plain[at].1).collect();
        let updated = run_writes::update_many_with(exec, &updates, &mut deltas).await?;
        workflows.extend(updated.iter().filter_map(ended_in_workflow));
        let mut updated: HashMap<i64, RunRecord> =
            updated.into_iter().map(|run| (run.id, run)).collect();
        for at in round {
            let (index, update) = plain[at];
            let run = updated.remove(&update.run.id);
            answers[index] = Some(Written::Applied(run.map(|run| (run, Vec::new()))));
        }
    }
    deltas.write(exec).await?;
    for index in others {
        let Exec::Sqlx(conn) = exec else {
            return Err(StorageError::Batch("this write needs a sqlx connection".to_owned()));
        };
        let answer = execute(conn, &writes[index]).await?;
        if let Written::Applied(Some((run, _))) = &answer {
            workflows.extend(ended_in_workflow(run));
        }
        answers[index] = Some(answer);
    }
    // In id order, so that two admins' batches take the workflow runs' locks in one order.
    workflows.sort_unstable();
    workflows.dedup();
    for id in workflows {
        let now_ms = writes.iter().map(now_of).max().unwrap_or(0);
        workflow_runs::advance(exec, id, now_ms).await?;
    }
    Ok(())
}

/// The workflow run `run` did a node's work for, if this transition ended it.
fn ended_in_workflow(run: &RunRecord) -> Option<i64> {
    run.node.filter(|_| run.state.is_terminal()).map(|node| node.workflow_run_id)
}

/// The instant `write` was asked for at, if it says.
fn now_of(write: &Write) -> i64 {
    match write {
        Write::CreateRuns { now_ms, .. }
        | Write::CreateClaimed { now_ms, .. }
        | Write::Claim { now_ms, .. }
        | Write::Audit { now_ms, .. }
        | Write::Apply { now_ms, .. } => *now_ms,
        Write::Renew { .. } | Write::Target { .. } => 0,
    }
}

/// The audit entry to record with the runs a creation makes, and when.
fn creation_audit(write: &Write) -> Option<(&AuditEntry, i64)> {
    match write {
        Write::CreateRuns { audit: Some(entry), now_ms, .. }
        | Write::CreateClaimed { audit: Some(entry), now_ms, .. } => Some((entry, *now_ms)),
        _ => None,
    }
}

/// Records the audit entry of creation `write`, if it has one, naming the runs it `created`.
async fn record_creation_audit(
    conn: &mut AnyConnection,
    write: &Write,
    created: &[Option<Claim>],
) -> Result<()> {
    if let Some((entry, now_ms)) = creation_audit(write) {
        let entry = audit::with_log_ids(entry, &created_ids(created));
        audit::insert_many(&mut Exec::Sqlx(conn), &[(&entry, now_ms)]).await?;
    }
    Ok(())
}

/// The existing run `write` changes, if it changes one.
fn changed_run(write: &Write) -> Option<i64> {
    match write {
        Write::Claim { id, .. } | Write::Renew { id, .. } | Write::Target { id, .. } => Some(*id),
        Write::Apply { run, .. } => Some(run.id),
        Write::CreateRuns { .. } | Write::CreateClaimed { .. } | Write::Audit { .. } => None,
    }
}

/// The ids of the runs a creation made (not those that existed already).
fn created_ids(created: &[Option<Claim>]) -> Vec<i64> {
    created.iter().flatten().map(|claim| claim.run.id).collect()
}

/// `write` as an update for [`run_writes::update_many`], if it is a transition without follow-up
/// runs, a next fire to set or an alarm to raise.
fn plain_update(write: &Write) -> Option<Update<'_>> {
    let Write::Apply { run, transition, lease, fuel_used, follow_ups, now_ms } = write else {
        return None;
    };
    if !follow_ups.is_empty() || transition.next_fire_delay_ms.is_some() || transition.alarm {
        return None;
    }
    let lease = lease.as_ref().map(|(owner, fence)| (owner.as_str(), *fence));
    Some(Update { run, transition, lease, fuel_used: *fuel_used, now_ms: *now_ms })
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
            Ok(mut savepoint) => match execute_advancing(&mut savepoint, write).await {
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

/// [`execute`], and for a transition that ended a workflow node's run, the decision of what
/// follows in its workflow run.
async fn execute_advancing(conn: &mut AnyConnection, write: &Write) -> Result<Written> {
    let written = execute(conn, write).await?;
    if let Written::Applied(Some((run, _))) = &written
        && let Some(id) = ended_in_workflow(run)
    {
        workflow_runs::advance(&mut Exec::Sqlx(conn), id, now_of(write)).await?;
    }
    Ok(written)
}

async fn execute(conn: &mut AnyConnection, write: &Write) -> Result<Written> {
    Ok(match write {
        Write::CreateRuns { runs, now_ms, .. } => {
            let inserts: Vec<_> =
                runs.iter().map(|run| Insert { run, claim: None, now_ms: *now_ms }).collect();
            let created = run_inserts::insert_many(conn, &inserts).await?;
            record_creation_audit(conn, write, &created).await?;
            Written::Ids(created.into_iter().map(|created| created.map(|c| c.run.id)).collect())
        }
        Write::CreateClaimed { runs, owner, now_ms, lease_until_ms, .. } => {
            let claim = Some((owner.as_str(), *lease_until_ms));
            let inserts: Vec<_> =
                runs.iter().map(|run| Insert { run, claim, now_ms: *now_ms }).collect();
            let created = run_inserts::insert_many(conn, &inserts).await?;
            record_creation_audit(conn, write, &created).await?;
            Written::Claims(created)
        }
        Write::Claim { id, owner, now_ms, lease_until_ms } => {
            Written::Claim(run_writes::claim(conn, *id, owner, *now_ms, *lease_until_ms).await?)
        }
        Write::Renew { id, owner, fence, lease_until_ms } => {
            Written::Done(run_writes::renew(conn, *id, owner, *fence, *lease_until_ms).await?)
        }
        Write::Target { id, owner, fence, address } => {
            Written::Done(run_writes::target(conn, *id, owner, *fence, address).await?)
        }
        Write::Audit { entry, now_ms } => {
            audit::insert_many(&mut Exec::Sqlx(conn), &[(entry, *now_ms)]).await?;
            Written::Done(true)
        }
        Write::Apply { run, transition, lease, fuel_used, follow_ups, now_ms } => {
            let lease = lease.as_ref().map(|(owner, fence)| (owner.as_str(), *fence));
            let update = Update { run, transition, lease, fuel_used: *fuel_used, now_ms: *now_ms };
            Written::Applied(run_writes::apply(conn, &update, follow_ups).await?)
        }
    })
}
