//! Finding the component a trigger names: a `GLUE_WASM` module by sha256, fetched from the admin
//! when this executor has not compiled it yet, or a `BEAN` component from the handlers dir.
//!
//! The runtime's cache verifies the digest of fetched bytes before compiling them and keeps the
//! compiled artifact on disk, so a module is fetched and compiled once per executor: the runs
//! that need a module this executor does not hold yet wait for one fetch of it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::protocol::{self, GLUE_WASM};
use crate::runtime::{CompiledJob, Runtime};

/// The largest module fetched from an admin.
const MAX_MODULE_BYTES: usize = 64 * 1024 * 1024;

/// Resolves triggers to compiled components.
#[derive(Clone)]
pub struct Modules {
    pub(super) runtime: Arc<Runtime>,
    pub(super) client: protocol::Client,
    pub(super) admin_urls: Vec<String>,
    pub(super) handlers_dir: Option<PathBuf>,
    /// One lock per digest being resolved: the runs that need it while it is fetched and
    /// compiled wait for that one resolution, then find it in memory. Without it, the first
    /// runs of many jobs sharing a new module each fetched it from the admin.
    pub(super) resolving: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Modules {
    /// Checks a trigger's glue type and source before it is queued.
    pub fn check(&self, glue_type: &str, glue_source: &str, handler: &str) -> Result<(), String> {
        match glue_type {
            GLUE_WASM if is_sha256(glue_source) => Ok(()),
            GLUE_WASM => Err(format!(
                "glueSource `{}` is not a sha256 digest",
                glue_source.chars().take(80).collect::<String>()
            )),
            "BEAN" if is_handler_name(handler) && self.handlers_dir.is_some() => Ok(()),
            "BEAN" if self.handlers_dir.is_none() => {
                Err("this executor has no --handlers-dir: BEAN jobs cannot run here".to_owned())
            }
            "BEAN" => Err(format!("executorHandler `{handler}` is not a valid handler name")),
            other => Err(format!(
                "glueType `{other}` is not supported: wasmjob executors run Wasm components only (GLUE_WASM or BEAN)"
            )),
        }
    }

    /// The compiled component for a checked trigger.
    pub async fn resolve(
        &self,
        glue_type: &str,
        glue_source: &str,
        handler: &str,
    ) -> anyhow::Result<CompiledJob> {
        if glue_type == GLUE_WASM {
            return self.by_digest(glue_source).await;
        }
        let dir = self.handlers_dir.clone().context("no handlers dir")?;
        let path = dir.join(format!("{handler}.wasm"));
        let bytes = tokio::fs::read(&path)
            .await
            .with_context(|| format!("BEAN handler `{handler}`: reading {}", path.display()))?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let runtime = self.runtime.clone();
        tokio::task::spawn_blocking(move || runtime.load(&sha256, move || Ok(bytes))).await?
    }

    async fn by_digest(&self, sha256: &str) -> anyhow::Result<CompiledJob> {
        if let Some(job) = self.runtime.in_memory(sha256) {
            crate::metrics::executor().module_lookup(true);
            return Ok(job);
        }
        let flight = match self.resolving.lock() {
            Ok(mut resolving) => resolving.entry(sha256.to_owned()).or_default().clone(),
            Err(_) => anyhow::bail!("the module resolution lock is poisoned"),
        };
        let resolved = {
            let _flight = flight.lock().await;
            self.resolve_digest(sha256).await
        };
        // A run arriving after this finds the module in memory, or resolves it anew on error.
        if let Ok(mut resolving) = self.resolving.lock()
            && resolving.get(sha256).is_some_and(|held| Arc::ptr_eq(held, &flight))
        {
            resolving.remove(sha256);
        }
        resolved
    }

    /// [`Modules::by_digest`] for the run that holds the digest's lock: from memory (a run
    /// that held it before resolved it), the disk cache, or the admin.
    async fn resolve_digest(&self, sha256: &str) -> anyhow::Result<CompiledJob> {
        // Compiled modules are nearly always in memory: a blocking thread only for the disk.
        let cached = match self.runtime.in_memory(sha256) {
            Some(job) => Some(job),
            None => {
                let (runtime, digest) = (self.runtime.clone(), sha256.to_owned());
                tokio::task::spawn_blocking(move || runtime.cached(&digest)).await?
            }
        };
        crate::metrics::executor().module_lookup(cached.is_some());
        if let Some(job) = cached {
            return Ok(job);
        }
        let started = std::time::Instant::now();
        let bytes = self.fetch(sha256).await?;
        let runtime = self.runtime.clone();
        let digest = sha256.to_owned();
        let job =
            tokio::task::spawn_blocking(move || runtime.load(&digest, move || Ok(bytes))).await?;
        crate::metrics::executor().module_compile.observe(started.elapsed().as_secs_f64());
        job
    }

    async fn fetch(&self, sha256: &str) -> anyhow::Result<Vec<u8>> {
        let mut errors = Vec::new();
        for admin in &self.admin_urls {
            match self
                .client
                .get_bytes(admin, &format!("api/modules/{sha256}"), MAX_MODULE_BYTES)
                .await
            {
                Ok(bytes) => return Ok(bytes),
                Err(error) => errors.push(format!("{error:#}")),
            }
        }
        anyhow::bail!("fetching module {sha256}: {}", errors.join("; "))
    }
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A handler name is a file stem in the handlers dir: no separators, no dots, nothing else.
fn is_handler_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::runtime::RuntimeConfig;

    /// The first runs of many jobs that share a module this executor does not hold yet: one
    /// fetches it from the admin (here a stand-in for the admin's module route, counting its
    /// requests), and the others wait and find it compiled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_that_need_a_new_module_together_fetch_it_once() {
        let wat = crate::runtime::tests::job_wat(1, "", "");
        let sha256 = hex::encode(Sha256::digest(wat.as_bytes()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let served = (fetches.clone(), wat);
        let route = axum::routing::get(move || {
            let (fetches, wat) = served.clone();
            async move {
                fetches.fetch_add(1, Ordering::Relaxed);
                // Slow enough that every run asks while the first fetch is under way.
                tokio::time::sleep(Duration::from_millis(50)).await;
                wat
            }
        });
        let admin = axum::Router::new().route("/api/modules/{sha256}", route);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, admin).await });
        let dir = tempfile::tempdir().unwrap();
        let config =
            RuntimeConfig { cache_dir: Some(dir.path().to_owned()), ..RuntimeConfig::default() };
        let modules = Modules {
            runtime: Arc::new(Runtime::new(config).unwrap()),
            client: protocol::Client::new(
                "a-test-access-token-0123456789",
                Duration::from_secs(10),
            )
            .unwrap(),
            admin_urls: vec![admin_url],
            handlers_dir: None,
            resolving: Default::default(),
        };
        let runs = (0..16).map(|_| {
            let (modules, sha256) = (modules.clone(), sha256.clone());
            tokio::spawn(async move {
                let job = modules.resolve(GLUE_WASM, &sha256, "").await.unwrap();
                job.sha256.to_string()
            })
        });
        for resolved in futures_util::future::join_all(runs).await {
            assert_eq!(resolved.unwrap(), sha256);
        }
        assert_eq!(fetches.load(Ordering::Relaxed), 1);
        assert_eq!(modules.runtime.cache_stats().compiled, 1);
        assert!(modules.resolving.lock().unwrap().is_empty(), "no lock is left behind");
    }
}
