//! The child-job graph's cycle check and the strategy enums' spellings.

use std::collections::HashMap;

use super::*;

#[test]
fn child_job_cycles_are_found() {
    // 1 → 2 → 3, and 4 alone.
    let edges: HashMap<i64, Vec<i64>> =
        [(1, vec![2]), (2, vec![3]), (3, vec![]), (4, vec![])].into_iter().collect();
    let check = |job: Option<i64>, children: &[i64]| child_job_cycle(job, children, &edges);
    assert_eq!(check(Some(3), &[1]), Some(vec![3, 1, 2, 3]));
    assert_eq!(check(Some(4), &[4]), Some(vec![4, 4]));
    assert_eq!(check(Some(2), &[3, 1]), Some(vec![2, 1, 2]));
    assert_eq!(check(Some(4), &[1, 2]), None);
    assert_eq!(check(Some(1), &[2, 3]), None);
    assert_eq!(check(None, &[1, 2]), None);
}

#[test]
fn spellings_round_trip() {
    for strategy in RouteStrategy::ALL {
        assert_eq!(strategy.as_str().parse::<RouteStrategy>(), Ok(*strategy));
    }
    let err = "SOMETIMES".parse::<BlockStrategy>().expect_err("not a strategy");
    assert_eq!(
        err.to_string(),
        "unknown BlockStrategy `SOMETIMES`, expected one of: SERIAL_EXECUTION, DISCARD_LATER, COVER_EARLY"
    );
}
