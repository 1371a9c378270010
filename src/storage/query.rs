//! A statement written once, in the SQL PostgreSQL and SQLite both accept, run on any of the
//! three dialects. On PostgreSQL and SQLite its text goes to sqlx unchanged. On MySQL and MariaDB
//! it is translated first, once per text ([`translate`]):
//!
//! - `$n` placeholders become `?`, and the arguments are bound again in the order the `?`s take
//!   them (a `$n` may appear twice, or before a lower one);
//! - `cast(… as bigint)` becomes `cast(… as signed)`, `length(` becomes `char_length(`;
//! - `on conflict (…) do nothing` becomes `insert ignore`, and `on conflict (…) do update set`
//!   becomes `on duplicate key update` with `excluded.c` read as `values(c)`;
//! - MariaDB has `insert … returning` and `delete … returning` but no `update … returning`: an
//!   `update t set … where … returning …` runs as three statements in one transaction (or
//!   savepoint): the keys of the matching rows are selected and locked (`for update`), those
//!   rows are updated, and read back. A table's key is `id`, or its columns in [`KEYS`].
//! - MariaDB does not name the columns of a prepared `… returning` statement (sqlx's rows would
//!   have none): those run unprepared, their arguments written into the text as literals
//!   ([`literal`], which no argument can break out of).
//!
//! Two rules keep the statements portable: a `limit` inside `in (…)` is wrapped in a derived
//! table (`id in (select id from (select … limit $1) as d)`), which MariaDB requires; and sums are
//! cast (`cast(sum(x) as bigint)`), since MariaDB's sums are decimals, which `Any` rows lack.
//!
//! MariaDB sends `text` columns as blobs, which sqlx's `Any` rows hold as bytes: the rows read
//! here hold them as text again, except [`BINARY_COLUMNS`].
//!
//! The call sites read like sqlx's own `query(…).bind(…).fetch_one(…)`, over a pool or a
//! connection (a transaction's included).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use sqlx::any::{AnyArguments, AnyQueryResult, AnyRow};
use sqlx::error::BoxDynError;
use sqlx::{Acquire, Any, AnyConnection, AnyPool, Arguments, Encode, Type};
use sqlx_core::any::{AnyArgumentBuffer, AnyTypeInfoKind, AnyValueKind};

/// Where a [`Query`] runs: a pool, or a connection (a transaction's included).
pub(super) enum On<'c> {
    Pool(&'c AnyPool),
    Connection(&'c mut AnyConnection),
}

impl<'c> From<&'c AnyPool> for On<'c> {
    fn from(pool: &'c AnyPool) -> Self {
        On::Pool(pool)
    }
}

impl<'c> From<&'c mut AnyConnection> for On<'c> {
    fn from(conn: &'c mut AnyConnection) -> Self {
        On::Connection(conn)
    }
}

/// A statement and its arguments, in the order of their `$n`.
pub(super) struct Query<'q> {
    sql: &'q str,
    args: std::result::Result<AnyArguments<'q>, BoxDynError>,
}

/// A statement of text `sql` (see the module's opening).
pub(super) fn query(sql: &str) -> Query<'_> {
    Query { sql, args: Ok(AnyArguments::default()) }
}

