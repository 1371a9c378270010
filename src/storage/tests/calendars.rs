//! Calendars stored and read back whole, the jobs that name them, the refused delete of one a
//! job names, and the compare-and-set that moves a job's next fire.

use super::*;
use crate::model::CalendarSpec;

fn workdays() -> CalendarSpec {
    CalendarSpec {
        time_zone: Some("Asia/Shanghai".to_owned()),
        description: "China workdays".to_owned(),
        excluded_dates: vec!["2026-10-01/2026-10-07".to_owned()],
        annual_dates: vec!["05-01".to_owned()],
        weekdays: vec!["SAT".to_owned(), "SUN".to_owned()],
        daily_windows: vec!["00:00-06:00".to_owned()],
        cron: vec!["* * 12 ? * *".to_owned()],
        included_dates: vec!["2026-09-27".to_owned(), "2026-10-10".to_owned()],
    }
}

#[tokio::test]
async fn calendars_are_stored_whole_and_a_named_one_is_not_deleted() {
    each_backend("calendars", |db| async move {
        let created = db.create_calendar("cn", &workdays(), 10).await.unwrap();
        assert_eq!((created.name.as_str(), &created.spec), ("cn", &workdays()));
        assert_eq!((created.created_at_ms, created.updated_at_ms), (10, 10));
        let error = db.create_calendar("cn", &CalendarSpec::default(), 11).await.unwrap_err();
        assert!(error.is_constraint_violation(), "{error}");
        let empty = db.create_calendar("empty", &CalendarSpec::default(), 12).await.unwrap();
        assert_eq!(empty.spec, CalendarSpec::default());
        let names: Vec<String> =
            db.list_calendars().await.unwrap().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["cn", "empty"]);
        assert_eq!(db.get_calendar("cn").await.unwrap(), Some(created.clone()));
        assert_eq!(db.get_calendar("nope").await.unwrap(), None);

        let changed = CalendarSpec { weekdays: vec!["SUN".to_owned()], ..workdays() };
        let updated = db.update_calendar("cn", &changed, 20).await.unwrap().unwrap();
        assert_eq!(
            (updated.spec.weekdays.as_slice(), updated.updated_at_ms),
            (&["SUN".to_owned()][..], 20)
        );
        assert_eq!(updated.created_at_ms, 10);
        assert_eq!(db.update_calendar("nope", &changed, 20).await.unwrap(), None);

        // A job names a calendar; deleting that calendar is refused, naming the job.
        let group = db.ensure_group("default", "Default", 0).await.unwrap();
        let spec = JobSpec { calendar: Some("cn".to_owned()), ..new_job(group.id) };
        let job = db.create_job(&spec, 30).await.unwrap();
        assert_eq!(job.spec.calendar.as_deref(), Some("cn"));
        assert_eq!(
            db.delete_calendar("cn").await.unwrap(),
            CalendarDelete::InUse(vec![(job.id, "nightly".to_owned())])
        );
        // A job cannot name a calendar that does not exist.
        let orphan = JobSpec { calendar: Some("nope".to_owned()), ..new_job(group.id) };
        let error = db.create_job(&orphan, 31).await.unwrap_err();
        assert!(error.is_constraint_violation(), "{error}");

        // Running jobs that name it, and their next fire moved only from what was read.
        assert!(db.running_jobs_with_calendar("cn").await.unwrap().is_empty());
        db.set_job_running(job.id, Some(1_000), 32).await.unwrap();
        let running = db.running_jobs_with_calendar("cn").await.unwrap();
        assert_eq!(running.iter().map(|job| job.id).collect::<Vec<_>>(), [job.id]);
        assert!(!db.reschedule_job(job.id, 999, 5_000, 33).await.unwrap());
        assert!(db.reschedule_job(job.id, 1_000, 5_000, 33).await.unwrap());
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().next_fire_ms, 5_000);

        // Once no job names it, it goes.
        let unnamed = JobSpec { calendar: None, ..spec.clone() };
        db.update_job(job.id, &unnamed, 5_000, 34).await.unwrap().unwrap();
        assert_eq!(db.get_job(job.id).await.unwrap().unwrap().spec.calendar, None);
        assert_eq!(db.delete_calendar("cn").await.unwrap(), CalendarDelete::Deleted);
        assert_eq!(db.delete_calendar("cn").await.unwrap(), CalendarDelete::NotFound);
        assert_eq!(db.get_calendar("cn").await.unwrap(), None);
    })
    .await;
}
