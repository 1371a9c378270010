//! A generated statement (its text and arguments) and where it runs: through sqlx on any
//! connection, or, for the SQLite group commit, on the SQLite writer's own connection
//! (`sqlite_writer.rs`), which runs a whole transaction in one call. The text is written once, in
//! the SQL PostgreSQL and SQLite accept (`query.rs` translates it for MySQL); only the binding and
//! the reading of rows differ. The text of
//! each generated shape is built once and kept ([`shaped`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{Result, StorageError};

/// One argument of a statement.
#[derive(Debug, Clone)]
pub(super) enum Arg<'a> {
    Int(Option<i64>),
    Text(Option<Cow<'a, str>>),
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(Some(value))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Arg::Int(value)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(Some(Cow::Borrowed(value)))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::Text(value.map(Cow::Borrowed))
    }
}

impl From<String> for Arg<'_> {
    fn from(value: String) -> Self {
        Arg::Text(Some(Cow::Owned(value)))
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Arg::Int(Some(value)) => ToSqlOutput::Owned(Value::Integer(*value)),
            Arg::Text(Some(text)) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Arg::Int(None) | Arg::Text(None) => ToSqlOutput::Owned(Value::Null),
        })
    }
}

/// A statement's text and its arguments, in the order of its placeholders.
#[derive(Debug)]
pub(super) struct Statement<'a> {
    pub sql: Arc<str>,
    pub args: Vec<Arg<'a>>,
}

impl<'a> Statement<'a> {
    pub(super) fn new(sql: impl Into<Arc<str>>) -> Self {
        Statement { sql: sql.into(), args: Vec::new() }
    }

    /// Appends the next argument.
    pub(super) fn bind(&mut self, arg: impl Into<Arg<'a>>) -> &mut Self {
        self.args.push(arg.into());
        self
    }
}

