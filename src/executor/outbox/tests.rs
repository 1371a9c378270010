//! Tests of the outbox: segments across restarts, quarantine, the in-memory fallback, and one
//! refused result among many.
//!
//! A tiny local HTTP server stands in for the admin, refusing any batch that holds a chosen
//! `logId` (as an admin does when it cannot apply one entry), so the outbox's fallback is tested
//! against real requests.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};

use super::*;
use crate::protocol::{CallbackBody, ReturnT};

#[derive(Clone, Default)]
struct FakeAdmin {
    /// The log ids of each call, in order.
    calls: Arc<Mutex<Vec<Vec<i64>>>>,
    refuse: Arc<Mutex<HashSet<i64>>>,
    /// Answer every call that only part of it was recorded in time.
    busy: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeAdmin {
    async fn serve(&self) -> String {
        async fn callback(
            State(admin): State<FakeAdmin>,
            Json(body): Json<CallbackBody>,
        ) -> Json<ReturnT<String>> {
            let ids: Vec<i64> = body.into_list().iter().map(|result| result.log_id).collect();
            let refused = ids.iter().any(|id| admin.refuse.lock().unwrap().contains(id));
            let count = ids.len();
            admin.calls.lock().unwrap().push(ids);
            if admin.busy.load(std::sync::atomic::Ordering::SeqCst) {
                let busy = format!("{} 0 of {count} results recorded", protocol::CALLBACK_BUSY);
                return Json(ReturnT::fail(busy));
            }
            if refused {
                return Json(ReturnT::fail("cannot apply one of the results"));
            }
            Json(ReturnT::success())
        }
        let app = Router::new().route("/api/callback", post(callback)).with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    fn calls(&self) -> Vec<Vec<i64>> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

fn result(log_id: i64) -> HandleCallbackParam {
    HandleCallbackParam {
        log_id,
        log_date_tim: 1_700_000_000_000,
        handle_code: 200,
        handle_msg: Some(format!("run {log_id}")),
        ..HandleCallbackParam::default()
    }
}

fn client() -> protocol::Client {
    protocol::Client::new("test-access-token-0123456789", Duration::from_secs(5)).unwrap()
}

fn link(url: &str) -> AdminLink {
    AdminLink {
        urls: vec![url.to_owned()],
        app_name: "test".to_owned(),
        generation: Generation::Classic,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn unreadable_entries_are_quarantined_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    std::fs::create_dir_all(&outbox_dir).unwrap();
    std::fs::write(outbox_dir.join("1.json"), serde_json::to_vec(&result(1)).unwrap()).unwrap();
    std::fs::write(outbox_dir.join("2.json"), b"{\"logId\": 2, \"handleCo").unwrap();
    std::fs::write(outbox_dir.join("3.json"), b"").unwrap();
    std::fs::write(outbox_dir.join("4.json.tmp"), b"{").unwrap();

    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    assert_eq!(outbox.pending_ids(), [1]);
    assert_eq!(outbox.stored_code(1), Some(200));
    assert_eq!(names(&outbox_dir), ["1.json", "quarantine", "results-1.log"]);
    assert_eq!(names(&outbox_dir.join("quarantine")), ["2.json", "3.json", "4.json.tmp"]);
    // The quarantined bytes are kept as they were.
    assert_eq!(std::fs::read(outbox_dir.join("quarantine/3.json")).unwrap(), b"");
}

#[tokio::test]
async fn a_refused_result_does_not_hold_back_the_others() {
    let admin = FakeAdmin::default();
    admin.refuse.lock().unwrap().insert(3);
    let url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("outbox")).unwrap();
    for log_id in 1..=5 {
        outbox.push(&result(log_id)).unwrap();
    }

    let round = outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert!(matches!(round, Round::More));
    assert_eq!(admin.calls(), [vec![1, 2, 3, 4, 5], vec![1], vec![2], vec![3], vec![4], vec![5]]);
    assert_eq!(outbox.pending_ids(), [3]);
    assert_eq!(names(&dir.path().join("outbox")), ["quarantine", "results-1.log"]);

    // Refused alone, it waits for its own backoff while later results go first.
    outbox.push(&result(6)).unwrap();
    let round = outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert!(matches!(round, Round::Idle(Some(_))));
    assert_eq!(admin.calls(), [vec![6]]);
    assert_eq!(outbox.pending_ids(), [3]);

    // Refused again alone: no batch fallback for a single entry, a longer backoff.
    due_now(&outbox, 3);
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![3]]);
    let entry_refusals = outbox.inner.state.lock().unwrap().entries[&3].refusals;
    assert_eq!(entry_refusals, 2);

    // Once the admin can apply it, it goes.
    admin.refuse.lock().unwrap().clear();
    due_now(&outbox, 3);
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![3]]);
    assert!(outbox.pending_ids().is_empty());
}

