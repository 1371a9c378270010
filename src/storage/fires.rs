//! The scheduler's fire transaction: due jobs moved to their next fire, with their runs.
//!
//! On SQLite the whole transaction runs on the group commit's own connection, in one call to
//! its thread (`sqlite_writer.rs`), as the group commit does, so that the writes of the steady
//! state share that one connection. In WAL mode a connection drops its page cache
//! whenever another connection has committed since its last transaction; with the fires
//! committed through the sqlx writer, the group commit read its pages again after every fire.

use std::collections::BTreeSet;

use foldhash::HashSet;

use super::partitions::held_now;
use super::reports::Deltas;
use super::run_inserts::{Insert, insert_many_with};
use super::runs::{Claim, NewRun};
use super::sqlite_writer;
use super::statement::{Arg, Cells, Exec, Statement};
use super::{Db, Dialect, Result};
use crate::partition::{self, Held};
use crate::schedule::NextFire;

/// One job's fire, for [`Db::fire_jobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The job.
    pub job_id: i64,
    /// The next fire time the scheduler read: the compare of the compare-and-set.
    pub expected_fire_ms: i64,
    /// The fire after this one.
    pub next: NextFire,
    /// The fire's runs (none for a skipped misfire).
    pub runs: Vec<NewRun>,
    /// Create the runs already claimed by this owner until this instant (ms), each with its
    /// executor recorded, instead of pending.
    pub claim: Option<(String, i64)>,
}

/// A newly created run: pending, or claimed at its creation.
#[derive(Debug)]
pub enum Fired {
    /// Pending: to be claimed before it is sent.
    Pending {
        /// The run's id.
        id: i64,
        /// Its job's id.
        job_id: i64,
    },
    /// Claimed at creation.
    Claimed(Box<Claim>),
}

impl Fired {
    /// The run's id.
    pub fn id(&self) -> i64 {
        match self {
            Fired::Pending { id, .. } => *id,
            Fired::Claimed(claim) => claim.run.id,
        }
    }
}

impl Db {
    /// The scheduler's atomic step: moves job `job_id` from the fire at `expected_fire_ms` to
    /// `next` (`NextFire::Never` stops the job; `NextFire::WhenRunsEnd` leaves it running without
    /// a next fire time until the lifecycle sets one) and creates `runs`, all in one
    /// transaction. Nothing happens, and no run ids come back, if another scheduler got there
    /// first (the job's next fire is no longer `expected_fire_ms`) or a run of the same fire
    /// exists already.
    pub async fn fire_job(
        &self,
        job_id: i64,
        expected_fire_ms: i64,
        next: NextFire,
        runs: &[NewRun],
        now_ms: i64,
    ) -> Result<Vec<i64>> {
        let fire = Fire { job_id, expected_fire_ms, next, runs: runs.to_vec(), claim: None };
        let mut fired = self.fire_jobs(std::slice::from_ref(&fire), now_ms, None).await?;
        Ok(fired.pop().unwrap_or_default().iter().map(Fired::id).collect())
    }

    /// [`Db::fire_job`] for many jobs in one transaction: each job moves, with its runs, only
    /// from the fire it was read at, and, with `lease`, only while its partition is held under
    /// the lease (owner and fence) the fire was planned under, checked in the transaction; the
    /// answer holds each job's new runs, in order (claimed ones for a fire with a `claim`).
    pub async fn fire_jobs(
        &self,
        fires: &[Fire],
        now_ms: i64,
        lease: Option<&Held>,
    ) -> Result<Vec<Vec<Fired>>> {
        let started = std::time::Instant::now();
        let created = match &self.sqlite_writer {
            Some(writer) => {
                let (fires, lease) = (fires.to_vec(), lease.cloned());
                writer
                    .write(self.writer(), move |exec| {
                        sqlite_writer::ready(fire_in(
                            exec,
                            Dialect::Sqlite,
                            &fires,
                            now_ms,
                            lease.as_ref(),
                        ))
                    })
                    .await?
            }
            None => {
                let mut tx = self.writer().begin().await?;
                let created =
                    fire_in(&mut Exec::Sqlx(&mut tx), self.dialect, fires, now_ms, lease).await?;
                tx.commit().await?;
                created
            }
        };
        crate::metrics::admin().db_transaction("fire", started.elapsed());
        Ok(created)
    }
}

