//! Users, sessions, API tokens, the audit log and the dashboard's figures, on each backend.

use super::{each_backend, failed, sent};
use crate::access::Role;
use crate::lifecycle::{self, Event, RunFacts};
use crate::model::{AddressType, RunState, TriggerType};
use crate::storage::{AuditEntry, DayCounts, Db, Dialect, LoginLocks, NewRun};

#[tokio::test]
async fn users_sessions_and_tokens() {
    each_backend("users", |db| async move {
        assert_eq!(db.count_users().await.unwrap(), 0);
        let group =
            db.create_group("billing", "Billing", AddressType::Auto, &[], 0, 1).await.unwrap();
        let alice = db.create_user("alice", "hash-a", Role::Admin, &[], 10).await.unwrap();
        let bob = db.create_user("bob", "hash-b", Role::Operator, &[group.id], 11).await.unwrap();
        assert_eq!((bob.role, bob.group_ids.clone()), (Role::Operator, vec![group.id]));
        let duplicate = db.create_user("alice", "other", Role::Viewer, &[], 12).await;
        assert!(duplicate.unwrap_err().is_constraint_violation());
        assert_eq!(db.get_user_by_name("bob").await.unwrap(), Some(bob.clone()));
        let names: Vec<String> =
            db.list_users().await.unwrap().into_iter().map(|u| u.name).collect();
        assert_eq!(names, ["alice", "bob"]);

        // A session is found by its hash until it expires, and ends with logout.
        db.create_session("s-hash", alice.id, "csrf", 100, 200).await.unwrap();
        let session = db.get_session("s-hash", 150).await.unwrap().unwrap();
        assert_eq!((session.user.name.as_str(), session.csrf_token.as_str()), ("alice", "csrf"));
        assert!(db.get_session("s-hash", 200).await.unwrap().is_none(), "expired");
        assert!(db.get_session("other", 150).await.unwrap().is_none());
        assert!(db.delete_session("s-hash").await.unwrap());
        assert!(db.get_session("s-hash", 150).await.unwrap().is_none());

        // Attempts count up and lock from the threshold, doubling to the cap; a locked user's
        // attempts are not counted; a success clears.
        let locks = LoginLocks { lock_after: 2, first_lock_ms: 100, max_lock_ms: 300 };
        let mut seen = Vec::new();
        for now in [1_000, 1_000, 1_050, 1_100, 1_300, 1_700] {
            let counted = db.count_login_attempt(bob.id, now, &locks).await.unwrap();
            let user = db.get_user(bob.id).await.unwrap().unwrap();
            seen.push((now, counted, user.locked_until_ms));
        }
        assert_eq!(
            seen,
            [
                (1_000, Some(1), 0),
                (1_000, Some(2), 1_100),
                (1_050, None, 1_100),
                (1_100, Some(3), 1_300),
                (1_300, Some(4), 1_600),
                (1_700, Some(5), 2_000),
            ]
        );
        db.clear_failed_logins(bob.id).await.unwrap();
        let cleared = db.get_user(bob.id).await.unwrap().unwrap();
        assert_eq!((cleared.failed_logins, cleared.locked_until_ms), (0, 0));

        // Tokens: stored by hash, used (which is noted), revoked only by their owner.
        let token = db.create_api_token(bob.id, "ci", "t-hash", 20).await.unwrap();
        assert_eq!(db.get_api_token_user("t-hash", 30).await.unwrap().map(|u| u.id), Some(bob.id));
        assert!(db.get_api_token_user("nope", 30).await.unwrap().is_none());
        assert_eq!(db.list_api_tokens(bob.id).await.unwrap()[0].last_used_at_ms, 30);
        db.get_api_token_user("t-hash", 31).await.unwrap();
        assert_eq!(
            db.list_api_tokens(bob.id).await.unwrap()[0].last_used_at_ms,
            30,
            "once a minute"
        );
        db.get_api_token_user("t-hash", 60_030).await.unwrap();
        assert_eq!(db.list_api_tokens(bob.id).await.unwrap()[0].last_used_at_ms, 60_030);
        assert!(!db.delete_api_token(alice.id, token.id).await.unwrap(), "not alice's");
        assert!(db.delete_api_token(bob.id, token.id).await.unwrap());
        assert!(db.get_api_token_user("t-hash", 40).await.unwrap().is_none());

        // Role changes; a new password ends the user's sessions; deleting takes everything.
        let viewer = db.set_user_role(bob.id, Role::Viewer, &[], 50).await.unwrap().unwrap();
        assert_eq!((viewer.role, viewer.group_ids), (Role::Viewer, vec![]));
        assert!(db.set_user_role(999, Role::Viewer, &[], 50).await.unwrap().is_none());
        db.create_session("b-hash", bob.id, "c", 60, 1_000).await.unwrap();
        assert!(db.set_user_password(bob.id, "hash-new", 70).await.unwrap());
        assert!(db.get_session("b-hash", 80).await.unwrap().is_none());
        db.create_session("b-hash2", bob.id, "c", 60, 1_000).await.unwrap();
        db.create_api_token(bob.id, "ci", "t-hash2", 20).await.unwrap();
        assert!(db.delete_user(bob.id).await.unwrap());
        assert!(!db.delete_user(bob.id).await.unwrap());
        assert!(db.get_session("b-hash2", 80).await.unwrap().is_none());
        assert!(db.get_api_token_user("t-hash2", 80).await.unwrap().is_none());
        assert_eq!(db.count_users().await.unwrap(), 1);
    })
    .await;
}

