//! The plans SQLite makes of the generated multi-row updates, and of the one-run update the
//! SQLite writer runs instead: each row of the values finds its run or job by id, whatever the
//! number of rows, and no statement scans a table. Compared bare, a statement of 256 rows made
//! SQLite index the values and scan every run kept.

use super::*;

#[tokio::test]
async fn generated_updates_find_each_row_by_id_and_scan_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    // As SQLite runs them (bare `?`), and with numbered placeholders, whose values are cast.
    let numbered: fn(usize) -> String = |n| format!("${n}");
    let bare: fn(usize) -> String = |_| "?".to_owned();
    let shapes = (0..=10).map(|power| 1_usize << power);
    for (p, shape) in shapes.flat_map(|shape| [(bare, shape), (numbered, shape)]) {
        let statements = [
            ("runs", run_writes::update_runs_sql(p, shape), shape * run_writes::UPDATE_PARAMS),
            ("jobs", fires::move_fires_sql(p, shape, true), shape * 4 + 1),
            ("jobs", fires::move_fires_sql(p, shape, false), shape * 4 + 1),
        ];
        assert_finds_by_id(&db, &statements).await;
    }
    // The update of one run that the SQLite writer runs instead, a run at a time.
    let one = run_writes::UPDATE_PARAMS + run_writes::COUNTED_PARAMS;
    let statements = [("runs", run_writes::update_run_sql().to_owned(), one)];
    assert_finds_by_id(&db, &statements).await;
}

/// Asserts that each of `statements` (a table, the statement's text and its number of
/// arguments) finds the rows of its table by id, and reads it no other way.
async fn assert_finds_by_id(db: &Db, statements: &[(&str, String, usize)]) {
    for (table, sql, args) in statements {
        let plan = sqlite_plan(db, sql, *args).await;
        let by_id = format!("SEARCH {table} USING INTEGER PRIMARY KEY (rowid=?)");
        assert!(plan.contains(&by_id), "{sql}: {plan:?}");
        // Any other step that reads the table: a scan, or a search through another index.
        let names = |step: &String| step.split_whitespace().any(|word| word == *table);
        let read_otherwise = plan.iter().any(|step| names(step) && *step != by_id);
        assert!(!read_otherwise, "{sql}: {plan:?}");
    }
}