/// The fire transaction's statements, run through `exec` inside the caller's transaction.
async fn fire_in(
    exec: &mut Exec<'_>,
    dialect: Dialect,
    fires: &[Fire],
    now_ms: i64,
    lease: Option<&Held>,
) -> Result<Vec<Vec<Fired>>> {
    let allowed: Vec<bool> = match lease {
        Some(held) => {
            let wanted: BTreeSet<u16> =
                fires.iter().map(|fire| partition::of(fire.job_id)).collect();
            let now_held = held_now(exec, dialect, held, &wanted).await?;
            fires.iter().map(|fire| now_held.contains(&partition::of(fire.job_id))).collect()
        }
        None => vec![true; fires.len()],
    };
    let mut moved = vec![false; fires.len()];
    for round in super::distinct_rounds(fires.iter().map(|fire| fire.job_id)) {
        let round: Vec<usize> = round.into_iter().filter(|&index| allowed[index]).collect();
        let mut rest = &round[..];
        for (rows, shape) in super::statement_shapes(round.len(), 256, exec.pads()) {
            let chunk: Vec<&Fire> = rest[..rows].iter().map(|&index| &fires[index]).collect();
            let ids = move_fires(exec, &chunk, shape, now_ms).await?;
            for &index in &rest[..rows] {
                moved[index] = ids.contains(&fires[index].job_id);
            }
            rest = &rest[rows..];
        }
    }
    let inserts: Vec<Insert<'_>> = fires
        .iter()
        .zip(&moved)
        .filter(|(_, moved)| **moved)
        .flat_map(|(fire, _)| {
            let claim = fire.claim.as_ref().map(|(owner, until)| (owner.as_str(), *until));
            fire.runs.iter().map(move |run| Insert { run, claim, now_ms })
        })
        .collect();
    let mut deltas = Deltas::default();
    let mut created = insert_many_with(exec, &inserts, &mut deltas).await?.into_iter();
    deltas.write(exec).await?;
    let mut all_fired = Vec::with_capacity(fires.len());
    for (fire, moved) in fires.iter().zip(moved) {
        let count = if moved { fire.runs.len() } else { 0 };
        let fired = created.by_ref().take(count).flatten().map(|claim| match fire.claim {
            Some(_) => Fired::Claimed(Box::new(claim)),
            None => Fired::Pending { id: claim.run.id, job_id: claim.run.job_id },
        });
        all_fired.push(fired.collect());
    }
    Ok(all_fired)
}

/// [`move_fires`]'s statement of `shape` rows, with placeholders `p`, returning the ids of the
/// jobs it moved when `returning`. Each job is found by its id, one row of the values at a
/// time: the values' columns are compared as expressions (`+ 0`), so that SQLite cannot index
/// them: compared bare, from 64 rows SQLite indexed the values and read every running job
/// (`storage::tests::plans`).
pub(super) fn move_fires_sql(p: fn(usize) -> String, shape: usize, returning: bool) -> String {
    let values = (0..shape)
        .map(|row| {
            let cells = (2..=5).map(|n| super::typed(p, row * 4 + n, "bigint"));
            format!("({})", cells.collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "update jobs set next_fire_ms = v.column3, running = v.column4,
            revision = jobs.revision + 1 - v.column4,
            updated_at = case when v.column4 = 0 then {} else jobs.updated_at end
         from (values {values}) as v
         where jobs.id = v.column1 + 0 and jobs.running = 1 and jobs.next_fire_ms = v.column2 + 0
         {}",
        p(1),
        if returning { "returning id" } else { "" }
    )
}

/// Moves each of `fires` (of distinct jobs) to its next fire if the job is still at the fire it
/// was read at, in one statement of `shape` rows (those past the fires' all null, matching no
/// job); the ids of the jobs moved.
async fn move_fires(
    exec: &mut Exec<'_>,
    fires: &[&Fire],
    shape: usize,
    now_ms: i64,
) -> Result<HashSet<i64>> {
    if let Exec::Sqlx(conn) = exec
        && super::query::is_mysql(conn)
    {
        let moves: Vec<super::mysql_writes::Move> = fires
            .iter()
            .map(|fire| super::mysql_writes::Move {
                job_id: fire.job_id,
                expected_fire_ms: fire.expected_fire_ms,
                next_fire_ms: fire.next.at().unwrap_or(0),
                running: i64::from(fire.next != NextFire::Never),
            })
            .collect();
        return super::mysql_writes::move_fires(conn, &moves, now_ms).await;
    }
    let p = exec.placeholder();
    let returning = |exec: &Exec<'_>| {
        super::statement::shaped(exec, "move fires", shape, || move_fires_sql(p, shape, true))
    };
    // On the SQLite writer's connection the moves are counted rather than returned
    // (`sqlite_writer::changed_all`): a fire's jobs all move but when a pass raced another.
    let counted = matches!(exec, Exec::Sqlite(_));
    let sql = match counted {
        true => super::statement::shaped(exec, "move fires, counted", shape, || {
            move_fires_sql(p, shape, false)
        }),
        false => returning(exec),
    };
    let mut statement = Statement::new(sql);
    statement.bind(now_ms);
    for fire in fires {
        statement
            .bind(fire.job_id)
            .bind(fire.expected_fire_ms)
            .bind(fire.next.at().unwrap_or(0))
            .bind(i64::from(fire.next != NextFire::Never));
    }
    for _ in fires.len() * 4..shape * 4 {
        statement.bind(Arg::Int(None));
    }
    if let Exec::Sqlite(conn) = exec {
        if sqlite_writer::changed_all(conn, &statement, fires.len())? {
            return Ok(fires.iter().map(|fire| fire.job_id).collect());
        }
        // Undone: run again, returning which jobs it moved.
        statement.sql = returning(exec);
    }
    let rows = exec.fetch_all(&statement).await?;
    rows.iter().map(|row| row.required_int("id")).collect()
}
