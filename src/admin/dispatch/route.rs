//! Routing at send time: the executor a run goes to, picked among its group's online executors
//! by the job's strategy, probing candidates for `FAILOVER` and `BUSYOVER`.

use std::time::Duration;

use super::{Dispatcher, Peer, now_ms};
use crate::model::Job;
use crate::protocol::JobIdParam;
use crate::routing::{Probe, Route};

/// How long a `FAILOVER` or `BUSYOVER` probe of one executor may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl Dispatcher {
    /// Picks the executor of a run routed at send time.
    pub(super) async fn route_run(&self, job: &Job) -> Result<String, String> {
        let group =
            self.inner.cache.group(job.spec.group_id).await.map_err(|e| format!("{e:#}"))?;
        let group = group.ok_or_else(|| format!("group {} does not exist", job.spec.group_id))?;
        let online = self
            .inner
            .cache
            .online_addresses(&group, now_ms())
            .await
            .map_err(|e| format!("{e:#}"))?;
        if online.is_empty() {
            return Err(format!("no executor online in group `{}`", group.app_name));
        }
        self.route(job, &online, now_ms())
            .await
            .ok_or_else(|| "no executor passed the route's probe".to_owned())
    }

    /// Picks one executor among `addresses` with the job's strategy, probing if it asks for it.
    pub(super) async fn route(
        &self,
        job: &Job,
        addresses: &[String],
        now_ms: i64,
    ) -> Option<String> {
        let route = {
            let mut router = self.inner.router.lock().ok()?;
            router.route(job.spec.route_strategy, job.id, addresses, now_ms, &mut rand::rng())?
        };
        match route {
            Route::One(address) => Some(address),
            Route::Broadcast(targets) => targets.into_iter().next().map(|(address, _, _)| address),
            Route::FirstPassing { probe, candidates } => {
                for candidate in candidates {
                    // XXL-JOB 3.5 executors answer only calls that name their application.
                    let peer = self.peer(&candidate).await;
                    let app_name = peer.as_ref().and_then(Peer::app_name_header);
                    let client = &self.inner.client;
                    let probed = async {
                        match probe {
                            Probe::Beat => {
                                client.call_as::<_, String>(&candidate, "beat", &(), app_name).await
                            }
                            Probe::IdleBeat => {
                                let param = JobIdParam { job_id: job.id, log_id: None };
                                client
                                    .call_as::<_, String>(&candidate, "idleBeat", &param, app_name)
                                    .await
                            }
                        }
                    };
                    // A probe is a liveness question: an executor that does not answer within
                    // XXL-JOB's 3 s is passed over, as one that refuses would be.
                    let passed = tokio::time::timeout(PROBE_TIMEOUT, probed).await;
                    if matches!(passed, Ok(Ok(_))) {
                        return Some(candidate);
                    }
                }
                None
            }
        }
    }
}
