//! The partitions' leases on every backend: beats, takes only of free or expired partitions,
//! give-backs, and fires that commit only under the lease they were planned under.

use super::*;
use crate::partition::{Held, PARTITIONS};
use crate::storage::Fire;

const LEASE_MS: i64 = 4_000;

fn held(owner: &str, fences: std::collections::HashMap<u16, i64>) -> Held {
    Held { owner: owner.to_owned(), fences: fences.into_iter().collect() }
}

#[tokio::test]
async fn leases_are_taken_only_when_free_and_renewed_by_their_holder() {
    each_backend("partition_leases", |db| async move {
        let all: Vec<u16> = (0..PARTITIONS).collect();
        // A fresh database has every partition free, and no admin.
        let beat = db.beat_partitions("a", "http://a", "", 100, 1_000, LEASE_MS).await.unwrap();
        assert_eq!(beat.live, ["a"]);
        assert!(beat.renewed.is_empty());
        assert_eq!(beat.leases.len(), usize::from(PARTITIONS));
        assert!(beat.leases.iter().all(|lease| lease.owner.is_none() && lease.fence == 0));

        let taken_a = db.take_partitions("a", &all[..128], &[], 1_000, 5_000).await.unwrap();
        assert_eq!(taken_a.len(), 128);
        assert!(taken_a.values().all(|fence| *fence == 1));
        // `b` asks for all: it gets only the free half, even when both ask at once.
        let (b, c) = tokio::join!(
            db.take_partitions("b", &all, &[], 1_001, 5_001),
            db.take_partitions("c", &all, &[], 1_001, 5_001),
        );
        let (b, c) = (b.unwrap(), c.unwrap());
        assert_eq!(b.len() + c.len(), 128, "each free partition taken once");
        assert!(b.keys().chain(c.keys()).all(|partition| *partition >= 128));

        // Renewed by its holder's beat; seen live with the others.
        db.beat_partitions("b", "http://b", "", 100, 1_500, LEASE_MS).await.unwrap();
        db.beat_partitions("c", "http://c", "", 100, 1_500, LEASE_MS).await.unwrap();
        let beat = db.beat_partitions("a", "http://a", "", 100, 2_000, LEASE_MS).await.unwrap();
        assert_eq!(beat.renewed, taken_a);
        assert_eq!(beat.live, ["a", "b", "c"]);
        let renewed = beat.leases.iter().filter(|lease| lease.owner.as_deref() == Some("a"));
        assert!(renewed.clone().all(|lease| lease.until_ms == 2_000 + LEASE_MS));

        // While `a`'s lease runs, nobody takes its partitions; once it ran out, `b` does, with
        // a new fence, and `a`'s next beat renews nothing.
        let early = db.take_partitions("b", &all[..128], &[], 5_999, 9_999).await.unwrap();
        assert!(early.is_empty(), "{early:?}");
        let late = db.take_partitions("b", &all[..128], &[], 6_001, 10_001).await.unwrap();
        assert_eq!(late.len(), 128);
        assert!(late.values().all(|fence| *fence == 2));
        let beat = db.beat_partitions("a", "http://a", "", 100, 6_002, LEASE_MS).await.unwrap();
        assert!(beat.renewed.is_empty());

        // `c` leaves: its partitions are free at once, and it is no admin any more.
        let left = db.leave_partitions("c").await.unwrap();
        assert_eq!(left, c.len() as u64);
        let admins = db.live_admins(0).await.unwrap();
        let owners: Vec<&str> = admins.iter().map(|admin| admin.owner.as_str()).collect();
        assert_eq!(owners, ["a", "b"]);
        assert_eq!(admins[1].partitions.len(), 128 + b.len());
        assert_eq!(admins[1].address, "http://b");
        // A give-back frees only the giver's own.
        assert_eq!(db.release_partitions("a", &all).await.unwrap(), 0);
        assert_eq!(db.release_partitions("b", &all[..10]).await.unwrap(), 10);
        let again = db.take_partitions("a", &all[..20], &[], 6_003, 10_003).await.unwrap();
        assert_eq!(again.len(), 10);
        // A restarted admin of the same member (host and listen address) finds its dead
        // predecessor, forgets it, and takes its partitions at once, lease or not.
        db.beat_partitions("old", "http://x", "host/x", 50, 6_004, LEASE_MS).await.unwrap();
        let old = db.take_partitions("old", &all, &[], 6_004, 10_004).await.unwrap();
        assert!(!old.is_empty());
        let old: Vec<u16> = old.into_keys().collect();
        let beat = db.beat_partitions("new", "http://x", "host/x", 60, 6_005, LEASE_MS).await;
        let dead = beat.unwrap().predecessors;
        assert_eq!(dead, ["old"]);
        let other = db.beat_partitions("other", "", "host/y", 40, 6_005, LEASE_MS).await;
        assert!(other.unwrap().predecessors.is_empty(), "another member's admins are not its");
        let early = db.take_partitions("a", &old, &[], 6_006, 10_006).await.unwrap();
        assert!(early.is_empty(), "the lease runs for everyone else");
        let taken = db.take_partitions("new", &old, &dead, 6_006, 10_006).await.unwrap();
        assert_eq!(taken.len(), old.len());
        assert!(!db.live_admins(0).await.unwrap().iter().any(|admin| admin.owner == "old"));
        db.leave_partitions("new").await.unwrap();
        db.leave_partitions("other").await.unwrap();
        // Admins silent for long are forgotten.
        assert_eq!(db.forget_departed_admins(1_500).await.unwrap(), 0);
        assert_eq!(db.forget_departed_admins(2_001).await.unwrap(), 1, "b last beat at 1500");
    })
    .await;
}

