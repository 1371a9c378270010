//! Business calendars through a real admin and executor: an excluded instant is neither fired
//! nor taken for a misfire, lifting the exclusion fires the job, and the API's answers (409 for
//! a calendar in use, 400 for a job naming an unknown one, `.ics` imports, the preview).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, TestApp, backends, sample_job};

/// Sends `method path` with a JSON body, or `body` as text when it is a string.
async fn send(api: &Api, method: reqwest::Method, path: &str, body: Value) -> (StatusCode, Value) {
    let request = api.http.request(method, api.url(path)).bearer_auth(&api.token);
    let request = match body {
        Value::Null => request,
        Value::String(text) => request.header("content-type", "text/calendar").body(text),
        body => request.json(&body),
    };
    let reply = request.send().await.unwrap();
    let status = reply.status();
    let text = reply.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The UTC date `days` from today, `2026-10-01`.
fn date(days: i64) -> String {
    let now = chrono::Utc::now() + chrono::TimeDelta::days(days);
    now.format("%Y-%m-%d").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_excluded_instant_is_not_fired_nor_misfired_and_lifting_the_exclusion_fires() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let db = &app.admin.as_ref().unwrap().state.db;
        // Today (and a day either side, should the test run across midnight) is excluded.
        let holiday =
            json!({"name": "holiday", "excluded_dates": [format!("{}/{}", date(-1), date(1))]});
        let (status, calendar) = api.post("/api/v1/calendars", holiday).await;
        assert_eq!(status, StatusCode::CREATED, "{calendar}");
        // Every second, and a misfire would fire at once: any run would show.
        let job_id = api
            .create_job(json!({
                "name": "on workdays", "schedule_type": "CRON", "schedule_conf": "* * * * * ?",
                "misfire_strategy": "FIRE_ONCE_NOW", "calendar": "holiday",
            }))
            .await;
        api.upload(job_id, sample_job("hello")).await;
        let (status, started) = api.post(&format!("/api/v1/jobs/{job_id}/start"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{started}");
        let next = db.get_job(job_id).await.unwrap().unwrap().next_fire_ms;
        let day_after = chrono::NaiveDate::parse_from_str(&date(2), "%Y-%m-%d").unwrap();
        let day_after = day_after.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_millis();
        assert_eq!(next, day_after, "the first allowed fire is the day after the exclusion");
        // Due now, and ten seconds late: excluded, so neither fired nor a misfire.
        let late = wasmjob::admin::now_ms() - 10_000;
        db.set_job_running(job_id, Some(late), late).await.unwrap();
        app.admin.as_ref().unwrap().state.scheduler_wake.notify_one();
        let moved = api
            .wait_until("the scheduler passes the excluded instant", || async {
                let job = db.get_job(job_id).await.unwrap().unwrap();
                (job.next_fire_ms != late).then_some(job)
            })
            .await;
        assert!(moved.running, "an excluded instant does not stop the job");
        assert_eq!(moved.next_fire_ms, day_after);
        let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
        assert_eq!(
            page["total"], 0,
            "an excluded instant makes no run, not even a misfire's: {page}"
        );
        // The exclusion lifted, the job fires within a second or two, on schedule.
        let (status, lifted) = send(
            api,
            reqwest::Method::PUT,
            "/api/v1/calendars/holiday",
            json!({"description": "lifted"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{lifted}");
        let run = api
            .wait_until("the job fires once the exclusion is lifted", || async {
                let (_, page) = api.get(&format!("/api/v1/logs?job_id={job_id}")).await;
                page["items"].as_array().and_then(|items| items.last().cloned())
            })
            .await;
        assert_eq!(run["trigger_type"], "CRON", "{run}");
        api.post(&format!("/api/v1/jobs/{job_id}/stop"), json!({})).await;
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendars_through_the_api() {
    for backend in backends() {
        let app = TestApp::start(backend).await;
        let api = &app.api;
        let workdays = json!({
            "name": "cn", "time_zone": "Asia/Shanghai", "weekdays": ["SAT", "SUN"],
            "excluded_dates": ["2026-10-01/2026-10-07"], "included_dates": ["2026-10-10"],
        });
        let (status, created) = api.post("/api/v1/calendars", workdays.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let (status, again) = api.post("/api/v1/calendars", workdays).await;
        assert_eq!((status, &again["code"]), (StatusCode::CONFLICT, &json!("conflict")), "{again}");
        let refusals = [
            json!({"name": "bad", "weekdays": ["FUNDAY"]}),
            json!({"name": "bad", "time_zone": "Mars/Olympus"}),
            json!({"name": "bad/name"}),
            json!({"name": "bad", "daily_windows": ["25:00-26:00"]}),
            json!({"name": "bad", "cron": ["* * *"]}),
            json!({"name": "bad", "colour": "red"}),
        ];
        for body in refusals {
            let (status, error) = api.post("/api/v1/calendars", body.clone()).await;
            assert!(status.is_client_error(), "{body}: {status} {error}");
        }
        let (status, list) = api.get("/api/v1/calendars").await;
        assert_eq!((status, list.as_array().unwrap().len()), (StatusCode::OK, 1), "{list}");
        let (status, missing) = api.get("/api/v1/calendars/nope").await;
        assert_eq!(
            (status, &missing["code"]),
            (StatusCode::NOT_FOUND, &json!("calendar_not_found"))
        );

        // A job naming an unknown calendar is refused, naming it; one naming `cn` is kept.
        let unknown =
            json!({"group_id": 1, "name": "j", "schedule_type": "NONE", "calendar": "nope"});
        let (status, error) = api.post("/api/v1/jobs", unknown).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert!(error["message"].as_str().unwrap().contains("`nope`"), "{error}");
        let job_id = api
            .create_job(
                json!({"name": "daily", "schedule_type": "CRON", "schedule_conf": "0 0 9 * * ?",
                "time_zone": "Asia/Shanghai", "calendar": "cn"}),
            )
            .await;
        let (_, job) = api.get(&format!("/api/v1/jobs/{job_id}")).await;
        assert_eq!(job["calendar"], "cn", "{job}");
        let (status, error) =
            send(api, reqwest::Method::DELETE, "/api/v1/calendars/cn", Value::Null).await;
        assert_eq!(status, StatusCode::CONFLICT, "{error}");
        assert!(error["message"].as_str().unwrap().contains("`daily`"), "{error}");

        // The preview skips and lists the excluded fires.
        let (status, preview) = api
            .get("/api/v1/schedule/preview?schedule_type=CRON&schedule_conf=0+0+9+*+*+%3F&time_zone=Asia/Shanghai&from=2026-09-30T02:00:00Z&count=2&calendar=cn")
            .await;
        assert_eq!(status, StatusCode::OK, "{preview}");
        assert_eq!(
            preview,
            json!({
                "fire_times": ["2026-10-08T09:00:00+08:00", "2026-10-09T09:00:00+08:00"],
                "excluded": [{
                    "time": "2026-10-01T09:00:00+08:00",
                    "rule": "excluded_dates 2026-10-01/2026-10-07",
                    "until": "2026-10-08T00:00:00+08:00",
                }],
            })
        );
        let (status, _) =
            api.get("/api/v1/schedule/preview?schedule_type=CRON&schedule_conf=0+0+9+*+*+%3F&calendar=nope").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        // An .ics file adds its events' dates; recurring events and non-files are refused.
        let ics = "BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20270101\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20270210\r\nDTEND;VALUE=DATE:20270217\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";
        let (status, imported) =
            send(api, reqwest::Method::POST, "/api/v1/calendars/cn/ics", json!(ics)).await;
        assert_eq!(status, StatusCode::OK, "{imported}");
        assert_eq!(
            imported["excluded_dates"],
            json!(["2026-10-01/2026-10-07", "2027-01-01", "2027-02-10/2027-02-16"])
        );
        let workday = "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART;VALUE=DATE:20270207\nEND:VEVENT\nEND:VCALENDAR\n";
        let (status, imported) = send(
            api,
            reqwest::Method::POST,
            "/api/v1/calendars/cn/ics?included=true",
            json!(workday),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{imported}");
        assert_eq!(imported["included_dates"], json!(["2026-10-10", "2027-02-07"]));
        for bad in [
            "not a calendar",
            "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART:20270101\nRRULE:FREQ=YEARLY\nEND:VEVENT\nEND:VCALENDAR\n",
        ] {
            let (status, error) =
                send(api, reqwest::Method::POST, "/api/v1/calendars/cn/ics", json!(bad)).await;
            assert_eq!(
                (status, &error["code"]),
                (StatusCode::UNPROCESSABLE_ENTITY, &json!("invalid_ics")),
                "{error}"
            );
        }
        let (status, _) =
            send(api, reqwest::Method::POST, "/api/v1/calendars/nope/ics", json!("x")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // Once no job names it, it can go.
        let (status, _) =
            send(api, reqwest::Method::DELETE, &format!("/api/v1/jobs/{job_id}"), Value::Null)
                .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, _) =
            send(api, reqwest::Method::DELETE, "/api/v1/calendars/cn", Value::Null).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        app.stop().await;
    }
}
