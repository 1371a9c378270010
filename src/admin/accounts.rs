//! Console accounts: password hashes, the secrets of sessions and API tokens, login with its
//! throttle, users made from the command line, and the audit trail's one writer.
//!
//! Passwords are hashed with argon2id (the crate's defaults: 19 MiB, 2 passes) on a blocking
//! thread. Session and API tokens are 256-bit random values; the database keeps their sha256, so
//! a copy of it opens no session. HTTP concerns (cookies, CSRF, status codes) stay in `http` and
//! `console`; this module answers with plain results.
//!
//! A login is bounded before it is authenticated: at most [`PasswordChecks`]' limit of
//! password checks run at once (about one per core), and an attempt beyond them is refused at
//! once ([`LoginError::Busy`]), never queued. An attempt is counted as a failure, in the
//! statement that decides the lock, before its password is checked; a success clears the count.
//! So parallel wrong guesses cannot each read the count from before the others: the fifth locks
//! the rest out, for 30 s, doubling with each further failure up to [`MAX_LOCK_MS`].

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use super::now_ms;
use crate::access::{Principal, Role};
use crate::config::NewUserConfig;
use crate::storage::{AuditEntry, Db, LoginLocks, User};

/// How long a browser session lasts, from login: 12 hours.
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;
/// The shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 10;
/// Failed logins in a row after which a user is locked for a while.
const LOCK_AFTER_FAILURES: i64 = 5;
/// The first lock lasts this long (ms); each further failure doubles it, up to [`MAX_LOCK_MS`].
const FIRST_LOCK_MS: i64 = 30_000;
/// The longest lock: 15 minutes, so that a stranger's guesses cannot keep a user out for long.
pub const MAX_LOCK_MS: i64 = 15 * 60 * 1000;
/// How long a client refused for [`LoginError::Busy`] is told to wait, in seconds.
pub const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// The bound on password checks running at once, each about 19 MiB of memory and tens of
/// milliseconds of a core. It also remembers the most that ran at once.
#[derive(Debug)]
pub struct PasswordChecks {
    limit: usize,
    running: AtomicUsize,
    high_water: AtomicUsize,
}

/// A password check's place in [`PasswordChecks`], given back when dropped.
struct CheckSlot<'a>(&'a PasswordChecks);

impl PasswordChecks {
    /// At most `limit` checks at once (at least one).
    pub fn new(limit: usize) -> PasswordChecks {
        PasswordChecks {
            limit: limit.max(1),
            running: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
        }
    }

    /// One check per core of this machine.
    pub fn per_core() -> PasswordChecks {
        PasswordChecks::new(std::thread::available_parallelism().map_or(2, usize::from))
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The most checks that ran at once so far.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }

    /// A place for one check, or `None` when the bound is reached.
    fn try_enter(&self) -> Option<CheckSlot<'_>> {
        let taken = self.running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
            (running < self.limit).then_some(running + 1)
        });
        let before = taken.ok()?;
        self.high_water.fetch_max(before + 1, Ordering::Relaxed);
        Some(CheckSlot(self))
    }
}

impl Drop for CheckSlot<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a login was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Unknown name or wrong password (the caller is not told which).
    #[error("wrong user name or password")]
    Refused,
    /// Too many failures: no attempt is checked until the lock ends.
    #[error("too many failed logins: try again in {} s", (.retry_after_ms + 999) / 1000)]
    Locked {
        /// How long the lock still lasts.
        retry_after_ms: i64,
    },
    /// As many password checks as the bound allows are running: try again shortly.
    #[error("too many logins at once: try again in {BUSY_RETRY_AFTER_SECS} s")]
    Busy,
    /// The database failed.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// The principal a user acts as.
pub fn principal(user: &User) -> Principal {
    Principal {
        user_id: Some(user.id),
        name: user.name.clone(),
        role: user.role,
        group_ids: user.group_ids.clone(),
    }
}

