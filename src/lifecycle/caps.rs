//! Which held runs a release claims, and in what order, when runs of a capped group's jobs end.
//!
//! Runs wait in the order of their instants. A run is released when its job's cap and its
//! group's cap both have room; within one job no run passes an older one, so a job at its cap
//! holds back its later runs, while the group's other jobs go on. Storage claims each chosen
//! run with the same rule checked again in its statement, so a stale count costs a claim that
//! does not happen, never a run over a cap.

use std::collections::{HashMap, HashSet};

/// A held run, as the release sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The run's id.
    pub id: i64,
    /// Its job's id.
    pub job_id: i64,
    /// Its instant (ms): runs are released oldest first, then by id.
    pub trigger_time_ms: i64,
}

/// The runs in flight and the caps of one group and its jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Room {
    /// The group's cap; 0 is none.
    pub group_cap: i64,
    /// The runs of all the group's jobs dispatching or running.
    pub group_in_flight: i64,
    /// Each job's cap (0 or absent: none).
    pub job_caps: HashMap<i64, i64>,
    /// Each job's runs dispatching or running (absent: none).
    pub job_in_flight: HashMap<i64, i64>,
}

/// The ids of the `held` runs to claim, in the order to claim them.
pub fn release_order(held: &[Held], room: &Room) -> Vec<i64> {
    let mut held = held.to_vec();
    held.sort_by_key(|run| (run.trigger_time_ms, run.id));
    let mut group_in_flight = room.group_in_flight;
    let mut in_flight = room.job_in_flight.clone();
    let mut blocked = HashSet::new();
    let mut order = Vec::new();
    for run in held {
        if room.group_cap > 0 && group_in_flight >= room.group_cap {
            break;
        }
        if blocked.contains(&run.job_id) {
            continue;
        }
        let cap = room.job_caps.get(&run.job_id).copied().unwrap_or(0);
        let running = in_flight.entry(run.job_id).or_insert(0);
        if cap > 0 && *running >= cap {
            // Its later runs wait behind it.
            blocked.insert(run.job_id);
            continue;
        }
        *running += 1;
        group_in_flight += 1;
        order.push(run.id);
    }
    order
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn held(runs: &[(i64, i64, i64)]) -> Vec<Held> {
        runs.iter()
            .map(|&(id, job_id, trigger_time_ms)| Held { id, job_id, trigger_time_ms })
            .collect()
    }

    fn room(group: (i64, i64), jobs: &[(i64, i64, i64)]) -> Room {
        Room {
            group_cap: group.0,
            group_in_flight: group.1,
            job_caps: jobs.iter().map(|&(job, cap, _)| (job, cap)).collect(),
            job_in_flight: jobs.iter().map(|&(job, _, running)| (job, running)).collect(),
        }
    }

    #[test]
    fn release_orders() {
        // Held runs as (id, job, instant); jobs as (job, cap, in flight); the group as (cap,
        // in flight).
        let cases = [
            ("nothing held", held(&[]), room((0, 0), &[(1, 1, 0)])),
            (
                "one place, oldest first",
                held(&[(12, 1, 300), (11, 1, 200)]),
                room((0, 0), &[(1, 1, 0)]),
            ),
            (
                "same instant: lower id first",
                held(&[(12, 1, 200), (11, 1, 200)]),
                room((0, 0), &[(1, 1, 0)]),
            ),
            ("job still full", held(&[(11, 1, 200)]), room((0, 0), &[(1, 1, 1)])),
            (
                "two places",
                held(&[(11, 1, 100), (12, 1, 200), (13, 1, 300)]),
                room((0, 0), &[(1, 3, 1)]),
            ),
            (
                "a full job holds back its own runs, not the group's others",
                held(&[(11, 1, 100), (21, 2, 200), (12, 1, 300), (22, 2, 400)]),
                room((0, 0), &[(1, 1, 1), (2, 2, 0)]),
            ),
            (
                "the group's cap stops the release",
                held(&[(11, 1, 100), (21, 2, 200), (22, 2, 300)]),
                room((2, 0), &[]),
            ),
            ("the group is full", held(&[(11, 1, 100)]), room((2, 2), &[])),
            (
                "both caps: the job's first, then the group's",
                held(&[(11, 1, 100), (12, 1, 200), (21, 2, 300), (31, 3, 400)]),
                room((3, 1), &[(1, 1, 0)]),
            ),
        ];
        let mut table = String::new();
        for (name, held, room) in cases {
            table.push_str(&format!("{name}: {:?}\n", release_order(&held, &room)));
        }
        expect![[r#"
            nothing held: []
            one place, oldest first: [11]
            same instant: lower id first: [11]
            job still full: []
            two places: [11, 12]
            a full job holds back its own runs, not the group's others: [21, 22]
            the group's cap stops the release: [11, 21]
            the group is full: []
            both caps: the job's first, then the group's: [11, 21]
        "#]]
        .assert_eq(&table);
    }
}
