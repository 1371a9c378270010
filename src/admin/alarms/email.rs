//! The e-mail channel: a plain-text alarm to a job's `alarm_email` through the SMTP server of
//! `--smtp-url` (lettre, on tokio, TLS by rustls).
//!
//! `alarm_email` is XXL-JOB's field: one address or several, comma-separated. An address that
//! does not parse fails the delivery for good; a server that does not answer or refuses is
//! tried again like a webhook.

use std::time::Duration;

use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::DeliveryError;
use crate::admin::http::rfc3339;
use crate::config::SmtpConfig;
use crate::model::Job;
use crate::storage::{AlarmEvent, EXECUTOR_LOST};

/// Sends alarm e-mails.
pub(super) struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl Mailer {
    /// A mailer for the server and sender of `smtp`.
    pub(super) fn new(smtp: &SmtpConfig) -> anyhow::Result<Mailer> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&smtp.url)
            .map_err(|error| anyhow::anyhow!("--smtp-url: {error}"))?
            .timeout(Some(Duration::from_secs(10)))
            .build();
        let from = smtp.from.parse().map_err(|error| anyhow::anyhow!("--smtp-from: {error}"))?;
        Ok(Mailer { transport, from })
    }

    /// Sends `event`'s alarm to `addresses` (comma-separated).
    pub(super) async fn send(
        &self,
        addresses: &str,
        event: &AlarmEvent,
        job: Option<&Job>,
    ) -> Result<(), DeliveryError> {
        let mut message = Message::builder().from(self.from.clone());
        for address in addresses.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let mailbox: Mailbox = address.parse().map_err(|error| {
                DeliveryError::Permanent(format!("alarm_email `{address}`: {error}"))
            })?;
            message = message.to(mailbox);
        }
        let (subject, text) = render(event, job);
        let message = message
            .subject(subject)
            .body(text)
            .map_err(|error| DeliveryError::Permanent(format!("building the e-mail: {error}")))?;
        self.transport
            .send(message)
            .await
            .map(drop)
            .map_err(|error| DeliveryError::Transient(format!("sending the e-mail: {error}")))
    }
}

/// The subject and text of `event`'s alarm.
fn render(event: &AlarmEvent, job: Option<&Job>) -> (String, String) {
    let time = rfc3339(event.created_at_ms).unwrap_or_default();
    if event.kind == EXECUTOR_LOST {
        let subject =
            format!("[wasmjob] executor {} of {} lost", event.executor_address, event.app_name);
        return (subject, format!("{time}\n{}\n", event.message));
    }
    let job_name = job.map_or("(deleted)", |job| job.spec.name.as_str());
    let job_id = event.job_id.unwrap_or_default();
    let run_id = event.run_id.unwrap_or_default();
    let subject = format!("[wasmjob] job {job_id} {job_name}: run {run_id} {}", event.state);
    let mut text = format!(
        "Job {job_id} ({job_name}), run {run_id}, attempt {}, ended {} at {time}.\n\
         Executor: {}\n\n{}\n",
        event.attempt, event.state, event.executor_address, event.message
    );
    if event.silenced_before > 0 {
        text.push_str(&format!(
            "\n{} earlier failures of this job were silenced since its previous alarm.\n",
            event.silenced_before
        ));
    }
    (subject, text)
}
