//! Alarms as stored state: the webhooks they go to, the events that raise them, and the
//! delivery of each event to each channel.
//!
//! An event is inserted in the transaction of its cause: a run's final failure by
//! `apply_transition` (`insert_run_failed`), an executor found lost by `mark_lost_executors`,
//! which moves the registry row's `lost_alarmed_at` in the same transaction. The admin's alarm
//! task then settles each new event once, a compare-and-set on its status and on the job's
//! silence row: silenced, or sent with one delivery per channel. Deliveries are claimed under a
//! lease (a compare-and-set like a run's), so two admins on one database never deliver one
//! twice at once, and a delivery whose attempt failed waits for its next attempt in the table.
//!
//! What is silenced, which channels an event goes to and when to try again are the admin's
//! decisions; this module stores them.

use super::query::query;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{Db, Result};
use crate::model::RunRecord;

/// An event kind: a run failed for the last time.
pub const RUN_FAILED: &str = "run_failed";
/// An event kind: an executor stopped beating.
pub const EXECUTOR_LOST: &str = "executor_lost";

const WEBHOOK_COLUMNS: &str = "id, name, url, secret, group_id, created_at, updated_at";
const EVENT_COLUMNS: &str = "e.id, e.kind, e.job_id, e.run_id, e.attempt, e.state, e.message,
    e.app_name, e.executor_address, e.created_at, e.status, e.silenced_before";
const DELIVERY_COLUMNS: &str =
    "d.id as delivery_id, d.channel, d.target, d.state as delivery_state,
    d.attempts, d.next_attempt_at, d.last_error, d.delivered_at";

/// A webhook alarms are posted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmWebhook {
    /// Its id.
    pub id: i64,
    /// A unique name.
    pub name: String,
    /// Where alarms are posted.
    pub url: String,
    /// The key of the body's HMAC signature.
    pub secret: String,
    /// Only alarms of this group's jobs and executors; `None` for all.
    pub group_id: Option<i64>,
    /// When it was created (ms).
    pub created_at_ms: i64,
    /// When it was last changed (ms).
    pub updated_at_ms: i64,
}

/// A webhook's settings to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAlarmWebhook {
    /// A unique name.
    pub name: String,
    /// Where alarms are posted.
    pub url: String,
    /// The signing key; `None` on an update keeps the stored one.
    pub secret: Option<String>,
    /// Only alarms of this group's; `None` for all.
    pub group_id: Option<i64>,
}

/// Something that raises an alarm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmEvent {
    /// Its id.
    pub id: i64,
    /// [`RUN_FAILED`] or [`EXECUTOR_LOST`].
    pub kind: String,
    /// The failed run's job.
    pub job_id: Option<i64>,
    /// The failed run.
    pub run_id: Option<i64>,
    /// The failed run's attempt.
    pub attempt: i64,
    /// The failed run's final state.
    pub state: String,
    /// The failed run's message.
    pub message: String,
    /// The lost executor's application name.
    pub app_name: String,
    /// The executor concerned.
    pub executor_address: String,
    /// When it happened (ms).
    pub created_at_ms: i64,
    /// `new`, `sent` or `silenced`.
    pub status: String,
    /// For a sent alarm, how many of its job's failures were silenced since the previous one.
    pub silenced_before: i64,
}

/// How an event is settled (see [`Db::settle_alarm_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Within its job's silence window: no delivery.
    Silenced {
        /// The job.
        job_id: i64,
        /// The job's silence row as read: `(last alarm at, its event id)`.
        last: (i64, i64),
    },
    /// Sent: one delivery per `(channel, target)`.
    Send {
        /// The job, whose silence window starts again.
        job_id: Option<i64>,
        /// The job's silence row as read, `None` when it had none.
        last: Option<(i64, i64)>,
        /// The deliveries to make.
        deliveries: Vec<(String, String)>,
    },
}

/// One delivery of an event to one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmDelivery {
    /// Its id.
    pub id: i64,
    /// `webhook` or `email`.
    pub channel: String,
    /// The webhook's id, or the e-mail addresses.
    pub target: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    /// Attempts made.
    pub attempts: i64,
    /// When the next attempt is due (ms).
    pub next_attempt_at_ms: i64,
    /// Why the last attempt failed.
    pub last_error: String,
    /// When it was delivered (ms), 0 until then.
    pub delivered_at_ms: i64,
    /// What it delivers.
    pub event: AlarmEvent,
}