/// A new random secret: `prefix` and 64 hex digits.
pub fn new_secret(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// What the database keeps of a session or API token.
pub fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Hashes `password` with argon2id, on a blocking thread.
pub async fn hash_password(password: &str) -> anyhow::Result<String> {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
            .map_err(|error| anyhow::anyhow!("salt: {error}"))?;
        let hash = Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map_err(|error| anyhow::anyhow!("hashing a password: {error}"))?;
        Ok(hash.to_string())
    })
    .await
    .context("the password hashing thread")?
}

/// Whether `password` matches `hash`, on a blocking thread. A hash that cannot be read
/// matches nothing.
pub async fn verify_password(password: &str, hash: &str) -> anyhow::Result<bool> {
    let (password, hash) = (password.to_owned(), hash.to_owned());
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash).is_ok_and(|parsed| {
            Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok()
        })
    })
    .await
    .context("the password hashing thread")
}

/// Checks a new user's name: 1 to 64 letters, digits, `.`, `_`, `-` or `@`.
pub fn check_user_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || ".-_@".contains(c));
    if ok { Ok(()) } else { Err("name: 1 to 64 letters, digits, '.', '-', '_' or '@'".to_owned()) }
}

/// Checks a new password: long enough, not absurdly long, no NUL.
pub fn check_password(password: &str) -> Result<(), String> {
    if password.chars().count() < MIN_PASSWORD_LEN || password.len() > 1024 {
        return Err(format!("password: {MIN_PASSWORD_LEN} to 1024 characters"));
    }
    if password.contains('\0') {
        return Err("password: NUL characters are not allowed".to_owned());
    }
    Ok(())
}

/// Checks `name` and `password` and opens a session, counting failures and recording the
/// outcome in the audit log. `source` is the client's address. The check takes a place in
/// `checks` or is refused as [`LoginError::Busy`]; the attempt is counted before the password
/// is checked. The session's token comes back for the cookie; the database keeps only its hash.
pub async fn login(
    db: &Db,
    checks: &PasswordChecks,
    name: &str,
    password: &str,
    source: &str,
) -> Result<String, LoginError> {
    let Some(_slot) = checks.try_enter() else {
        return Err(LoginError::Busy);
    };
    let now = now_ms();
    let user = db.get_user_by_name(name).await.map_err(anyhow::Error::from)?;
    let Some(user) = user else {
        // Spend the time a real check takes, so that timing does not tell which names exist.
        verify_password(password, dummy_hash()).await?;
        audit_login(db, name, None, source, "login.failed").await;
        return Err(LoginError::Refused);
    };
    let locks = LoginLocks {
        lock_after: LOCK_AFTER_FAILURES,
        first_lock_ms: FIRST_LOCK_MS,
        max_lock_ms: MAX_LOCK_MS,
    };
    let counted = db.count_login_attempt(user.id, now, &locks).await;
    if counted.map_err(anyhow::Error::from)?.is_none() {
        let locked = db.get_user(user.id).await.map_err(anyhow::Error::from)?;
        let until_ms = locked.map_or(now, |user| user.locked_until_ms);
        audit_login(db, name, Some(user.id), source, "login.locked").await;
        return Err(LoginError::Locked { retry_after_ms: (until_ms - now).max(1) });
    }
    if !verify_password(password, &user.password_hash).await? {
        audit_login(db, name, Some(user.id), source, "login.failed").await;
        return Err(LoginError::Refused);
    }
    db.clear_failed_logins(user.id).await.map_err(anyhow::Error::from)?;
    let token = new_secret("");
    let csrf_token = new_secret("");
    db.create_session(&secret_hash(&token), user.id, &csrf_token, now, now + SESSION_TTL_MS)
        .await
        .map_err(anyhow::Error::from)?;
    audit_login(db, name, Some(user.id), source, "login").await;
    Ok(token)
}

/// The hash checked for names that do not exist.
fn dummy_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let salt = SaltString::encode_b64(&[7u8; 16]).expect("16 bytes make a valid salt");
        Argon2::default()
            .hash_password(b"not a password of anyone", &salt)
            .map(|hash| hash.to_string())
            .unwrap_or_default()
    })
}

