//! Concurrency caps: a job's `max_concurrent_runs` and its group's, the most of their runs
//! dispatching or running at once, across every executor and every admin.
//!
//! A capped job's runs are created pending and claimed only here: the claim is one statement
//! that reads the caps and counts the runs in flight, and a run that finds no room is marked
//! held in the same transaction. A held run waits, durably, until a run of its job or group
//! ends; then [`Db::release_held`] claims the held runs that fit, in the order
//! `lifecycle::caps::release_order` decides. Within one job, runs are claimed in order of their
//! instant: no run is claimed while an older one of its job is held.
//!
//! Each of these transactions is alone among those of its group: SQLite has one writer, whose
//! lock the claim's first statement takes, and on PostgreSQL each takes the group's advisory
//! lock first. So a run is never held after the release that would have claimed it read the
//! held runs, and two admins cannot both claim the last free place.

use super::query::query;
use sqlx::{AnyConnection, Row};

use super::runs::{COLUMNS, Claim, run_from_row};
use super::{Db, Dialect, Result};
use crate::lifecycle::caps::{Held, Room, release_order};

/// The advisory lock of group `group_id`'s capped claims: this key plus the group's id
/// ("wjcap" in ASCII, shifted clear of the ids).
const CAP_LOCK_BASE: i64 = 0x0077_6a63_6170_i64 << 20;

/// The runs in flight (sent, or running on an executor): they hold a place under a cap, and past
/// the bound on unfinished runs they hold back their job's fires.
pub(super) const IN_FLIGHT: &str = "state in ('dispatching', 'running')";

/// What [`Db::claim_capped`] did.
#[derive(Debug)]
pub enum CappedClaim {
    /// The run is claimed: its caps had room (or its lease ran out and it is taken over).
    Claimed(Box<Claim>),
    /// Its job or group is at its cap, or an older run of its job waits: it is held, pending.
    Held,
    /// It is no longer pending (another admin claimed it, or it ended).
    Gone,
}

