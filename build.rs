//! Tells cargo to rebuild the crate when `migrations/` changes: `sqlx::migrate!` embeds the
//! migration files at compile time, and cargo would otherwise not notice a new one.
//!
//! It also gives `wasmjob --version` what it prints besides the version: the git commit
//! (`WASMJOB_GIT_COMMIT`; `unknown` outside a git checkout, or the value of that variable when a
//! packager sets it), the build date (`WASMJOB_BUILD_DATE`, from `SOURCE_DATE_EPOCH` when set,
//! for reproducible builds) and the wasmtime version in `Cargo.lock`
//! (`WASMJOB_WASMTIME_VERSION`). Nothing here fails the build: what cannot be found is `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = env("WASMJOB_GIT_COMMIT").or_else(|| git_commit(manifest_dir));
    println!("cargo:rustc-env=WASMJOB_GIT_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
    let date = env("SOURCE_DATE_EPOCH")
        .and_then(|epoch| epoch.trim().parse::<u64>().ok())
        .or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
            Some(now.as_secs())
        })
        .map_or_else(|| "unknown".to_owned(), civil_date);
    println!("cargo:rustc-env=WASMJOB_BUILD_DATE={date}");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let wasmtime = std::fs::read_to_string(manifest_dir.join("Cargo.lock"))
        .ok()
        .and_then(|lock| locked_version(&lock, "wasmtime"));
    println!(
        "cargo:rustc-env=WASMJOB_WASMTIME_VERSION={}",
        wasmtime.as_deref().unwrap_or("unknown")
    );
}

#[expect(clippy::disallowed_methods, reason = "a build script reads cargo's environment")]
fn env(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

/// The commit checked out in `dir`, and the files to watch for the next one.
fn git_commit(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        let output = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        output.status.success().then(|| text.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // A commit moves HEAD, or the branch it names (in the common directory of worktrees, or
    // in packed-refs). Only files that exist are watched: cargo reruns a build script whose
    // watched file is missing at every build.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// The version of package `name` in the text of a `Cargo.lock`.
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(version.trim_end_matches('"').to_owned());
        }
    }
    None
}

/// `YYYY-MM-DD` (UTC) of `secs` since the Unix epoch (the civil-from-days algorithm).
fn civil_date(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
