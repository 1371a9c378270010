//! Workflow runs as stored: the decision that commits with each end of a node's run, the start
//! of a node's runs once, a join over every shard, a retry by hand and a kill.

use super::*;
use crate::model::RunRecord;
use crate::storage::{NodeRetry, StartingNode, WorkflowSchedule};
use crate::workflow::{
    Condition, EdgeSpec, NodeSpec, NodeState, RunState as FlowState, WorkflowSpec,
};

fn node(name: &str, job_id: i64) -> NodeSpec {
    NodeSpec { name: name.to_owned(), job_id, param: None, pass_inputs: true }
}

fn edge(from: &str, to: &str, condition: Condition) -> EdgeSpec {
    EdgeSpec { from: from.to_owned(), to: to.to_owned(), condition }
}

/// A group with a job, its id and the group's.
async fn job(db: &Db) -> (i64, i64) {
    let group = db.ensure_group("flows", "Flows", 1).await.unwrap().id;
    let mut spec = new_job(group);
    spec.child_job_ids.clear();
    (db.create_job(&spec, 1).await.unwrap().id, group)
}

/// A run of job `job_id` for a node, as the dispatcher plans it.
fn planned(job_id: i64, shard_index: i64, shard_total: i64) -> NewRun {
    NewRun {
        trigger_type: TriggerType::Workflow,
        fire_time_ms: None,
        shard_total,
        ..fire(job_id, 10, shard_index)
    }
}

/// Ends run `id` with `handle_code` and `message`, as an executor's result does: claimed,
/// sent, then its result.
async fn end(db: &Db, id: i64, handle_code: i32, message: &str) -> RunRecord {
    let claim = db.claim_run(id, "me", 20, 1_000).await.unwrap().unwrap();
    let sent = sent("http://e:9999", 21, 30);
    let lease = Some(("me", claim.fence));
    db.apply_transition(id, &sent, lease, None, &[], 21).await.unwrap().unwrap();
    let facts = RunFacts {
        state: RunState::Running,
        attempt: 0,
        kill_requested: false,
        trigger_type: TriggerType::Workflow,
        from_fire: false,
    };
    let job = JobFacts { retry_count: 0, has_children: false, fix_delay_ms: None };
    let event = Event::Result {
        handle_code,
        message: message.to_owned(),
        started_at_ms: Some(22),
        accepted: None,
    };
    let transition = lifecycle::transition(&facts, Some(&job), &event).unwrap();
    db.apply_transition(id, &transition, None, None, &[], 23).await.unwrap().unwrap().0
}

/// The names of the nodes decided to start, not started yet.
async fn starting(db: &Db, id: i64) -> Vec<StartingNode> {
    db.starting_workflow_nodes(Some(id), i64::MAX, 100).await.unwrap()
}

/// Each node's state, `+` after a node decided to start.
async fn states(db: &Db, id: i64) -> String {
    let nodes = db.workflow_nodes(id).await.unwrap();
    let states: Vec<String> = nodes
        .iter()
        .map(|node| format!("{}{}", node.state, if node.starting { "+" } else { "" }))
        .collect();
    let run = db.get_workflow_run(id).await.unwrap().unwrap();
    format!("{} [{}]", run.state, states.join(" "))
}