/// An admin that recorded only part of a batch in its time gets the whole batch again after a
/// backoff, not each result alone (which would cost it more).
#[tokio::test]
async fn a_busy_admin_gets_the_batch_again_whole() {
    let admin = FakeAdmin::default();
    admin.busy.store(true, std::sync::atomic::Ordering::SeqCst);
    let url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("outbox")).unwrap();
    for log_id in 1..=3 {
        outbox.push(&result(log_id)).unwrap();
    }
    assert!(outbox.deliver_once(&client(), &link(&url)).await.is_err());
    assert_eq!(admin.calls(), [vec![1, 2, 3]]);
    assert_eq!(outbox.pending_ids(), [1, 2, 3]);
    assert!(outbox.inner.state.lock().unwrap().entries.values().all(|e| e.refusals == 0));

    admin.busy.store(false, std::sync::atomic::Ordering::SeqCst);
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![1, 2, 3]]);
    assert!(outbox.pending_ids().is_empty());
}

/// A result goes first to the admin that sent its run when the executor was given that admin's
/// URL, else to the first admin; an unreachable one passes it on to the others in order.
#[tokio::test]
async fn each_result_goes_first_to_the_admin_that_sent_its_run() {
    let admins = [FakeAdmin::default(), FakeAdmin::default(), FakeAdmin::default()];
    let mut urls = Vec::new();
    for admin in &admins {
        urls.push(admin.serve().await);
    }
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let link = AdminLink { urls: [urls.clone(), vec![gone.clone()]].concat(), ..link("") };
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("outbox")).unwrap();
    let replying = |log_id, reply_to: Option<&str>| HandleCallbackParam {
        reply_to: reply_to.map(str::to_owned),
        ..result(log_id)
    };
    let with_slash = format!("{}/", urls[1]);
    let sent = [
        replying(1, Some(&urls[2])),
        replying(2, Some(&with_slash)),
        replying(3, None),
        replying(4, Some("http://an-admin-this-executor-was-not-given:8080")),
        replying(5, Some(&gone)),
        replying(6, Some(&urls[2])),
    ];
    for result in &sent {
        outbox.push(result).unwrap();
    }
    let round = outbox.deliver_once(&client(), &link).await.unwrap();
    assert!(matches!(round, Round::Idle(None)));
    // Two calls at once: the one to the first admin, and the one it took over.
    let mut first_admins_calls = admins[0].calls();
    first_admins_calls.sort();
    assert_eq!(first_admins_calls, [vec![3, 4], vec![5]]);
    assert_eq!(admins[1].calls(), [vec![2]]);
    assert_eq!(admins[2].calls(), [vec![1, 6]]);
    assert!(outbox.pending_ids().is_empty());
    // The admin not reached is passed over as a first choice for a while: a paused admin does
    // not hold each round for a timeout.
    assert_eq!(outbox.first_admin(&link, &replying(7, Some(&gone))), 0);
    assert_eq!(outbox.first_admin(&link, &replying(8, Some(&urls[2]))), 2);
}

#[tokio::test]
async fn an_unreachable_admin_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("outbox")).unwrap();
    outbox.push(&result(1)).unwrap();
    // A port nobody listens on: bind one, then let it go.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    assert!(outbox.deliver_once(&client(), &link(&url)).await.is_err());
    assert_eq!(outbox.pending_ids(), [1]);
    assert!(outbox.inner.state.lock().unwrap().entries[&1].retry_at.is_none());
}

#[tokio::test]
async fn a_result_the_disk_refuses_is_kept_in_memory_and_delivered() {
    let admin = FakeAdmin::default();
    let url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    // The segment's handle turns read-only under the outbox: every write fails with a real IO
    // error, whatever the user's rights.
    {
        let mut state = outbox.inner.state.lock().unwrap();
        let writer = state.writer.as_mut().unwrap();
        writer.file = Arc::new(File::open(outbox_dir.join("results-1.log")).unwrap());
    }

    let error = outbox.push(&result(9)).unwrap_err();
    assert!(error.to_string().contains("storing the result of run 9"), "{error}");
    // Nothing written since a failure is promised durable: later results stay in memory too.
    let error = outbox.push(&result(10)).unwrap_err();
    assert!(error.to_string().contains("an earlier write or sync failed"), "{error}");
    assert_eq!(outbox.pending_ids(), [9, 10]);
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![9, 10]]);
    assert!(outbox.pending_ids().is_empty());
}