impl<'q> Query<'q> {
    /// Binds the next argument (`$1`, then `$2`, …).
    pub(super) fn bind<T>(mut self, value: T) -> Self
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        if let Ok(args) = &mut self.args
            && let Err(error) = args.add(value)
        {
            self.args = Err(error);
        }
        self
    }

    /// Runs the statement and returns its rows.
    pub(super) async fn fetch_all<'c>(self, on: impl Into<On<'c>>) -> sqlx::Result<Vec<AnyRow>> {
        let args = self.args.map_err(sqlx::Error::Encode)?;
        match on.into() {
            On::Pool(pool) => fetch_all(self.sql, args, &mut *pool.acquire().await?).await,
            On::Connection(conn) => fetch_all(self.sql, args, conn).await,
        }
    }

    /// Runs the statement and returns its first row, if any.
    pub(super) async fn fetch_optional<'c>(
        self,
        on: impl Into<On<'c>>,
    ) -> sqlx::Result<Option<AnyRow>> {
        Ok(self.fetch_all(on).await?.into_iter().next())
    }

    /// Runs the statement and returns its first row, or `RowNotFound`.
    pub(super) async fn fetch_one<'c>(self, on: impl Into<On<'c>>) -> sqlx::Result<AnyRow> {
        self.fetch_optional(on).await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs the statement and returns how many rows it changed.
    pub(super) async fn execute<'c>(self, on: impl Into<On<'c>>) -> sqlx::Result<AnyQueryResult> {
        let args = self.args.map_err(sqlx::Error::Encode)?;
        match on.into() {
            On::Pool(pool) => execute(self.sql, args, &mut *pool.acquire().await?).await,
            On::Connection(conn) => execute(self.sql, args, conn).await,
        }
    }
}

async fn fetch_all(
    sql: &str,
    args: AnyArguments<'_>,
    conn: &mut AnyConnection,
) -> sqlx::Result<Vec<AnyRow>> {
    if !is_mysql(conn) {
        return sqlx::query_with(sql, args).fetch_all(conn).await;
    }
    let rows = match &*translate(sql) {
        Translated::Plain(statement) if statement.returning => {
            let text = statement.interpolated(&args);
            sqlx::Executor::fetch_all(conn, sqlx::raw_sql(&text)).await?
        }
        Translated::Plain(statement) => {
            sqlx::query_with(&statement.text, statement.args(&args)).fetch_all(conn).await?
        }
        Translated::UpdateReturning(update) => return update.run(conn, &args).await,
    };
    Ok(rows.into_iter().map(text_from_blobs).collect())
}

async fn execute(
    sql: &str,
    args: AnyArguments<'_>,
    conn: &mut AnyConnection,
) -> sqlx::Result<AnyQueryResult> {
    if !is_mysql(conn) {
        return sqlx::query_with(sql, args).execute(conn).await;
    }
    match &*translate(sql) {
        Translated::Plain(statement) if statement.returning => {
            let text = statement.interpolated(&args);
            sqlx::Executor::execute(conn, sqlx::raw_sql(&text)).await
        }
        Translated::Plain(statement) => {
            sqlx::query_with(&statement.text, statement.args(&args)).execute(conn).await
        }
        Translated::UpdateReturning(update) => {
            let rows = update.run(conn, &args).await?;
            Ok(AnyQueryResult { rows_affected: rows.len() as u64, last_insert_id: None })
        }
    }
}

/// The columns that hold bytes (a module's): every other blob MariaDB sends is a `text` column.
const BINARY_COLUMNS: [&str; 1] = ["bytes"];

