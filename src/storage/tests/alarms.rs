//! Alarm events committed with their causes, settled and delivered once, and the daily report.

use super::*;

fn result(state: RunState, attempt: i64, retry_count: i64, handle_code: i32) -> Transition {
    let facts = RunFacts {
        state,
        attempt,
        kill_requested: false,
        trigger_type: TriggerType::Manual,
        from_fire: false,
    };
    let job = JobFacts { retry_count, has_children: false, fix_delay_ms: None };
    let event = Event::Result {
        handle_code,
        message: "boom".to_owned(),
        started_at_ms: Some(350),
        accepted: None,
    };
    lifecycle::transition(&facts, Some(&job), &event).unwrap()
}

fn manual(job_id: i64, attempt: i64) -> NewRun {
    NewRun { trigger_type: TriggerType::Manual, fire_time_ms: None, attempt, ..fire(job_id, 0, 0) }
}

/// Creates a run, sends it and applies `transition` (with `follow_ups`); the run's id.
async fn ended_run(db: &Db, job_id: i64, transition: &Transition, follow_ups: &[NewRun]) -> i64 {
    let id = db.create_run(&manual(job_id, 0), 100).await.unwrap().unwrap();
    db.claim_run(id, "me", 100, 1_000).await.unwrap().unwrap();
    db.apply_transition(id, &sent("http://e1", 200, 0), Some(("me", 1)), None, &[], 200)
        .await
        .unwrap()
        .unwrap();
    db.apply_transition(id, transition, None, None, follow_ups, 300).await.unwrap().unwrap();
    id
}

#[tokio::test]
async fn a_final_failure_commits_its_alarm_event_and_a_retried_one_does_not() {
    each_backend("alarm_events", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        // A failure with a retry left raises nothing; its retry failing for the last time does.
        let retried = result(RunState::Running, 0, 1, 500);
        assert!(!retried.alarm && retried.retry);
        ended_run(&db, job.id, &retried, &[manual(job.id, 1)]).await;
        assert!(db.new_alarm_events(10).await.unwrap().is_empty());
        let last = result(RunState::Running, 0, 0, 502);
        let run_id = ended_run(&db, job.id, &last, &[]).await;
        let events = db.new_alarm_events(10).await.unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        let event = &events[0];
        assert_eq!(
            (event.kind.as_str(), event.job_id, event.run_id, event.state.as_str()),
            (RUN_FAILED, Some(job.id), Some(run_id), "timed_out")
        );
        assert_eq!((event.message.as_str(), event.status.as_str()), ("boom", "new"));
        // Many final failures applied together (one batch) each get their event.
        let mut ids = Vec::new();
        for _ in 0..20 {
            let id = db.create_run(&manual(job.id, 0), 100).await.unwrap().unwrap();
            db.claim_run(id, "me", 100, 1_000).await.unwrap().unwrap();
            let sent = sent("http://e1", 200, 0);
            db.apply_transition(id, &sent, Some(("me", 1)), None, &[], 200).await.unwrap();
            ids.push(id);
        }
        let failed = result(RunState::Running, 0, 0, 500);
        let applies = ids.iter().map(|id| db.apply_transition(*id, &failed, None, None, &[], 300));
        for applied in futures_util::future::join_all(applies).await {
            assert!(applied.unwrap().is_some());
        }
        assert_eq!(db.new_alarm_events(100).await.unwrap().len(), 21);
    })
    .await;
}

fn failed_final() -> Transition {
    result(RunState::Running, 0, 0, 500)
}

