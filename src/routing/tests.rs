//! Table tests of the route strategies, with XXL-JOB's placements as expected values.

use super::*;
use expect_test::{Expect, expect};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::fmt::Write as _;

use RouteStrategy::*;

const HOUR_MS: i64 = 60 * 60 * 1000;

/// One row of a scenario: route `times` triggers of `job` over `addresses` at `now_ms`.
struct Step<'a> {
    strategy: RouteStrategy,
    job: i64,
    addresses: &'a [&'a str],
    now_ms: i64,
    times: usize,
}

fn step<'a>(
    strategy: RouteStrategy,
    job: i64,
    addresses: &'a [&'a str],
    now_ms: i64,
    times: usize,
) -> Step<'a> {
    Step { strategy, job, addresses, now_ms, times }
}

fn render(route: Option<Route>) -> String {
    match route {
        None => "none".to_owned(),
        Some(Route::One(address)) => address,
        Some(Route::FirstPassing { probe, candidates }) => {
            format!("{probe:?}?[{}]", candidates.join(","))
        }
        Some(Route::Broadcast(targets)) => {
            let shards: Vec<String> = targets
                .iter()
                .map(|(address, index, total)| format!("{address}#{index}/{total}"))
                .collect();
            format!("[{}]", shards.join(","))
        }
    }
}

