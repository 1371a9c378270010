//! Runs placed in a starting state through storage and `lifecycle`, as a dispatcher that then
//! died would have left them.

use wasmjob::lifecycle::{self, Event, RunFacts};
use wasmjob::model::TriggerType;
use wasmjob::storage::{Db, NewRun};

/// A manual run of job `job_id` at `at_ms`, with param `p`.
pub fn manual_run(job_id: i64, at_ms: i64) -> NewRun {
    NewRun {
        job_id,
        trigger_type: TriggerType::Manual,
        trigger_time_ms: at_ms,
        fire_time_ms: None,
        param: "p".to_owned(),
        executor_address: None,
        shard_index: 0,
        shard_total: 1,
        sharding_items: Vec::new(),
        attempt: 0,
        version: None,
        parent_run_id: None,
        node: None,
    }
}

/// A run that `address` accepted at `at_ms`, as a dispatcher records it, for a job with
/// `timeout_secs`.
///
/// The test's own admin is running and may take a new pending run for itself before this
/// claims it (the run is due at once); such a run is left to that admin and another created.
/// The claim's lease outlasts the test's next steps, so that admin cannot take the run over
/// between the claim and the send; a sent run holds no lease.
pub async fn running_run(
    db: &Db,
    run: &NewRun,
    address: &str,
    at_ms: i64,
    timeout_secs: i64,
) -> i64 {
    let lease_until = at_ms.max(chrono::Utc::now().timestamp_millis()) + 600_000;
    for _ in 0..20 {
        let id = db.create_run(run, at_ms).await.unwrap().unwrap();
        let Some(claim) = db.claim_run(id, "dead-admin", at_ms, lease_until).await.unwrap() else {
            continue;
        };
        let facts = RunFacts {
            state: claim.run.state,
            attempt: claim.run.attempt,
            kill_requested: false,
            trigger_type: claim.run.trigger_type,
            from_fire: claim.run.fire_time_ms.is_some(),
        };
        let sent = Event::Sent { address: address.to_owned(), at_ms, timeout_secs, grace_ms: 0 };
        let transition = lifecycle::transition(&facts, None, &sent).unwrap();
        let lease = Some(("dead-admin", claim.fence));
        let applied = db.apply_transition(id, &transition, lease, None, &[], at_ms).await.unwrap();
        assert!(applied.is_some(), "run {id}: no one else may take a run under a live lease");
        return id;
    }
    panic!("the test's admin took each of 20 new runs before they could be claimed");
}

/// An RFC 3339 time of a run's JSON, in ms.
pub fn time_ms(time: &serde_json::Value) -> i64 {
    let text = time.as_str().unwrap_or_else(|| panic!("no time: {time}"));
    chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
}

/// When the run of `run` (its JSON) was sent, or, if the admin did not see the acceptance
/// before the result, when it started or ended (neither earlier than its send).
pub fn sent_ms(run: &serde_json::Value) -> i64 {
    ["dispatched_at", "started_at", "handle_time"]
        .iter()
        .find(|key| run[**key].is_string())
        .map(|key| time_ms(&run[*key]))
        .unwrap_or_else(|| panic!("no time of its send: {run}"))
}
