//! The guest components of `sample-jobs/`, built once per test run.
//!
//! The first caller builds the whole sample-jobs workspace for `wasm32-wasip2` (installing the
//! target with rustup if it is missing); everyone else waits for that and reads the result.
//! Cargo's own lock on `sample-jobs/target` keeps concurrent test binaries from colliding.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const TARGET: &str = "wasm32-wasip2";

/// The bytes of the sample job `name` (`hello`, `spin`, …).
pub fn sample_job(name: &str) -> Vec<u8> {
    let dir = built();
    let path = dir.join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample-jobs");
        ensure_target();
        let status = Command::new(env!("CARGO"))
            .args(["build", "--release", "--target", TARGET, "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(root.join("target"))
            .status()
            .expect("running cargo to build sample-jobs");
        assert!(status.success(), "building sample-jobs failed: {status}");
        root.join("target").join(TARGET).join("release")
    })
}

/// Installs the wasm target when rustup manages this toolchain and lacks it.
fn ensure_target() {
    let Ok(output) = Command::new("rustup").args(["target", "list", "--installed"]).output() else {
        return; // No rustup: the toolchain must already have the target.
    };
    if String::from_utf8_lossy(&output.stdout).lines().any(|line| line.trim() == TARGET) {
        return;
    }
    let status =
        Command::new("rustup").args(["target", "add", TARGET]).status().expect("running rustup");
    assert!(status.success(), "rustup target add {TARGET} failed");
}
