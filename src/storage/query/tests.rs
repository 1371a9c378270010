//! The MySQL translation of statements, as a table: each text as written for PostgreSQL and
//! SQLite, and what MariaDB is sent.

use sqlx::Arguments as _;
use sqlx::any::AnyArguments;
use sqlx_core::any::{AnyTypeInfoKind, AnyValueKind};

use super::{Numbered, Translated, UpdateReturning, literal, numbered, translation};

fn plain(text: &str, order: &[usize]) -> Translated {
    Translated::Plain(numbered_as(text, order))
}

fn numbered_as(text: &str, order: &[usize]) -> Numbered {
    let returning = text.contains("returning");
    Numbered { text: text.to_owned(), order: order.to_vec(), returning }
}

#[test]
fn statements_are_translated_for_mysql() {
    let table = [
        ("select * from jobs where id = $1", plain("select * from jobs where id = ?", &[0])),
        (
            "insert into jobs (a, b, c) values ($1, $2, $2) returning id",
            plain("insert into jobs (a, b, c) values (?, ?, ?) returning id", &[0, 1, 1]),
        ),
        ("select $2, $1, '$3'", plain("select ?, ?, '$3'", &[1, 0])),
        (
            "select cast(sum(runs) as bigint) as n, cast(x as text) from t",
            plain("select cast(sum(runs) as signed) as n, cast(x as char) from t", &[]),
        ),
        (
            "select substr(action, 1, length($2)) = $2, char_length(x)",
            plain("select substr(action, 1, char_length(?)) = ?, char_length(x)", &[1, 1]),
        ),
        (
            "insert into modules (sha256) values ($1) on conflict (sha256) do nothing",
            plain("insert ignore into modules (sha256) values (?)", &[0]),
        ),
        (
            "insert into runs (a) values ($1), ($2) on conflict (a, b) where b is not null \
             do nothing returning id",
            plain("insert ignore into runs (a) values (?), (?) returning id", &[0, 1]),
        ),
        (
            "insert into r (day, runs) values ($1, $2) \
             on conflict (day) do update set runs = r.runs + excluded.runs, at = excluded.at",
            plain(
                "insert into r (day, runs) values (?, ?) \
                 on duplicate key update runs = r.runs + values(runs), at = values(at)",
                &[0, 1],
            ),
        ),
        (
            "update jobs set a = $1 where id = $2",
            plain("update jobs set a = ? where id = ?", &[0, 1]),
        ),
        (
            "update users set failed = failed + 1, until = $2 + 5
             where id = $1 and until <= $2 returning failed",
            Translated::UpdateReturning(UpdateReturning {
                select_keys: numbered_as(
                    "select id from users where id = ? and until <= ? for update",
                    &[0, 1],
                ),
                update: numbered_as(
                    "update users set failed = failed + 1, until = ? + 5 where (id) in (",
                    &[1],
                ),
                read_back: "select failed from users where (id) in (".to_owned(),
                key: "id",
            }),
        ),
        (
            "update runs set state = 'x' where id = $1 and not exists (select 1 from runs w \
             where w.id = runs.id) returning id, fence",
            Translated::UpdateReturning(UpdateReturning {
                select_keys: numbered_as(
                    "select id from runs where id = ? and not exists (select 1 from runs w \
                     where w.id = runs.id) for update",
                    &[0],
                ),
                update: numbered_as("update runs set state = 'x' where (id) in (", &[]),
                read_back: "select id, fence from runs where (id) in (".to_owned(),
                key: "id",
            }),
        ),
        (
            "update registry set at = $1 where registry_group = $2 returning registry_key",
            Translated::UpdateReturning(UpdateReturning {
                select_keys: numbered_as(
                    "select registry_group, registry_key, registry_value from registry \
                     where registry_group = ? for update",
                    &[1],
                ),
                update: numbered_as(
                    "update registry set at = ? \
                     where (registry_group, registry_key, registry_value) in (",
                    &[0],
                ),
                read_back: "select registry_key from registry \
                            where (registry_group, registry_key, registry_value) in ("
                    .to_owned(),
                key: "registry_group, registry_key, registry_value",
            }),
        ),
        (
            "delete from sessions where id = $1 returning user_id",
            plain("delete from sessions where id = ? returning user_id", &[0]),
        ),
    ];
    for (sql, expected) in table {
        assert_eq!(translation(sql), expected, "{sql}");
    }
}

#[test]
fn a_dollar_without_digits_is_left_alone() {
    assert_eq!(numbered("select '$' || $ || $0"), numbered_as("select '$' || $ || $0", &[]));
}

#[test]
fn arguments_written_as_literals_cannot_end_them_early() {
    let table = [
        (AnyValueKind::BigInt(-42), "-42"),
        (AnyValueKind::Null(AnyTypeInfoKind::Text), "null"),
        (AnyValueKind::Text("".into()), "_utf8mb4 '' collate utf8mb4_nopad_bin"),
        (
            AnyValueKind::Text("it's \\' -- é".into()),
            "_utf8mb4 x'69742773205c27202d2d20c3a9' collate utf8mb4_nopad_bin",
        ),
        (AnyValueKind::Blob(vec![0, 255].into()), "x'00ff'"),
    ];
    for (value, expected) in table {
        assert_eq!(literal(&value), expected, "{value:?}");
    }
    let mut args = AnyArguments::default();
    args.add("a'b").unwrap();
    args.add(7_i64).unwrap();
    let statement = numbered("insert into t (a, b, c) values ($2, '?', $1) returning id");
    assert_eq!(
        statement.interpolated(&args),
        "insert into t (a, b, c) values (7, '?', _utf8mb4 x'612762' collate utf8mb4_nopad_bin) \
         returning id"
    );
}
