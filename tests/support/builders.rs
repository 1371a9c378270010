//! The source builders (componentize-py, componentize-js) for the tests, installed once.
//!
//! The first caller runs `wasmjob setup-builders --dir target/tmp/builders` (pip and npm at the
//! pinned versions), under a file lock so that concurrent test processes share one install;
//! later runs find it there and install nothing. Without python3 or node the caller is told why
//! and skips. Built components land in `builders/cache` (the admin's own cache, keyed by the
//! source's sha256), so a rerun does not build again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The builders directory, installed; `None` (with the reason printed) when python3 with pip or
/// node with npm is missing on this machine.
pub fn builders_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let tools: [(&str, &[&str]); 3] = [
            ("python3", &["-m", "pip", "--version"]),
            ("node", &["--version"]),
            ("npm", &["--version"]),
        ];
        for (tool, args) in tools {
            if !Command::new(tool).args(args).output().is_ok_and(|o| o.status.success()) {
                return Err(format!("`{tool} {}` does not run", args.join(" ")));
            }
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("builders");
        std::fs::create_dir_all(&dir).expect("making the builders dir");
        let lock = std::fs::File::create(dir.join(".lock")).expect("creating the builders lock");
        lock.lock().expect("taking the builders lock");
        let status = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .arg("setup-builders")
            .arg("--dir")
            .arg(&dir)
            .status()
            .expect("running wasmjob setup-builders");
        lock.unlock().expect("releasing the builders lock");
        assert!(status.success(), "wasmjob setup-builders failed: {status}");
        Ok(dir)
    });
    match dir {
        Ok(dir) => Some(dir.clone()),
        Err(reason) => {
            eprintln!(
                "skipping: the source builders need python3 with pip and node with npm: {reason}"
            );
            None
        }
    }
}

/// The text of `sample-jobs/<path>` (`python/hello.py`, `js/hostile.js`, …).
pub fn sample_source(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample-jobs").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}
