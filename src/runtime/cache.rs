//! Compiled components by sha256: in memory, and on disk as precompiled artifacts.
//!
//! An artifact is written only by this process, from bytes whose digest it checked, into a
//! directory named after the engine's compatibility fingerprint, and renamed into place when
//! complete; only such files are ever deserialized. Nothing here fetches modules: the caller
//! supplies the bytes when the cache misses.
//!
//! Loading is single-flight per digest: when many runs of a new module start at once, one
//! compiles it and the others wait for that result instead of compiling it again, and each
//! write goes through a temporary file of its own.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::bindings::JobPre;
use super::host::RunState;

/// A component compiled and linked, ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct CompiledJob {
    pub(super) pre: JobPre<RunState>,
    /// The module's sha256.
    pub sha256: Arc<str>,
}

/// Counters of how modules were obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Compiled from bytes.
    pub compiled: u64,
    /// Loaded from a precompiled artifact on disk.
    pub loaded_from_disk: u64,
    /// Found compiled in memory.
    pub memory_hits: u64,
}

pub(super) struct Cache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<String, CompiledJob>>,
    /// One lock per digest being loaded, so that it is compiled once.
    loading: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    compiled: AtomicU64,
    loaded_from_disk: AtomicU64,
    memory_hits: AtomicU64,
}

impl Cache {
    pub(super) fn new(engine: &Engine, root: Option<PathBuf>) -> anyhow::Result<Cache> {
        let dir = match root {
            Some(root) => {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                engine.precompile_compatibility_hash().hash(&mut hasher);
                let dir = root.join(format!("{:016x}", hasher.finish()));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating module cache {}", dir.display()))?;
                Some(dir)
            }
            None => None,
        };
        Ok(Cache {
            dir,
            memory: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashMap::new()),
            compiled: AtomicU64::new(0),
            loaded_from_disk: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
        })
    }

    pub(super) fn stats(&self) -> CacheStats {
        CacheStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            loaded_from_disk: self.loaded_from_disk.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
        }
    }

    /// The compiled job in memory, without touching the disk.
    pub(super) fn in_memory(&self, sha256: &str) -> Option<CompiledJob> {
        let job = self.memory.lock().ok()?.get(sha256).cloned()?;
        self.memory_hits.fetch_add(1, Ordering::Relaxed);
        Some(job)
    }

    pub(super) fn cached(
        &self,
        engine: &Engine,
        linker: &Linker<RunState>,
        sha256: &str,
    ) -> Option<CompiledJob> {
        if let Some(job) = self.in_memory(sha256) {
            return Some(job);
        }
        let path = self.artifact_path(sha256)?;
        if !path.exists() {
            return None;
        }
        match load_artifact(engine, &path) {
            Ok(component) => {
                let job = link(linker, &component, sha256).ok()?;
                self.loaded_from_disk.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    module.sha256 = sha256,
                    "loaded precompiled module {sha256} from cache"
                );
                self.remember(job.clone());
                Some(job)
            }
            Err(error) => {
                // A stale or damaged artifact is not fatal: it is compiled again and replaced.
                tracing::warn!(module.sha256 = sha256, %error, "ignoring cached artifact {}", path.display());
                None
            }
        }
    }

    pub(super) fn load(
        &self,
        engine: &Engine,
        linker: &Linker<RunState>,
        sha256: &str,
        bytes: impl FnOnce() -> anyhow::Result<Vec<u8>>,
    ) -> anyhow::Result<CompiledJob> {
        if let Some(job) = self.cached(engine, linker, sha256) {
            return Ok(job);
        }
        let flight = {
            let mut loading =
                self.loading.lock().map_err(|_| anyhow::anyhow!("module cache lock poisoned"))?;
            loading.entry(sha256.to_owned()).or_default().clone()
        };
        let _flight = flight.lock().map_err(|_| anyhow::anyhow!("module cache lock poisoned"))?;
        // Whoever held the flight before us may have loaded it.
        let loaded = match self.cached(engine, linker, sha256) {
            Some(job) => Ok(job),
            None => self.compile_and_store(engine, linker, sha256, bytes),
        };
        if let Ok(mut loading) = self.loading.lock() {
            loading.remove(sha256);
        }
        loaded
    }

    fn compile_and_store(
        &self,
        engine: &Engine,
        linker: &Linker<RunState>,
        sha256: &str,
        bytes: impl FnOnce() -> anyhow::Result<Vec<u8>>,
    ) -> anyhow::Result<CompiledJob> {
        let bytes = bytes()?;
        let digest = hex::encode(Sha256::digest(&bytes));
        if digest != sha256 {
            anyhow::bail!("module digest mismatch: expected {sha256}, got {digest}");
        }
        let started = std::time::Instant::now();
        let component = super::compile(engine, &bytes)
            .map_err(anyhow::Error::from)
            .context("compiling module")?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            module.sha256 = sha256,
            duration_ms = started.elapsed().as_millis() as u64,
            "compiled module {sha256}"
        );
        if let Some(path) = self.artifact_path(sha256)
            && let Err(error) = store_artifact(&component, &path)
        {
            tracing::warn!(module.sha256 = sha256, %error, "could not cache compiled module");
        }
        let job = link(linker, &component, sha256)?;
        self.remember(job.clone());
        Ok(job)
    }

    fn remember(&self, job: CompiledJob) {
        if let Ok(mut memory) = self.memory.lock() {
            memory.insert(job.sha256.to_string(), job);
        }
    }

    fn artifact_path(&self, sha256: &str) -> Option<PathBuf> {
        // The digest names a file: accept nothing but lowercase hex of the right length.
        let is_digest =
            sha256.len() == 64 && sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let dir = self.dir.as_ref()?;
        is_digest.then(|| dir.join(format!("{sha256}.cwasm")))
    }
}

fn link(
    linker: &Linker<RunState>,
    component: &Component,
    sha256: &str,
) -> anyhow::Result<CompiledJob> {
    let pre =
        linker.instantiate_pre(component).map_err(anyhow::Error::from).context("linking module")?;
    let pre = JobPre::new(pre)
        .map_err(anyhow::Error::from)
        .context("module does not export the job world's `run`")?;
    Ok(CompiledJob { pre, sha256: Arc::from(sha256) })
}

fn store_artifact(component: &Component, path: &Path) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    // A name no other writer can share, in this process or another one.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{write}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[allow(unsafe_code)]
fn load_artifact(engine: &Engine, path: &Path) -> anyhow::Result<Component> {
    // SAFETY: `path` is inside this executor's own cache directory, and only `store_artifact`
    // writes there: files are complete artifacts this process produced (written whole, then
    // renamed) from bytes whose digest it checked. Uploaded bytes never reach this function.
    let component = unsafe { Component::deserialize_file(engine, path)? };
    Ok(component)
}
