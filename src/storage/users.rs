//! Console users, their browser sessions and personal API tokens.
//!
//! Secrets arrive hashed: the caller hashes passwords (argon2id) and tokens (sha256); nothing
//! here sees a secret in clear. Deleting a user deletes its sessions and tokens in the same
//! transaction (SQLite runs without foreign-key enforcement, so no cascade does it for us).

use super::query::query;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Db, Result, StorageError, parse_column, split_list};
use crate::access::Role;

const COLUMNS: &str =
    "id, name, password_hash, role, group_ids, failed_logins, locked_until, created_at";

/// When failed logins lock a user: from `lock_after` failures in a row, for `first_lock_ms`,
/// doubled by each further failure up to `max_lock_ms`.
#[derive(Debug, Clone, Copy)]
pub struct LoginLocks {
    /// The failures in a row that lock.
    pub lock_after: i64,
    /// The first lock (ms).
    pub first_lock_ms: i64,
    /// The longest lock (ms).
    pub max_lock_ms: i64,
}

/// A console user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Its id.
    pub id: i64,
    /// The login name, unique.
    pub name: String,
    /// The argon2id hash in PHC format.
    pub password_hash: String,
    /// What it may do.
    pub role: Role,
    /// For an operator, the groups it may change.
    pub group_ids: Vec<i64>,
    /// Failed logins since the last success.
    pub failed_logins: i64,
    /// Logins are refused until then (ms), after too many failures.
    pub locked_until_ms: i64,
    /// When it was created (ms).
    pub created_at_ms: i64,
}

/// A browser session, found by its token's hash.
#[derive(Debug, Clone)]
pub struct Session {
    /// Whose it is.
    pub user: User,
    /// The token forms and scripts send back with every change.
    pub csrf_token: String,
    /// When it ends (ms).
    pub expires_at_ms: i64,
}

/// A personal API token (its hash stays in the database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Its id.
    pub id: i64,
    /// The owner.
    pub user_id: i64,
    /// What the owner called it.
    pub name: String,
    /// When it was created (ms).
    pub created_at_ms: i64,
    /// When it was last used (ms), 0 if never.
    pub last_used_at_ms: i64,
}

impl Db {
    /// Creates a user; a name in use is a constraint violation.
    pub async fn create_user(
        &self,
        name: &str,
        password_hash: &str,
        role: Role,
        group_ids: &[i64],
        now_ms: i64,
    ) -> Result<User> {
        let row = query(&format!(
            "insert into users (name, password_hash, role, group_ids, created_at, updated_at)
             values ($1, $2, $3, $4, $5, $5) returning {COLUMNS}"
        ))
        .bind(name)
        .bind(password_hash)
        .bind(role.as_str())
        .bind(join_ids(group_ids))
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        user_from_row(&row)
    }

