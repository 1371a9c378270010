//! Tests of `client_cli`.

use expect_test::expect;

use super::*;

#[test]
fn tables_align_and_cells_flatten() {
    let header = vec!["ID".to_owned(), "NAME".to_owned(), "ADDRESSES".to_owned()];
    let rows = vec![
        vec!["1".to_owned(), "hello".to_owned(), cell(&json!(["a", "b"]))],
        vec!["12".to_owned(), cell(&json!("two\nlines")), cell(&Value::Null)],
    ];
    expect![[r#"
        ID  NAME       ADDRESSES
        1   hello      a,b
        12  two lines
    "#]]
    .assert_eq(&render_table(&header, &rows));
    assert_eq!(encode("by hand/ü"), "by%20hand%2F%C3%BC");
}
