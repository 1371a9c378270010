//! Alarms: the admin's task that turns alarm events into webhook posts and e-mails.
//!
//! Events are stored by the changes that cause them (a run's final failure with its transition,
//! a lost executor by the sweep), so an alarm exists exactly when its cause committed. Every
//! second this task first settles the new events, oldest first: a run's failure within its
//! job's silence window after the job's last alarm is silenced (and counted into the next
//! alarm), any other event is sent, one delivery per matching webhook and one e-mail to the
//! job's `alarm_email` when SMTP is configured. Then it delivers the deliveries that are due,
//! each claimed under a lease, concurrently; a failed attempt is tried again with exponential
//! backoff ([`retry_delay_ms`]) until [`MAX_ATTEMPTS`], so a webhook that is down for a while
//! gets every alarm once it is back. Both steps are compare-and-sets in the database, so two
//! admins on one database settle and deliver each alarm once.
//!
//! Killed and skipped runs raise no alarm (the lifecycle decides: `Transition::alarm`).
//! This module does not decide what a failure is, and it does not read executors' logs.

mod email;
mod webhook;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{AppState, now_ms};
use crate::storage::{AlarmDelivery, AlarmEvent, DeliveryOutcome, EXECUTOR_LOST, Settle};

/// How often new events and due deliveries are looked for.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a claimed delivery is held: longer than any attempt (webhooks and SMTP time out
/// after 10 s), so a lease runs out only when its admin died.
const LEASE_MS: i64 = 60_000;
/// The most events settled, and deliveries attempted, per pass.
const BATCH: i64 = 100;
/// Attempts before a delivery is given up as failed: with [`retry_delay_ms`], about three and a
/// half hours of retrying.
const MAX_ATTEMPTS: i64 = 30;
/// The longest wait between two attempts.
const MAX_RETRY_DELAY_MS: i64 = 600_000;

/// Whether a failure at `at_ms` of a job whose last alarm went out at `last_alarm_ms` is
/// silenced by its window of `window_secs` (0: never).
fn silenced(last_alarm_ms: Option<i64>, at_ms: i64, window_secs: i64) -> bool {
    match last_alarm_ms {
        Some(last) if window_secs > 0 => at_ms.abs_diff(last) < window_secs as u64 * 1000,
        _ => false,
    }
}

/// How long to wait before the next attempt once `attempts` attempts failed: 1 s, doubling,
/// at most 10 min; `None` once [`MAX_ATTEMPTS`] were made.
fn retry_delay_ms(attempts: i64) -> Option<i64> {
    if attempts >= MAX_ATTEMPTS {
        return None;
    }
    let doublings = u32::try_from(attempts.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
    Some((1_000i64 << doublings).min(MAX_RETRY_DELAY_MS))
}

/// Why a delivery attempt failed.
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    /// Worth trying again (the receiver is down, refused, or timed out).
    #[error("{0}")]
    Transient(String),
    /// Trying again cannot help (the webhook was deleted, an address is malformed).
    #[error("{0}")]
    Permanent(String),
}