#[tokio::test]
async fn audit_is_read_newest_first_and_filtered() {
    each_backend("audit", |db| async move {
        let entry = |actor: &str, action: &str| AuditEntry {
            actor: actor.to_owned(),
            user_id: Some(1),
            source: "127.0.0.1".to_owned(),
            action: action.to_owned(),
            target: "job 1".to_owned(),
            before_json: Some("{\"name\":\"a\"}".to_owned()),
            after_json: None,
        };
        db.record_audit(&entry("alice", "job.create"), 1).await.unwrap();
        db.record_audit(&entry("bob", "job_x"), 2).await.unwrap();
        db.record_audit(&entry("alice", "login"), 3).await.unwrap();
        let all = db.list_audit(None, None, 10, 0).await.unwrap();
        let actions: Vec<&str> = all.items.iter().map(|r| r.entry.action.as_str()).collect();
        assert_eq!((all.total, actions), (3, vec!["login", "job_x", "job.create"]));
        assert_eq!(all.items[2].entry, entry("alice", "job.create"));
        assert_eq!(all.items[2].at_ms, 1);
        let alice = db.list_audit(Some("alice"), None, 1, 1).await.unwrap();
        assert_eq!((alice.total, alice.items[0].entry.action.as_str()), (2, "job.create"));
        // A prefix is literal: `job.` does not match `job_x`.
        let jobs = db.list_audit(None, Some("job."), 10, 0).await.unwrap();
        assert_eq!(jobs.total, 1);
    })
    .await;
}

#[tokio::test]
async fn a_triggers_audit_record_commits_with_its_runs_and_names_them() {
    each_backend("trigger_audit", |db| async move {
        let entry = |n: i64| AuditEntry {
            actor: "ops".to_owned(),
            user_id: None,
            source: "127.0.0.1".to_owned(),
            action: "job.trigger".to_owned(),
            target: format!("job {n}"),
            before_json: None,
            after_json: Some(format!("{{\"param\":\"p{n}\"}}")),
        };
        let run = |n: i64| NewRun {
            job_id: n,
            trigger_type: TriggerType::Manual,
            trigger_time_ms: 1_000,
            fire_time_ms: None,
            param: format!("p{n}"),
            executor_address: Some("http://127.0.0.1:9".to_owned()),
            shard_index: 0,
            shard_total: 1,
            sharding_items: Vec::new(),
            attempt: 0,
            version: None,
            parent_run_id: None,
            node: None,
        };
        // Twenty triggers at once share group commits, claimed or pending; on PostgreSQL the
        // one whose param holds a NUL byte fails, and its audit record goes with it.
        let mut triggers = tokio::task::JoinSet::new();
        for n in 1..=20_i64 {
            let db = db.clone();
            triggers.spawn(async move {
                let mut runs = vec![run(n), run(n)];
                if n == 7 {
                    runs[1].param = "bad\0".to_owned();
                }
                let audit = entry(n);
                let ids = if n % 2 == 0 {
                    db.create_claimed_runs(&runs, "admin-a", 1_000, 16_000, Some(&audit))
                        .await
                        .map(|claims| claims.into_iter().map(|c| c.map(|c| c.run.id)).collect())
                } else {
                    db.create_audited_runs(&runs, 1_000, Some(&audit)).await
                };
                (n, ids)
            });
        }
        let mut created = std::collections::BTreeMap::new();
        while let Some(joined) = triggers.join_next().await {
            let (n, ids) = joined.unwrap();
            match (n, db.dialect(), ids) {
                (7, Dialect::Postgres, ids) => assert!(ids.is_err(), "{ids:?}"),
                (_, _, ids) => {
                    created.insert(n, ids.unwrap().into_iter().flatten().collect::<Vec<_>>());
                }
            }
        }
        let audit = db.list_audit(None, Some("job.trigger"), 100, 0).await.unwrap();
        assert_eq!(audit.total, created.len() as i64);
        for record in &audit.items {
            let n: i64 = record.entry.target.trim_start_matches("job ").parse().unwrap();
            let after: serde_json::Value =
                serde_json::from_str(record.entry.after_json.as_deref().unwrap()).unwrap();
            let log_ids: Vec<i64> = serde_json::from_value(after["log_ids"].clone()).unwrap();
            assert_eq!(
                (after["param"].as_str(), &log_ids),
                (Some(&*format!("p{n}")), &created[&n])
            );
            assert_eq!(log_ids.len(), 2);
            for id in log_ids {
                assert_eq!(db.get_run(id).await.unwrap().unwrap().job_id, n);
            }
        }
    })
    .await;
}

