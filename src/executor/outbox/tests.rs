//! Tests of the outbox: quarantine, the in-memory fallback, and one refused result among many.
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
}

impl FakeAdmin {
    async fn serve(&self) -> String {
        async fn callback(
            State(admin): State<FakeAdmin>,
            Json(body): Json<CallbackBody>,
        ) -> Json<ReturnT<String>> {
            let ids: Vec<i64> = body.into_list().iter().map(|result| result.log_id).collect();
            let refused = ids.iter().any(|id| admin.refuse.lock().unwrap().contains(id));
            admin.calls.lock().unwrap().push(ids);
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
    assert_eq!(names(&outbox_dir), ["1.json", "quarantine"]);
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

    let round = outbox.deliver_once(&client(), std::slice::from_ref(&url)).await.unwrap();
    assert!(matches!(round, Round::More));
    assert_eq!(admin.calls(), [vec![1, 2, 3, 4, 5], vec![1], vec![2], vec![3], vec![4], vec![5]]);
    assert_eq!(outbox.pending_ids(), [3]);
    assert_eq!(names(&dir.path().join("outbox")), ["3.json", "quarantine"]);

    // Refused alone, it waits for its own backoff while later results go first.
    outbox.push(&result(6)).unwrap();
    let round = outbox.deliver_once(&client(), std::slice::from_ref(&url)).await.unwrap();
    assert!(matches!(round, Round::Idle(Some(_))));
    assert_eq!(admin.calls(), [vec![6]]);
    assert_eq!(outbox.pending_ids(), [3]);

    // Refused again alone: no batch fallback for a single entry, a longer backoff.
    outbox.inner.pending.lock().unwrap()[0].retry_at = None;
    outbox.deliver_once(&client(), std::slice::from_ref(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![3]]);
    let entry_refusals = outbox.inner.pending.lock().unwrap()[0].refusals;
    assert_eq!(entry_refusals, 2);

    // Once the admin can apply it, it goes.
    admin.refuse.lock().unwrap().clear();
    outbox.inner.pending.lock().unwrap()[0].retry_at = None;
    outbox.deliver_once(&client(), std::slice::from_ref(&url)).await.unwrap();
    assert_eq!(admin.calls(), [vec![3]]);
    assert!(outbox.pending_ids().is_empty());
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
    assert!(outbox.deliver_once(&client(), &[url]).await.is_err());
    assert_eq!(outbox.pending_ids(), [1]);
    assert!(outbox.inner.pending.lock().unwrap()[0].retry_at.is_none());
}

#[tokio::test]
async fn a_result_the_disk_refuses_is_kept_in_memory_and_delivered() {
    let admin = FakeAdmin::default();
    let url = admin.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    let outbox = Outbox::open(outbox_dir.clone()).unwrap();
    // The directory disappears under the executor: writes fail whatever the user's rights.
    std::fs::remove_dir_all(&outbox_dir).unwrap();

    let error = outbox.push(&result(9)).unwrap_err();
    assert!(error.to_string().contains("storing the result of run 9"), "{error}");
    assert_eq!(outbox.pending_ids(), [9]);
    outbox.deliver_once(&client(), &[url]).await.unwrap();
    assert_eq!(admin.calls(), [vec![9]]);
    assert!(outbox.pending_ids().is_empty());
}
