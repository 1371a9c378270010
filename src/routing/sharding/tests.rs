//! Table tests of the sharding strategies against assignments worked out by hand from
//! ElasticJob's rules (and, for the rotate and odevity strategies, ElasticJob's own examples).

use expect_test::{Expect, expect};

use super::*;
use ShardingStrategy::*;

/// (strategy, job name, total items, executors as given) → each executor with its items.
type Row = (ShardingStrategy, &'static str, u32, &'static [&'static str]);

fn check(rows: &[Row], expect: Expect) {
    let mut out = String::new();
    for &(strategy, job_name, total, executors) in rows {
        let executors: Vec<String> = executors.iter().map(|e| (*e).to_owned()).collect();
        let shown: Vec<String> = assign(strategy, job_name, total, &executors)
            .into_iter()
            .map(|(executor, items)| format!("{executor}:{items:?}"))
            .collect();
        let shown = if shown.is_empty() { "none".to_owned() } else { shown.join(" ") };
        out.push_str(&format!("{strategy} `{job_name}` {total} -> {shown}\n"));
    }
    expect.assert_eq(&out);
}

const HOSTS: &[&str] = &["h0", "h1", "h2"];

#[test]
fn average_allocation() {
    check(
        &[
            // ElasticJob's documented examples: 9, 8 and 10 items over three servers.
            (AverageAllocation, "any", 9, HOSTS),
            (AverageAllocation, "any", 8, HOSTS),
            (AverageAllocation, "any", 10, HOSTS),
            // Executors are sorted as strings, whatever order they come in.
            (AverageAllocation, "any", 2, &["h2", "h0", "h1"]),
            (AverageAllocation, "any", 3, &["http://10.0.0.9:9999", "http://10.0.0.10:9999"]),
            (AverageAllocation, "any", 3, &[]),
        ],
        expect![[r#"
            AVERAGE_ALLOCATION `any` 9 -> h0:[0, 1, 2] h1:[3, 4, 5] h2:[6, 7, 8]
            AVERAGE_ALLOCATION `any` 8 -> h0:[0, 1, 6] h1:[2, 3, 7] h2:[4, 5]
            AVERAGE_ALLOCATION `any` 10 -> h0:[0, 1, 2, 9] h1:[3, 4, 5] h2:[6, 7, 8]
            AVERAGE_ALLOCATION `any` 2 -> h0:[0] h1:[1] h2:[]
            AVERAGE_ALLOCATION `any` 3 -> http://10.0.0.10:9999:[0, 2] http://10.0.0.9:9999:[1]
            AVERAGE_ALLOCATION `any` 3 -> none
        "#]],
    );
}

#[test]
fn odevity_sort_by_name() {
    check(
        &[
            // "1".hashCode() = 49, odd: ascending (ElasticJob's test).
            (OdevitySortByName, "1", 2, HOSTS),
            // "0".hashCode() = 48, even: descending (ElasticJob's test).
            (OdevitySortByName, "0", 2, HOSTS),
            // "polygenelubricants".hashCode() = -2147483648, even: descending.
            (OdevitySortByName, "polygenelubricants", 4, HOSTS),
        ],
        expect![[r#"
            ODEVITY_SORT_BY_NAME `1` 2 -> h0:[0] h1:[1] h2:[]
            ODEVITY_SORT_BY_NAME `0` 2 -> h0:[] h1:[1] h2:[0]
            ODEVITY_SORT_BY_NAME `polygenelubricants` 4 -> h0:[2] h1:[1] h2:[0, 3]
        "#]],
    );
}

#[test]
fn rotate_server_by_name() {
    check(
        &[
            // 49 % 3 = 1, 50 % 3 = 2, 51 % 3 = 0 (ElasticJob's tests).
            (RotateServerByName, "1", 2, HOSTS),
            (RotateServerByName, "2", 2, HOSTS),
            (RotateServerByName, "3", 2, HOSTS),
            // |-2147483648| = 2^31, and 2^31 % 3 = 2: the order is h2, h0, h1.
            (RotateServerByName, "polygenelubricants", 3, HOSTS),
        ],
        expect![[r#"
            ROTATE_SERVER_BY_NAME `1` 2 -> h0:[] h1:[0] h2:[1]
            ROTATE_SERVER_BY_NAME `2` 2 -> h0:[1] h1:[] h2:[0]
            ROTATE_SERVER_BY_NAME `3` 2 -> h0:[0] h1:[1] h2:[]
            ROTATE_SERVER_BY_NAME `polygenelubricants` 3 -> h0:[1] h1:[2] h2:[0]
        "#]],
    );
}

#[test]
fn consistent_hash() {
    check(
        &[
            // `Q` is |81 - 48| = 33: item 0 sums to 33 (h0 takes 0..=33), items 1 to 9 to 34
            // to 42 and `Q10`, `Q11` to 34, 35 (h1 takes 34..=66); nothing reaches 67.
            (ConsistentHash, "Q", 12, HOSTS),
            // `zz` is 74 + 74 = 148: items 0 to 3 give 48, 49, 50, 51; over two executors
            // h0 takes 0..=49 and h1 50..=99.
            (ConsistentHash, "zz", 4, &["h1", "h0"]),
            // `a-b` is 49 + |45 - 48| + 50 = 102: items 0 to 2 give 2, 3, 4.
            (ConsistentHash, "a-b", 3, &["h0", "h1"]),
        ],
        expect![[r#"
            CONSISTENT_HASH `Q` 12 -> h0:[0] h1:[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] h2:[]
            CONSISTENT_HASH `zz` 4 -> h0:[0, 1] h1:[2, 3]
            CONSISTENT_HASH `a-b` 3 -> h0:[0, 1, 2] h1:[]
        "#]],
    );
}

#[test]
fn java_string_hashes() {
    let hashes: Vec<i32> = ["", "0", "hello", "polygenelubricants", "中", "😀"]
        .iter()
        .map(|s| java_string_hash(s))
        .collect();
    assert_eq!(hashes, [0, 48, 99_162_322, i32::MIN, 20_013, 1_772_899]);
}

#[test]
fn item_parameters() {
    let rows: &[(&str, u32)] = &[
        ("0=Beijing,1=Shanghai,2=Guangzhou", 3),
        (" 0 = A , 2=C ", 3),
        ("", 3),
        ("0=A,0=B", 3),
        ("3=D", 3),
        ("0", 3),
        ("0=", 3),
        ("x=A", 3),
        ("0=a=b", 3),
        ("-1=A", 3),
        ("0=A,", 3),
    ];
    let out: String = rows
        .iter()
        .map(|(text, total)| match parse_item_parameters(text, *total) {
            Ok(parameters) => format!("`{text}` -> {parameters:?}\n"),
            Err(error) => format!("`{text}` -> {error}\n"),
        })
        .collect();
    expect![[r#"
        `0=Beijing,1=Shanghai,2=Guangzhou` -> {0: "Beijing", 1: "Shanghai", 2: "Guangzhou"}
        ` 0 = A , 2=C ` -> {0: "A", 2: "C"}
        `` -> {}
        `0=A,0=B` -> item 0 has two parameters
        `3=D` -> item 3 is out of range: items run from 0 to 2
        `0` -> `0` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        `0=` -> `0=` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        `x=A` -> `x=A` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        `0=a=b` -> `0=a=b` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        `-1=A` -> `-1=A` is not `item=parameter`, as in 0=Beijing,1=Shanghai
        `0=A,` -> `` is not `item=parameter`, as in 0=Beijing,1=Shanghai
    "#]]
    .assert_eq(&out);
}
