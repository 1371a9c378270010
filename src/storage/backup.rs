//! `wasmjob backup`: a consistent copy of a SQLite database that a running admin may be writing.
//!
//! SQLite's online backup copies every page of the database in one step, inside one read
//! transaction: in WAL mode the admin's writers go on meanwhile, and the copy is the database as
//! it was when the step began (a copy made page by page over several steps would start again at
//! each write). The copy is written beside its target, checked (`pragma integrity_check`),
//! switched out of WAL mode so that it is one self-contained file, synced, and only then renamed
//! into place: a backup that fails leaves no file that looks like a backup.
//!
//! This module does not restore (a copy is restored by putting it in place of the database of a
//! stopped admin, see the README) and knows nothing of PostgreSQL, whose backups are pg_dump's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    /// The copy's size in bytes.
    pub bytes: u64,
    /// Jobs in the copy.
    pub jobs: i64,
    /// Runs in the copy.
    pub runs: i64,
}

/// How often a step that found the database locked (another process checkpointing its WAL, or
/// changing the journal mode) is tried again, a tenth of a second apart.
const LOCKED_RETRIES: u32 = 100;

/// Copies the SQLite database `database` into the new file `to`.
pub fn backup_sqlite(database: &Path, to: &Path) -> anyhow::Result<BackupSummary> {
    // Read-write without create: a source that is not there is an error, not a new empty
    // database; read-only connections cannot always read a WAL database another process holds.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let source = Connection::open_with_flags(database, flags)
        .with_context(|| format!("opening {}", database.display()))?;
    source.busy_timeout(Duration::from_secs(5))?;
    let partial = partial_path(to);
    match std::fs::remove_file(&partial) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(error).with_context(|| format!("removing {}", partial.display()));
        }
    }
    let copied = copy(&source, &partial).and_then(|summary| {
        std::fs::File::open(&partial)
            .and_then(|file| file.sync_all())
            .with_context(|| format!("syncing {}", partial.display()))?;
        Ok(summary)
    });
    let summary = match copied {
        Ok(summary) => summary,
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
    };
    // `rename` would replace a file made since the flags were checked: a hard link does not.
    std::fs::hard_link(&partial, to)
        .with_context(|| format!("moving the copy into place as {}", to.display()))?;
    std::fs::remove_file(&partial).with_context(|| format!("removing {}", partial.display()))?;
    if let Some(dir) = to.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        // The new name is durable once its directory is synced.
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(summary)
}

/// Where the copy is written before it is complete.
fn partial_path(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    to.with_file_name(name)
}

/// Copies `source` into the new file `target`, checks the copy and counts what it holds.
fn copy(source: &Connection, target: &Path) -> anyhow::Result<BackupSummary> {
    let mut copy = Connection::open(target)
        .with_context(|| format!("creating the copy {}", target.display()))?;
    {
        let backup = Backup::new(source, &mut copy).context("starting the backup")?;
        let mut locked = 0;
        loop {
            // -1: every page in this one step, so that the copy is one snapshot.
            match backup.step(-1).context("copying the database")? {
                StepResult::Done => break,
                StepResult::More => {}
                StepResult::Busy | StepResult::Locked if locked < LOCKED_RETRIES => {
                    locked += 1;
                    pause();
                }
                StepResult::Busy | StepResult::Locked => {
                    anyhow::bail!("the database stayed locked for 10 s: try again")
                }
                _ => anyhow::bail!("the backup step answered something unknown"),
            }
        }
    }
    let check: String = copy.query_row("pragma integrity_check", [], |row| row.get(0))?;
    if check != "ok" {
        anyhow::bail!("the copy fails SQLite's integrity check: {check}");
    }
    // The copy keeps the source's WAL mode in its header; out of it, the copy is one file.
    let mode: String = copy.query_row("pragma journal_mode = delete", [], |row| row.get(0))?;
    if mode != "delete" {
        anyhow::bail!("the copy stays in journal mode {mode}");
    }
    let jobs = copy.query_row("select count(*) from jobs", [], |row| row.get(0))?;
    let runs = copy.query_row("select count(*) from runs", [], |row| row.get(0))?;
    copy.close().map_err(|(_, error)| error).context("closing the copy")?;
    let bytes = std::fs::metadata(target)?.len();
    Ok(BackupSummary { bytes, jobs, runs })
}

#[expect(clippy::disallowed_methods, reason = "a backup runs on a blocking thread of its own")]
fn pause() {
    std::thread::sleep(Duration::from_millis(100));
}