/// `row` with its `text` columns, sent by MariaDB as blobs, as text.
fn text_from_blobs(mut row: AnyRow) -> AnyRow {
    for (column, value) in row.columns.iter_mut().zip(row.values.iter_mut()) {
        if BINARY_COLUMNS.contains(&&*column.name) {
            continue;
        }
        let text = match &mut value.kind {
            AnyValueKind::Blob(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
            AnyValueKind::Null(kind @ AnyTypeInfoKind::Blob) => {
                *kind = AnyTypeInfoKind::Text;
                None
            }
            _ => None,
        };
        if let Some(text) = text {
            value.kind = AnyValueKind::Text(text.into());
        }
        if column.type_info.kind == AnyTypeInfoKind::Blob {
            column.type_info.kind = AnyTypeInfoKind::Text;
        }
    }
    row
}

/// Whether `conn` is a MySQL or MariaDB connection.
pub(super) fn is_mysql(conn: &AnyConnection) -> bool {
    conn.backend_name() == <sqlx::MySql as sqlx::Database>::NAME
}

/// A statement's text for MySQL and MariaDB.
#[derive(Debug, PartialEq)]
pub(super) enum Translated {
    /// One statement.
    Plain(Numbered),
    /// An `update … returning`, run as three statements.
    UpdateReturning(UpdateReturning),
}

/// A text with `?` placeholders, and for each, the index of the argument it takes.
#[derive(Debug, PartialEq)]
pub(super) struct Numbered {
    pub text: String,
    pub order: Vec<usize>,
    /// Whether it returns rows from a write (`… returning`).
    pub returning: bool,
}

impl Numbered {
    /// The text with `args` written into it as literals.
    fn interpolated(&self, args: &AnyArguments<'_>) -> String {
        let mut text = String::with_capacity(self.text.len() + 16 * self.order.len());
        let mut order = self.order.iter().peekable();
        let mut quoted = false;
        for c in self.text.chars() {
            if c == '\'' {
                quoted = !quoted;
            }
            match order.next_if(|_| c == '?' && !quoted) {
                Some(at) => match args.values.0.get(*at) {
                    Some(value) => text.push_str(&literal(value)),
                    None => text.push_str("null"),
                },
                None => text.push(c),
            }
        }
        text
    }

    /// `args` in the order of this text's placeholders.
    fn args<'q>(&self, args: &AnyArguments<'q>) -> AnyArguments<'q> {
        let values = self.order.iter().filter_map(|at| args.values.0.get(*at).cloned());
        AnyArguments { values: AnyArgumentBuffer(values.collect()) }
    }
}

/// The tables whose key is not `id`, with their key's columns.
const KEYS: [(&str, &str); 1] = [("registry", "registry_group, registry_key, registry_value")];

/// The columns of `table`'s key.
fn key_of(table: &str) -> &'static str {
    KEYS.iter().find(|(name, _)| *name == table).map_or("id", |(_, key)| key)
}

/// `update t set s where w returning c`, as MariaDB runs it.
#[derive(Debug, PartialEq)]
pub(super) struct UpdateReturning {
    /// `select key from t where w for update`.
    pub select_keys: Numbered,
    /// `update t set s where (key) in (`, the keys and `)` to follow.
    pub update: Numbered,
    /// `select c from t where (key) in (`, the keys and `)` to follow.
    pub read_back: String,
    /// The key's columns, to order the rows read back.
    pub key: &'static str,
}

impl UpdateReturning {
    async fn run(
        &self,
        conn: &mut AnyConnection,
        args: &AnyArguments<'_>,
    ) -> sqlx::Result<Vec<AnyRow>> {
        let mut tx = conn.begin().await?;
        let keys = sqlx::query_with(&self.select_keys.text, self.select_keys.args(args))
            .fetch_all(&mut *tx)
            .await?;
        if keys.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let list: Vec<String> = keys
            .into_iter()
            .map(text_from_blobs)
            .map(|row| {
                let values: Vec<String> =
                    row.values.iter().map(|value| literal(&value.kind)).collect();
                format!("({})", values.join(", "))
            })
            .collect();
        let list = list.join(", ");
        // Texts new each time (their keys are written in): sent unprepared.
        let update = format!("{}{list})", self.update.interpolated(args));
        fetch_text(&mut tx, &update).await?;
        let read_back = format!("{}{list}) order by {}", self.read_back, self.key);
        let rows = fetch_text(&mut tx, &read_back).await?;
        tx.commit().await?;
        Ok(rows)
    }
}

/// Runs `text`, a statement with its values written in as literals, unprepared; its rows.
pub(super) async fn fetch_text(conn: &mut AnyConnection, text: &str) -> sqlx::Result<Vec<AnyRow>> {
    let rows = sqlx::Executor::fetch_all(conn, sqlx::raw_sql(text)).await?;
    Ok(rows.into_iter().map(text_from_blobs).collect())
}

/// An integer, or null, as a MySQL literal.
pub(super) fn int_literal(value: Option<i64>) -> String {
    value.map_or_else(|| "null".to_owned(), |value| value.to_string())
}

/// A text, or null, as a MySQL literal (see [`literal`]).
pub(super) fn text_literal(value: Option<&str>) -> String {
    match value {
        Some(text) => literal(&AnyValueKind::Text(text.into())),
        None => "null".to_owned(),
    }
}

