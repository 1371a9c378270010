//! The partitions' leases and the admins that share them (migration 0019).
//!
//! An admin's beat ([`Db::beat_partitions`]) records it as live, renews the leases it holds and
//! reads every lease; `partition::plan` then says what it takes ([`Db::take_partitions`], a
//! compare-and-set that bumps the fence) and gives back ([`Db::release_partitions`]). A graceful
//! stop gives everything back and forgets the admin ([`Db::leave_partitions`]). On PostgreSQL
//! and MySQL an admin holds a lock named after it on a connection of its own
//! ([`Db::open_admin_session`]), and a beat reads whose locks are held ([`Beat::sessions`]):
//! the database lets a lock go when its connection ends, as it does when the admin dies.
//!
//! The reads of the scheduler and the sweep name the partitions they cover with
//! [`partition_filter`], and a fire commits only under the lease it was planned under:
//! [`held_now`] reads the leases again in the fire's transaction, locked against a take until
//! it commits (`for share` on PostgreSQL, `lock in share mode` on MySQL; SQLite's one writer
//! serialises the two).
//!
//! What a fair share is, and when to take or give back, is `partition`'s decision, not this
//! module's.

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::{AnyConnection, Row};

use super::query::query;
use super::statement::{Cells, Exec, Statement};
use super::{Db, Dialect, Result};
use crate::partition::{Held, Lease, PARTITIONS, SPREAD};

/// What one beat read: the leases this admin renewed, the live admins and every lease.
#[derive(Debug, Clone)]
pub struct Beat {
    /// Partition → fence of each lease the beat renewed.
    pub renewed: HashMap<u16, i64>,
    /// The admins seen within the lease, this one included.
    pub live: Vec<String>,
    /// The earlier incarnations of this admin (the same `member`), forgotten by this beat:
    /// they are dead, and their partitions are this admin's to take at once.
    pub predecessors: Vec<String>,
    /// Every partition's lease, by partition.
    pub leases: Vec<Lease>,
    /// The admins, among the live ones and the leases' holders, whose session
    /// ([`Db::open_admin_session`]) is open: one that held its session and no longer does has
    /// died, or lost its connection to the database. Empty on SQLite.
    pub sessions: HashSet<String>,
}

/// An admin's session ([`Db::open_admin_session`]); closing it (dropping it) lets its lock go.
pub struct AdminSession {
    _connection: AnyConnection,
}

/// The class of the admins' session locks on PostgreSQL (the first key of the two-key
/// advisory locks): "wjob".
const SESSION_CLASS: i64 = 0x776a_6f62;

/// The second key of `owner`'s session lock on PostgreSQL: a hash of its id (FNV-1a) in
/// 31 bits, as an advisory lock's key is a 32-bit integer read back unsigned. Two admins whose
/// keys collide: the second goes without a session.
fn session_key(owner: &str) -> i64 {
    let hash = owner
        .bytes()
        .fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    i64::from(hash & 0x7fff_ffff)
}

/// The name of the session lock of the admin `$1` on MySQL, whose named locks are the server's,
/// not a database's: a hash of the database's name and the admin's id, within the 64
/// characters a name may have.
const MYSQL_SESSION_LOCK: &str = "sha1(concat('wasmjob/', database(), '/', $1))";

/// Of `admins`, those whose session lock is held now.
async fn sessions_held(
    conn: &mut AnyConnection,
    dialect: Dialect,
    admins: &[&str],
) -> Result<HashSet<String>> {
    let mut held = HashSet::new();
    match dialect {
        Dialect::Sqlite => {}
        Dialect::Postgres => {
            let keys: HashSet<i64> = query(
                "select cast(objid as bigint) as key from pg_locks
                 where locktype = 'advisory' and cast(classid as bigint) = $1 and objsubid = 2
                 and granted
                 and database = (select oid from pg_database where datname = current_database())",
            )
            .bind(SESSION_CLASS)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| row.try_get("key"))
            .collect::<std::result::Result<_, _>>()?;
            held.extend(
                admins
                    .iter()
                    .filter(|admin| keys.contains(&session_key(admin)))
                    .map(|admin| (*admin).to_owned()),
            );
        }
        Dialect::Mysql => {
            for admin in admins {
                let user = query(&format!(
                    "select cast(is_used_lock({MYSQL_SESSION_LOCK}) as bigint) as user"
                ))
                .bind(*admin)
                .fetch_one(&mut *conn)
                .await?
                .try_get::<Option<i64>, _>("user")?;
                if user.is_some() {
                    held.insert((*admin).to_owned());
                }
            }
        }
    }
    Ok(held)
}

