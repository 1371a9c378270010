//! Backfills: leases taken by one admin at a time, releases that move the cursor once, one run
//! per instant whoever creates it, and progress counted per instant.

use super::*;
use crate::backfill::{BackfillState, Progress, WindowSchedule};

fn new_backfill(job_id: i64, rerun: bool) -> NewBackfill {
    NewBackfill {
        job_id,
        from_ms: 1_000,
        to_ms: 10_000,
        max_concurrent: 2,
        rerun,
        window: WindowSchedule {
            schedule_type: ScheduleType::FixRate,
            schedule_conf: "1".to_owned(),
            time_zone: None,
            anchor_ms: 0,
        },
        total: 10,
        created_by: "op".to_owned(),
    }
}

/// A backfill's run for `instant`, as the driver plans it.
fn backfill_run(job_id: i64, instant: i64, rerun: bool) -> NewRun {
    NewRun {
        trigger_type: TriggerType::Backfill,
        fire_time_ms: (!rerun).then_some(instant),
        ..fire(job_id, instant, 0)
    }
}

fn planned(job_id: i64, instants: &[i64], rerun: bool) -> Vec<(i64, Vec<NewRun>)> {
    instants.iter().map(|&at| (at, vec![backfill_run(job_id, at, rerun)])).collect()
}

async fn release(
    db: &Db,
    id: i64,
    owner: &str,
    cursor_ms: i64,
    instants: &[(i64, Vec<NewRun>)],
) -> Option<Vec<Claim>> {
    let release =
        Release { backfill_id: id, owner, cursor_ms, instants, claim_until_ms: None, now_ms: 50 };
    db.release_backfill(&release).await.unwrap()
}