impl Db {
    /// Claims run `id` of a job in group `group_id` for `owner` until `lease_until_ms`, if its
    /// job's and group's caps have room and no older run of its job is held; else marks it
    /// held. A run whose dispatcher's lease ran out before `now_ms` is taken over whatever the
    /// caps say: it already holds its place.
    pub async fn claim_capped(
        &self,
        id: i64,
        group_id: i64,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<CappedClaim> {
        let mut tx = self.writer().begin().await?;
        self.lock_caps(&mut tx, group_id).await?;
        let claimed = claim(&mut tx, id, owner, now_ms, lease_until_ms).await?;
        let outcome = match claimed {
            Some(claim) => CappedClaim::Claimed(Box::new(claim)),
            None => {
                let held = query("update runs set held = 1 where id = $1 and state = 'pending'")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                if held.rows_affected() == 1 { CappedClaim::Held } else { CappedClaim::Gone }
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Claims for `owner` the held runs of group `group_id`'s jobs that now fit under their
    /// caps, oldest first, looking at no more than `limit` of them.
    pub async fn release_held(
        &self,
        group_id: i64,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: i64,
    ) -> Result<Vec<Claim>> {
        let mut tx = self.writer().begin().await?;
        self.lock_caps(&mut tx, group_id).await?;
        let rows = query(
            "select r.id, r.job_id, r.trigger_time from runs r join jobs j on j.id = r.job_id
             where j.group_id = $1 and r.state = 'pending' and r.held = 1
             order by r.trigger_time, r.id limit $2",
        )
        .bind(group_id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let held = rows
            .iter()
            .map(|row| {
                Ok(Held {
                    id: row.try_get("id")?,
                    job_id: row.try_get("job_id")?,
                    trigger_time_ms: row.try_get("trigger_time")?,
                })
            })
            .collect::<Result<Vec<Held>>>()?;
        if held.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let room = room(&mut tx, group_id).await?;
        // Each claim checks the caps again: the order only says which to try.
        let mut claims = Vec::new();
        for id in release_order(&held, &room) {
            if let Some(claim) = claim(&mut tx, id, owner, now_ms, lease_until_ms).await? {
                claims.push(claim);
            }
        }
        tx.commit().await?;
        Ok(claims)
    }

    /// The groups that have held runs, at most `limit`: the sweep releases them, in case the
    /// release after a run's end was lost with its admin.
    pub async fn groups_with_held_runs(&self, limit: i64) -> Result<Vec<i64>> {
        let rows = query(
            "select distinct j.group_id from runs r join jobs j on j.id = r.job_id
             where r.state = 'pending' and r.held = 1 limit $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("group_id")?)).collect()
    }

    /// Job `job_id`'s runs in flight, oldest first, at most `limit`.
    pub async fn runs_in_flight(&self, job_id: i64, limit: i64) -> Result<Vec<i64>> {
        let rows = query(&format!(
            "select id from runs where job_id = $1 and {IN_FLIGHT} order by id limit $2"
        ))
        .bind(job_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Takes group `group_id`'s cap lock until the transaction ends: an advisory lock on
    /// PostgreSQL, the group's row on MySQL; SQLite's single writer needs none.
    async fn lock_caps(&self, conn: &mut AnyConnection, group_id: i64) -> Result<()> {
        match self.dialect {
            Dialect::Postgres => {
                // Wrapped, so that the row read holds no `void` column (which `Any` rows lack).
                query("select 1 as locked from (select pg_advisory_xact_lock($1)) as l")
                    .bind(CAP_LOCK_BASE.wrapping_add(group_id))
                    .fetch_one(&mut *conn)
                    .await?;
            }
            Dialect::Mysql => {
                query("select id from groups where id = $1 for update")
                    .bind(group_id)
                    .fetch_all(&mut *conn)
                    .await?;
            }
            Dialect::Sqlite => {}
        }
        Ok(())
    }
}

/// Group `group_id`'s caps and its jobs', with their runs in flight, read on `conn`.
async fn room(conn: &mut AnyConnection, group_id: i64) -> Result<Room> {
    let group_cap = query("select max_concurrent_runs from groups where id = $1")
        .bind(group_id)
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| row.try_get::<i64, _>("max_concurrent_runs"))
        .transpose()?
        .unwrap_or(0);
    let mut room = Room { group_cap, ..Room::default() };
    let caps = query(
        "select id, max_concurrent_runs from jobs where group_id = $1 and max_concurrent_runs > 0",
    )
    .bind(group_id)
    .fetch_all(&mut *conn)
    .await?;
    for row in caps {
        room.job_caps.insert(row.try_get("id")?, row.try_get("max_concurrent_runs")?);
    }
    let in_flight = query(&format!(
        "select a.job_id, count(*) as n from runs a join jobs j on j.id = a.job_id
         where j.group_id = $1 and a.{IN_FLIGHT} group by a.job_id"
    ))
    .bind(group_id)
    .fetch_all(&mut *conn)
    .await?;
    for row in in_flight {
        let n: i64 = row.try_get("n")?;
        room.job_in_flight.insert(row.try_get("job_id")?, n);
        room.group_in_flight += n;
    }
    Ok(room)
}

/// Claims run `id` on `conn` if it is pending and fits under its job's and group's caps behind
/// every older held run of its job, or if its dispatcher's lease ran out.
async fn claim(
    conn: &mut AnyConnection,
    id: i64,
    owner: &str,
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Option<Claim>> {
    let row = query(&format!(
        "update runs set state = 'dispatching', held = 0, lease_owner = $1, lease_until = $2,
            fence = fence + 1, claimed_at = case when claimed_at = 0 then $3 else claimed_at end
         where id = $4 and ((state = 'dispatching' and lease_until < $3) or (state = 'pending'
            and not exists (select 1 from jobs j where j.id = runs.job_id
                and j.max_concurrent_runs > 0 and j.max_concurrent_runs <= (select count(*)
                    from runs a where a.job_id = j.id and a.{IN_FLIGHT}))
            and not exists (select 1 from jobs j join groups g on g.id = j.group_id
                where j.id = runs.job_id and g.max_concurrent_runs > 0
                and g.max_concurrent_runs <= (select count(*) from runs a
                    join jobs k on k.id = a.job_id where k.group_id = g.id and a.{IN_FLIGHT}))
            and not exists (select 1 from runs w where w.job_id = runs.job_id
                and w.state = 'pending' and w.held = 1 and w.id <> runs.id
                and (w.trigger_time < runs.trigger_time
                    or (w.trigger_time = runs.trigger_time and w.id < runs.id)))))
         returning {COLUMNS}, fence"
    ))
    .bind(owner)
    .bind(lease_until_ms)
    .bind(now_ms)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Claim { run: run_from_row(&row)?, fence: row.try_get("fence")? }))
}