#[tokio::test]
async fn events_settle_once_and_deliveries_are_claimed_once() {
    each_backend("alarm_settle", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let failed = result(RunState::Running, 0, 0, 500);
        ended_run(&db, job.id, &failed, &[]).await;
        ended_run(&db, job.id, &failed, &[]).await;
        ended_run(&db, job.id, &failed, &[]).await;
        let events = db.new_alarm_events(10).await.unwrap();
        let (first, second, third) = (&events[0], &events[1], &events[2]);

        assert_eq!(db.alarm_silence(job.id).await.unwrap(), None);
        let send = Settle::Send {
            job_id: Some(job.id),
            last: None,
            deliveries: vec![("webhook".to_owned(), "7".to_owned())],
        };
        assert!(db.settle_alarm_event(first, &send, 1_000).await.unwrap());
        // Settled once: a second admin that read the same event changes nothing.
        assert!(!db.settle_alarm_event(first, &send, 1_000).await.unwrap());
        let last = db.alarm_silence(job.id).await.unwrap().unwrap();
        assert_eq!(last, (first.created_at_ms, first.id));
        // A decision made on a silence row that moved meanwhile is refused.
        assert!(!db.settle_alarm_event(second, &send, 1_000).await.unwrap());
        let stale = Settle::Silenced { job_id: job.id, last: (0, 0) };
        assert!(!db.settle_alarm_event(second, &stale, 1_000).await.unwrap());
        let silenced = Settle::Silenced { job_id: job.id, last };
        assert!(db.settle_alarm_event(second, &silenced, 1_000).await.unwrap());
        let again = Settle::Send {
            job_id: Some(job.id),
            last: Some(last),
            deliveries: vec![("webhook".to_owned(), "7".to_owned())],
        };
        assert!(db.settle_alarm_event(third, &again, 1_000).await.unwrap());
        assert!(db.new_alarm_events(10).await.unwrap().is_empty());
        let listed = db.list_alarm_events(Some(job.id), 10).await.unwrap();
        let statuses: Vec<(&str, i64)> =
            listed.iter().map(|e| (e.status.as_str(), e.silenced_before)).collect();
        assert_eq!(statuses, [("sent", 1), ("silenced", 0), ("sent", 0)]);

        // Two deliveries; each is claimed by one admin only, until its lease runs out.
        let due = db.due_alarm_deliveries(1_000, 10).await.unwrap();
        assert_eq!(due.len(), 2);
        let claimed = db.claim_alarm_delivery(due[0], "a", 1_000, 61_000).await.unwrap().unwrap();
        assert_eq!((claimed.channel.as_str(), claimed.target.as_str()), ("webhook", "7"));
        assert_eq!(claimed.event.id, first.id);
        assert!(db.claim_alarm_delivery(due[0], "b", 1_000, 61_000).await.unwrap().is_none());
        assert_eq!(db.due_alarm_deliveries(1_000, 10).await.unwrap(), [due[1]]);
        // A failed attempt waits for its next one; only the lease holder records it.
        let retry = DeliveryOutcome::Retry { at_ms: 5_000, error: "refused".to_owned() };
        assert!(!db.finish_alarm_delivery(due[0], "b", &retry).await.unwrap());
        assert!(db.finish_alarm_delivery(due[0], "a", &retry).await.unwrap());
        assert!(db.claim_alarm_delivery(due[0], "b", 4_999, 70_000).await.unwrap().is_none());
        let claimed = db.claim_alarm_delivery(due[0], "b", 5_000, 70_000).await.unwrap().unwrap();
        assert_eq!((claimed.attempts, claimed.last_error.as_str()), (1, "refused"));
        let delivered = DeliveryOutcome::Delivered(5_100);
        assert!(db.finish_alarm_delivery(due[0], "b", &delivered).await.unwrap());
        // An expired lease is taken over: its holder died mid-attempt.
        db.claim_alarm_delivery(due[1], "a", 1_000, 2_000).await.unwrap().unwrap();
        db.claim_alarm_delivery(due[1], "b", 2_001, 9_000).await.unwrap().unwrap();
        let failed = DeliveryOutcome::Failed { error: "gone".to_owned() };
        assert!(!db.finish_alarm_delivery(due[1], "a", &failed).await.unwrap());
        assert!(db.finish_alarm_delivery(due[1], "b", &failed).await.unwrap());
        assert!(db.due_alarm_deliveries(i64::MAX - 1, 10).await.unwrap().is_empty());
        let states: Vec<(String, i64)> = db
            .list_alarm_deliveries(10)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.state, d.attempts))
            .collect();
        assert_eq!(states, [("failed".to_owned(), 1), ("delivered".to_owned(), 2)]);

        // Retention: ended deliveries and settled events go; a pending delivery keeps its event.
        let pending = Settle::Send {
            job_id: None,
            last: None,
            deliveries: vec![("webhook".to_owned(), "8".to_owned())],
        };
        ended_run(&db, job.id, &failed_final(), &[]).await;
        let fourth = db.new_alarm_events(10).await.unwrap().remove(0);
        assert!(db.settle_alarm_event(&fourth, &pending, 1_000).await.unwrap());
        assert_eq!(db.delete_old_alarms(300).await.unwrap(), 0);
        assert_eq!(db.delete_old_alarms(i64::MAX).await.unwrap(), 2 + 3);
        assert_eq!(db.list_alarm_events(None, 10).await.unwrap().len(), 1);
        assert_eq!(db.list_alarm_deliveries(10).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn an_executor_is_alarmed_once_per_time_it_goes_silent() {
    each_backend("alarm_lost", |db| async move {
        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://a:9999",
            &Peer { kind: "wasmjob", version: "" },
            1_000,
        )
        .await
        .unwrap();
        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://b:9999",
            &Peer { kind: "wasmjob", version: "" },
            5_000,
        )
        .await
        .unwrap();
        let lost = db.mark_lost_executors("EXECUTOR", 2_000, 3_000).await.unwrap();
        assert_eq!(lost, [("default".to_owned(), "http://a:9999".to_owned())]);
        assert!(db.mark_lost_executors("EXECUTOR", 2_500, 3_500).await.unwrap().is_empty());
        // It comes back, then goes silent again: a new alarm.
        db.upsert_registration(
            "EXECUTOR",
            "default",
            "http://a:9999",
            &Peer { kind: "wasmjob", version: "" },
            4_000,
        )
        .await
        .unwrap();
        assert!(db.mark_lost_executors("EXECUTOR", 4_000, 4_100).await.unwrap().is_empty());
        let lost = db.mark_lost_executors("EXECUTOR", 4_500, 4_600).await.unwrap();
        assert_eq!(lost.len(), 1);
        let events = db.new_alarm_events(10).await.unwrap();
        let kinds: Vec<(&str, &str)> =
            events.iter().map(|e| (e.kind.as_str(), e.executor_address.as_str())).collect();
        assert_eq!(kinds, [(EXECUTOR_LOST, "http://a:9999"), (EXECUTOR_LOST, "http://a:9999")]);
    })
    .await;
}

