//! Delivering the outbox to the admins: due results in batches, each result first to the admin
//! that sent its run when the executor was given its URL (`replyTo`: that admin records the
//! send and the result in one write), each entry of a refused batch
//! alone behind its own backoff, a batch the admin answered busy (`callback busy:`, it recorded
//! only part in its time) sent again whole after a backoff, the whole outbox backed off while no
//! admin answers, and a stopping executor's drain until nothing is left or its deadline passed.

use super::*;

impl Outbox {
    /// Delivers results until `shutdown`, then until none is left or `drain_for` has passed
    /// ([`Outbox::drain`]).
    pub async fn deliver(
        self,
        client: protocol::Client,
        admin: AdminLink,
        shutdown: CancellationToken,
        drain_for: Duration,
    ) {
        self.deliver_until(&client, &admin, &shutdown).await;
        self.drain(&client, &admin, drain_for).await;
    }

    /// Delivers results, backing off while no admin answers, until `shutdown`.
    async fn deliver_until(
        &self,
        client: &protocol::Client,
        admin: &AdminLink,
        shutdown: &CancellationToken,
    ) {
        let mut backoff = Duration::from_millis(500);
        loop {
            let round = self.deliver_once(client, admin).await;
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match round {
                Ok(Round::More) => continue,
                Ok(Round::Idle(next_due)) => {
                    backoff = Duration::from_millis(500);
                    let until_due =
                        next_due.map(|due| due.saturating_duration_since(Instant::now()));
                    until_due.unwrap_or(Duration::from_secs(5)).min(Duration::from_secs(5))
                }
                Err(error) => {
                    tracing::warn!(%error, "could not deliver results, retrying in {} ms", backoff.as_millis());
                    let wait = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    wait
                }
            };
            tokio::select! {
                () = self.inner.notify.notified() => {}
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// A stopping executor's last deliveries: rounds until no result is left, or `limit` has
    /// passed (at least one round is made), backing off between rounds no admin answered, and
    /// waiting for the results an admin refused alone as their own backoff says. What is left
    /// at the deadline stays on disk for the next start.
    async fn drain(&self, client: &protocol::Client, admin: &AdminLink, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut backoff = DRAIN_BACKOFF;
        loop {
            let round = tokio::time::timeout_at(deadline, self.deliver_once(client, admin)).await;
            let (left, _) = self.backlog();
            if left == 0 {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    "stopping with {left} results not delivered within {} ms: they wait in the \
                     outbox for the next start",
                    limit.as_millis()
                );
                return;
            }
            let wait = match round {
                Ok(Ok(Round::More)) | Err(_) => Duration::ZERO,
                Ok(Ok(Round::Idle(next_due))) => {
                    next_due.map_or(backoff, |due| due.saturating_duration_since(Instant::now()))
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "stopping: could not deliver {left} results, retrying in {} ms", backoff.as_millis());
                    let wait = backoff;
                    backoff = (backoff * 2).min(MAX_DRAIN_BACKOFF);
                    wait
                }
            };
            tokio::time::sleep_until((Instant::now() + wait).min(deadline)).await;
        }
    }

    /// Sends one batch of the entries due now, each result first to the admin that sent its
    /// run when this executor was given that admin's URL (a part for each admin, at once); an
    /// admin's refusal sends its part one by one. `Err` when no admin could be reached.
    pub(super) async fn deliver_once(
        &self,
        client: &protocol::Client,
        admin: &AdminLink,
    ) -> anyhow::Result<Round> {
        let batch = self.due(BATCH);
        if batch.is_empty() {
            return Ok(Round::Idle(self.next_due()));
        }
        let full = batch.len() == BATCH;
        let mut parts: BTreeMap<usize, Vec<HandleCallbackParam>> = BTreeMap::new();
        for result in batch {
            parts.entry(self.first_admin(admin, &result)).or_default().push(result);
        }
        let rounds = futures_util::future::join_all(
            parts.into_iter().map(|(first, part)| self.deliver_part(client, admin, first, part)),
        )
        .await;
        let mut more = full;
        for round in rounds {
            more |= round?;
        }
        Ok(if more { Round::More } else { Round::Idle(self.next_due()) })
    }

    /// Sends `batch` to the admins, `first` first; an admin's refusal sends it one by one.
    /// Whether to go on at once (something was refused); `Err` when no admin could be reached.
    async fn deliver_part(
        &self,
        client: &protocol::Client,
        admin: &AdminLink,
        first: usize,
        batch: Vec<HandleCallbackParam>,
    ) -> anyhow::Result<bool> {
        let results: Vec<&HandleCallbackParam> = batch.iter().collect();
        match self.send(client, admin, first, &results).await {
            Sent::Acknowledged => {
                self.acknowledged(&batch).await;
                tracing::debug!(count = batch.len(), "delivered {} results", batch.len());
                return Ok(false);
            }
            Sent::Unreachable(error) => return Err(error),
            Sent::Refused(error) if batch.len() == 1 => self.refused_alone(&batch[0], &error),
            Sent::Refused(error) => {
                tracing::warn!(
                    %error,
                    "an admin refused a batch of {} results: sending them one by one",
                    batch.len()
                );
                for result in &batch {
                    match self.send(client, admin, first, &[result]).await {
                        Sent::Acknowledged => {
                            self.acknowledged(std::slice::from_ref(result)).await;
                        }
                        Sent::Refused(error) => self.refused_alone(result, &error),
                        Sent::Unreachable(error) => return Err(error),
                    }
                }
            }
        }
        Ok(true)
    }

    /// Up to `limit` pending results not waiting for their own backoff, oldest first.
    fn due(&self, limit: usize) -> Vec<HandleCallbackParam> {
        let now = Instant::now();
        let Ok(mut state) = self.inner.state.lock() else { return Vec::new() };
        state.drop_stale_front();
        let State { entries, order, .. } = &*state;
        order
            .iter()
            .filter_map(|(log_id, stamp)| entries.get(log_id).filter(|entry| entry.stamp == *stamp))
            .filter(|entry| entry.retry_at.is_none_or(|at| at <= now))
            .take(limit)
            .map(|entry| entry.result.clone())
            .collect()
    }

    fn next_due(&self) -> Option<Instant> {
        let state = self.inner.state.lock().ok()?;
        state.entries.values().filter_map(|entry| entry.retry_at).min()
    }

    /// Forgets acknowledged results: an `ack` line each, and their segments or files deleted
    /// once nothing in them is pending.
    async fn acknowledged(&self, results: &[HandleCallbackParam]) {
        let log_ids: Vec<i64> = results.iter().map(|result| result.log_id).collect();
        let outbox = self.clone();
        let done = tokio::task::spawn_blocking(move || outbox.forget(&log_ids)).await;
        if let Err(error) = done {
            tracing::error!(%error, "outbox: forgetting acknowledged results failed");
        }
    }

    /// Puts an entry an admin refused alone behind the others, with its own backoff.
    fn refused_alone(&self, result: &HandleCallbackParam, error: &ProtocolError) {
        let Ok(mut state) = self.inner.state.lock() else { return };
        state.stamps += 1;
        let stamp = state.stamps;
        let Some(entry) = state.entries.get_mut(&result.log_id) else { return };
        entry.refusals += 1;
        entry.stamp = stamp;
        let wait = ENTRY_BACKOFF
            .saturating_mul(1 << entry.refusals.min(16).saturating_sub(1))
            .min(MAX_ENTRY_BACKOFF);
        entry.retry_at = Some(Instant::now() + wait);
        let refusals = entry.refusals;
        state.order.push_back((result.log_id, stamp));
        if refusals == 1 {
            tracing::error!(
                run.id = result.log_id,
                %error,
                "the admin refused the result of run {}; retrying it alone in {} ms",
                result.log_id,
                wait.as_millis()
            );
        } else {
            tracing::warn!(
                run.id = result.log_id,
                %error,
                "the admin refused the result of run {} again ({refusals} times)",
                result.log_id,
            );
        }
    }

    /// The index in `admin.urls` of the admin `result` goes to first: the one that sent its
    /// run (`replyTo`) if this executor was given its URL and reached it lately, else the first.
    pub(super) fn first_admin(&self, admin: &AdminLink, result: &HandleCallbackParam) -> usize {
        let Some(reply_to) = result.reply_to.as_deref().map(|url| url.trim_end_matches('/')) else {
            return 0;
        };
        let Some(index) = admin.urls.iter().position(|url| url.trim_end_matches('/') == reply_to)
        else {
            return 0;
        };
        let passed_over = self.inner.passed_over.lock().is_ok_and(|passed_over| {
            passed_over.get(&index).is_some_and(|until| *until > Instant::now())
        });
        if passed_over { 0 } else { index }
    }

    /// Sends `results` to the first admin that acknowledges them, trying `admin.urls[first]`
    /// and then the others in order, in the form its generation reads: a bare array, or for
    /// XXL-JOB 3.5 `{"callbackList": [...]}`. An admin tried first and not reached is passed
    /// over as a first choice for [`PASS_OVER`].
    async fn send(
        &self,
        client: &protocol::Client,
        admin: &AdminLink,
        first: usize,
        results: &[&HandleCallbackParam],
    ) -> Sent {
        let mut refused = None;
        let mut unreachable = None;
        let app_name = Some(admin.app_name.as_str());
        let others = (0..admin.urls.len()).filter(|index| *index != first);
        for index in std::iter::once(first).chain(others) {
            let Some(url) = admin.urls.get(index) else { continue };
            let sent = match admin.generation {
                Generation::Classic => {
                    client.call_as::<_, String>(url, "api/callback", results, app_name).await
                }
                Generation::V3_5 => {
                    let body = CallbackList { callback_list: results };
                    client.call_as::<_, String>(url, "api/callback", &body, app_name).await
                }
            };
            match sent {
                Ok(_) => return Sent::Acknowledged,
                Err(
                    error @ (ProtocolError::Transport { .. } | ProtocolError::Connection { .. }),
                ) => {
                    if index == first && first != 0 {
                        self.pass_over(index);
                    }
                    unreachable = Some(error);
                }
                // The admin recorded part of the batch in its time: the whole batch goes again
                // after a backoff, not each result alone (which would cost it more).
                Err(error @ ProtocolError::Refused { .. }) if is_busy(&error) => {
                    unreachable = Some(error)
                }
                Err(error) => refused = Some(error),
            }
        }
        match (refused, unreachable) {
            (Some(error), _) => Sent::Refused(error),
            (None, Some(error)) => Sent::Unreachable(error.into()),
            (None, None) => Sent::Unreachable(anyhow::anyhow!("no admin URL configured")),
        }
    }

    fn pass_over(&self, index: usize) {
        if let Ok(mut passed_over) = self.inner.passed_over.lock() {
            passed_over.insert(index, Instant::now() + PASS_OVER);
        }
    }
}

/// Whether `error` is an admin's answer that it recorded only part of a callback in its time.
fn is_busy(error: &ProtocolError) -> bool {
    matches!(error, ProtocolError::Refused { msg, .. } if msg.starts_with(protocol::CALLBACK_BUSY))
}