#[tokio::test]
async fn a_sharded_node_joins_once_every_shard_ended_and_outputs_flow() {
    each_backend("workflow_join", |db| async move {
        let (job, group) = job(&db).await;
        // extract → transform (3 shards) → load → report (always); alert on extract's failure.
        let spec = WorkflowSpec {
            name: "etl".to_owned(),
            group_id: group,
            nodes: vec![
                node("extract", job),
                node("transform", job),
                node("load", job),
                node("alert", job),
                node("report", job),
            ],
            edges: vec![
                edge("extract", "transform", Condition::OnSuccess),
                edge("transform", "load", Condition::OnSuccess),
                edge("extract", "alert", Condition::OnFailure),
                edge("load", "report", Condition::Always),
            ],
        };
        let workflow = db.create_workflow(&spec, &WorkflowSchedule::default(), "op", 5).await.unwrap();
        assert_eq!(db.get_workflow(workflow.id).await.unwrap().unwrap().spec, spec);
        let id = db.trigger_workflow(workflow.id, &spec, TriggerType::Manual, "op", 6).await.unwrap();
        assert_eq!(states(&db, id).await, "running [running+ waiting waiting waiting waiting]");

        let roots = starting(&db, id).await;
        assert_eq!(roots.iter().map(|n| (n.node, n.round)).collect::<Vec<_>>(), [(0, 1)]);
        let ids = db.start_workflow_node(&roots[0], &[planned(job, 0, 1)], 7).await.unwrap();
        let ids = ids.unwrap();
        // A second start of the same round, by another admin or the sweep, creates nothing.
        assert_eq!(db.start_workflow_node(&roots[0], &[planned(job, 0, 1)], 7).await.unwrap(), None);
        let run = db.get_run(ids[0]).await.unwrap().unwrap();
        assert_eq!(run.node.map(|n| (n.workflow_run_id, n.node, n.round)), Some((id, 0, 1)));
        assert_eq!(states(&db, id).await, "running [running waiting waiting waiting waiting]");

        end(&db, ids[0], 200, "rows=3").await;
        assert_eq!(states(&db, id).await, "running [succeeded running+ waiting skipped waiting]");
        let middle = starting(&db, id).await;
        let shards: Vec<NewRun> = (0..3).map(|shard| planned(job, shard, 3)).collect();
        let shard_ids = db.start_workflow_node(&middle[0], &shards, 30).await.unwrap().unwrap();
        assert_eq!(shard_ids.len(), 3);

        // The join waits for every shard.
        end(&db, shard_ids[2], 200, "two").await;
        end(&db, shard_ids[0], 200, "zero").await;
        assert_eq!(states(&db, id).await, "running [succeeded running waiting skipped waiting]");
        assert!(starting(&db, id).await.is_empty());
        end(&db, shard_ids[1], 200, "one").await;
        assert_eq!(states(&db, id).await, "running [succeeded succeeded running+ skipped waiting]");
        let nodes = db.workflow_nodes(id).await.unwrap();
        assert_eq!(
            nodes[1].output,
            r#"[{"message":"zero","shard":0},{"message":"one","shard":1},{"message":"two","shard":2}]"#
        );

        let load = starting(&db, id).await;
        let load_ids = db.start_workflow_node(&load[0], &[planned(job, 0, 1)], 40).await.unwrap();
        end(&db, load_ids.unwrap()[0], 500, "disk full").await;
        // `always` runs the report after a failed load; the load's failure is not handled.
        assert_eq!(states(&db, id).await, "running [succeeded succeeded failed skipped running+]");
        let report = starting(&db, id).await;
        let report_ids = db.start_workflow_node(&report[0], &[planned(job, 0, 1)], 50).await;
        end(&db, report_ids.unwrap().unwrap()[0], 200, "sent").await;
        assert_eq!(states(&db, id).await, "failed [succeeded succeeded failed skipped succeeded]");
        let run = db.get_workflow_run(id).await.unwrap().unwrap();
        assert!(run.ended_at_ms > 0);
        assert_eq!(db.workflow_node_runs(id).await.unwrap().len(), 6);
        assert_eq!(db.list_workflow_runs(workflow.id, 10).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn shards_ending_together_start_the_join_once() {
    each_backend("workflow_race", |db| async move {
        let (job, group) = job(&db).await;
        let spec = WorkflowSpec {
            name: "fan-in".to_owned(),
            group_id: group,
            nodes: vec![node("wide", job), node("join", job)],
            edges: vec![edge("wide", "join", Condition::OnSuccess)],
        };
        let workflow =
            db.create_workflow(&spec, &WorkflowSchedule::default(), "op", 5).await.unwrap();
        for round in 0..5 {
            let id = db.trigger_workflow(workflow.id, &spec, TriggerType::Manual, "op", 6).await;
            let id = id.unwrap();
            let wide = starting(&db, id).await;
            let shards: Vec<NewRun> = (0..8).map(|shard| planned(job, shard, 8)).collect();
            let ids = db.start_workflow_node(&wide[0], &shards, 7).await.unwrap().unwrap();
            // Every shard ends at once, each in its own commit.
            let ends = ids.iter().map(|&run| end(&db, run, 200, "ok"));
            futures_util::future::join_all(ends).await;
            assert_eq!(states(&db, id).await, "running [succeeded running+]", "round {round}");
            // Two starts of the join at once (two admins, or an admin and its sweep): one
            // creates its run.
            let join = starting(&db, id).await;
            let runs = [planned(job, 0, 1)];
            let (a, b) = tokio::join!(
                db.start_workflow_node(&join[0], &runs, 8),
                db.start_workflow_node(&join[0], &runs, 8),
            );
            let started: Vec<_> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
            assert_eq!(started.len(), 1, "round {round}");
            assert_eq!(db.workflow_node_runs(id).await.unwrap().len(), 9);
        }
    })
    .await;
}

#[tokio::test]
async fn a_node_retried_by_hand_continues_and_a_killed_run_starts_nothing() {
    each_backend("workflow_retry", |db| async move {
        let (job, group) = job(&db).await;
        let spec = WorkflowSpec {
            name: "retry".to_owned(),
            group_id: group,
            nodes: vec![node("first", job), node("second", job), node("third", job)],
            edges: vec![
                edge("first", "second", Condition::OnSuccess),
                edge("second", "third", Condition::OnSuccess),
            ],
        };
        let workflow =
            db.create_workflow(&spec, &WorkflowSchedule::default(), "op", 5).await.unwrap();
        let id = db.trigger_workflow(workflow.id, &spec, TriggerType::Manual, "op", 6).await;
        let id = id.unwrap();
        let first = starting(&db, id).await;
        let ids = db.start_workflow_node(&first[0], &[planned(job, 0, 1)], 7).await.unwrap();
        end(&db, ids.unwrap()[0], 500, "flaky").await;
        assert_eq!(states(&db, id).await, "failed [failed skipped skipped]");

        // Only a failed node is retried.
        let refused = db.retry_workflow_node(id, 1, 8).await.unwrap();
        assert!(matches!(refused, NodeRetry::Refused(_)), "{refused:?}");
        assert!(matches!(db.retry_workflow_node(999, 0, 8).await.unwrap(), NodeRetry::NoRun));
        let retried = db.retry_workflow_node(id, 0, 9).await.unwrap();
        assert!(matches!(retried, NodeRetry::Started), "{retried:?}");
        assert_eq!(states(&db, id).await, "running [running+ waiting waiting]");
        let again = starting(&db, id).await;
        assert_eq!(again[0].round, 2);
        // The first round's start is stale: it creates nothing.
        assert_eq!(
            db.start_workflow_node(&first[0], &[planned(job, 0, 1)], 10).await.unwrap(),
            None
        );
        let ids = db.start_workflow_node(&again[0], &[planned(job, 0, 1)], 10).await.unwrap();
        end(&db, ids.unwrap()[0], 200, "fine now").await;
        assert_eq!(states(&db, id).await, "running [succeeded running+ waiting]");
        let second = starting(&db, id).await;
        let ids = db.start_workflow_node(&second[0], &[planned(job, 0, 1)], 11).await.unwrap();
        let running = ids.unwrap()[0];

        // A kill skips what has not started and hands back what runs.
        assert_eq!(db.kill_workflow_run(id, 12).await.unwrap(), Some(vec![running]));
        assert_eq!(db.kill_workflow_run(id, 13).await.unwrap(), None, "killed once");
        assert_eq!(states(&db, id).await, "killed [succeeded running skipped]");
        end(&db, running, 500, "killed").await;
        assert_eq!(states(&db, id).await, "killed [succeeded failed skipped]");
        assert!(starting(&db, id).await.is_empty());
        assert!(matches!(db.retry_workflow_node(id, 1, 14).await.unwrap(), NodeRetry::Killed));

        // A node whose job is gone fails without runs, and the workflow run goes on.
        let id = db.trigger_workflow(workflow.id, &spec, TriggerType::Manual, "op", 15).await;
        let id = id.unwrap();
        let first = starting(&db, id).await;
        assert!(db.fail_workflow_node(&first[0], "job 1 no longer exists", 16).await.unwrap());
        assert!(!db.fail_workflow_node(&first[0], "again", 16).await.unwrap());
        assert_eq!(states(&db, id).await, "failed [failed skipped skipped]");
        let nodes = db.workflow_nodes(id).await.unwrap();
        assert_eq!(nodes[0].reason, "job 1 no longer exists");
        assert_eq!(nodes[0].state, NodeState::Failed);
        assert_eq!(db.get_workflow_run(id).await.unwrap().unwrap().state, FlowState::Failed);
        assert!(db.delete_workflow(workflow.id).await.unwrap());
        assert!(db.get_workflow_run(id).await.unwrap().is_some(), "runs outlive their workflow");
        // Past the retention, ended workflow runs go with their nodes.
        assert_eq!(db.delete_ended_workflow_runs(16, 10).await.unwrap(), 1, "killed at 12");
        assert_eq!(db.delete_ended_workflow_runs(17, 10).await.unwrap(), 1, "ended at 16");
        assert!(db.get_workflow_run(id).await.unwrap().is_none());
        assert!(db.workflow_nodes(id).await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_scheduled_workflow_fires_once_per_instant() {
    each_backend("workflow_fire", |db| async move {
        let (job, group) = job(&db).await;
        let spec = WorkflowSpec {
            name: "nightly".to_owned(),
            group_id: group,
            nodes: vec![node("only", job)],
            edges: Vec::new(),
        };
        let schedule = WorkflowSchedule {
            schedule_type: ScheduleType::FixRate,
            schedule_conf: "60".to_owned(),
            time_zone: None,
            misfire_strategy: MisfireStrategy::FireOnceNow,
        };
        let lease = super::lease_everything(&db, "admin").await;
        let created = db.create_workflow(&spec, &schedule, "op", 5).await.unwrap();
        assert_eq!((created.running, created.schedule.clone()), (false, schedule.clone()));
        assert!(db.due_workflows(i64::MAX, 10, &lease).await.unwrap().is_empty(), "stopped");
        let started = db.set_workflow_running(created.id, Some(1_000), 6).await.unwrap().unwrap();
        assert_eq!((started.running, started.next_fire_ms), (true, 1_000));
        assert_eq!(db.next_workflow_fire(&lease).await.unwrap(), Some(1_000));
        assert!(db.due_workflows(999, 10, &lease).await.unwrap().is_empty());
        let due = db.due_workflows(1_000, 10, &lease).await.unwrap();
        assert_eq!(due.len(), 1);

        // Two admins read it due and fire it: one creates the run.
        let fire = Some((1_000, TriggerType::Cron));
        let (a, b) = tokio::join!(
            db.fire_workflow(&due[0], 61_000, fire, 1_001, &lease),
            db.fire_workflow(&due[0], 61_000, fire, 1_001, &lease),
        );
        let fired: Vec<Option<i64>> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
        assert_eq!(fired.len(), 1, "{fired:?}");
        let run = db.get_workflow_run(fired[0].unwrap()).await.unwrap().unwrap();
        assert_eq!((run.trigger_type, run.state), (TriggerType::Cron, FlowState::Running));
        assert_eq!(db.get_workflow(created.id).await.unwrap().unwrap().next_fire_ms, 61_000);

        // An update keeps it running on its new next fire; a stop ends the fires.
        let moved = db.update_workflow(created.id, &spec, &schedule, 90_000, 7).await.unwrap();
        assert_eq!(moved.map(|w| (w.running, w.next_fire_ms)), Some((true, 90_000)));
        let stopped = db.set_workflow_running(created.id, None, 8).await.unwrap().unwrap();
        assert_eq!((stopped.running, stopped.next_fire_ms), (false, 0));
        let stale = db.fire_workflow(&due[0], 61_000, fire, 9, &lease).await.unwrap();
        assert_eq!(stale, None, "a stopped workflow does not fire");
        let counts = db.workflow_run_counts().await.unwrap();
        assert_eq!(counts, [("running".to_owned(), 1)]);
    })
    .await;
}