#[tokio::test]
async fn runs_are_counted_by_state_since_an_instant() {
    each_backend("reports", |db| async move {
        let run = |at: i64| NewRun {
            job_id: 1,
            trigger_type: TriggerType::Manual,
            trigger_time_ms: at,
            fire_time_ms: None,
            param: String::new(),
            executor_address: None,
            shard_index: 0,
            shard_total: 1,
            sharding_items: Vec::new(),
            attempt: 0,
            version: None,
            parent_run_id: None,
            node: None,
        };
        for at in [10, 20, 30] {
            db.create_run(&run(at), at).await.unwrap();
        }
        // Two days: job 1 fails twice and succeeds once on the second, job 2 fails once.
        const DAY: i64 = 86_400_000;
        for (job_id, code) in [(1, 500), (1, 500), (1, 200), (2, 500)] {
            let id =
                db.create_run(&NewRun { job_id, ..run(DAY + 5) }, DAY + 5).await.unwrap().unwrap();
            end(&db, id, code).await;
        }
        let days = db.report_days(0, DAY).await.unwrap();
        let day = |day_ms, success, failed, running, total| DayCounts {
            day_ms,
            success,
            failed,
            running,
            total,
            ..DayCounts::default()
        };
        assert_eq!(days, [day(0, 0, 0, 3, 3), day(DAY, 1, 3, 0, 4)]);
        assert_eq!(db.report_days(DAY, DAY).await.unwrap().len(), 1);
        assert_eq!(db.top_failing_jobs(0, 5).await.unwrap(), [(1, 2), (2, 1)]);
        assert_eq!(db.top_failing_jobs(0, 1).await.unwrap(), [(1, 2)]);
    })
    .await;
}

/// Takes run `id` from pending to running, then to its result `handle_code`.
async fn end(db: &Db, id: i64, handle_code: i32) {
    let claim = db.claim_run(id, "admin", 1, 1_000).await.unwrap().unwrap();
    assert!(db.set_run_target(id, "admin", claim.fence, "http://e:9999").await.unwrap());
    let running = sent("http://e:9999", 2, 5);
    db.apply_transition(id, &running, Some(("admin", claim.fence)), None, &[], 2)
        .await
        .unwrap()
        .unwrap();
    let result = if handle_code == 200 {
        let facts = RunFacts {
            state: RunState::Running,
            attempt: 0,
            kill_requested: false,
            trigger_type: TriggerType::Manual,
            from_fire: false,
        };
        let event = Event::Result {
            handle_code,
            message: "ok".to_owned(),
            started_at_ms: Some(3),
            accepted: None,
        };
        lifecycle::transition(&facts, None, &event).unwrap()
    } else {
        failed(RunState::Running)
    };
    db.apply_transition(id, &result, None, None, &[], 4).await.unwrap().unwrap();
}