/// A live admin and the partitions it holds (`GET /api/v1/admins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRecord {
    /// Its lease owner id.
    pub owner: String,
    /// The address it serves its API at, as it reported it.
    pub address: String,
    /// When it started, in ms since the epoch.
    pub started_at: i64,
    /// Its last beat.
    pub seen_at: i64,
    /// The partitions it holds, ascending.
    pub partitions: Vec<u16>,
}

impl Db {
    /// One beat of `owner` at `now_ms`: records it as live (with its `address`, its `member`
    /// key and its start), forgets its predecessors (the admins of the same non-empty `member`
    /// started no later), renews every lease it holds until `now_ms + lease_ms`, and reads the
    /// admins seen since `now_ms - lease_ms` and every lease.
    pub async fn beat_partitions(
        &self,
        owner: &str,
        address: &str,
        member: &str,
        started_at: i64,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Beat> {
        let admin = BeatingAdmin {
            owner: owner.to_owned(),
            address: address.to_owned(),
            member: member.to_owned(),
            started_at,
        };
        let read = match &self.sqlite_writer {
            // On SQLite, on the group commit's connection, as the fires (`fires.rs`).
            Some(writer) => {
                let write = move |exec: &mut Exec<'_>| {
                    super::sqlite_writer::ready(beat_in(exec, &admin, now_ms, lease_ms))
                };
                writer.write(self.writer(), write).await?
            }
            None => {
                let mut tx = self.writer().begin().await?;
                let read = beat_in(&mut Exec::Sqlx(&mut tx), &admin, now_ms, lease_ms).await?;
                let mut admins: Vec<&str> = read.live.iter().map(String::as_str).collect();
                admins.extend(read.leases.iter().filter_map(|lease| lease.owner.as_deref()));
                admins.sort_unstable();
                admins.dedup();
                let sessions = sessions_held(&mut tx, self.dialect, &admins).await?;
                tx.commit().await?;
                BeatRead { sessions, ..read }
            }
        };
        let renewed = read
            .leases
            .iter()
            .filter(|lease| lease.owner.as_deref() == Some(owner))
            .map(|lease| (lease.partition, lease.fence))
            .collect();
        let BeatRead { live, predecessors, leases, sessions } = read;
        Ok(Beat { renewed, live, predecessors, leases, sessions })
    }

    /// Opens `owner`'s session: a connection of its own, out of the pool, that holds a lock
    /// named after `owner` for as long as it is open (an advisory lock on PostgreSQL, a named
    /// lock on MySQL). The database lets the lock go the moment the connection ends, which it
    /// does when the admin's process dies: the other admins' beats see it
    /// ([`Beat::sessions`]). `None` on SQLite, which one admin uses alone, and when the lock
    /// is held already (by a session of an admin with a colliding key; the admin then goes
    /// without, and its death is seen only when its lease runs out).
    pub async fn open_admin_session(&self, owner: &str) -> Result<Option<AdminSession>> {
        if self.dialect == Dialect::Sqlite {
            return Ok(None);
        }
        let mut connection = self.pool.acquire().await?.detach();
        let held = match self.dialect {
            Dialect::Postgres => query(
                "select pg_try_advisory_lock(cast($1 as integer), cast($2 as integer)) as held",
            )
            .bind(SESSION_CLASS)
            .bind(session_key(owner))
            .fetch_one(&mut connection)
            .await?
            .try_get::<bool, _>("held")?,
            _ => {
                query(&format!("select cast(get_lock({MYSQL_SESSION_LOCK}, 0) as bigint) as held"))
                    .bind(owner)
                    .fetch_one(&mut connection)
                    .await?
                    .try_get::<Option<i64>, _>("held")?
                    == Some(1)
            }
        };
        Ok(held.then_some(AdminSession { _connection: connection }))
    }

