//! The plans SQLite makes of the generated multi-row updates: each row of the values finds its
//! run or job by id, whatever the number of rows, and no statement scans a table. Compared
//! bare, a statement of 256 rows made SQLite index the values and scan every run kept.

use super::*;

#[tokio::test]
async fn multi_row_updates_find_each_row_by_id_and_scan_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite:{}", dir.path().join("t.db").display())).await.unwrap();
    // As SQLite runs them (bare `?`), and with numbered placeholders, whose values are cast.
    let numbered: fn(usize) -> String = |n| format!("${n}");
    let bare: fn(usize) -> String = |_| "?".to_owned();
    let shapes = (0..=10).map(|power| 1_usize << power);
    for (p, shape) in shapes.flat_map(|shape| [(bare, shape), (numbered, shape)]) {
        let statements = [
            (
                "runs",
                run_writes::update_runs_sql(p, shape, false),
                shape * run_writes::UPDATE_PARAMS,
            ),
            (
                "runs",
                run_writes::update_runs_sql(p, shape, true),
                shape * (run_writes::UPDATE_PARAMS + run_writes::COUNTED_PARAMS.len()),
            ),
            ("jobs", fires::move_fires_sql(p, shape, true), shape * 4 + 1),
            ("jobs", fires::move_fires_sql(p, shape, false), shape * 4 + 1),
        ];
        for (table, sql, args) in statements {
            let plan = sqlite_plan(&db, &sql, args).await;
            let by_id = format!("SEARCH {table} USING INTEGER PRIMARY KEY (rowid=?)");
            assert!(plan.contains(&by_id), "{table}, {shape} rows: {plan:?}");
            // Any other step that reads the table: a scan, or a search through another index.
            let names = |step: &String| step.split_whitespace().any(|word| word == table);
            let read_otherwise = plan.iter().any(|step| names(step) && *step != by_id);
            assert!(!read_otherwise, "{table}, {shape} rows: {plan:?}");
        }
    }
}