/// How a delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Delivered at this instant (ms).
    Delivered(i64),
    /// Failed; try again at `at_ms`.
    Retry {
        /// When.
        at_ms: i64,
        /// Why it failed.
        error: String,
    },
    /// Failed for the last time.
    Failed {
        /// Why.
        error: String,
    },
}

impl Db {
    /// Creates a webhook.
    pub async fn create_alarm_webhook(
        &self,
        webhook: &NewAlarmWebhook,
        now_ms: i64,
    ) -> Result<AlarmWebhook> {
        let row = query(&format!(
            "insert into alarm_webhooks (name, url, secret, group_id, created_at, updated_at)
             values ($1, $2, $3, $4, $5, $5) returning {WEBHOOK_COLUMNS}"
        ))
        .bind(&webhook.name)
        .bind(&webhook.url)
        .bind(webhook.secret.as_deref().unwrap_or(""))
        .bind(webhook.group_id)
        .bind(now_ms)
        .fetch_one(self.writer())
        .await?;
        webhook_from_row(&row)
    }

    /// Every webhook, by id.
    pub async fn list_alarm_webhooks(&self) -> Result<Vec<AlarmWebhook>> {
        let rows = query(&format!("select {WEBHOOK_COLUMNS} from alarm_webhooks order by id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(webhook_from_row).collect()
    }

    /// Webhook `id`, if it exists.
    pub async fn get_alarm_webhook(&self, id: i64) -> Result<Option<AlarmWebhook>> {
        let row = query(&format!("select {WEBHOOK_COLUMNS} from alarm_webhooks where id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(webhook_from_row).transpose()
    }

    /// Replaces webhook `id`'s settings (its secret only when one is given).
    pub async fn update_alarm_webhook(
        &self,
        id: i64,
        webhook: &NewAlarmWebhook,
        now_ms: i64,
    ) -> Result<Option<AlarmWebhook>> {
        let row = query(&format!(
            "update alarm_webhooks set name = $1, url = $2, secret = coalesce($3, secret),
                group_id = $4, updated_at = $5
             where id = $6 returning {WEBHOOK_COLUMNS}"
        ))
        .bind(&webhook.name)
        .bind(&webhook.url)
        .bind(webhook.secret.as_deref())
        .bind(webhook.group_id)
        .bind(now_ms)
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(webhook_from_row).transpose()
    }

    /// Deletes webhook `id`; whether it existed. Its pending deliveries fail when attempted.
    pub async fn delete_alarm_webhook(&self, id: i64) -> Result<bool> {
        let done = query("delete from alarm_webhooks where id = $1")
            .bind(id)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks the executors of `registry_group` that have not beaten since before
    /// `offline_before_ms`, and were not alarmed since their last beat, as alarmed, and inserts
    /// an [`EXECUTOR_LOST`] event for each, in one transaction. Returns their
    /// `(app name, address)`.
    pub async fn mark_lost_executors(
        &self,
        registry_group: &str,
        offline_before_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>> {
        let mut tx = self.writer().begin().await?;
        let rows = query(
            "update registry set lost_alarmed_at = $1
             where registry_group = $2 and updated_at < $3 and lost_alarmed_at < updated_at
             returning registry_key, registry_value",
        )
        .bind(now_ms)
        .bind(registry_group)
        .bind(offline_before_ms)
        .fetch_all(&mut *tx)
        .await?;
        let mut lost = Vec::with_capacity(rows.len());
        for row in rows {
            let app_name: String = row.try_get("registry_key")?;
            let address: String = row.try_get("registry_value")?;
            query(
                "insert into alarm_events (kind, app_name, executor_address, message, created_at)
                 values ($1, $2, $3, $4, $5)",
            )
            .bind(EXECUTOR_LOST)
            .bind(&app_name)
            .bind(&address)
            .bind(format!("executor {address} of {app_name} stopped sending heartbeats"))
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            lost.push((app_name, address));
        }
        tx.commit().await?;
        Ok(lost)
    }

    /// Events not settled yet, oldest first, at most `limit`.
    pub async fn new_alarm_events(&self, limit: i64) -> Result<Vec<AlarmEvent>> {
        let rows = query(&format!(
            "select {EVENT_COLUMNS} from alarm_events e where e.status = 'new' order by e.id limit $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Events newest first, optionally of one job, at most `limit`.
    pub async fn list_alarm_events(
        &self,
        job_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AlarmEvent>> {
        let rows = query(&format!(
            "select {EVENT_COLUMNS} from alarm_events e
             where ($1 = 0 or e.job_id = $1) order by e.id desc limit $2"
        ))
        .bind(job_id.unwrap_or(0))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Job `job_id`'s silence row: when its last alarm was sent, and that alarm's event id.
    pub async fn alarm_silence(&self, job_id: i64) -> Result<Option<(i64, i64)>> {
        let row = query("select last_alarm_at, last_event_id from alarm_silence where job_id = $1")
            .bind(job_id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some((row.try_get("last_alarm_at")?, row.try_get("last_event_id")?)))
    }

    /// Settles `event` as `settle` says, in one transaction: a compare-and-set on the event
    /// being new and on its job's silence row being as read. False (and nothing changed) when
    /// either moved meanwhile: the event is looked at again.
    pub async fn settle_alarm_event(
        &self,
        event: &AlarmEvent,
        settle: &Settle,
        now_ms: i64,
    ) -> Result<bool> {
        let mut tx = self.writer().begin().await?;
        let (status, silenced_before) =
            match settle {
                Settle::Silenced { job_id, last } => {
                    // A no-op update: it checks the row and holds it until the commit.
                    let done = query(
                        "update alarm_silence set last_alarm_at = last_alarm_at
                     where job_id = $1 and last_alarm_at = $2 and last_event_id = $3",
                    )
                    .bind(*job_id)
                    .bind(last.0)
                    .bind(last.1)
                    .execute(&mut *tx)
                    .await?;
                    if done.rows_affected() != 1 {
                        return Ok(false);
                    }
                    ("silenced", 0)
                }
                Settle::Send { job_id: None, .. } => ("sent", 0),
                Settle::Send { job_id: Some(job_id), last, .. } => {
                    let done =
                        match last {
                            None => query(
                                "insert into alarm_silence (job_id, last_alarm_at, last_event_id)
                         values ($1, $2, $3) on conflict (job_id) do nothing",
                            )
                            .bind(*job_id)
                            .bind(event.created_at_ms)
                            .bind(event.id)
                            .execute(&mut *tx)
                            .await?,
                            Some((at_ms, event_id)) => query(
                                "update alarm_silence set last_alarm_at = $1, last_event_id = $2
                         where job_id = $3 and last_alarm_at = $4 and last_event_id = $5",
                            )
                            .bind(event.created_at_ms.max(*at_ms))
                            .bind(event.id.max(*event_id))
                            .bind(*job_id)
                            .bind(*at_ms)
                            .bind(*event_id)
                            .execute(&mut *tx)
                            .await?,
                        };
                    if done.rows_affected() != 1 {
                        return Ok(false);
                    }
                    let previous = last.map_or(0, |(_, event_id)| event_id);
                    let silenced: i64 = query(
                        "select count(*) as n from alarm_events
                     where job_id = $1 and status = 'silenced' and id > $2 and id < $3",
                    )
                    .bind(*job_id)
                    .bind(previous)
                    .bind(event.id)
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get("n")?;
                    ("sent", silenced)
                }
            };
        let done = query(
            "update alarm_events set status = $1, silenced_before = $2
             where id = $3 and status = 'new'",
        )
        .bind(status)
        .bind(silenced_before)
        .bind(event.id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        if let Settle::Send { deliveries, .. } = settle {
            for (channel, target) in deliveries {
                query(
                    "insert into alarm_deliveries
                        (event_id, channel, target, next_attempt_at, created_at)
                     values ($1, $2, $3, $4, $4)",
                )
                .bind(event.id)
                .bind(channel)
                .bind(target)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Ids of deliveries due at `now_ms` and not held by anyone, oldest first, at most `limit`.
    pub async fn due_alarm_deliveries(&self, now_ms: i64, limit: i64) -> Result<Vec<i64>> {
        let rows = query(
            "select id from alarm_deliveries
             where state = 'pending' and next_attempt_at <= $1 and lease_until < $1
             order by next_attempt_at, id limit $2",
        )
        .bind(now_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Takes the lease on delivery `id` for `owner` until `lease_until_ms`, if it is still due
    /// and nobody holds it; the delivery with its event.
    pub async fn claim_alarm_delivery(
        &self,
        id: i64,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<Option<AlarmDelivery>> {
        let done = query(
            "update alarm_deliveries set lease_owner = $1, lease_until = $2
             where id = $3 and state = 'pending' and next_attempt_at <= $4 and lease_until < $4",
        )
        .bind(owner)
        .bind(lease_until_ms)
        .bind(id)
        .bind(now_ms)
        .execute(self.writer())
        .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let row = query(&format!(
            "select {DELIVERY_COLUMNS}, {EVENT_COLUMNS}
             from alarm_deliveries d join alarm_events e on e.id = d.event_id where d.id = $1"
        ))
        .bind(id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(delivery_from_row).transpose()
    }

    /// Records how `owner`'s attempt at delivery `id` ended; false when its lease moved on.
    pub async fn finish_alarm_delivery(
        &self,
        id: i64,
        owner: &str,
        outcome: &DeliveryOutcome,
    ) -> Result<bool> {
        let (state, next_attempt_at, error, delivered_at) = match outcome {
            DeliveryOutcome::Delivered(at_ms) => ("delivered", 0, "", *at_ms),
            DeliveryOutcome::Retry { at_ms, error } => ("pending", *at_ms, error.as_str(), 0),
            DeliveryOutcome::Failed { error } => ("failed", 0, error.as_str(), 0),
        };
        let done = query(
            "update alarm_deliveries set state = $1, attempts = attempts + 1,
                next_attempt_at = case when $2 = 0 then next_attempt_at else $2 end,
                last_error = $3, delivered_at = $4, lease_owner = '', lease_until = 0
             where id = $5 and lease_owner = $6 and state = 'pending'",
        )
        .bind(state)
        .bind(next_attempt_at)
        .bind(error)
        .bind(delivered_at)
        .bind(id)
        .bind(owner)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes alarm history from before `before_ms` (the run retention): deliveries no longer
    /// pending, and settled events with no delivery left. Returns how many rows went.
    pub async fn delete_old_alarms(&self, before_ms: i64) -> Result<u64> {
        let mut tx = self.writer().begin().await?;
        let deliveries =
            query("delete from alarm_deliveries where created_at < $1 and state <> 'pending'")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?;
        let events = query(
            "delete from alarm_events where created_at < $1 and status <> 'new'
                and not exists (select 1 from alarm_deliveries d where d.event_id = alarm_events.id)",
        )
        .bind(before_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(deliveries.rows_affected() + events.rows_affected())
    }

    /// Deliveries newest first, at most `limit`, with their events.
    pub async fn list_alarm_deliveries(&self, limit: i64) -> Result<Vec<AlarmDelivery>> {
        let rows = query(&format!(
            "select {DELIVERY_COLUMNS}, {EVENT_COLUMNS}
             from alarm_deliveries d join alarm_events e on e.id = d.event_id
             order by d.id desc limit $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }
}

/// Inserts the [`RUN_FAILED`] event of `run`, which just ended for good, on `conn` (the
/// transaction of its transition).
pub(super) async fn insert_run_failed(
    conn: &mut AnyConnection,
    run: &RunRecord,
    now_ms: i64,
) -> Result<()> {
    query(
        "insert into alarm_events
            (kind, job_id, run_id, attempt, state, message, executor_address, created_at)
         values ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(RUN_FAILED)
    .bind(run.job_id)
    .bind(run.id)
    .bind(run.attempt)
    .bind(run.state.as_str())
    .bind(&run.handle_msg)
    .bind(run.executor_address.as_deref().unwrap_or(""))
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn webhook_from_row(row: &AnyRow) -> Result<AlarmWebhook> {
    Ok(AlarmWebhook {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        url: row.try_get("url")?,
        secret: row.try_get("secret")?,
        group_id: row.try_get("group_id")?,
        created_at_ms: row.try_get("created_at")?,
        updated_at_ms: row.try_get("updated_at")?,
    })
}

fn event_from_row(row: &AnyRow) -> Result<AlarmEvent> {
    Ok(AlarmEvent {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        job_id: row.try_get("job_id")?,
        run_id: row.try_get("run_id")?,
        attempt: row.try_get("attempt")?,
        state: row.try_get("state")?,
        message: row.try_get("message")?,
        app_name: row.try_get("app_name")?,
        executor_address: row.try_get("executor_address")?,
        created_at_ms: row.try_get("created_at")?,
        status: row.try_get("status")?,
        silenced_before: row.try_get("silenced_before")?,
    })
}

fn delivery_from_row(row: &AnyRow) -> Result<AlarmDelivery> {
    Ok(AlarmDelivery {
        id: row.try_get("delivery_id")?,
        channel: row.try_get("channel")?,
        target: row.try_get("target")?,
        state: row.try_get("delivery_state")?,
        attempts: row.try_get("attempts")?,
        next_attempt_at_ms: row.try_get("next_attempt_at")?,
        last_error: row.try_get("last_error")?,
        delivered_at_ms: row.try_get("delivered_at")?,
        event: event_from_row(row)?,
    })
}