    /// Takes, for `owner` until `lease_until_ms`, each of `partitions` that is still free at
    /// `now_ms` (no holder, a lease that ran out, or a holder among `predecessors`), bumping its
    /// fence; returns the partitions taken with their new fences. A partition another admin
    /// took first is left out.
    pub async fn take_partitions(
        &self,
        owner: &str,
        partitions: &[u16],
        predecessors: &[String],
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<HashMap<u16, i64>> {
        if partitions.is_empty() {
            return Ok(HashMap::new());
        }
        let dead: Vec<String> = (0..predecessors.len()).map(|n| format!("${}", n + 4)).collect();
        let dead = match dead.is_empty() {
            true => String::new(),
            false => format!(" or owner in ({})", dead.join(", ")),
        };
        let sql = format!(
            "update partitions set owner = $1, fence = fence + 1, lease_until = $2
             where id in ({}) and (owner is null or lease_until < $3{dead})
             returning id, fence",
            id_list(partitions.iter().copied())
        );
        let mut take = query(&sql).bind(owner).bind(lease_until_ms).bind(now_ms);
        for predecessor in predecessors {
            take = take.bind(predecessor.as_str());
        }
        let taken = take.fetch_all(self.writer()).await?;
        taken.iter().map(|row| Ok((partition_of(row)?, row.try_get("fence")?))).collect()
    }

    /// Ends now the dispatch leases of `owners` (admins whose partitions were taken over
    /// because their leases ran out, or earlier incarnations) on runs they claimed and did not
    /// send, so that the sweep claims them at once instead of when those leases run out. The
    /// fence is left alone: the next claim bumps it. How many runs.
    pub async fn expire_dispatch_leases(&self, owners: &[String], now_ms: i64) -> Result<u64> {
        if owners.is_empty() {
            return Ok(0);
        }
        let list: Vec<String> = (0..owners.len()).map(|n| format!("${}", n + 2)).collect();
        let sql = format!(
            "update runs set lease_until = 0
             where state = 'dispatching' and lease_until >= $1 and lease_owner in ({})",
            list.join(", ")
        );
        let mut expire = query(&sql).bind(now_ms);
        for owner in owners {
            expire = expire.bind(owner.as_str());
        }
        Ok(expire.execute(self.writer()).await?.rows_affected())
    }

    /// Gives back `owner`'s leases on `partitions`, so that another admin takes them at its
    /// next beat. How many it gave back.
    pub async fn release_partitions(&self, owner: &str, partitions: &[u16]) -> Result<u64> {
        if partitions.is_empty() {
            return Ok(0);
        }
        let done = query(&format!(
            "update partitions set owner = null, lease_until = 0 where owner = $1 and id in ({})",
            id_list(partitions.iter().copied())
        ))
        .bind(owner)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected())
    }

