//! The beat's decisions as tables, and a simulation of admins joining, dying and leaving that
//! checks the shares converge and no partition is ever held twice.

use super::*;

const LEASE_MS: i64 = 4_000;

fn leases(owners: &[(&str, std::ops::Range<u16>, i64)]) -> Vec<Lease> {
    (0..PARTITIONS)
        .map(|partition| {
            let holder = owners.iter().find(|(_, range, _)| range.contains(&partition));
            Lease {
                partition,
                owner: holder.map(|(owner, _, _)| (*owner).to_owned()),
                fence: 1,
                until_ms: holder.map_or(0, |(_, _, until)| *until),
            }
        })
        .collect()
}

fn live(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

#[test]
fn partitions_of_ids() {
    let cases = [(0, 0), (1, 167), (2, 78), (3, 245), (255, 89), (256, 0), (257, 167)];
    for (id, partition) in cases {
        assert_eq!(of(id), partition, "id {id}");
    }
    assert_eq!(of(-1), of(255));
    assert_eq!(of(i64::MAX), of(255));
    // Every partition is the partition of 256 consecutive ids, once.
    let all: std::collections::BTreeSet<u16> = (1_000..1_256).map(of).collect();
    assert_eq!(all.len(), usize::from(PARTITIONS));
}

#[test]
fn beats() {
    struct Case {
        name: &'static str,
        me: &'static str,
        live: &'static [&'static str],
        dead: &'static [&'static str],
        owners: Vec<(&'static str, std::ops::Range<u16>, i64)>,
        share: usize,
        take: Option<std::ops::Range<u16>>,
        release: Option<std::ops::Range<u16>>,
        look_again_at: Option<i64>,
    }
    let now = 10_000;
    let cases = [
        Case {
            name: "alone on a fresh database: takes everything",
            me: "a",
            dead: &[],
            live: &[],
            owners: vec![],
            share: 256,
            take: Some(0..256),
            release: None,
            look_again_at: None,
        },
        Case {
            name: "alone, holding everything: nothing to do",
            me: "a",
            dead: &[],
            live: &["a"],
            owners: vec![("a", 0..256, now + LEASE_MS)],
            share: 256,
            take: None,
            release: None,
            look_again_at: None,
        },
        Case {
            name: "a second admin joined: the first gives back the upper half",
            me: "a",
            dead: &[],
            live: &["a", "b"],
            owners: vec![("a", 0..256, now + LEASE_MS)],
            share: 128,
            take: None,
            release: Some(128..256),
            look_again_at: None,
        },
        Case {
            name: "the second admin takes what was given back",
            me: "b",
            dead: &[],
            live: &["a", "b"],
            owners: vec![("a", 0..128, now + LEASE_MS)],
            share: 128,
            take: Some(128..256),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "the second admin before the first gave back: it waits",
            me: "b",
            dead: &[],
            live: &["a", "b"],
            owners: vec![("a", 0..256, now + LEASE_MS)],
            share: 128,
            take: None,
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "three admins: the first by id holds one more",
            me: "a",
            dead: &[],
            live: &["c", "b", "a"],
            owners: vec![],
            share: 86,
            take: Some(0..86),
            release: None,
            look_again_at: None,
        },
        Case {
            name: "a dead admin's lease has not run out: not taken, looked at again when it does",
            me: "a",
            dead: &[],
            live: &["a"],
            owners: vec![("a", 0..128, now + LEASE_MS), ("dead", 128..256, now + 1_500)],
            share: 256,
            take: None,
            release: None,
            look_again_at: Some(now + 1_501),
        },
        Case {
            name: "a dead admin's lease ran out: taken",
            me: "a",
            dead: &[],
            live: &["a"],
            owners: vec![("a", 0..128, now + LEASE_MS), ("dead", 128..256, now - 1)],
            share: 256,
            take: Some(128..256),
            release: None,
            look_again_at: None,
        },
        Case {
            name: "a lease that runs out this very millisecond is still held",
            me: "a",
            dead: &[],
            live: &["a"],
            owners: vec![("dead", 0..256, now)],
            share: 256,
            take: None,
            release: None,
            look_again_at: Some(now + 1),
        },
        Case {
            name: "short of its share, it takes only up to the share",
            me: "b",
            dead: &[],
            live: &["a", "b"],
            owners: vec![("a", 0..100, now + LEASE_MS)],
            share: 128,
            take: Some(100..228),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "a lease ran out while a dead admin still counts as live: taken beyond the share",
            me: "b",
            dead: &[],
            live: &["a", "b", "c"],
            owners: vec![
                ("a", 0..86, now + LEASE_MS),
                ("c", 86..171, now - 1),
                ("b", 171..256, now + LEASE_MS),
            ],
            share: 85,
            take: Some(86..171),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "above its share, it gives the excess back",
            me: "b",
            dead: &[],
            live: &["a", "b"],
            owners: vec![("a", 0..86, now + LEASE_MS), ("b", 86..256, now + LEASE_MS)],
            share: 128,
            take: None,
            release: Some(214..256),
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "a restarted admin takes its dead predecessor's partitions at once",
            me: "new",
            dead: &["old"],
            live: &["new", "old"],
            owners: vec![("old", 0..256, now + 3_000)],
            share: 256,
            take: Some(0..256),
            release: None,
            look_again_at: None,
        },
        Case {
            name: "a dead admin's partitions: the first live admin takes what its share lacks",
            me: "a",
            dead: &["c"],
            live: &["a", "b", "c"],
            owners: vec![
                ("a", 0..86, now + LEASE_MS),
                ("b", 86..171, now + LEASE_MS),
                ("c", 171..256, now + 3_000),
            ],
            share: 128,
            take: Some(171..213),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "a dead admin's partitions: the second live admin takes the rest",
            me: "b",
            dead: &["c"],
            live: &["a", "b", "c"],
            owners: vec![
                ("a", 0..86, now + LEASE_MS),
                ("b", 86..171, now + LEASE_MS),
                ("c", 171..256, now + 3_000),
            ],
            share: 128,
            take: Some(213..256),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "a dead admin's partitions after the first took its part: the second's part",
            me: "b",
            dead: &["c"],
            live: &["a", "b", "c"],
            owners: vec![
                ("a", 0..86, now + LEASE_MS),
                ("b", 86..171, now + LEASE_MS),
                ("a", 171..213, now + LEASE_MS),
                ("c", 213..256, now + 3_000),
            ],
            share: 128,
            take: Some(213..256),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
        Case {
            name: "a dead admin's partitions while another admin is above its share",
            me: "a",
            dead: &["c"],
            live: &["a", "b", "c"],
            owners: vec![
                ("a", 0..100, now + LEASE_MS),
                ("b", 100..240, now + LEASE_MS),
                ("c", 240..256, now + 3_000),
            ],
            share: 128,
            take: Some(240..256),
            release: None,
            look_again_at: Some(now + LEASE_MS + 1),
        },
    ];
    for case in cases {
        let plan = plan(case.me, now, &live(case.live), &live(case.dead), &leases(&case.owners));
        let expected = Plan {
            share: case.share,
            take: case.take.map_or_else(Vec::new, Iterator::collect),
            release: case.release.map_or_else(Vec::new, |range| range.rev().collect()),
            look_again_at: case.look_again_at,
        };
        assert_eq!(plan, expected, "{}", case.name);
    }
}

#[test]
fn shares_add_up_and_differ_by_at_most_one() {
    for count in 1..=20usize {
        let names: Vec<String> = (0..count).map(|index| format!("admin-{index:02}")).collect();
        let shares: Vec<usize> =
            names.iter().map(|name| plan(name, 0, &names, &[], &leases(&[])).share).collect();
        assert_eq!(shares.iter().sum::<usize>(), usize::from(PARTITIONS), "{count} admins");
        let (least, most) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
        assert!(most - least <= 1, "{count} admins: {shares:?}");
    }
}

/// Admins beat in turn against one table of leases, applying their plans as storage would
/// (a take only of a free partition, a release only of one's own); admins join, one dies
/// (stops beating), one leaves (gives everything back). After each change the shares are
/// reached within a few beats past the lease, and no partition ever has two holders.
#[test]
fn admins_joining_dying_and_leaving_converge_to_fair_shares() {
    let mut table = leases(&[]);
    let mut now = 0;
    let mut seen: BTreeMap<&str, i64> = BTreeMap::new();
    let beat = |table: &mut Vec<Lease>,
                me: &'static str,
                now: i64,
                seen: &mut BTreeMap<&'static str, i64>| {
        seen.insert(me, now);
        for lease in table.iter_mut().filter(|lease| lease.owner.as_deref() == Some(me)) {
            lease.until_ms = now + LEASE_MS;
        }
        let live: Vec<String> = seen
            .iter()
            .filter(|(_, at)| **at >= now - LEASE_MS)
            .map(|(name, _)| (*name).to_owned())
            .collect();
        let plan = plan(me, now, &live, &[], table);
        for partition in plan.take {
            let lease = &mut table[usize::from(partition)];
            assert!(lease.is_free(now), "{me} took a partition not free");
            *lease = Lease {
                partition,
                owner: Some(me.to_owned()),
                fence: lease.fence + 1,
                until_ms: now + LEASE_MS,
            };
        }
        for partition in plan.release {
            let lease = &mut table[usize::from(partition)];
            assert_eq!(lease.owner.as_deref(), Some(me));
            lease.owner = None;
            lease.until_ms = 0;
        }
    };
    let held = |table: &Vec<Lease>, me: &str| {
        table.iter().filter(|lease| lease.owner.as_deref() == Some(me)).count()
    };
    type Phase = (&'static [&'static str], &'static [(&'static str, usize)]);
    let phases: [Phase; 4] = [
        (&["a"], &[("a", 256)]),
        (&["a", "b", "c"], &[("a", 86), ("b", 85), ("c", 85)]),
        // `c` dies: it beats no more, and its partitions are taken once its lease ran out.
        (&["a", "b"], &[("a", 128), ("b", 128)]),
        // `b` leaves: it gives everything back and is forgotten.
        (&["a"], &[("a", 256)]),
    ];
    for (phase, (beating, expected)) in phases.iter().enumerate() {
        if phase == 3 {
            for lease in table.iter_mut().filter(|lease| lease.owner.as_deref() == Some("b")) {
                lease.owner = None;
                lease.until_ms = 0;
            }
            seen.remove("b");
        }
        for _ in 0..(LEASE_MS / 1_000 + 4) {
            now += 1_000;
            for me in *beating {
                beat(&mut table, me, now, &mut seen);
            }
        }
        for (me, share) in *expected {
            assert_eq!(held(&table, me), *share, "phase {phase}: {me}");
        }
    }
}