/// Settles and delivers alarms until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let alarms = match Alarms::new(&state) {
        Ok(alarms) => alarms,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "alarms are off: {error}");
            return;
        }
    };
    loop {
        alarms.pass().await;
        tokio::select! {
            () = tokio::time::sleep(POLL_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

struct Alarms {
    state: AppState,
    owner: String,
    webhooks: webhook::Poster,
    mailer: Option<email::Mailer>,
}

impl Alarms {
    fn new(state: &AppState) -> anyhow::Result<Alarms> {
        let mailer = match &state.config.alarms.smtp {
            Some(smtp) => Some(email::Mailer::new(smtp)?),
            None => None,
        };
        Ok(Alarms {
            state: state.clone(),
            owner: state.dispatcher.owner().to_owned(),
            webhooks: webhook::Poster::new(state.config.network.ca_file.as_deref())?,
            mailer,
        })
    }

    async fn pass(&self) {
        if let Err(error) = self.settle_new().await {
            tracing::error!(error = format!("{error:#}"), "settling alarm events failed");
        }
        if let Err(error) = self.deliver_due().await {
            tracing::error!(error = format!("{error:#}"), "delivering alarms failed");
        }
    }

    async fn settle_new(&self) -> anyhow::Result<()> {
        let db = &self.state.db;
        for event in db.new_alarm_events(BATCH).await? {
            let settle = self.plan(&event).await?;
            if matches!(settle, Settle::Silenced { .. }) {
                crate::metrics::admin().alarms_silenced.inc();
            }
            // A false answer means another admin settled it, or an alarm of the same job
            // went out meanwhile: the event is looked at again in the next pass.
            if !db.settle_alarm_event(&event, &settle, now_ms()).await? {
                tracing::debug!("alarm event {} moved meanwhile", event.id);
            }
        }
        Ok(())
    }

    /// How `event` is settled: silenced, or sent to which channels.
    async fn plan(&self, event: &AlarmEvent) -> anyhow::Result<Settle> {
        let db = &self.state.db;
        let (job, group_id) = if event.kind == EXECUTOR_LOST {
            let groups = db.list_groups().await?;
            (None, groups.iter().find(|group| group.app_name == event.app_name).map(|g| g.id))
        } else {
            let job = match event.job_id {
                Some(id) => db.get_job(id).await?,
                None => None,
            };
            let group_id = job.as_ref().map(|job| job.spec.group_id);
            (job, group_id)
        };
        let last = match &job {
            Some(job) => db.alarm_silence(job.id).await?,
            None => None,
        };
        if let (Some(job), Some(last)) = (&job, last)
            && silenced(Some(last.0), event.created_at_ms, job.spec.alarm_silence_secs)
        {
            return Ok(Settle::Silenced { job_id: job.id, last });
        }
        let mut deliveries: Vec<(String, String)> = db
            .list_alarm_webhooks()
            .await?
            .into_iter()
            .filter(|webhook| webhook.group_id.is_none() || webhook.group_id == group_id)
            .map(|webhook| ("webhook".to_owned(), webhook.id.to_string()))
            .collect();
        let email = job.as_ref().and_then(|job| job.spec.alarm_email.as_deref());
        if let (Some(_), Some(addresses)) = (&self.mailer, email)
            && !addresses.trim().is_empty()
        {
            deliveries.push(("email".to_owned(), addresses.trim().to_owned()));
        }
        Ok(Settle::Send { job_id: job.map(|job| job.id), last, deliveries })
    }

    async fn deliver_due(&self) -> anyhow::Result<()> {
        let ids = self.state.db.due_alarm_deliveries(now_ms(), BATCH).await?;
        let attempts = ids.into_iter().map(|id| async move {
            if let Err(error) = self.deliver(id).await {
                tracing::error!(error = format!("{error:#}"), "alarm delivery {id} failed");
            }
        });
        futures_util::future::join_all(attempts).await;
        Ok(())
    }

    /// Claims delivery `id` and makes one attempt at it.
    async fn deliver(&self, id: i64) -> anyhow::Result<()> {
        let db = &self.state.db;
        let now = now_ms();
        let Some(delivery) = db.claim_alarm_delivery(id, &self.owner, now, now + LEASE_MS).await?
        else {
            return Ok(());
        };
        let attempt = match delivery.channel.as_str() {
            "webhook" => self.post_webhook(&delivery).await,
            "email" => self.send_email(&delivery).await,
            other => Err(DeliveryError::Permanent(format!("unknown channel `{other}`"))),
        };
        let attempts = delivery.attempts + 1;
        let outcome = match attempt {
            Ok(()) => DeliveryOutcome::Delivered(now_ms()),
            Err(DeliveryError::Transient(error)) => match retry_delay_ms(attempts) {
                Some(delay_ms) => DeliveryOutcome::Retry { at_ms: now_ms() + delay_ms, error },
                None => DeliveryOutcome::Failed { error },
            },
            Err(DeliveryError::Permanent(error)) => DeliveryOutcome::Failed { error },
        };
        let (label, level_error) = match &outcome {
            DeliveryOutcome::Delivered(_) => ("delivered", None),
            DeliveryOutcome::Retry { error, .. } => ("retried", Some(error)),
            DeliveryOutcome::Failed { error } => ("failed", Some(error)),
        };
        crate::metrics::admin().alarm_delivery(&delivery.channel, label);
        match (label, level_error) {
            ("failed", Some(error)) => tracing::error!(
                alarm.delivery = id,
                error = %error,
                "alarm delivery {id} ({} {}) failed for good after {attempts} attempts: {error}",
                delivery.channel,
                delivery.target,
            ),
            (_, Some(error)) => tracing::warn!(
                alarm.delivery = id,
                error = %error,
                "alarm delivery {id} ({}) failed, will retry: {error}",
                delivery.channel,
            ),
            _ => tracing::info!(alarm.delivery = id, "alarm delivery {id} delivered"),
        }
        db.finish_alarm_delivery(id, &self.owner, &outcome).await?;
        Ok(())
    }

    async fn post_webhook(&self, delivery: &AlarmDelivery) -> Result<(), DeliveryError> {
        let db = &self.state.db;
        let internal = |error: crate::storage::StorageError| {
            DeliveryError::Transient(format!("reading the alarm: {error}"))
        };
        let webhook_id: i64 = delivery
            .target
            .parse()
            .map_err(|_| DeliveryError::Permanent(format!("bad webhook `{}`", delivery.target)))?;
        let Some(webhook) = db.get_alarm_webhook(webhook_id).await.map_err(internal)? else {
            return Err(DeliveryError::Permanent(format!("webhook {webhook_id} was deleted")));
        };
        let job = match delivery.event.job_id {
            Some(id) => db.get_job(id).await.map_err(internal)?,
            None => None,
        };
        let body = webhook::body(&delivery.event, job.as_ref());
        self.webhooks.post(&webhook, delivery.id, &delivery.event.kind, &body).await
    }

    async fn send_email(&self, delivery: &AlarmDelivery) -> Result<(), DeliveryError> {
        let Some(mailer) = &self.mailer else {
            return Err(DeliveryError::Transient("no SMTP server is configured".to_owned()));
        };
        let job =
            match delivery.event.job_id {
                Some(id) => self.state.db.get_job(id).await.map_err(|error| {
                    DeliveryError::Transient(format!("reading the job: {error}"))
                })?,
                None => None,
            };
        mailer.send(&delivery.target, &delivery.event, job.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn failures_within_the_window_are_silenced() {
        let cases = [
            (None, 1_000, 300),
            (Some(0), 299_999, 300),
            (Some(0), 300_000, 300),
            (Some(10_000), 5_000, 300),
            (Some(0), 1, 0),
            (Some(0), 86_400_000, 86_400),
        ];
        let out: String = cases
            .iter()
            .map(|&(last, at, window)| {
                format!("last {last:?} at {at} window {window}s: {}\n", silenced(last, at, window))
            })
            .collect();
        expect![[r#"
            last None at 1000 window 300s: false
            last Some(0) at 299999 window 300s: true
            last Some(0) at 300000 window 300s: false
            last Some(10000) at 5000 window 300s: true
            last Some(0) at 1 window 0s: false
            last Some(0) at 86400000 window 86400s: false
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn retries_back_off_then_give_up() {
        let out: String = [1, 2, 3, 5, 10, 11, 29, 30, 31]
            .iter()
            .map(|&attempts| format!("after {attempts}: {:?}\n", retry_delay_ms(attempts)))
            .collect();
        expect![[r#"
            after 1: Some(1000)
            after 2: Some(2000)
            after 3: Some(4000)
            after 5: Some(16000)
            after 10: Some(512000)
            after 11: Some(600000)
            after 29: Some(600000)
            after 30: None
            after 31: None
        "#]]
        .assert_eq(&out);
    }
}
