//! The callback inbox (migration 0022): executors' callbacks acknowledged before all their
//! results were applied (`admin::dispatch::inbox` decides when, and applies them).
//!
//! A row holds a callback's body as it came, the admin applying it (`owner`) and until when that
//! admin has it (`taken_until`). Its owner deletes it once every result is applied. A row whose
//! owner is gone, or whose time ran out, is taken by a compare-and-set on both columns, so two
//! admins that look at once take it once; and since a result applies once, a row applied twice
//! (an owner that was only slow) changes nothing the second time.
//!
//! On SQLite the hot writes (recording a row, deleting it) go to the group commit's own
//! connection (`sqlite_writer.rs`), as the fires do: a commit through the sqlx writer would
//! empty that connection's page cache.

use sqlx::Row as _;

use super::query::query;
use super::statement::{Exec, Row, Statement};
use super::{Db, Result};

/// A recorded callback that an admin took to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCallback {
    /// The row's id.
    pub id: i64,
    /// The callback's body, as the executor sent it.
    pub body: String,
}

/// A row of the inbox as the takers read it, without its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    /// The row's id.
    pub id: i64,
    /// The admin applying it.
    pub owner: String,
    /// Until when (ms) that admin has it.
    pub taken_until_ms: i64,
    /// How many results its callback carried.
    pub results: i64,
}

impl Db {
    /// Records callback `body` of `results` results as row `id`, taken by `owner` until
    /// `taken_until_ms`. Fails if row `id` exists.
    pub async fn record_callback(
        &self,
        id: i64,
        body: String,
        results: i64,
        owner: &str,
        now_ms: i64,
        taken_until_ms: i64,
    ) -> Result<()> {
        let owner = owner.to_owned();
        self.inbox_write(move |placeholder| {
            let mut statement = Statement::new(format!(
                "insert into callback_inbox (id, owner, taken_until, received_at, results, body)
                 values ({}, {}, {}, {}, {}, {})",
                placeholder(1),
                placeholder(2),
                placeholder(3),
                placeholder(4),
                placeholder(5),
                placeholder(6)
            ));
            statement.bind(id).bind(owner).bind(taken_until_ms).bind(now_ms).bind(results);
            statement.bind(body);
            statement
        })
        .await
    }

    /// Deletes row `id`: every result of its callback was applied.
    pub async fn forget_callback(&self, id: i64) -> Result<()> {
        self.inbox_write(move |placeholder| {
            let mut statement =
                Statement::new(format!("delete from callback_inbox where id = {}", placeholder(1)));
            statement.bind(id);
            statement
        })
        .await
    }

    /// The rows that may be taken at `now_ms`: those of the admins `gone`, and those whose
    /// time ran out (whoever's), oldest first, at most `limit`.
    pub async fn takeable_callbacks(
        &self,
        gone: &[String],
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<InboxEntry>> {
        let mut sql =
            "select id, owner, taken_until, results from callback_inbox where taken_until < $1"
                .to_owned();
        for at in 0..gone.len() {
            sql.push_str(&format!(" or owner = ${}", at + 3));
        }
        sql.push_str(" order by received_at, id limit $2");
        let mut select = query(&sql).bind(now_ms).bind(limit);
        for gone in gone {
            select = select.bind(gone.as_str());
        }
        let rows = select.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(InboxEntry {
                    id: row.try_get("id")?,
                    owner: row.try_get("owner")?,
                    taken_until_ms: row.try_get("taken_until")?,
                    results: row.try_get("results")?,
                })
            })
            .collect()
    }

    /// Takes `entry` for `owner` until `taken_until_ms` if it is still as read, and returns its
    /// callback; `None` when another admin took it, or its owner deleted it, since.
    pub async fn take_callback(
        &self,
        entry: &InboxEntry,
        owner: &str,
        taken_until_ms: i64,
    ) -> Result<Option<RecordedCallback>> {
        let taken = query(
            "update callback_inbox set owner = $1, taken_until = $2
             where id = $3 and owner = $4 and taken_until = $5",
        )
        .bind(owner)
        .bind(taken_until_ms)
        .bind(entry.id)
        .bind(entry.owner.as_str())
        .bind(entry.taken_until_ms)
        .execute(self.writer())
        .await?;
        if taken.rows_affected() == 0 {
            return Ok(None);
        }
        let row = query("select body from callback_inbox where id = $1 and owner = $2")
            .bind(entry.id)
            .bind(owner)
            .fetch_optional(self.writer())
            .await?;
        row.map(|row| Ok(RecordedCallback { id: entry.id, body: row.try_get("body")? })).transpose()
    }

    /// Gives back `owner`'s rows, stopping: any admin may take them now. How many it gave back.
    pub async fn release_callbacks(&self, owner: &str) -> Result<u64> {
        let released = query("update callback_inbox set taken_until = 0 where owner = $1")
            .bind(owner)
            .execute(self.writer())
            .await?;
        Ok(released.rows_affected())
    }

    /// How many rows the inbox holds, and how many results they carry.
    pub async fn count_recorded_callbacks(&self) -> Result<(i64, i64)> {
        let row = query(
            "select count(*) as n, cast(coalesce(sum(results), 0) as bigint) as results
             from callback_inbox",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("n")?, row.try_get("results")?))
    }

    /// Runs the one statement `build` makes (given the dialect's placeholder) as a transaction
    /// of its own: on SQLite on the group commit's connection, elsewhere on the writer pool.
    async fn inbox_write(
        &self,
        build: impl FnOnce(fn(usize) -> String) -> Statement<'static> + Send + 'static,
    ) -> Result<()> {
        match &self.sqlite_writer {
            Some(writer) => {
                let write = move |exec: &mut Exec<'_>| {
                    let statement = build(exec.placeholder());
                    super::sqlite_writer::ready(exec.fetch_all(&statement)).map(drop)
                };
                writer.write(self.writer(), write).await
            }
            None => {
                let mut conn = self.writer().acquire().await?;
                let mut exec = Exec::Sqlx(&mut conn);
                let statement = build(exec.placeholder());
                exec.fetch_all(&statement).await.map(|_: Vec<Row>| ())
            }
        }
    }
}
