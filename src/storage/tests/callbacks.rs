//! The callback inbox: a recorded callback comes back whole, is taken once, and only when its
//! owner is gone, its time ran out or its owner gave it back.

use super::*;
use crate::storage::{InboxEntry, RecordedCallback};

/// A body as an executor sends it: quotes, non-ASCII and a few kilobytes.
fn body(results: usize) -> String {
    let entries: Vec<String> = (0..results)
        .map(|at| {
            format!(
                r#"{{"logId":{at},"logDateTim":0,"handleCode":200,"handleMsg":"ok \"{at}\" é"}}"#
            )
        })
        .collect();
    format!("[{}]", entries.join(","))
}

#[tokio::test]
async fn recorded_callbacks_are_taken_once_when_their_owner_is_gone_or_late() {
    each_backend("callback_inbox", |db| async move {
        assert_eq!(db.count_recorded_callbacks().await.unwrap(), (0, 0));
        db.record_callback(11, body(100), 100, "a", 1_000, 61_000).await.unwrap();
        db.record_callback(12, body(3), 3, "b", 2_000, 62_000).await.unwrap();
        db.record_callback(13, body(1), 1, "c", 3_000, 4_000).await.unwrap();
        // An id recorded twice is refused: the caller sends the callback back.
        assert!(db.record_callback(11, body(1), 1, "a", 1_000, 61_000).await.is_err());
        assert_eq!(db.count_recorded_callbacks().await.unwrap(), (3, 104));

        // Before anything ran out, with nobody gone: nothing to take.
        let ids = |entries: Vec<InboxEntry>| entries.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(db.takeable_callbacks(&[], 3_500, 10).await.unwrap()), Vec::<i64>::new());
        // Later: row 13's time ran out (for its own owner too, whose apply failed); with admin
        // "a" gone, its row too, oldest first.
        let gone = vec!["a".to_owned()];
        assert_eq!(ids(db.takeable_callbacks(&[], 5_000, 10).await.unwrap()), vec![13]);
        let takeable = db.takeable_callbacks(&gone, 5_000, 10).await.unwrap();
        assert_eq!(ids(takeable.clone()), vec![11, 13]);
        assert_eq!(takeable[0].results, 100);
        assert_eq!(ids(db.takeable_callbacks(&gone, 5_000, 1).await.unwrap()), vec![11]);

        // Taken once: the body comes back as it went in, and a second taker, who read the row
        // as it was, gets nothing.
        let taken = db.take_callback(&takeable[0], "d", 65_000).await.unwrap().unwrap();
        assert_eq!(taken, RecordedCallback { id: 11, body: body(100) });
        assert_eq!(db.take_callback(&takeable[0], "e", 65_000).await.unwrap(), None);
        // Now "d"'s until 65 s: not takeable for "a"'s being gone.
        assert_eq!(ids(db.takeable_callbacks(&gone, 5_000, 10).await.unwrap()), vec![13]);

        // Deleted once applied; a row deleted meanwhile is not taken.
        db.forget_callback(11).await.unwrap();
        db.forget_callback(13).await.unwrap();
        assert_eq!(db.take_callback(&takeable[1], "d", 65_000).await.unwrap(), None);
        assert_eq!(db.count_recorded_callbacks().await.unwrap(), (1, 3));
        assert_eq!(ids(db.takeable_callbacks(&[], 70_000, 10).await.unwrap()), vec![12]);
        // Given back by its owner, stopping, a row is anyone's at once.
        assert_eq!(ids(db.takeable_callbacks(&[], 5_000, 10).await.unwrap()), Vec::<i64>::new());
        assert_eq!(db.release_callbacks("b").await.unwrap(), 1);
        assert_eq!(ids(db.takeable_callbacks(&[], 5_000, 10).await.unwrap()), vec![12]);
    })
    .await;
}