#[tokio::test]
async fn the_daily_report_counts_runs_by_state_and_keeps_deleted_ones() {
    each_backend("report", |db| async move {
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let job = db.create_job(&new_job(group.id), 10).await.unwrap();
        let day = |n: i64| n * DAY_MS;
        // Day 10: two successes, a failure, a pending run; day 12: a kill.
        let create = |at: i64| {
            let db = db.clone();
            async move { db.create_run(&manual(job.id, 0), at).await.unwrap().unwrap() }
        };
        let ok = result(RunState::Running, 0, 0, 200);
        let failed = result(RunState::Running, 0, 0, 500);
        let end = async |id: i64, transition: &Transition| {
            db.claim_run(id, "me", 0, i64::MAX).await.unwrap().unwrap();
            db.apply_transition(id, &sent("http://e1", 1, 0), Some(("me", 1)), None, &[], 1)
                .await
                .unwrap();
            db.apply_transition(id, transition, None, None, &[], 2).await.unwrap().unwrap();
        };
        for transition in [&ok, &ok, &failed] {
            let id = create(day(10) + 5).await;
            end(id, transition).await;
        }
        create(day(10) + 6).await;
        let killed = create(day(12) + DAY_MS - 1).await;
        let kill = lifecycle::transition(
            &RunFacts {
                state: RunState::Pending,
                attempt: 0,
                kill_requested: false,
                trigger_type: TriggerType::Manual,
                from_fire: false,
            },
            None,
            &Event::Kill,
        )
        .unwrap();
        db.apply_transition(killed, &kill, None, None, &[], 3).await.unwrap().unwrap();

        let render = |days: Vec<DayCounts>| -> Vec<String> {
            days.iter()
                .map(|d| {
                    format!(
                        "{} ok {} failed {} killed {} running {} total {}",
                        d.day_ms / DAY_MS,
                        d.success,
                        d.failed,
                        d.killed,
                        d.running,
                        d.total
                    )
                })
                .collect()
        };
        let expected = [
            "9 ok 0 failed 0 killed 0 running 0 total 0",
            "10 ok 2 failed 1 killed 0 running 1 total 4",
            "11 ok 0 failed 0 killed 0 running 0 total 0",
            "12 ok 0 failed 0 killed 1 running 0 total 1",
        ];
        // Counted by the transactions that created and ended the runs, then the same once
        // folded, the folding in two goes.
        let counted = db.report_days(day(9), day(12)).await.unwrap();
        assert_eq!(render(counted), expected);
        assert!(db.fold_report(3).await.unwrap() == 3);
        assert_eq!(render(db.report_days(day(9), day(12)).await.unwrap()), expected);
        assert!(db.fold_report(1_000).await.unwrap() > 0);
        assert_eq!(db.fold_report(1_000).await.unwrap(), 0);
        assert_eq!(render(db.report_days(day(9), day(12)).await.unwrap()), expected);

        // Retention deletes the ended runs of day 10; the report keeps them.
        assert_eq!(db.delete_ended_runs(day(11), 100).await.unwrap(), 3);
        assert_eq!(render(db.report_days(day(9), day(12)).await.unwrap()), expected);
        // The run left unfinished on day 10 ends: it moves from running to its state.
        let pending = db.dispatchable_runs(i64::MAX, 100, 10, &super::everything()).await.unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        end(pending[0].0, &ok).await;
        let ended = db.report_days(day(10), day(10)).await.unwrap();
        assert_eq!(render(ended), ["10 ok 3 failed 1 killed 0 running 0 total 4"]);
    })
    .await;
}