/// Ends run `id` (pending) with `state`'s handle code.
async fn end(db: &Db, id: i64, handle_code: i32) {
    db.claim_run(id, "me", 100, 1_000).await.unwrap().unwrap();
    db.apply_transition(id, &sent("http://e1", 200, 0), Some(("me", 1)), None, &[], 200)
        .await
        .unwrap()
        .unwrap();
    let facts = RunFacts {
        state: RunState::Running,
        attempt: 0,
        kill_requested: false,
        trigger_type: TriggerType::Backfill,
        from_fire: false,
    };
    let job = JobFacts { retry_count: 0, has_children: false, fix_delay_ms: None };
    let event = Event::Result {
        handle_code,
        message: String::new(),
        started_at_ms: Some(250),
        accepted: None,
    };
    let ended = lifecycle::transition(&facts, Some(&job), &event).unwrap();
    db.apply_transition(id, &ended, None, None, &[], 300).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_backfill_is_driven_by_one_admin_and_releases_each_instant_once() {
    each_backend("backfill_lease", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let created = db.create_backfill(&new_backfill(job.id, false), 20).await.unwrap();
        assert_eq!(
            (created.state, created.cursor_ms, created.released),
            (BackfillState::Running, 999, 0)
        );
        assert_eq!(db.get_backfill(created.id).await.unwrap(), Some(created.clone()));
        assert_eq!(db.list_backfills(job.id, 10).await.unwrap(), vec![created.clone()]);
        assert!(db.running_backfills_exist().await.unwrap());

        // One admin holds the lease until it runs out.
        let held = db.claim_backfills("a", 100, 15_100, 10).await.unwrap();
        assert_eq!(held.len(), 1);
        assert!(db.claim_backfills("b", 200, 15_200, 10).await.unwrap().is_empty());
        assert_eq!(db.claim_backfills("a", 300, 15_300, 10).await.unwrap().len(), 1, "renewed");

        // Only the holder releases, and only from the cursor it read.
        let first = planned(job.id, &[1_000, 2_000], false);
        assert_eq!(release(&db, created.id, "b", 999, &first).await, None);
        let runs = release(&db, created.id, "a", 999, &first).await.unwrap();
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|claim| claim.run.trigger_type == TriggerType::Backfill));
        assert_eq!(runs[1].run.trigger_time_ms, 2_000);
        assert_eq!(release(&db, created.id, "a", 999, &first).await, None, "the cursor moved");
        let after = db.get_backfill(created.id).await.unwrap().unwrap();
        assert_eq!((after.cursor_ms, after.released), (2_000, 2));
        assert_eq!(db.unfinished_backfill_runs(created.id, job.id).await.unwrap(), 2);

        // A lease that ran out is taken over; the old holder's release then does nothing.
        assert_eq!(db.claim_backfills("b", 16_000, 31_000, 10).await.unwrap().len(), 1);
        let next = planned(job.id, &[3_000], false);
        assert_eq!(release(&db, created.id, "a", 2_000, &next).await, None);
        assert_eq!(release(&db, created.id, "b", 2_000, &next).await.unwrap().len(), 1);

        // A paused backfill is not claimed and releases nothing; resumed, it goes on.
        let paused = db
            .set_backfill_state(
                created.id,
                &[BackfillState::Running],
                BackfillState::Paused,
                "",
                400,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!((paused.state, paused.finished_at_ms), (BackfillState::Paused, 0));
        assert!(!db.running_backfills_exist().await.unwrap());
        assert!(db.claim_backfills("b", 16_100, 31_100, 10).await.unwrap().is_empty());
        let later = planned(job.id, &[4_000], false);
        assert_eq!(release(&db, created.id, "b", 3_000, &later).await, None);
        let again = db.set_backfill_state(
            created.id,
            &[BackfillState::Running],
            BackfillState::Paused,
            "",
            401,
        );
        assert_eq!(again.await.unwrap(), None, "a paused backfill is not paused again");
        db.set_backfill_state(
            created.id,
            &[BackfillState::Paused],
            BackfillState::Running,
            "",
            402,
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(release(&db, created.id, "b", 3_000, &later).await.unwrap().len(), 1);
        // A lease given up at a stop is taken at once.
        assert_eq!(db.release_backfill_leases("b").await.unwrap(), 1);
        assert_eq!(db.claim_backfills("c", 16_200, 31_200, 10).await.unwrap().len(), 1);

        // Cancelled is final, and stamped.
        let cancelled = db
            .set_backfill_state(
                created.id,
                &[BackfillState::Running, BackfillState::Paused],
                BackfillState::Cancelled,
                "",
                500,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!((cancelled.state, cancelled.finished_at_ms), (BackfillState::Cancelled, 500));
        let resumed = db.set_backfill_state(
            created.id,
            &[BackfillState::Paused],
            BackfillState::Running,
            "",
            501,
        );
        assert_eq!(resumed.await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn an_instant_that_has_a_run_gets_none_unless_rerun() {
    each_backend("backfill_idempotent", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        // The schedule fired at 2_000 already.
        let fired = db.create_run(&fire(job.id, 2_000, 0), 10).await.unwrap().unwrap();

        let first = db.create_backfill(&new_backfill(job.id, false), 20).await.unwrap();
        db.claim_backfills("a", 100, 15_100, 10).await.unwrap();
        let instants = planned(job.id, &[1_000, 2_000, 3_000], false);
        let runs = release(&db, first.id, "a", 999, &instants).await.unwrap();
        let times: Vec<i64> = runs.iter().map(|claim| claim.run.trigger_time_ms).collect();
        assert_eq!(times, [1_000, 3_000], "the fired instant gets no second run");

        // A second identical backfill creates nothing.
        let second = db.create_backfill(&new_backfill(job.id, false), 30).await.unwrap();
        db.claim_backfills("a", 110, 15_110, 10).await.unwrap();
        let none = release(&db, second.id, "a", 999, &instants).await.unwrap();
        assert!(none.is_empty(), "{none:?}");
        let second = db.get_backfill(second.id).await.unwrap().unwrap();
        assert_eq!(
            db.backfill_progress(&second).await.unwrap(),
            Progress { done: 0, failed: 0, skipped: 3, running: 0, pending: 7 }
        );

        // With rerun, every instant gets a run of its own, once.
        let rerun = db.create_backfill(&new_backfill(job.id, true), 40).await.unwrap();
        db.claim_backfills("a", 120, 15_120, 10).await.unwrap();
        let instants = planned(job.id, &[1_000, 2_000, 3_000], true);
        let runs = release(&db, rerun.id, "a", 999, &instants).await.unwrap();
        assert_eq!(runs.len(), 3);
        assert!(runs.iter().all(|claim| claim.run.id != fired));
        assert_eq!(release(&db, rerun.id, "a", 999, &instants).await, None);

        // Progress per instant as the runs end; done once every instant is released and ended.
        let rerun_row = db.get_backfill(rerun.id).await.unwrap().unwrap();
        end(&db, runs[0].run.id, 200).await;
        end(&db, runs[1].run.id, 500).await;
        assert_eq!(
            db.backfill_progress(&rerun_row).await.unwrap(),
            Progress { done: 1, failed: 1, skipped: 0, running: 1, pending: 7 }
        );
        assert_eq!(db.unfinished_backfill_runs(rerun.id, job.id).await.unwrap(), 1);
        let rest: Vec<i64> = (4..=10).map(|second| second * 1_000).collect();
        let rest = planned(job.id, &rest, true);
        assert_eq!(release(&db, rerun.id, "a", 3_000, &rest).await.unwrap().len(), 7);
        assert!(!db.finish_backfill(rerun.id, "a", 600).await.unwrap(), "runs are unfinished");
        let open: Vec<i64> = db
            .list_runs(&RunFilter {
                job_id: Some(job.id),
                state: Some(RunState::Pending),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|run| run.trigger_type == TriggerType::Backfill && run.fire_time_ms.is_none())
            .map(|run| run.id)
            .collect();
        assert_eq!(open.len(), 8);
        for id in open {
            end(&db, id, 200).await;
        }
        assert!(!db.finish_backfill(rerun.id, "b", 600).await.unwrap(), "not the holder");
        assert!(db.finish_backfill(rerun.id, "a", 600).await.unwrap());
        let done = db.get_backfill(rerun.id).await.unwrap().unwrap();
        assert_eq!((done.state, done.finished_at_ms), (BackfillState::Done, 600));
        assert_eq!(
            db.backfill_progress(&done).await.unwrap(),
            Progress { done: 9, failed: 1, skipped: 0, running: 0, pending: 0 }
        );
    })
    .await;
}

/// Two admins that both believe they hold a backfill, releasing the same instants at once:
/// one release commits, the other creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_releasing_together_create_each_run_once() {
    each_backend("backfill_race", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        for rerun in [false, true] {
            let backfill = db.create_backfill(&new_backfill(job.id, rerun), 20).await.unwrap();
            db.claim_backfills("a", 100, 15_100, 10).await.unwrap();
            let instants = planned(job.id, &[1_000, 2_000, 3_000, 4_000], rerun);
            let (one, two) = tokio::join!(
                release(&db, backfill.id, "a", 999, &instants),
                release(&db, backfill.id, "a", 999, &instants)
            );
            let created = one.iter().chain(two.iter()).map(Vec::len).sum::<usize>();
            assert_eq!(created, 4, "rerun {rerun}: {one:?} {two:?}");
            assert!(one.is_none() || two.is_none());
        }
    })
    .await;
}