    /// User `id`, if it exists.
    pub async fn get_user(&self, id: i64) -> Result<Option<User>> {
        let row = query(&format!("select {COLUMNS} from users where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// The user called `name`, if there is one.
    pub async fn get_user_by_name(&self, name: &str) -> Result<Option<User>> {
        let row = query(&format!("select {COLUMNS} from users where name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// All users, by id.
    pub async fn list_users(&self) -> Result<Vec<User>> {
        let rows = query(&format!("select {COLUMNS} from users order by id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(user_from_row).collect()
    }

    /// How many users there are (none on a fresh install).
    pub async fn count_users(&self) -> Result<i64> {
        let row = query("select count(*) as n from users").fetch_one(&self.pool).await?;
        Ok(row.try_get("n")?)
    }

    /// Sets user `id`'s role and groups; the user, or `None` if it does not exist.
    pub async fn set_user_role(
        &self,
        id: i64,
        role: Role,
        group_ids: &[i64],
        now_ms: i64,
    ) -> Result<Option<User>> {
        let row = query(&format!(
            "update users set role = $1, group_ids = $2, updated_at = $3 where id = $4
             returning {COLUMNS}"
        ))
        .bind(role.as_str())
        .bind(join_ids(group_ids))
        .bind(now_ms)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// Replaces user `id`'s password hash and ends its sessions. Whether it exists.
    pub async fn set_user_password(
        &self,
        id: i64,
        password_hash: &str,
        now_ms: i64,
    ) -> Result<bool> {
        let mut tx = self.writer().begin().await?;
        query("delete from sessions where user_id = $1").bind(id).execute(&mut *tx).await?;
        let done = query(
            "update users set password_hash = $1, failed_logins = 0, locked_until = 0,
             updated_at = $2 where id = $3",
        )
        .bind(password_hash)
        .bind(now_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes user `id` with its sessions and tokens. Whether it existed.
    pub async fn delete_user(&self, id: i64) -> Result<bool> {
        let mut tx = self.writer().begin().await?;
        query("delete from sessions where user_id = $1").bind(id).execute(&mut *tx).await?;
        query("delete from api_tokens where user_id = $1").bind(id).execute(&mut *tx).await?;
        let done = query("delete from users where id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Counts a login attempt of user `id` at `now_ms` as a failure, and locks the user as
    /// `locks` says for the new count, in one statement, unless the user is locked already:
    /// then nothing changes and the answer is `None`. Otherwise the new count: the attempt may
    /// go on to check the password, and a success clears the count ([`Db::clear_failed_logins`]).
    ///
    /// Counted before the check, in the statement that decides the lock, parallel attempts each
    /// see the count of those before them: the one that reaches the threshold locks the others
    /// out, instead of each reading the count before any was recorded.
    pub async fn count_login_attempt(
        &self,
        id: i64,
        now_ms: i64,
        locks: &LoginLocks,
    ) -> Result<Option<i64>> {
        // The lock per count, from the threshold up, doubling to the cap: a handful of cases
        // written from the constants, so that both dialects read the same statement.
        let mut lock = String::from("case");
        let mut lock_ms = locks.first_lock_ms;
        let mut failures = locks.lock_after;
        while lock_ms < locks.max_lock_ms {
            lock.push_str(&format!(" when failed_logins + 1 = {failures} then $2 + {lock_ms}"));
            lock_ms = lock_ms.saturating_mul(2);
            failures += 1;
        }
        lock.push_str(&format!(
            " when failed_logins + 1 >= {failures} then $2 + {} else 0 end",
            locks.max_lock_ms
        ));
        // The lock first: it reads the old count, and MySQL evaluates assignments in order.
        let row = query(&format!(
            "update users set locked_until = {lock}, failed_logins = failed_logins + 1
             where id = $1 and locked_until <= $2 returning failed_logins"
        ))
        .bind(id)
        .bind(now_ms)
        .fetch_optional(self.writer())
        .await?;
        row.map(|row| Ok(row.try_get("failed_logins")?)).transpose()
    }

    /// Forgets user `id`'s failed logins (after a successful one).
    pub async fn clear_failed_logins(&self, id: i64) -> Result<()> {
        query("update users set failed_logins = 0, locked_until = 0 where id = $1")
            .bind(id)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    /// Opens a session for user `user_id` until `expires_at_ms`, and drops expired ones.
    pub async fn create_session(
        &self,
        token_hash: &str,
        user_id: i64,
        csrf_token: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<()> {
        let mut tx = self.writer().begin().await?;
        query("delete from sessions where expires_at <= $1").bind(now_ms).execute(&mut *tx).await?;
        query(
            "insert into sessions (token_hash, user_id, csrf_token, created_at, expires_at)
             values ($1, $2, $3, $4, $5)",
        )
        .bind(token_hash)
        .bind(user_id)
        .bind(csrf_token)
        .bind(now_ms)
        .bind(expires_at_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The live session whose token hashes to `token_hash`, with its user.
    pub async fn get_session(&self, token_hash: &str, now_ms: i64) -> Result<Option<Session>> {
        let user_columns = COLUMNS.split(", ").map(|c| format!("u.{c}")).collect::<Vec<_>>();
        let row = query(&format!(
            "select {}, s.csrf_token, s.expires_at from sessions s join users u on u.id = s.user_id
             where s.token_hash = $1 and s.expires_at > $2",
            user_columns.join(", ")
        ))
        .bind(token_hash)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Session {
            user: user_from_row(&row)?,
            csrf_token: row.try_get("csrf_token")?,
            expires_at_ms: row.try_get("expires_at")?,
        }))
    }

    /// Ends the session whose token hashes to `token_hash`. Whether there was one.
    pub async fn delete_session(&self, token_hash: &str) -> Result<bool> {
        let done = query("delete from sessions where token_hash = $1")
            .bind(token_hash)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Stores a personal API token of user `user_id`.
    pub async fn create_api_token(
        &self,
        user_id: i64,
        name: &str,
        token_hash: &str,
        now_ms: i64,
    ) -> Result<ApiToken> {
        let row = query(
            "insert into api_tokens (user_id, name, token_hash, created_at) values ($1, $2, $3, $4)
             returning id, user_id, name, created_at, last_used_at",
        )
        .bind(user_id)
        .bind(name)
        .bind(token_hash)
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        token_from_row(&row)
    }

    /// User `user_id`'s API tokens, by id.
    pub async fn list_api_tokens(&self, user_id: i64) -> Result<Vec<ApiToken>> {
        let rows = query(
            "select id, user_id, name, created_at, last_used_at from api_tokens
             where user_id = $1 order by id",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(token_from_row).collect()
    }

    /// Revokes token `id` of user `user_id`. Whether it existed.
    pub async fn delete_api_token(&self, user_id: i64, id: i64) -> Result<bool> {
        let done = query("delete from api_tokens where id = $1 and user_id = $2")
            .bind(id)
            .bind(user_id)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The user of the API token that hashes to `token_hash`, noting its use. The use is
    /// written at most once a minute per token, so a busy script does not queue a write per
    /// request behind the scheduler's.
    pub async fn get_api_token_user(&self, token_hash: &str, now_ms: i64) -> Result<Option<User>> {
        let row = query("select user_id, last_used_at from api_tokens where token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let last_used_at: i64 = row.try_get("last_used_at")?;
        if last_used_at == 0 || now_ms - last_used_at >= 60_000 {
            query("update api_tokens set last_used_at = $1 where token_hash = $2")
                .bind(now_ms)
                .bind(token_hash)
                .execute(self.writer())
                .await?;
        }
        self.get_user(row.try_get("user_id")?).await
    }
}

fn join_ids(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn user_from_row(row: &AnyRow) -> Result<User> {
    let group_ids: String = row.try_get("group_ids")?;
    let group_ids = split_list(&group_ids)
        .map(|id| id.parse().map_err(|_| StorageError::Corrupt(format!("group_ids: `{id}`"))))
        .collect::<Result<Vec<i64>>>()?;
    Ok(User {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        password_hash: row.try_get("password_hash")?,
        role: parse_column(row, "role")?,
        group_ids,
        failed_logins: row.try_get("failed_logins")?,
        locked_until_ms: row.try_get("locked_until")?,
        created_at_ms: row.try_get("created_at")?,
    })
}

fn token_from_row(row: &AnyRow) -> Result<ApiToken> {
    Ok(ApiToken {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        name: row.try_get("name")?,
        created_at_ms: row.try_get("created_at")?,
        last_used_at_ms: row.try_get("last_used_at")?,
    })
}