async fn audit_login(db: &Db, name: &str, user_id: Option<i64>, source: &str, action: &str) {
    let entry = AuditEntry {
        actor: name.chars().take(64).collect(),
        user_id,
        source: source.to_owned(),
        action: action.to_owned(),
        target: format!("user {}", name.chars().take(64).collect::<String>()),
        before_json: None,
        after_json: None,
    };
    record(db, &entry).await;
}

/// Appends `entry` to the audit log. The change it records has happened, so a failure to
/// record it cannot undo it: it is logged as an error for someone to look at.
pub async fn record(db: &Db, entry: &AuditEntry) {
    if let Err(error) = db.record_audit(entry, now_ms()).await {
        tracing::error!(%error, audit.action = %entry.action, "could not record `{}` on {} in the audit log", entry.action, entry.target);
    }
}

/// Records that `principal`, from `source`, did `action` on `target`, with the thing's JSON
/// before and after where the caller has it.
pub async fn audit(
    db: &Db,
    principal: &Principal,
    source: &str,
    action: &str,
    target: String,
    before: Option<String>,
    after: Option<String>,
) {
    record(db, &entry(principal, source, action, target, before, after)).await;
}

/// The audit entry of `principal`, from `source`, doing `action` on `target`, for a write that
/// records it in its own transaction.
pub fn entry(
    principal: &Principal,
    source: &str,
    action: &str,
    target: String,
    before: Option<String>,
    after: Option<String>,
) -> AuditEntry {
    AuditEntry {
        actor: principal.name.clone(),
        user_id: principal.user_id,
        source: source.to_owned(),
        action: action.to_owned(),
        target,
        before_json: before,
        after_json: after,
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// `wasmjob user create`: adds a user to the database of `config`, with the password read from
/// the terminal (asked twice, not echoed) or from the first line of standard input.
pub async fn create_user_from_cli(config: NewUserConfig) -> anyhow::Result<()> {
    let password = read_password(&config.name)?;
    check_password(&password).map_err(anyhow::Error::msg)?;
    let db = Db::connect(&config.database_url).await?;
    let created = create_user_in(&db, &config, &password).await;
    db.close().await;
    let user = created?;
    tracing::info!("created {} `{}` (user {})", user.role, user.name, user.id);
    Ok(())
}

async fn create_user_in(db: &Db, config: &NewUserConfig, password: &str) -> anyhow::Result<User> {
    let groups = db.list_groups().await?;
    let mut group_ids = Vec::new();
    for name in &config.groups {
        let group =
            groups.iter().find(|group| group.app_name == *name || group.id.to_string() == *name);
        let group = group.with_context(|| format!("there is no group `{name}`"))?;
        group_ids.push(group.id);
    }
    let hash = hash_password(password).await?;
    let user = db.create_user(&config.name, &hash, config.role, &group_ids, now_ms()).await;
    let user = match user {
        Err(error) if error.is_constraint_violation() => {
            anyhow::bail!("a user called `{}` exists already", config.name)
        }
        other => other?,
    };
    let after = serde_json::json!({"name": user.name, "role": user.role.as_str(), "group_ids": user.group_ids});
    let cli = Principal {
        user_id: None,
        name: "command-line".to_owned(),
        role: Role::Admin,
        group_ids: Vec::new(),
    };
    audit(
        db,
        &cli,
        "",
        "user.create",
        format!("user {}", user.name),
        None,
        Some(after.to_string()),
    )
    .await;
    Ok(user)
}

fn read_password(name: &str) -> anyhow::Result<String> {
    if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("Password for {name}: "))?;
        let again = rpassword::prompt_password("The same password again: ")?;
        if first != again {
            anyhow::bail!("the two passwords differ");
        }
        return Ok(first);
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).context("reading the password from standard input")?;
    Ok(line.trim_end_matches(['\n', '\r']).to_owned())
}
