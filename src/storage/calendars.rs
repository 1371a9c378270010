//! Business calendars and the jobs that name them.
//!
//! A calendar's rules are one JSON object of lists of entries as written (`rules`), read and
//! written whole; checking them is `schedule::calendar`'s business, done before they get here.
//! Jobs name a calendar by name, through a foreign key, so a calendar a job names cannot be
//! deleted: [`Db::delete_calendar`] answers with the jobs instead, and a job saved meanwhile
//! makes the delete fail on the key.

use super::query::query;
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::job_rows::{COLUMNS as JOB_COLUMNS, job_from_row};
use super::{Db, Result, StorageError};
use crate::model::{CalendarRecord, CalendarSpec, Job};

const COLUMNS: &str = "name, time_zone, description, rules, created_at, updated_at";

/// What [`Db::delete_calendar`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum CalendarDelete {
    /// It is gone.
    Deleted,
    /// There is no such calendar.
    NotFound,
    /// These jobs (id, name) name it; nothing changed.
    InUse(Vec<(i64, String)>),
}

impl Db {
    /// Creates calendar `name`; an existing name is a constraint violation.
    pub async fn create_calendar(
        &self,
        name: &str,
        spec: &CalendarSpec,
        now_ms: i64,
    ) -> Result<CalendarRecord> {
        let row = query(&format!(
            "insert into calendars (name, time_zone, description, rules, created_at, updated_at)
             values ($1, $2, $3, $4, $5, $5) returning {COLUMNS}"
        ))
        .bind(name)
        .bind(spec.time_zone.as_deref())
        .bind(&spec.description)
        .bind(rules_json(spec))
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        calendar_from_row(&row)
    }

    /// Calendar `name`, if it exists.
    pub async fn get_calendar(&self, name: &str) -> Result<Option<CalendarRecord>> {
        let row = query(&format!("select {COLUMNS} from calendars where name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(calendar_from_row).transpose()
    }

    /// All calendars, by name.
    pub async fn list_calendars(&self) -> Result<Vec<CalendarRecord>> {
        let rows = query(&format!("select {COLUMNS} from calendars order by name"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(calendar_from_row).collect()
    }

    /// Replaces the rules of calendar `name`; `None` if it does not exist.
    pub async fn update_calendar(
        &self,
        name: &str,
        spec: &CalendarSpec,
        now_ms: i64,
    ) -> Result<Option<CalendarRecord>> {
        let row = query(&format!(
            "update calendars set time_zone = $1, description = $2, rules = $3, updated_at = $4
             where name = $5 returning {COLUMNS}"
        ))
        .bind(spec.time_zone.as_deref())
        .bind(&spec.description)
        .bind(rules_json(spec))
        .bind(now_ms)
        .bind(name)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(calendar_from_row).transpose()
    }

    /// Deletes calendar `name` unless a job names it, in one transaction.
    pub async fn delete_calendar(&self, name: &str) -> Result<CalendarDelete> {
        let mut tx = self.writer().begin().await?;
        let rows = query("select id, name from jobs where calendar = $1 order by id")
            .bind(name)
            .fetch_all(&mut *tx)
            .await?;
        if !rows.is_empty() {
            let jobs = rows
                .iter()
                .map(|row| Ok((row.try_get("id")?, row.try_get("name")?)))
                .collect::<std::result::Result<Vec<_>, sqlx::Error>>()?;
            tx.rollback().await?;
            return Ok(CalendarDelete::InUse(jobs));
        }
        let done =
            query("delete from calendars where name = $1").bind(name).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(if done.rows_affected() == 1 {
            CalendarDelete::Deleted
        } else {
            CalendarDelete::NotFound
        })
    }

    /// The running jobs that name calendar `name`, by id.
    pub async fn running_jobs_with_calendar(&self, name: &str) -> Result<Vec<Job>> {
        let rows = query(&format!(
            "select {JOB_COLUMNS} from jobs where calendar = $1 and running = 1 order by id"
        ))
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Moves the next fire of running job `id` from `expected_ms` to `next_ms` (0 for none,
    /// as a `FIX_DELAY` job waiting for its runs has). Whether it moved: a job that fired or
    /// changed meanwhile is left as it is.
    pub async fn reschedule_job(
        &self,
        id: i64,
        expected_ms: i64,
        next_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let done = query(
            "update jobs set next_fire_ms = $1, updated_at = $2
             where id = $3 and running = 1 and next_fire_ms = $4",
        )
        .bind(next_ms)
        .bind(now_ms)
        .bind(id)
        .bind(expected_ms)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// The lists of `spec` as one JSON object.
fn rules_json(spec: &CalendarSpec) -> String {
    let mut rules = Map::new();
    for (field, entries) in fields(spec) {
        rules.insert(field.to_owned(), Value::from(entries.clone()));
    }
    Value::Object(rules).to_string()
}

/// The lists of a calendar by their names in `rules`.
fn fields(spec: &CalendarSpec) -> [(&'static str, &Vec<String>); 6] {
    [
        ("excluded_dates", &spec.excluded_dates),
        ("annual_dates", &spec.annual_dates),
        ("weekdays", &spec.weekdays),
        ("daily_windows", &spec.daily_windows),
        ("cron", &spec.cron),
        ("included_dates", &spec.included_dates),
    ]
}

fn calendar_from_row(row: &AnyRow) -> Result<CalendarRecord> {
    let text: String = row.try_get("rules")?;
    let corrupt = || StorageError::Corrupt(format!("calendar rules: `{text}`"));
    let rules: Value = serde_json::from_str(&text).map_err(|_| corrupt())?;
    let list = |field: &str| -> Result<Vec<String>> {
        match rules.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned).ok_or_else(corrupt))
                .collect(),
            Some(_) => Err(corrupt()),
        }
    };
    let spec = CalendarSpec {
        time_zone: row.try_get("time_zone")?,
        description: row.try_get("description")?,
        excluded_dates: list("excluded_dates")?,
        annual_dates: list("annual_dates")?,
        weekdays: list("weekdays")?,
        daily_windows: list("daily_windows")?,
        cron: list("cron")?,
        included_dates: list("included_dates")?,
    };
    Ok(CalendarRecord {
        name: row.try_get("name")?,
        spec,
        created_at_ms: row.try_get("created_at")?,
        updated_at_ms: row.try_get("updated_at")?,
    })
}
