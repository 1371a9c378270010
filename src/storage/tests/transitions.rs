//! A transition answers its run exactly as stored, whether the group commit counted the row it
//! changed (on SQLite, a run at a time, when the run was still as its caller read it) or had
//! the rows returned.

use std::sync::atomic::Ordering;

use super::*;

/// The transition of `event` for `run` as read, as the dispatcher computes it (no job: no
/// retry, alarm or child, so the group commit records it with the batch's other updates).
fn transition_of(run: &RunRecord, event: &Event) -> Transition {
    lifecycle::transition(&RunFacts::of(run), None, event).unwrap()
}

fn apply(run: &RunRecord, event: Event, lease: Option<(&str, i64)>, now_ms: i64) -> batch::Write {
    batch::Write::Apply {
        run: Box::new(run.clone()),
        transition: transition_of(run, &event),
        lease: lease.map(|(owner, fence)| (owner.to_owned(), fence)),
        fuel_used: Some(now_ms * 10),
        follow_ups: Vec::new(),
        now_ms,
    }
}

/// Commits `writes` (of distinct runs) as one batch: the runs they answered, `None` where a
/// compare failed. Each run answered is the run as `get_run` reads it once the batch committed.
async fn commit(db: &Db, writes: Vec<batch::Write>) -> Vec<Option<RunRecord>> {
    let answers = commit_batch(db, writes).await;
    let answered: Vec<Option<RunRecord>> = answers
        .into_iter()
        .map(|answer| match answer.unwrap() {
            batch::Written::Applied(applied) => applied.map(|(run, _)| run),
            other => panic!("unexpected answer {other:?}"),
        })
        .collect();
    for run in answered.iter().flatten() {
        assert_eq!(Some(run), db.get_run(run.id).await.unwrap().as_ref(), "run {}", run.id);
    }
    answered
}

fn result(code: i32, accepted: Option<(&str, i64)>) -> Event {
    Event::Result {
        handle_code: code,
        message: format!("handled with {code}"),
        started_at_ms: Some(300),
        accepted: accepted.map(|(address, at_ms)| (address.to_owned(), at_ms)),
    }
}

#[tokio::test]
async fn a_transition_answers_its_run_as_stored_whether_its_rows_were_counted_or_returned() {
    each_backend("answered_as_stored", |db| async move {
        let counted_before = run_writes::COUNTED_UPDATES.load(Ordering::Relaxed);
        let address = "http://e:9999";
        // Six runs claimed by "admin-1", the last read before its executor was recorded; the
        // odd ones created a day later, so that the report must count each by its own day.
        let mut claims = Vec::new();
        for n in 0..6 {
            let created_at = 1 + (n % 2) * reports::DAY_MS;
            let id = db.create_run(&fire(1, 1_000 + n, 0), created_at).await.unwrap().unwrap();
            claims.push(db.claim_run(id, "admin-1", 10, 20_000).await.unwrap().unwrap());
        }
        let lease = |n: usize| Some(("admin-1", claims[n].fence));
        let stale = claims[5].run.clone();
        assert!(db.set_run_target(stale.id, "admin-1", claims[5].fence, address).await.unwrap());

        // Sent, a result that overtook the send's record, a kill asked for while dispatching:
        // one statement. Not sent (a failure, with its alarm, recorded on its own), and a result
        // that overtook the send of a run read before its executor was recorded.
        let sent = |at_ms| Event::Sent {
            address: address.to_owned(),
            at_ms,
            timeout_secs: 5,
            grace_ms: 10,
        };
        let writes = vec![
            apply(&claims[0].run, sent(100), lease(0), 100),
            apply(&claims[1].run, sent(100), lease(1), 100),
            apply(&claims[3].run, result(200, Some((address, 120))), None, 120),
            apply(&claims[4].run, Event::Kill, None, 130),
        ];
        let mut answered = commit(&db, writes).await;
        let not_sent = Event::NotSent { reason: "refused".to_owned() };
        answered.extend(commit(&db, vec![apply(&claims[2].run, not_sent, lease(2), 110)]).await);
        let overtook = result(200, Some((address, 140)));
        answered.extend(commit(&db, vec![apply(&stale, overtook, None, 140)]).await);
        assert!(answered.iter().all(Option::is_some), "{answered:?}");
        let states: Vec<RunState> = answered.iter().flatten().map(|run| run.state).collect();
        use RunState::{Dispatching, Failed, Killed, Lost, Running, Success};
        assert_eq!(states, [Running, Running, Success, Dispatching, Failed, Success]);
        let overtaken = answered[2].as_ref().unwrap();
        assert_eq!((overtaken.trigger_code, overtaken.dispatched_at_ms), (200, 120));
        assert_eq!(overtaken.trigger_msg, format!("sent to {address}"));
        assert!(answered[3].as_ref().unwrap().kill_requested);
        assert_eq!(answered[5].as_ref().unwrap().executor_address.as_deref(), Some(address));
        let now: Vec<RunRecord> = answered.into_iter().flatten().collect();

        // A result of the killed run as read before its kill: its compare fails.
        let late = apply(&claims[4].run, result(200, Some((address, 150))), None, 150);
        assert_eq!(commit(&db, vec![late]).await, [None]);
        // A result and a kill of a running run in one statement; then that run's result
        // (killed), and the loss of the run killed while dispatching (a failure).
        let writes = vec![
            apply(&now[0], result(200, None), None, 400),
            apply(&now[1], Event::Kill, None, 410),
        ];
        let mut answered = commit(&db, writes).await;
        let killed = answered[1].clone().unwrap();
        answered.extend(commit(&db, vec![apply(&killed, result(500, None), None, 450)]).await);
        let lost = Event::Lost { reason: "gone".to_owned() };
        answered.extend(commit(&db, vec![apply(&now[3], lost, None, 460)]).await);
        assert!(answered.iter().all(Option::is_some), "{answered:?}");
        let ended: Vec<(RunState, bool, i32, i64)> = answered
            .iter()
            .flatten()
            .map(|run| (run.state, run.kill_requested, run.handle_code, run.handle_time_ms))
            .collect();
        let expected = [
            (Success, false, 200, 400),
            (Running, true, 0, 0),
            (Killed, true, 500, 450),
            (Lost, true, 500, 460),
        ];
        assert_eq!(ended, expected);
        let first = answered[0].as_ref().unwrap();
        assert_eq!((first.fuel_used, first.started_at_ms), (Some(4_000), 300));

        // The same result again: its compare fails, and nothing changes.
        let writes = vec![apply(&now[0], result(200, None), None, 500)];
        assert_eq!(commit(&db, writes).await, [None]);
        assert_eq!(db.get_run(now[0].id).await.unwrap().unwrap().handle_time_ms, 400);

        // The report counted each run once, by the day it was created, in the state it ended:
        // on the first day the runs that succeeded, failed and were lost, on the second the
        // two that succeeded and the one killed.
        let days = db.report_days(0, reports::DAY_MS).await.unwrap();
        let counts: Vec<_> = days
            .iter()
            .map(|day| (day.success, day.failed, day.killed, day.lost, day.running, day.total))
            .collect();
        assert_eq!(counts, [(1, 1, 0, 1, 0, 3), (2, 0, 1, 0, 0, 3)]);
        let counted = run_writes::COUNTED_UPDATES.load(Ordering::Relaxed);
        if db.dialect() == Dialect::Sqlite {
            assert!(counted > counted_before, "no update was counted on SQLite");
        }
    })
    .await;
}