    /// At a graceful stop: gives back every lease `owner` holds and forgets it as an admin.
    pub async fn leave_partitions(&self, owner: &str) -> Result<u64> {
        let mut tx = self.writer().begin().await?;
        let done = query("update partitions set owner = null, lease_until = 0 where owner = $1")
            .bind(owner)
            .execute(&mut *tx)
            .await?;
        query("delete from admins where owner = $1").bind(owner).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// The admins seen at or after `since_ms`, by id, each with the partitions it holds.
    pub async fn live_admins(&self, since_ms: i64) -> Result<Vec<AdminRecord>> {
        let rows = query(
            "select owner, address, started_at, seen_at from admins
             where seen_at >= $1 order by owner",
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        let leases = read_leases(&mut Exec::Sqlx(&mut *self.pool.acquire().await?)).await?;
        rows.iter()
            .map(|row| {
                let owner: String = row.try_get("owner")?;
                let partitions = leases
                    .iter()
                    .filter(|lease| lease.owner.as_deref() == Some(owner.as_str()))
                    .map(|lease| lease.partition)
                    .collect();
                Ok(AdminRecord {
                    address: row.try_get("address")?,
                    started_at: row.try_get("started_at")?,
                    seen_at: row.try_get("seen_at")?,
                    owner,
                    partitions,
                })
            })
            .collect()
    }

    /// Forgets the admins not seen since `before_ms` (they died without leaving); how many.
    pub async fn forget_departed_admins(&self, before_ms: i64) -> Result<u64> {
        let done = query("delete from admins where seen_at < $1")
            .bind(before_ms)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected())
    }
}

/// A SQL condition (`and …`) that keeps the rows whose `id_column` falls in a partition `held`
/// holds: nothing when it holds them all, a condition no row meets when it holds none.
pub(super) fn partition_filter(held: &Held, id_column: &str) -> String {
    if held.is_all() {
        return String::new();
    }
    if held.is_empty() {
        return "and 1 = 0".to_owned();
    }
    let partitions = id_list(held.fences.keys().copied());
    format!("and (({id_column} * {SPREAD}) % {PARTITIONS}) in ({partitions})")
}

/// Of `partitions`, those `held` still holds with the fence it was planned under, read in the
/// caller's transaction and locked against a take until it commits.
pub(super) async fn held_now(
    exec: &mut Exec<'_>,
    dialect: Dialect,
    held: &Held,
    partitions: &BTreeSet<u16>,
) -> Result<HashSet<u16>> {
    if partitions.is_empty() {
        return Ok(HashSet::new());
    }
    let lock = match dialect {
        Dialect::Postgres => " for share",
        Dialect::Mysql => " lock in share mode",
        Dialect::Sqlite => "",
    };
    let p = exec.placeholder();
    let mut statement = Statement::new(format!(
        "select id, fence from partitions where owner = {} and id in ({}){lock}",
        p(1),
        id_list(partitions.iter().copied())
    ));
    statement.bind(held.owner.as_str());
    let rows = exec.fetch_all(&statement).await?;
    let mut now_held = HashSet::with_capacity(rows.len());
    for row in &rows {
        let partition = partition_of(row)?;
        if held.holds(partition, row.required_int("fence")?) {
            now_held.insert(partition);
        }
    }
    Ok(now_held)
}

/// The admin a beat is of.
struct BeatingAdmin {
    owner: String,
    address: String,
    member: String,
    started_at: i64,
}

/// What [`beat_in`] read, and the sessions held (read after it, outside SQLite).
struct BeatRead {
    live: Vec<String>,
    predecessors: Vec<String>,
    leases: Vec<Lease>,
    sessions: HashSet<String>,
}

/// A beat's statements ([`Db::beat_partitions`]) through `exec`, in the caller's transaction.
async fn beat_in(
    exec: &mut Exec<'_>,
    admin: &BeatingAdmin,
    now_ms: i64,
    lease_ms: i64,
) -> Result<BeatRead> {
    let p = exec.placeholder();
    let mut insert = Statement::new(format!(
        "insert into admins (owner, address, member, started_at, seen_at)
         values ({}, {}, {}, {}, {})
         on conflict (owner) do update set address = excluded.address,
             seen_at = excluded.seen_at",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    ));
    insert
        .bind(admin.owner.as_str())
        .bind(admin.address.as_str())
        .bind(admin.member.as_str())
        .bind(admin.started_at)
        .bind(now_ms);
    exec.fetch_all(&insert).await?;
    let mut predecessors = Vec::new();
    if !admin.member.is_empty() {
        let mut forget = Statement::new(format!(
            "delete from admins where member = {} and owner <> {} and started_at <= {}
             returning owner",
            p(1),
            p(2),
            p(3)
        ));
        forget.bind(admin.member.as_str()).bind(admin.owner.as_str()).bind(admin.started_at);
        for row in exec.fetch_all(&forget).await? {
            predecessors.push(row.required_text("owner")?);
        }
    }
    let mut renew = Statement::new(format!(
        "update partitions set lease_until = {} where owner = {}",
        p(1),
        p(2)
    ));
    renew.bind(now_ms + lease_ms).bind(admin.owner.as_str());
    exec.fetch_all(&renew).await?;
    let mut live = Statement::new(format!(
        "select owner from admins where seen_at >= {} order by owner",
        p(1)
    ));
    live.bind(now_ms - lease_ms);
    let live = exec.fetch_all(&live).await?;
    let live = live.iter().map(|row| row.required_text("owner")).collect::<Result<Vec<_>>>()?;
    let leases = read_leases(exec).await?;
    Ok(BeatRead { live, predecessors, leases, sessions: HashSet::new() })
}

async fn read_leases(exec: &mut Exec<'_>) -> Result<Vec<Lease>> {
    let statement =
        Statement::new("select id, owner, fence, lease_until from partitions order by id");
    let rows = exec.fetch_all(&statement).await?;
    rows.iter()
        .map(|row| {
            Ok(Lease {
                partition: partition_of(row)?,
                owner: row.text("owner")?,
                fence: row.required_int("fence")?,
                until_ms: row.required_int("lease_until")?,
            })
        })
        .collect()
}

fn partition_of(row: &impl Cells) -> Result<u16> {
    let id = row.required_int("id")?;
    u16::try_from(id)
        .ok()
        .filter(|partition| *partition < PARTITIONS)
        .ok_or_else(|| super::StorageError::Corrupt(format!("partition {id}")))
}

/// Partition numbers as a SQL list: they are ours, never input, so they go in as literals.
fn id_list(partitions: impl Iterator<Item = u16>) -> String {
    partitions.map(|partition| partition.to_string()).collect::<Vec<_>>().join(", ")
}