/// The collation of text literals: the tables', so that a literal compares with a column, or
/// with another literal, as two columns do.
const TEXT_COLLATION: &str = " collate utf8mb4_nopad_bin";

/// `value` as a MySQL literal. Text is written as the hex of its UTF-8 bytes with a
/// `_utf8mb4` introducer: no text, whatever its quotes, backslashes or the session's
/// `sql_mode`, can end the literal early.
pub(super) fn literal(value: &AnyValueKind<'_>) -> String {
    use std::fmt::Write as _;
    let hex = |bytes: &[u8]| {
        let mut hex = String::with_capacity(bytes.len() * 2);
        for byte in bytes {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    };
    match value {
        AnyValueKind::Null(_) => "null".to_owned(),
        AnyValueKind::Bool(value) => i64::from(*value).to_string(),
        AnyValueKind::SmallInt(value) => value.to_string(),
        AnyValueKind::Integer(value) => value.to_string(),
        AnyValueKind::BigInt(value) => value.to_string(),
        AnyValueKind::Real(value) => format!("{value:e}"),
        AnyValueKind::Double(value) => format!("{value:e}"),
        AnyValueKind::Text(text) if text.is_empty() => format!("_utf8mb4 ''{TEXT_COLLATION}"),
        AnyValueKind::Text(text) => format!("_utf8mb4 x'{}'{TEXT_COLLATION}", hex(text.as_bytes())),
        AnyValueKind::Blob(bytes) => format!("x'{}'", hex(bytes)),
        // sqlx may add kinds; none is bound here.
        _ => "null".to_owned(),
    }
}

/// The MySQL text of `sql`, translated once and kept. A text built with values in it (rather
/// than placeholders) would be kept once per value: the table is emptied when it grows past a
/// bound, so it cannot grow without end.
pub(super) fn translate(sql: &str) -> Arc<Translated> {
    static KEPT: LazyLock<Mutex<HashMap<String, Arc<Translated>>>> = LazyLock::new(Mutex::default);
    if let Some(kept) = KEPT.lock().ok().and_then(|kept| kept.get(sql).cloned()) {
        return kept;
    }
    let translated = Arc::new(translation(sql));
    if let Ok(mut kept) = KEPT.lock() {
        if kept.len() >= 4_096 {
            kept.clear();
        }
        kept.insert(sql.to_owned(), translated.clone());
    }
    translated
}

/// The translation itself (see the module's opening).
pub(super) fn translation(sql: &str) -> Translated {
    let sql = rewrite_words(sql);
    let sql = rewrite_conflict(&sql);
    match split_update_returning(&sql) {
        Some((table, set, filter, returning)) => {
            let key = key_of(table);
            Translated::UpdateReturning(UpdateReturning {
                select_keys: numbered(&format!(
                    "select {key} from {table} where {filter} for update"
                )),
                update: numbered(&format!("update {table} set {set} where ({key}) in (")),
                read_back: format!("select {returning} from {table} where ({key}) in ("),
                key,
            })
        }
        None => Translated::Plain(numbered(&sql)),
    }
}

/// `$n` placeholders outside string literals as `?`, with the argument each takes.
pub(super) fn numbered(sql: &str) -> Numbered {
    let mut text = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut chars = sql.char_indices().peekable();
    let mut quoted = false;
    while let Some((_, c)) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '$' && !quoted {
            let mut digits = String::new();
            while let Some((_, d)) = chars.peek().filter(|(_, d)| d.is_ascii_digit()) {
                digits.push(*d);
                chars.next();
            }
            if let Ok(n) = digits.parse::<usize>()
                && n > 0
            {
                text.push('?');
                order.push(n - 1);
                continue;
            }
            text.push('$');
            text.push_str(&digits);
            continue;
        }
        text.push(c);
    }
    let returning = find_top_level(&text.to_ascii_lowercase(), "returning").is_some();
    Numbered { text, order, returning }
}

