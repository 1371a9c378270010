//! Concurrency caps where runs are claimed: a job's cap, its group's, the order of release, and
//! the held runs the sweep leaves alone.

use super::*;
use crate::storage::CappedClaim;

fn manual(job_id: i64, at_ms: i64) -> NewRun {
    NewRun {
        trigger_type: TriggerType::Manual,
        fire_time_ms: None,
        trigger_time_ms: at_ms,
        ..fire(job_id, at_ms, 0)
    }
}

/// What a capped claim of each run did: `C` claimed, `H` held, `-` gone.
async fn claim_each(db: &Db, group_id: i64, ids: &[i64], now_ms: i64) -> String {
    let mut out = String::new();
    for id in ids {
        out.push(
            match db.claim_capped(*id, group_id, "me", now_ms, now_ms + 1_000).await.unwrap() {
                CappedClaim::Claimed(_) => 'C',
                CappedClaim::Held => 'H',
                CappedClaim::Gone => '-',
            },
        );
    }
    out
}

/// Ends claimed run `id` (fence 1) as a success.
async fn end(db: &Db, id: i64, fence: i64, now_ms: i64) {
    let facts = RunFacts {
        state: RunState::Dispatching,
        attempt: 0,
        kill_requested: false,
        trigger_type: TriggerType::Manual,
        from_fire: false,
    };
    let event = Event::Result {
        handle_code: 200,
        message: "ok".to_owned(),
        started_at_ms: None,
        accepted: None,
    };
    let transition = lifecycle::transition(&facts, None, &event).unwrap();
    db.apply_transition(id, &transition, Some(("me", fence)), None, &[], now_ms)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_jobs_cap_holds_runs_and_releases_them_in_order() {
    each_backend("caps_job", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let spec = JobSpec { max_concurrent_runs: 2, ..new_job(group.id) };
        let job = db.create_job(&spec, 10).await.unwrap();
        let mut ids = Vec::new();
        for at in [100, 200, 300, 400] {
            ids.push(db.create_run(&manual(job.id, at), at).await.unwrap().unwrap());
        }
        // Two fit; the third and fourth wait, held, and the sweep leaves them alone.
        assert_eq!(claim_each(&db, group.id, &ids, 500).await, "CCHH");
        let held = db.get_run(ids[2]).await.unwrap().unwrap();
        assert_eq!((held.state, held.held), (RunState::Pending, true));
        assert!(
            db.dispatchable_runs(10_000, 500, 10, &super::everything()).await.unwrap().is_empty()
        );
        assert_eq!(db.groups_with_held_runs(10).await.unwrap(), [group.id]);
        // A run that ends frees one place, and a held run is not claimed past an older one.
        end(&db, ids[0], 1, 600).await;
        assert_eq!(claim_each(&db, group.id, &ids[3..], 650).await, "H");
        // The release gives the place to the oldest held run.
        let released = db.release_held(group.id, "me", 700, 1_700, 10).await.unwrap();
        assert_eq!(released.iter().map(|claim| claim.run.id).collect::<Vec<_>>(), [ids[2]]);
        assert!(!released[0].run.held);
        assert_eq!(db.runs_in_flight(job.id, 10).await.unwrap(), [ids[1], ids[2]]);
        // A claimed run whose lease ran out is taken over whatever the cap says.
        assert_eq!(claim_each(&db, group.id, &ids[1..2], 5_000).await, "C");
        // Ended runs are gone for a claim.
        assert_eq!(claim_each(&db, group.id, &ids[..1], 5_000).await, "-");
        end(&db, ids[1], 2, 5_100).await;
        end(&db, ids[2], 1, 5_200).await;
        let released = db.release_held(group.id, "me", 5_300, 6_300, 10).await.unwrap();
        assert_eq!(released.iter().map(|claim| claim.run.id).collect::<Vec<_>>(), [ids[3]]);
        assert!(db.groups_with_held_runs(10).await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_groups_cap_counts_the_runs_of_all_its_jobs() {
    each_backend("caps_group", |db| async move {
        let group =
            db.create_group("capped", "Capped", AddressType::Auto, &[], 2, 0).await.unwrap();
        let other = db.ensure_group("default", "Default", 0).await.unwrap();
        let a = db.create_job(&new_job(group.id), 10).await.unwrap();
        let b = db.create_job(&new_job(group.id), 10).await.unwrap();
        let free = db.create_job(&new_job(other.id), 10).await.unwrap();
        let mut runs = Vec::new();
        for (job, at) in [(a.id, 100), (b.id, 200), (b.id, 300), (a.id, 400)] {
            runs.push(db.create_run(&manual(job, at), at).await.unwrap().unwrap());
        }
        assert_eq!(claim_each(&db, group.id, &runs, 500).await, "CCHH");
        // Another group's job is not counted, nor held.
        let elsewhere = db.create_run(&manual(free.id, 450), 450).await.unwrap().unwrap();
        assert_eq!(claim_each(&db, other.id, &[elsewhere], 500).await, "C");
        // One end frees one place in the group: the oldest held run of any of its jobs.
        end(&db, runs[0], 1, 600).await;
        let released = db.release_held(group.id, "me", 700, 1_700, 10).await.unwrap();
        assert_eq!(released.iter().map(|claim| claim.run.id).collect::<Vec<_>>(), [runs[2]]);
        assert_eq!(db.groups_with_held_runs(10).await.unwrap(), [group.id]);
        // Raising the cap makes room for the rest.
        db.update_group(group.id, "Capped", AddressType::Auto, &[], 3, 800).await.unwrap();
        let released = db.release_held(group.id, "me", 900, 1_900, 10).await.unwrap();
        assert_eq!(released.iter().map(|claim| claim.run.id).collect::<Vec<_>>(), [runs[3]]);
    })
    .await;
}
