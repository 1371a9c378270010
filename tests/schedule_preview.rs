//! `GET /api/v1/schedule/preview` through the router with `oneshot`: fire times with the zone's
//! offset across daylight-saving changes, and a 400 with a reason for every bad parameter.

use axum::body::Body;
use axum::http::Request;
use expect_test::{Expect, expect};
use http_body_util::BodyExt;
use tower::ServiceExt;
use wasmjob::admin::{AppState, router};
use wasmjob::storage::Db;

use crate::support::ADMIN_TOKEN;

async fn app() -> (axum::Router, tempfile::TempDir) {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let db =
        Db::connect(&format!("sqlite:{}", dir.path().join("preview.db").display())).await.unwrap();
    let config = crate::support::app::admin_config(String::new());
    (router(AppState::new(db, config).unwrap()), dir)
}

/// Sends `GET /api/v1/schedule/preview?{query}` for each row and renders `status body`.
async fn check(rows: &[(&str, Option<&str>)], expect: Expect) {
    let (app, _dir) = app().await;
    let mut text = String::new();
    for &(query, token) in rows {
        let mut request = Request::get(format!("/api/v1/schedule/preview?{query}"));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let auth = match token {
            None => "no token",
            Some(token) if token == ADMIN_TOKEN => "token",
            Some(_) => "wrong token",
        };
        text += &format!("{query} ({auth})\n  {status} {}\n", String::from_utf8_lossy(&body));
    }
    expect.assert_eq(&text);
}