/// Runs the steps in order on `state` with a seeded RNG and prints one line per step.
fn check(mut state: RouterState, steps: &[Step<'_>], expected: Expect) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut out = String::new();
    for s in steps {
        let addresses: Vec<String> = s.addresses.iter().map(|a| (*a).to_owned()).collect();
        let picks: Vec<String> = (0..s.times)
            .map(|_| render(state.route(s.strategy, s.job, &addresses, s.now_ms, &mut rng)))
            .collect();
        let _ = writeln!(
            out,
            "{} job={} t={} [{}] -> {}",
            s.strategy,
            s.job,
            s.now_ms,
            s.addresses.join(","),
            picks.join(" ")
        );
    }
    expected.assert_eq(&out);
}

const ABC: &[&str] = &["a", "b", "c"];

#[test]
fn stateless_strategies() {
    check(
        RouterState::new(),
        &[
            step(First, 1, ABC, 0, 2),
            step(Last, 1, ABC, 0, 2),
            step(Random, 1, ABC, 0, 8),
            step(Failover, 1, ABC, 0, 1),
            step(Busyover, 1, ABC, 0, 1),
            step(ShardingBroadcast, 1, ABC, 0, 1),
            step(ShardingBroadcast, 1, &["solo"], 0, 1),
        ],
        expect![[r#"
            FIRST job=1 t=0 [a,b,c] -> a a
            LAST job=1 t=0 [a,b,c] -> c c
            RANDOM job=1 t=0 [a,b,c] -> b a a a a a b b
            FAILOVER job=1 t=0 [a,b,c] -> Beat?[a,b,c]
            BUSYOVER job=1 t=0 [a,b,c] -> IdleBeat?[a,b,c]
            SHARDING_BROADCAST job=1 t=0 [a,b,c] -> [a#0/3,b#1/3,c#2/3]
            SHARDING_BROADCAST job=1 t=0 [solo] -> [solo#0/1]
        "#]],
    );
}

#[test]
fn no_addresses_means_no_route() {
    let steps: Vec<Step<'_>> =
        RouteStrategy::ALL.iter().map(|&strategy| step(strategy, 1, &[], 0, 1)).collect();
    check(
        RouterState::new(),
        &steps,
        expect![[r#"
        FIRST job=1 t=0 [] -> none
        LAST job=1 t=0 [] -> none
        ROUND job=1 t=0 [] -> none
        RANDOM job=1 t=0 [] -> none
        CONSISTENT_HASH job=1 t=0 [] -> none
        LEAST_FREQUENTLY_USED job=1 t=0 [] -> none
        LEAST_RECENTLY_USED job=1 t=0 [] -> none
        FAILOVER job=1 t=0 [] -> none
        BUSYOVER job=1 t=0 [] -> none
        SHARDING_BROADCAST job=1 t=0 [] -> none
    "#]],
    );
}

#[test]
fn round_counts_per_job_from_a_random_start() {
    check(
        RouterState::new(),
        &[
            step(Round, 1, ABC, 0, 4),
            step(Round, 2, ABC, 0, 4),
            // The counter belongs to the job, not to the address list.
            step(Round, 1, &["a", "b"], HOUR_MS, 4),
            // Exactly 24 hours after first use the cache is still valid...
            step(Round, 1, ABC, 24 * HOUR_MS, 1),
            // ...one millisecond later it is dropped and job 1 starts from a new random value.
            step(Round, 1, ABC, 24 * HOUR_MS + 1, 3),
        ],
        expect![[r#"
            ROUND job=1 t=0 [a,b,c] -> c a b c
            ROUND job=2 t=0 [a,b,c] -> a b c a
            ROUND job=1 t=3600000 [a,b] -> b a b a
            ROUND job=1 t=86400000 [a,b,c] -> b
            ROUND job=1 t=86400001 [a,b,c] -> c a b
        "#]],
    );
}

#[test]
fn round_restarts_after_a_million() {
    let mut state = RouterState::new();
    state.round.jobs(0).insert(1, COUNT_RESET_ABOVE - 1);
    // The counter goes 999_999 -> 1_000_000 (b) -> 1_000_001 (c), and because that is past the
    // limit the next trigger starts again from a random value, as XXL-JOB's does.
    check(
        state,
        &[step(Round, 1, ABC, 0, 4)],
        expect![[r#"
        ROUND job=1 t=0 [a,b,c] -> b c c a
    "#]],
    );
}

#[test]
fn consistent_hash_matches_xxl_job() {
    // The expected placements were computed independently of this code, with Python's
    // hashlib and a sorted ring built the way XXL-JOB's TreeMap is:
    //
    // python3 -c 'import hashlib,bisect
    // h=lambda k:int.from_bytes(hashlib.md5(k.encode()).digest()[:4],"little")
    // def pick(j,addrs):
    //     ring={h(f"SHARD-{a}-NODE-{i}"):a for a in addrs for i in range(100)}
    //     ks=sorted(ring); x=bisect.bisect_left(ks,h(str(j))); return ring[ks[x%len(ks)]]
    // A=["http://10.0.0.1:9999/","http://10.0.0.2:9999/","http://10.0.0.3:9999/"]
    // for addrs in (A,A[:2],A[1:]): print([pick(j,addrs)[-7] for j in [1,2,3,5,7,42,1000]])'
    //
    // ['3', '3', '1', '1', '2', '2', '3']
    // ['1', '1', '1', '1', '2', '2', '2']
    // ['3', '3', '2', '2', '2', '2', '3']
    //
    // Dropping an address moves only the jobs that were on it, which is the point of a ring.
    const ALL: &[&str] =
        &["http://10.0.0.1:9999/", "http://10.0.0.2:9999/", "http://10.0.0.3:9999/"];
    let lists: [&[&str]; 3] = [ALL, &ALL[..2], &ALL[1..]];
    let steps: Vec<Step<'_>> = lists
        .iter()
        .flat_map(|&list| {
            [1, 2, 3, 5, 7, 42, 1000].map(|job| step(ConsistentHash, job, list, 0, 1))
        })
        .collect();
    check(
        RouterState::new(),
        &steps,
        expect![[r#"
            CONSISTENT_HASH job=1 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
            CONSISTENT_HASH job=2 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
            CONSISTENT_HASH job=3 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=5 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=7 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=42 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=1000 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
            CONSISTENT_HASH job=1 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=2 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=3 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=5 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.1:9999/
            CONSISTENT_HASH job=7 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=42 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=1000 t=0 [http://10.0.0.1:9999/,http://10.0.0.2:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=1 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
            CONSISTENT_HASH job=2 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
            CONSISTENT_HASH job=3 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=5 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=7 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=42 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.2:9999/
            CONSISTENT_HASH job=1000 t=0 [http://10.0.0.2:9999/,http://10.0.0.3:9999/] -> http://10.0.0.3:9999/
        "#]],
    );
}

#[test]
fn consistent_hash_hashes_the_address_as_xxl_job_registered_it() {
    // Our admin stores `http://ip:port` without the slash XXL-JOB executors register with, and
    // XXL-JOB hashes the registered string, slash included. Expected placements, from the
    // Python ring of the test above fed the registered (slashed) spellings:
    //
    // A=["http://192.168.1.10:9999/","http://192.168.1.11:9999/","http://192.168.1.12:9999/"]
    // print([pick(j,A)[-7] for j in [1,2,3,4,5,6,7,8,9,10,42,1000]])
    // ['0', '2', '0', '2', '0', '1', '1', '1', '0', '0', '0', '0']
    //
    // (Hashing the stored spellings instead gives 2 0 0 0 0 2 0 2 2 2 2 1: most jobs would move
    // when a user switches from a Java admin.) Both spellings must land on the same executor.
    const STORED: &[&str] =
        &["http://192.168.1.10:9999", "http://192.168.1.11:9999", "http://192.168.1.12:9999"];
    const REGISTERED: &[&str] =
        &["http://192.168.1.10:9999/", "http://192.168.1.11:9999/", "http://192.168.1.12:9999/"];
    let jobs = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 1000];
    let mut rng = StdRng::seed_from_u64(7);
    let mut state = RouterState::new();
    let mut line = |addresses: &[&str]| -> String {
        let addresses: Vec<String> = addresses.iter().map(|a| (*a).to_owned()).collect();
        let picks: Vec<String> = jobs
            .iter()
            .map(|&job| {
                let route = state.route(ConsistentHash, job, &addresses, 0, &mut rng);
                let picked = render(route);
                let host = picked.trim_end_matches('/').trim_end_matches(":9999");
                host.rsplit('.').next().unwrap_or_default().to_owned()
            })
            .collect();
        picks.join(" ")
    };
    let out = format!("stored:     {}\nregistered: {}\n", line(STORED), line(REGISTERED));
    expect![[r#"
        stored:     10 12 10 12 10 11 11 11 10 10 10 10
        registered: 10 12 10 12 10 11 11 11 10 10 10 10
    "#]]
    .assert_eq(&out);
}

#[test]
fn least_frequently_used() {
    check(
        RouterState::new(),
        &[
            step(LeastFrequentlyUsed, 1, ABC, 0, 9),
            // d starts at a random count below 4, under the others, so it is picked until it
            // catches up.
            step(LeastFrequentlyUsed, 1, &["a", "b", "c", "d"], 0, 8),
            step(LeastFrequentlyUsed, 1, &["b", "d"], 0, 4),
            step(LeastFrequentlyUsed, 2, &["x"], 0, 2),
            // After 24 hours the counts start over from random values.
            step(LeastFrequentlyUsed, 1, ABC, 25 * HOUR_MS, 6),
        ],
        expect![[r#"
            LEAST_FREQUENTLY_USED job=1 t=0 [a,b,c] -> b c a b c a b c a
            LEAST_FREQUENTLY_USED job=1 t=0 [a,b,c,d] -> d d b c d a b c
            LEAST_FREQUENTLY_USED job=1 t=0 [b,d] -> d b d b
            LEAST_FREQUENTLY_USED job=2 t=0 [x] -> x x
            LEAST_FREQUENTLY_USED job=1 t=90000000 [a,b,c] -> a a b c a b
        "#]],
    );
}

#[test]
fn least_frequently_used_ties_and_overflow() {
    let mut state = RouterState::new();
    let counts = state.lfu.jobs(0).entry(1).or_default();
    for (address, count) in [("a", 5), ("b", 3), ("c", 3), ("d", COUNT_RESET_ABOVE + 1)] {
        counts.insert(address.to_owned(), count);
    }
    // d is over the limit, so it restarts at a random count below 4. b and c tie at 3 and
    // b wins because it comes first in the list; in the second step they tie again at 4
    // and c wins, because now it comes first: the list order breaks ties, not the name.
    check(
        state,
        &[
            step(LeastFrequentlyUsed, 1, &["a", "b", "c", "d"], 0, 4),
            step(LeastFrequentlyUsed, 1, &["a", "c", "b", "d"], 0, 4),
        ],
        expect![[r#"
            LEAST_FREQUENTLY_USED job=1 t=0 [a,b,c,d] -> d d b c
            LEAST_FREQUENTLY_USED job=1 t=0 [a,c,b,d] -> d c b d
        "#]],
    );
}

#[test]
fn least_recently_used() {
    check(
        RouterState::new(),
        &[
            step(LeastRecentlyUsed, 1, ABC, 0, 4),
            // b is gone and d is new: d joins behind everything used so far.
            step(LeastRecentlyUsed, 1, &["a", "c", "d"], 0, 4),
            step(LeastRecentlyUsed, 2, &["c", "a"], 0, 3),
            // After 24 hours the order starts over from the list.
            step(LeastRecentlyUsed, 1, &["a", "c", "d"], 25 * HOUR_MS, 2),
        ],
        expect![[r#"
            LEAST_RECENTLY_USED job=1 t=0 [a,b,c] -> a b c a
            LEAST_RECENTLY_USED job=1 t=0 [a,c,d] -> c a d c
            LEAST_RECENTLY_USED job=2 t=0 [c,a] -> c a c
            LEAST_RECENTLY_USED job=1 t=90000000 [a,c,d] -> a c
        "#]],
    );
}

#[test]
fn strategies_keep_separate_caches() {
    // ROUND, LFU and LRU each expire on their own clock, as XXL-JOB's classes do: LRU first
    // used at hour 20 survives ROUND's reset at hour 25.
    check(
        RouterState::new(),
        &[
            step(Round, 1, ABC, 0, 1),
            step(LeastRecentlyUsed, 1, ABC, 20 * HOUR_MS, 2),
            step(Round, 1, ABC, 25 * HOUR_MS, 1),
            step(LeastRecentlyUsed, 1, ABC, 25 * HOUR_MS, 2),
        ],
        expect![[r#"
            ROUND job=1 t=0 [a,b,c] -> c
            LEAST_RECENTLY_USED job=1 t=72000000 [a,b,c] -> a b
            ROUND job=1 t=90000000 [a,b,c] -> a
            LEAST_RECENTLY_USED job=1 t=90000000 [a,b,c] -> c a
        "#]],
    );
}