#[tokio::test]
async fn a_restart_delivers_what_was_not_acknowledged_and_only_that() {
    let admin = FakeAdmin::default();
    let url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    for log_id in 1..=3 {
        outbox.push(&result(log_id)).unwrap();
    }
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![1, 2, 3]]);
    outbox.push(&result(4)).unwrap();
    // A result pushed again (a killed run reported twice) replaces the first.
    let mut again = result(4);
    again.handle_code = 500;
    outbox.push(&again).unwrap();
    drop(outbox);

    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    assert_eq!(outbox.pending_ids(), [4]);
    assert_eq!(outbox.stored_code(4), Some(500));
    // The first segment still held run 4; the new one starts empty.
    assert_eq!(names(&outbox_dir), ["quarantine", "results-1.log", "results-2.log"]);
    outbox.deliver_once(&client(), &link(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![4]]);
    // Everything acknowledged: the closed segment is gone.
    assert_eq!(names(&outbox_dir), ["quarantine", "results-2.log"]);
    drop(outbox);
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    assert!(outbox.pending_ids().is_empty());
    assert_eq!(names(&outbox_dir), ["quarantine", "results-3.log"]);
}

#[test]
fn full_segments_rotate_and_go_once_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    let total = SEGMENT_LINES as i64 + 10;
    for log_id in 1..=total {
        outbox.push(&result(log_id)).unwrap();
    }
    assert_eq!(names(&outbox_dir), ["quarantine", "results-1.log", "results-2.log"]);
    outbox.forget(&(1..SEGMENT_LINES as i64).collect::<Vec<_>>());
    assert_eq!(names(&outbox_dir), ["quarantine", "results-1.log", "results-2.log"]);
    outbox.forget(&[SEGMENT_LINES as i64]);
    assert_eq!(names(&outbox_dir), ["quarantine", "results-2.log"]);
    assert_eq!(outbox.pending_ids(), (SEGMENT_LINES as i64 + 1..=total).collect::<Vec<_>>());
}

#[test]
fn a_line_that_cannot_be_read_is_quarantined_and_the_rest_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    std::fs::create_dir_all(&outbox_dir).unwrap();
    let mut segment = serde_json::to_vec(&result(1)).unwrap();
    segment.extend_from_slice(b"\n{\"logId\": 2, \"handle\n");
    segment.extend_from_slice(&serde_json::to_vec(&result(3)).unwrap());
    segment.extend_from_slice(b"\nack 1\n");
    // A line cut short by a crash: its push never returned.
    segment.extend_from_slice(b"{\"logId\": 4");
    std::fs::write(outbox_dir.join("results-7.log"), segment).unwrap();

    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    assert_eq!(outbox.pending_ids(), [3]);
    assert_eq!(names(&outbox_dir), ["quarantine", "results-7.log", "results-8.log"]);
    let bad = std::fs::read_to_string(outbox_dir.join("quarantine/results-7.log.bad")).unwrap();
    assert_eq!(bad, "{\"logId\": 2, \"handle\n{\"logId\": 4\n");
}

#[test]
fn concurrent_pushes_share_syncs_and_all_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..8_i64 {
            let outbox = &outbox;
            scope.spawn(move || {
                for n in 0..50 {
                    outbox.push(&result(thread * 1000 + n + 1)).unwrap();
                }
            });
        }
    });
    assert_eq!(outbox.inner.synced.through(), 400);
    drop(outbox);
    let outbox = Outbox::open(outbox_dir).unwrap();
    assert_eq!(outbox.pending_ids().len(), 400);
}

#[test]
fn a_batch_is_stored_with_its_lines_synced_across_a_segment_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    let count = SEGMENT_LINES as i64 + 100;
    let results: Vec<_> = (1..=count).map(result).collect();
    let stored = outbox.push_all(&results);
    assert_eq!(stored.len(), results.len());
    assert!(stored.iter().all(Result::is_ok));
    assert_eq!(outbox.inner.synced.through(), count as u64);
    drop(outbox);
    assert_eq!(names(&outbox_dir), ["quarantine", "results-1.log", "results-2.log"]);
    let outbox = Outbox::open(outbox_dir).unwrap();
    assert_eq!(outbox.pending_ids(), (1..=count).collect::<Vec<_>>());
}

/// Lifts the backoff of run `log_id`'s entry.
fn due_now(outbox: &Outbox, log_id: i64) {
    outbox.inner.state.lock().unwrap().entries.get_mut(&log_id).unwrap().retry_at = None;
}