/// The text of generated statement `name` of `rows` rows for `exec`'s dialect: `build` makes
/// it the first time, and it is kept. The group commit runs the same few shapes again and again
/// (row counts are powers of two, see [`super::statement_shapes`]); building the text of
/// thousands of placeholders each time was work on the SQLite writer's thread, which every
/// commit waits for.
pub(super) fn shaped(
    exec: &Exec<'_>,
    name: &'static str,
    rows: usize,
    build: impl FnOnce() -> String,
) -> Arc<str> {
    type Shapes = HashMap<(&'static str, usize, bool), Arc<str>>;
    static SHAPES: LazyLock<Mutex<Shapes>> = LazyLock::new(Mutex::default);
    let key = (name, rows, exec.placeholder()(1) == "?");
    let cached = SHAPES.lock().ok().and_then(|shapes| shapes.get(&key).cloned());
    if let Some(text) = cached {
        return text;
    }
    let text: Arc<str> = build().into();
    if let Ok(mut shapes) = SHAPES.lock() {
        shapes.insert(key, text.clone());
    }
    text
}

/// Where statements run.
pub(super) enum Exec<'c> {
    /// Any connection, through sqlx.
    Sqlx(&'c mut AnyConnection),
    /// The SQLite writer's connection, on its own thread: each call is done when it returns.
    Sqlite(&'c mut rusqlite::Connection),
}

impl Exec<'_> {
    /// The placeholder of the `n`th argument (see [`super::placeholder`]).
    pub(super) fn placeholder(&self) -> fn(usize) -> String {
        match self {
            Exec::Sqlx(conn) => super::placeholder(conn),
            Exec::Sqlite(_) => |_| "?".to_owned(),
        }
    }

    /// Whether generated statements of many rows are padded to a few shapes, one statement
    /// each ([`super::statement_shapes`]): on PostgreSQL, where each is a round trip. MySQL's
    /// writes have their own statements, and SQLite's cost no round trip.
    pub(super) fn pads(&self) -> bool {
        match self {
            Exec::Sqlx(conn) => conn.backend_name() == <sqlx::Postgres as sqlx::Database>::NAME,
            Exec::Sqlite(_) => false,
        }
    }

    /// Runs `statement` and returns the rows it returns (none for a write without `returning`).
    pub(super) async fn fetch_all(&mut self, statement: &Statement<'_>) -> Result<Vec<Row>> {
        match self {
            Exec::Sqlx(conn) if super::query::is_mysql(conn) => {
                let mut query = super::query::query(&statement.sql);
                for arg in &statement.args {
                    query = match arg {
                        Arg::Int(value) => query.bind(*value),
                        Arg::Text(value) => query.bind(value.as_deref()),
                    };
                }
                let rows = query.fetch_all(&mut **conn).await?;
                Ok(rows.into_iter().map(Row::Any).collect())
            }
            Exec::Sqlx(conn) => {
                let mut query = sqlx::query(&statement.sql);
                for arg in &statement.args {
                    query = match arg {
                        Arg::Int(value) => query.bind(*value),
                        Arg::Text(value) => query.bind(value.as_deref()),
                    };
                }
                let rows = query.fetch_all(&mut **conn).await?;
                Ok(rows.into_iter().map(Row::Any).collect())
            }
            Exec::Sqlite(conn) => sqlite_fetch_all(conn, statement),
        }
    }
}

fn sqlite_fetch_all(conn: &rusqlite::Connection, statement: &Statement<'_>) -> Result<Vec<Row>> {
    let mut prepared = conn.prepare_cached(&statement.sql)?;
    let columns: Arc<[String]> =
        prepared.column_names().into_iter().map(str::to_owned).collect::<Vec<_>>().into();
    let mut rows = prepared.query(rusqlite::params_from_iter(&statement.args))?;
    let mut read = Vec::new();
    while let Some(row) = rows.next()? {
        // Sized at once: collected from the iterator, a run's 38 values grew the vector five
        // times, a copy each.
        let mut values = Vec::with_capacity(columns.len());
        for at in 0..columns.len() {
            values.push(row.get::<_, Value>(at)?);
        }
        read.push(Row::Sqlite(ValueRow {
            columns: columns.clone(),
            values,
            next: AtomicUsize::new(0),
        }));
    }
    Ok(read)
}

/// A row read by an [`Exec`].
pub(super) enum Row {
    Any(AnyRow),
    Sqlite(ValueRow),
}

/// A row read on the SQLite writer's connection: its values, by column.
pub(super) struct ValueRow {
    columns: Arc<[String]>,
    values: Vec<Value>,
    /// Where the next column is looked for first: right after the last one read, since a row is
    /// mostly read in the order of its columns (a run's 37, say, which a search from the first
    /// for each would compare some 700 names to find).
    next: AtomicUsize,
}

impl ValueRow {
    fn value(&self, column: &str) -> Result<&Value> {
        let start = self.next.load(Ordering::Relaxed).min(self.columns.len());
        let (wrapped, ahead) = self.columns.split_at(start);
        let at = ahead.iter().position(|name| name == column).map(|at| start + at);
        let at = at.or_else(|| wrapped.iter().position(|name| name == column));
        if let Some(at) = at {
            self.next.store(at + 1, Ordering::Relaxed);
        }
        at.and_then(|at| self.values.get(at))
            .ok_or_else(|| StorageError::Corrupt(format!("no column `{column}` in the row")))
    }
}

/// The columns of a row, as the types the code stores.
pub(super) trait Cells {
    fn int(&self, column: &str) -> Result<Option<i64>>;
    fn text(&self, column: &str) -> Result<Option<String>>;

    /// A column that is never null.
    fn required_int(&self, column: &str) -> Result<i64> {
        self.int(column)?.ok_or_else(|| null(column))
    }

    /// A column that is never null.
    fn required_text(&self, column: &str) -> Result<String> {
        self.text(column)?.ok_or_else(|| null(column))
    }
}

fn null(column: &str) -> StorageError {
    StorageError::Corrupt(format!("{column}: null"))
}

impl Cells for AnyRow {
    fn int(&self, column: &str) -> Result<Option<i64>> {
        Ok(self.try_get(column)?)
    }

    fn text(&self, column: &str) -> Result<Option<String>> {
        Ok(self.try_get(column)?)
    }
}

impl Cells for ValueRow {
    fn int(&self, column: &str) -> Result<Option<i64>> {
        match self.value(column)? {
            Value::Integer(value) => Ok(Some(*value)),
            Value::Null => Ok(None),
            other => Err(StorageError::Corrupt(format!("{column}: {other:?}, not an integer"))),
        }
    }

    fn text(&self, column: &str) -> Result<Option<String>> {
        match self.value(column)? {
            Value::Text(value) => Ok(Some(value.clone())),
            Value::Null => Ok(None),
            other => Err(StorageError::Corrupt(format!("{column}: {other:?}, not text"))),
        }
    }
}

impl Cells for Row {
    fn int(&self, column: &str) -> Result<Option<i64>> {
        match self {
            Row::Any(row) => row.int(column),
            Row::Sqlite(row) => row.int(column),
        }
    }

    fn text(&self, column: &str) -> Result<Option<String>> {
        match self {
            Row::Any(row) => row.text(column),
            Row::Sqlite(row) => row.text(column),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_columns_are_found_in_any_order() {
        let columns: Arc<[String]> = ["id", "state", "note"].map(str::to_owned).into();
        let values = vec![Value::Integer(7), Value::Text("running".to_owned()), Value::Null];
        let row = ValueRow { columns, values, next: AtomicUsize::new(0) };
        // In order, backwards, again, and one that is not there, each read as it comes.
        let reads = [
            ("id", Some("7")),
            ("state", Some("running")),
            ("note", None),
            ("state", Some("running")),
            ("id", Some("7")),
            ("id", Some("7")),
            ("note", None),
            ("other", None),
            ("state", Some("running")),
        ];
        for (column, expected) in reads {
            let read = match row.value(column) {
                Ok(Value::Integer(value)) => Some(value.to_string()),
                Ok(Value::Text(value)) => Some(value.clone()),
                Ok(_) => None,
                Err(_) if column == "other" => None,
                Err(error) => panic!("{column}: {error}"),
            };
            assert_eq!(read.as_deref(), expected, "{column}");
        }
        assert!(row.value("other").is_err());
    }
}