#[tokio::test]
async fn a_fire_commits_only_under_the_lease_it_was_planned_under() {
    each_backend("partition_fires", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        assert!(db.set_job_running(job.id, Some(1_000), 11).await.unwrap());
        let partition = crate::partition::of(job.id);
        let other = (partition + 1) % PARTITIONS;

        // `a` holds the job's partition; `b` holds another: `b` reads no due job.
        let a = held("a", db.take_partitions("a", &[partition], &[], 0, 3_000).await.unwrap());
        let b = held("b", db.take_partitions("b", &[other], &[], 0, 3_000).await.unwrap());
        assert_eq!(db.due_jobs(1_000, 10, &a).await.unwrap().len(), 1);
        assert!(db.due_jobs(1_000, 10, &b).await.unwrap().is_empty());
        assert_eq!(db.earliest_fire(&b).await.unwrap(), None);
        assert!(db.due_jobs(1_000, 10, &Held::none("c")).await.unwrap().is_empty());

        // `a` planned the fire, then lost the partition to `b` (its lease ran out): the fire
        // commits nothing. Under `b`'s lease, it commits.
        let fire = Fire {
            job_id: job.id,
            expected_fire_ms: 1_000,
            next: NextFire::At(2_000),
            runs: vec![fire(job.id, 1_000, 0)],
            claim: None,
        };
        let taken = db.take_partitions("b", &[partition], &[], 3_001, 7_000).await.unwrap();
        let b = held("b", b.fences.clone().into_iter().chain(taken).collect());
        let stale = db.fire_jobs(std::slice::from_ref(&fire), 3_002, Some(&a)).await.unwrap();
        assert!(stale[0].is_empty(), "a fire under a lost lease");
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().next_fire_ms, 1_000);
        // Even `a` taking it back later does not revive the fence it planned under.
        db.release_partitions("b", &[partition]).await.unwrap();
        db.take_partitions("a", &[partition], &[], 3_003, 7_000).await.unwrap();
        let stale = db.fire_jobs(std::slice::from_ref(&fire), 3_004, Some(&a)).await.unwrap();
        assert!(stale[0].is_empty(), "a fire under an older fence");
        let b_stale = db.fire_jobs(std::slice::from_ref(&fire), 3_004, Some(&b)).await.unwrap();
        assert!(b_stale[0].is_empty(), "b gave it back");
        let now =
            held("a", db.beat_partitions("a", "", "", 0, 3_005, LEASE_MS).await.unwrap().renewed);
        let fired = db.fire_jobs(std::slice::from_ref(&fire), 3_006, Some(&now)).await.unwrap();
        assert_eq!(fired[0].len(), 1);
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().next_fire_ms, 2_000);
    })
    .await;
}

#[tokio::test]
async fn an_admins_session_is_seen_open_until_its_connection_ends() {
    each_backend("admin_sessions", |db| async move {
        let owner = "with-a-session";
        let session = db.open_admin_session(owner).await.unwrap();
        if db.dialect() == Dialect::Sqlite {
            assert!(session.is_none(), "one admin uses SQLite alone: no session");
            let beat = db.beat_partitions(owner, "", "", 0, 1_000, LEASE_MS).await.unwrap();
            assert!(beat.sessions.is_empty());
            return;
        }
        let session = session.expect("a session");
        // Its lock is held: a second session of the same id cannot take it.
        assert!(db.open_admin_session(owner).await.unwrap().is_none());
        db.beat_partitions("without", "", "", 0, 1_000, LEASE_MS).await.unwrap();
        let beat = db.beat_partitions(owner, "", "", 0, 1_000, LEASE_MS).await.unwrap();
        assert_eq!(beat.sessions, [owner.to_owned()].into(), "only the admin with a session");

        // Its connection ends: the database lets the lock go, and a beat sees it.
        drop(session);
        let mut open = true;
        for _ in 0..100 {
            let beat = db.beat_partitions("without", "", "", 0, 1_100, LEASE_MS).await.unwrap();
            open = beat.sessions.contains(owner);
            if !open {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(!open, "the session was seen to end");
        assert!(db.open_admin_session(owner).await.unwrap().is_some(), "and can be opened again");
    })
    .await;
}
