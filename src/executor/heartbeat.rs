//! The registry heartbeat: `/api/registry` at start and every interval to the first admin that
//! answers, and `/api/registryRemove` on shutdown.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::protocol::{self, REGISTRY_GROUP_EXECUTOR, RegistryParam};

/// Beats until `shutdown`, then says goodbye.
pub async fn run(
    client: protocol::Client,
    admin_urls: Vec<String>,
    param: RegistryParam,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut registered = false;
    loop {
        match send(&client, &admin_urls, "api/registry", &param).await {
            Ok(admin) if !registered => {
                tracing::info!(
                    "registered {} as `{}` with {admin}",
                    param.registry_value,
                    param.registry_key
                );
                registered = true;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "heartbeat failed");
                registered = false;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(if registered { interval } else { interval.min(Duration::from_secs(3)) }) => {}
            () = shutdown.cancelled() => break,
        }
    }
    if let Err(error) = send(&client, &admin_urls, "api/registryRemove", &param).await {
        tracing::warn!(%error, "could not deregister");
    }
}

/// The registry parameter of an executor.
pub fn param(app_name: &str, address: &str) -> RegistryParam {
    RegistryParam {
        registry_group: REGISTRY_GROUP_EXECUTOR.to_owned(),
        registry_key: app_name.to_owned(),
        registry_value: address.to_owned(),
        held_runs: None,
    }
}

/// Sends `param` to the first admin that accepts it; returns that admin.
async fn send<'a>(
    client: &protocol::Client,
    admin_urls: &'a [String],
    path: &str,
    param: &RegistryParam,
) -> anyhow::Result<&'a str> {
    let mut errors = Vec::new();
    for admin in admin_urls {
        match client.call::<_, String>(admin, path, param).await {
            Ok(_) => return Ok(admin),
            Err(error) => errors.push(error.to_string()),
        }
    }
    anyhow::bail!("no admin accepted {path}: {}", errors.join("; "))
}