/// Functions and casts MariaDB spells differently.
fn rewrite_words(sql: &str) -> String {
    let mut text = replace_word(sql, "as bigint)", "as signed)");
    text = replace_word(&text, "as text)", "as char)");
    replace_word(&text, "length(", "char_length(")
}

/// Replaces `word` where it starts a word (not `char_length(` for `length(`), ignoring case.
fn replace_word(sql: &str, word: &str, by: &str) -> String {
    let lower = sql.to_ascii_lowercase();
    let mut text = String::with_capacity(sql.len());
    let mut from = 0;
    while let Some(at) = lower[from..].find(word).map(|at| at + from) {
        let starts_word = lower[..at]
            .chars()
            .next_back()
            .is_none_or(|before| !(before.is_ascii_alphanumeric() || before == '_'));
        text.push_str(&sql[from..at]);
        text.push_str(if starts_word { by } else { &sql[at..at + word.len()] });
        from = at + word.len();
    }
    text.push_str(&sql[from..]);
    text
}

/// `insert … on conflict (…) do nothing` as `insert ignore …`, and `on conflict (…) do update
/// set` as `on duplicate key update`, reading `excluded.c` as `values(c)`.
fn rewrite_conflict(sql: &str) -> String {
    let lower = sql.to_ascii_lowercase();
    let Some(at) = find_top_level(&lower, "on conflict") else { return sql.to_owned() };
    let rest = &lower[at..];
    if let Some(action) = rest.find("do nothing") {
        let before = sql[..at].trim_end();
        let after = &sql[at + action + "do nothing".len()..];
        let before = replace_word(before, "insert into", "insert ignore into");
        return format!("{before}{after}");
    }
    if let Some(action) = rest.find("do update set") {
        let before = &sql[..at];
        let set = &sql[at + action + "do update set".len()..];
        let mut set_text = String::with_capacity(set.len());
        let lower_set = set.to_ascii_lowercase();
        let mut from = 0;
        while let Some(found) = lower_set[from..].find("excluded.").map(|found| found + from) {
            set_text.push_str(&set[from..found]);
            let name_start = found + "excluded.".len();
            let name_end = set[name_start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(set.len(), |end| end + name_start);
            set_text.push_str(&format!("values({})", &set[name_start..name_end]));
            from = name_end;
        }
        set_text.push_str(&set[from..]);
        return format!("{before}on duplicate key update{set_text}");
    }
    sql.to_owned()
}

/// The table, `set` list, `where` condition and `returning` list of an `update … returning`.
fn split_update_returning(sql: &str) -> Option<(&str, &str, &str, &str)> {
    let trimmed = sql.trim_start();
    let lower = trimmed.to_ascii_lowercase();
    if !lower.starts_with("update ") {
        return None;
    }
    let returning = find_top_level(&lower, "returning")?;
    let set = find_top_level(&lower, "set")?;
    let filter = find_top_level(&lower, "where")?;
    if !(set < filter && filter < returning) {
        return None;
    }
    let table = trimmed["update ".len()..set].trim();
    Some((
        table,
        trimmed[set + "set".len()..filter].trim(),
        trimmed[filter + "where".len()..returning].trim(),
        trimmed[returning + "returning".len()..].trim(),
    ))
}

/// Where keyword `word` first appears in `lower` outside parentheses and string literals, as a
/// word of its own.
fn find_top_level(lower: &str, word: &str) -> Option<usize> {
    let bytes = lower.as_bytes();
    let mut depth = 0_i32;
    let mut quoted = false;
    for (at, &byte) in bytes.iter().enumerate() {
        match byte {
            b'\'' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted => depth -= 1,
            _ if !quoted && depth == 0 && lower[at..].starts_with(word) => {
                let before = at.checked_sub(1).map(|before| bytes[before]);
                let after = bytes.get(at + word.len());
                let boundary = |byte: Option<&u8>| {
                    byte.is_none_or(|byte| !(byte.is_ascii_alphanumeric() || *byte == b'_'))
                };
                if boundary(before.as_ref()) && boundary(after) {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