#[tokio::test]
async fn fire_times() {
    let token = Some(ADMIN_TOKEN);
    let rows = [
        (
            "schedule_type=CRON&schedule_conf=0+30+2+*+*+%3F&time_zone=Europe/Berlin&from=2026-03-28T12:00:00Z&count=3",
            token,
        ),
        (
            "schedule_type=CRON&schedule_conf=0+0/30+*+*+*+%3F&time_zone=America/New_York&from=2026-11-01T05:10:00Z&count=4",
            token,
        ),
        (
            "schedule_type=CRON&schedule_conf=0+0+12+LW+*+%3F&from=2026-01-01T00:00:00%2B09:00",
            token,
        ),
        (
            "schedule_type=CRON&schedule_conf=0+15+10+%3F+*+6L+2026&time_zone=Asia/Tokyo&from=2026-10-01T00:00:00Z&count=100",
            token,
        ),
        ("schedule_type=CRON&schedule_conf=0+0+0+30+2+%3F&from=2026-01-01T00:00:00Z", token),
        (
            "schedule_type=FIX_RATE&schedule_conf=90&time_zone=Australia/Lord_Howe&from=2026-04-05T14:58:00.250Z&count=2",
            token,
        ),
        ("schedule_type=NONE&from=2026-01-01T00:00:00Z", token),
        // FIX_DELAY shows its first fire only: the later ones depend on how long runs take.
        ("schedule_type=FIX_DELAY&schedule_conf=90&from=2026-01-01T00:00:00Z&count=3", token),
        (
            "schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00%2B02:00&time_zone=Asia/Tokyo&from=2026-01-01T00:00:00Z",
            token,
        ),
        ("schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00Z&from=2026-05-01T09:00:00Z", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+1+1+%3F&time_zone=&from=&count=", token),
    ];
    // The last row runs from now: only its shape is stable, so it shows the year's first fire.
    let (last, fixed) = rows.split_last().unwrap();
    check(fixed, expect![[r#"
        schedule_type=CRON&schedule_conf=0+30+2+*+*+%3F&time_zone=Europe/Berlin&from=2026-03-28T12:00:00Z&count=3 (token)
          200 {"fire_times":["2026-03-29T03:00:00+02:00","2026-03-30T02:30:00+02:00","2026-03-31T02:30:00+02:00"]}
        schedule_type=CRON&schedule_conf=0+0/30+*+*+*+%3F&time_zone=America/New_York&from=2026-11-01T05:10:00Z&count=4 (token)
          200 {"fire_times":["2026-11-01T01:30:00-04:00","2026-11-01T01:00:00-05:00","2026-11-01T01:30:00-05:00","2026-11-01T02:00:00-05:00"]}
        schedule_type=CRON&schedule_conf=0+0+12+LW+*+%3F&from=2026-01-01T00:00:00%2B09:00 (token)
          200 {"fire_times":["2026-01-30T12:00:00+00:00","2026-02-27T12:00:00+00:00","2026-03-31T12:00:00+00:00","2026-04-30T12:00:00+00:00","2026-05-29T12:00:00+00:00"]}
        schedule_type=CRON&schedule_conf=0+15+10+%3F+*+6L+2026&time_zone=Asia/Tokyo&from=2026-10-01T00:00:00Z&count=100 (token)
          200 {"fire_times":["2026-10-30T10:15:00+09:00","2026-11-27T10:15:00+09:00","2026-12-25T10:15:00+09:00"]}
        schedule_type=CRON&schedule_conf=0+0+0+30+2+%3F&from=2026-01-01T00:00:00Z (token)
          200 {"fire_times":[]}
        schedule_type=FIX_RATE&schedule_conf=90&time_zone=Australia/Lord_Howe&from=2026-04-05T14:58:00.250Z&count=2 (token)
          200 {"fire_times":["2026-04-06T01:29:30.250+10:30","2026-04-06T01:31:00.250+10:30"]}
        schedule_type=NONE&from=2026-01-01T00:00:00Z (token)
          200 {"fire_times":[]}
        schedule_type=FIX_DELAY&schedule_conf=90&from=2026-01-01T00:00:00Z&count=3 (token)
          200 {"fire_times":["2026-01-01T00:01:30+00:00"]}
        schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00%2B02:00&time_zone=Asia/Tokyo&from=2026-01-01T00:00:00Z (token)
          200 {"fire_times":["2026-05-01T16:00:00+09:00"]}
        schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00Z&from=2026-05-01T09:00:00Z (token)
          200 {"fire_times":[]}
    "#]]).await;
    let (app, _dir) = app().await;
    let request = Request::get(format!("/api/v1/schedule/preview?{}", last.0))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let times = body["fire_times"].as_array().unwrap();
    assert_eq!(times.len(), 5, "{body}");
    assert!(times.iter().all(|time| time.as_str().unwrap().ends_with("-01-01T12:00:00+00:00")));
}

#[tokio::test]
async fn refusals() {
    let token = Some(ADMIN_TOKEN);
    let rows = [
        ("schedule_type=CRON&schedule_conf=0+0+12+%3F+*+MON", None),
        ("schedule_type=CRON&schedule_conf=0+0+12+%3F+*+MON", Some("wrong")),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+MON", token),
        ("schedule_type=CRON&schedule_conf=0+61+12+*+*+%3F", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+L-31+*+%3F", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*", token),
        ("schedule_type=CRON", token),
        ("schedule_type=CRON&schedule_conf=%00%FF", token),
        ("schedule_type=FIX_RATE&schedule_conf=-5", token),
        ("schedule_type=FIX_DELAY&schedule_conf=1.5", token),
        ("schedule_type=ONCE&schedule_conf=tomorrow", token),
        ("schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00", token),
        ("schedule_type=NONE&schedule_conf=30", token),
        ("schedule_type=HOURLY&schedule_conf=1", token),
        ("schedule_conf=0+0+12+*+*+%3F", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&time_zone=Mars/Olympus", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&from=yesterday", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&from=2026-13-01T00:00:00Z", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=0", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=101", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=-1", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=99999999999999999999999", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&cron=1", token),
        ("schedule_type=CRON&schedule_type=NONE", token),
        ("schedule_type=CRON&schedule_conf=%", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&calendar=nope", token),
        ("schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&calendar=%00", token),
    ];
    check(&rows, expect![[r#"
        schedule_type=CRON&schedule_conf=0+0+12+%3F+*+MON (no token)
          401 {"code":"unauthorized","message":"missing or wrong bearer token"}
        schedule_type=CRON&schedule_conf=0+0+12+%3F+*+MON (wrong token)
          401 {"code":"unauthorized","message":"missing or wrong bearer token"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+MON (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `0 0 12 * * MON`: day-of-week field, at character 11: exactly one of day-of-month and day-of-week must be `?`"}
        schedule_type=CRON&schedule_conf=0+61+12+*+*+%3F (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `0 61 12 * * ?`: minute field, at character 2: minute values must be from 0 to 59"}
        schedule_type=CRON&schedule_conf=0+0+12+L-31+*+%3F (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `0 0 12 L-31 * ?`: day-of-month field, at character 9: the offset from the last day must be at most 30"}
        schedule_type=CRON&schedule_conf=0+0+12+*+* (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `0 0 12 * *`: at character 10: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 5"}
        schedule_type=CRON (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression ``: at character 0: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 0"}
        schedule_type=CRON&schedule_conf=%00%FF (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `\u0000�`: at character 2: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 1"}
        schedule_type=FIX_RATE&schedule_conf=-5 (token)
          400 {"code":"invalid_schedule","message":"invalid fix rate `-5`: expected a whole number of seconds from 1 to 31536000"}
        schedule_type=FIX_DELAY&schedule_conf=1.5 (token)
          400 {"code":"invalid_schedule","message":"invalid fix delay `1.5`: expected a whole number of seconds from 1 to 31536000"}
        schedule_type=ONCE&schedule_conf=tomorrow (token)
          400 {"code":"invalid_schedule","message":"invalid instant `tomorrow`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00"}
        schedule_type=ONCE&schedule_conf=2026-05-01T09:00:00 (token)
          400 {"code":"invalid_schedule","message":"invalid instant `2026-05-01T09:00:00`: expected an RFC 3339 instant with its offset, such as 2026-05-01T09:00:00+02:00"}
        schedule_type=NONE&schedule_conf=30 (token)
          400 {"code":"invalid_schedule","message":"schedule type NONE takes no configuration, got `30`"}
        schedule_type=HOURLY&schedule_conf=1 (token)
          400 {"code":"invalid_query","message":"schedule_type: unknown ScheduleType `HOURLY`, expected one of: CRON, FIX_RATE, FIX_DELAY, ONCE, NONE"}
        schedule_conf=0+0+12+*+*+%3F (token)
          400 {"code":"invalid_query","message":"schedule_type is required: CRON, FIX_RATE, FIX_DELAY, ONCE or NONE"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&time_zone=Mars/Olympus (token)
          400 {"code":"invalid_schedule","message":"unknown time zone `Mars/Olympus`"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&from=yesterday (token)
          400 {"code":"invalid_query","message":"from: `yesterday` is not an RFC 3339 instant such as 2026-03-29T00:00:00Z"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&from=2026-13-01T00:00:00Z (token)
          400 {"code":"invalid_query","message":"from: `2026-13-01T00:00:00Z` is not an RFC 3339 instant such as 2026-03-29T00:00:00Z"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=0 (token)
          400 {"code":"invalid_query","message":"count: `0` is not a number from 1 to 100"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=101 (token)
          400 {"code":"invalid_query","message":"count: `101` is not a number from 1 to 100"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=-1 (token)
          400 {"code":"invalid_query","message":"count: `-1` is not a number from 1 to 100"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&count=99999999999999999999999 (token)
          400 {"code":"invalid_query","message":"count: `99999999999999999999999` is not a number from 1 to 100"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&cron=1 (token)
          400 {"code":"invalid_query","message":"Failed to deserialize query string: cron: unknown field `cron`, expected one of `schedule_type`, `schedule_conf`, `time_zone`, `from`, `count`, `calendar`"}
        schedule_type=CRON&schedule_type=NONE (token)
          400 {"code":"invalid_query","message":"Failed to deserialize query string: duplicate field `schedule_type`"}
        schedule_type=CRON&schedule_conf=% (token)
          400 {"code":"invalid_schedule","message":"invalid cron expression `%`: at character 1: expected 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), found 1"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&calendar=nope (token)
          400 {"code":"invalid_query","message":"calendar: calendar `nope` does not exist"}
        schedule_type=CRON&schedule_conf=0+0+12+*+*+%3F&calendar=%00 (token)
          400 {"code":"invalid_query","message":"calendar: calendar `\u0000` does not exist"}
    "#]]).await;
}
