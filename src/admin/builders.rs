//! Builders: Python and JavaScript job source turned into components for the job world.
//!
//! Two pinned tools do the work, each installed by `wasmjob setup-builders` into its own
//! directory of the builders dir: componentize-py (PyPI, a pip `--target` tree run with the
//! admin's `python3`) and componentize-js (npm, an `npm install --prefix` tree run by `node`
//! through `builders/componentize.mjs`, a driver compiled into this binary). A build runs as a
//! child process in a fresh scratch directory (mode 0700) holding only the source, the job
//! world's WIT and the driver, confined by `builders/sandbox.rs` (no inherited environment; with
//! bwrap, a read-only host, no network, and `nobody` where the admin is root), with a data-size
//! limit (`ulimit -d`, which V8's and wasmtime's address-space reservations do not count
//! against), and a time limit after which its whole process group is killed. componentize-py is
//! called through its library API with the scratch directory as its only path, so the
//! handler's top level, which its pre-initialization runs, sees that directory and the
//! interpreter's bundled standard library, and nothing of the host. Its error becomes a [`BuildError`] carrying the tool's
//! message, trimmed, with the scratch and builder directories' paths taken out.
//!
//! Built components are kept in `<builders dir>/cache` by the sha256 of language, pinned
//! version, world, driver and source, so the same text is built once. The component is validated by the
//! caller exactly as an uploaded one; nothing here trusts it.
//! This module never runs a component and never decides where one is stored.

use std::ffi::OsString;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::config::BuilderConfig;
use crate::model::Language;

mod sandbox;

/// The componentize-py release installed and used.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
/// The @bytecodealliance/componentize-js release installed and used.
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";
/// The job world every source is built for.
const JOB_WIT: &str = include_str!("../../wit/job.wit");
/// The Python driver that calls componentize-py's library API with the scratch directory as the
/// only path: its command line would append the host's site-packages directories (the
/// inherited `VIRTUAL_ENV`'s, the system's, the user's) and preopen them writable for the
/// handler's top level. Run with `-I -S`, so `site` adds nothing either; argument 1 is where
/// `setup` installed the package.
const PY_DRIVER: &str = "import sys; sys.path.append(sys.argv[1]); from componentize_py import componentize; componentize(['job.wit'], ['job'], [], False, None, ['.'], [], 'handler', 'out.wasm', False, [], [], False, None)";
/// The Node driver that calls componentize-js's library API.
const JS_DRIVER: &str = include_str!("builders/componentize.mjs");
/// The longest error message kept from a builder.
const MAX_MESSAGE_CHARS: usize = 2000;
/// The most lines kept from a builder's error output (its end, where the error is).
const MAX_MESSAGE_LINES: usize = 12;

/// Builds at once in this process: each takes a core or more for tens of seconds.
static BUILD_SLOTS: Semaphore = Semaphore::const_new(1);

/// Why source did not become a component.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builder for the language is not installed where the flags say.
    #[error(
        "the {tool} builder is not installed{where_}: install it with `wasmjob setup-builders --dir DIR` and start the admin with `--builders-dir DIR`"
    )]
    Missing {
        /// The tool's name.
        tool: &'static str,
        /// Where it was looked for, if anywhere.
        where_: String,
    },
    /// The builder refused the source: its message, with the line it names.
    #[error("{0}")]
    Failed(String),
    /// The builder ran past its time limit and was killed.
    #[error("the build did not finish within {0} s")]
    Timeout(u64),
    /// The builder could not be run at all (the host's fault, not the source's).
    #[error(transparent)]
    Host(#[from] anyhow::Error),
}

impl BuildError {
    /// The stable error code of the REST API.
    pub fn code(&self) -> &'static str {
        match self {
            BuildError::Missing { .. } => "builder_missing",
            BuildError::Failed(_) => "build_failed",
            BuildError::Timeout(_) => "build_timeout",
            BuildError::Host(_) => "internal",
        }
    }
}

/// The name of the tool that builds `language`, or `None` for components.
pub fn tool(language: Language) -> Option<&'static str> {
    match language {
        Language::Wasm => None,
        Language::Python => Some("componentize-py"),
        Language::Javascript => Some("componentize-js"),
    }
}

/// Builds `source` into a component, or takes it from the cache when this text was built before.
pub async fn build(
    config: &BuilderConfig,
    language: Language,
    source: &str,
) -> Result<Vec<u8>, BuildError> {
    let tool = tool(language).context("a component needs no build")?;
    let Some(dir) = config.dir.clone().filter(|dir| installed(dir, language)) else {
        let where_ = config.dir.as_ref().map(|d| format!(" in {}", d.display()));
        return Err(BuildError::Missing { tool, where_: where_.unwrap_or_default() });
    };
    let cached = dir.join("cache").join(format!("{}.wasm", cache_key(language, source)));
    if let Ok(bytes) = std::fs::read(&cached) {
        return Ok(bytes);
    }
    let _slot = BUILD_SLOTS.acquire().await.context("build slots closed")?;
    let config = config.clone();
    let source = source.to_owned();
    let bytes =
        tokio::task::spawn_blocking(move || build_blocking(&config, &dir, language, &source))
            .await
            .context("the build task failed")??;
    // The cache only saves time: failing to write it loses nothing.
    if let Some(parent) = cached.parent()
        && std::fs::create_dir_all(parent).is_ok()
    {
        let partial = cached.with_extension("partial");
        if std::fs::write(&partial, &bytes).is_ok() {
            let _ = std::fs::rename(&partial, &cached);
        }
    }
    Ok(bytes)
}

/// Installs both builders at their pinned versions into `dir` (skipping one already there),
/// with pip (`--target`) and npm (`--prefix`).
pub fn setup(dir: &Path, python: &Path, npm: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if !installed(dir, Language::Python) {
        let target = dir.join("componentize-py");
        let status = Command::new(python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&target)
            .arg(format!("componentize-py=={COMPONENTIZE_PY_VERSION}"))
            .status()
            .with_context(|| format!("running {} -m pip", python.display()))?;
        anyhow::ensure!(status.success(), "pip install componentize-py failed: {status}");
        std::fs::write(marker(dir, Language::Python), COMPONENTIZE_PY_VERSION)?;
    }
    if !installed(dir, Language::Javascript) {
        let prefix = dir.join("componentize-js");
        let status = Command::new(npm)
            .args(["install", "--no-audit", "--no-fund", "--loglevel", "error", "--prefix"])
            .arg(&prefix)
            .arg(format!("@bytecodealliance/componentize-js@{COMPONENTIZE_JS_VERSION}"))
            .status()
            .with_context(|| format!("running {} install", npm.display()))?;
        anyhow::ensure!(status.success(), "npm install componentize-js failed: {status}");
        std::fs::write(marker(dir, Language::Javascript), COMPONENTIZE_JS_VERSION)?;
    }
    Ok(())
}

/// Whether the builder of `language` is installed in `dir` at its pinned version.
pub fn installed(dir: &Path, language: Language) -> bool {
    let pinned = match language {
        Language::Wasm => return true,
        Language::Python => COMPONENTIZE_PY_VERSION,
        Language::Javascript => COMPONENTIZE_JS_VERSION,
    };
    std::fs::read_to_string(marker(dir, language)).is_ok_and(|version| version == pinned)
}

/// The file `setup` writes once a builder's install succeeded.
fn marker(dir: &Path, language: Language) -> PathBuf {
    dir.join(format!("{}.installed", tool(language).unwrap_or("wasm")))
}

/// What a built component is cached under: everything the build depends on.
fn cache_key(language: Language, source: &str) -> String {
    let mut hash = Sha256::new();
    for part in [
        language.as_str(),
        COMPONENTIZE_PY_VERSION,
        COMPONENTIZE_JS_VERSION,
        JOB_WIT,
        PY_DRIVER,
        JS_DRIVER,
    ] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.update(source.as_bytes());
    hex::encode(hash.finalize())
}

fn build_blocking(
    config: &BuilderConfig,
    dir: &Path,
    language: Language,
    source: &str,
) -> Result<Vec<u8>, BuildError> {
    // The build runs in its scratch directory: every path it is given must be absolute.
    let dir = &dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))?;
    let scratch = Scratch::new()?;
    let work = scratch.0.as_path();
    std::fs::write(work.join("job.wit"), JOB_WIT).context("writing the world")?;
    let (interpreter, args): (Interpreter, Vec<OsString>) = match language {
        Language::Python => {
            std::fs::write(work.join("handler.py"), source).context("writing the source")?;
            let mut args: Vec<OsString> =
                ["-I", "-S", "-B", "-c", PY_DRIVER].map(OsString::from).to_vec();
            args.push(dir.join("componentize-py").into());
            (Interpreter::python(&config.python)?, args)
        }
        Language::Javascript => {
            std::fs::write(work.join("handler.mjs"), source).context("writing the source")?;
            std::fs::write(work.join("componentize.mjs"), JS_DRIVER)
                .context("writing the driver")?;
            let entry = dir
                .join("componentize-js/node_modules/@bytecodealliance/componentize-js/src/componentize.js");
            let mut args: Vec<OsString> = vec!["componentize.mjs".into(), entry.into()];
            args.extend(["handler.mjs", "job.wit", "job", "out.wasm"].map(OsString::from));
            (Interpreter::node(&config.node)?, args)
        }
        Language::Wasm => return Err(anyhow::anyhow!("a component needs no build").into()),
    };
    let mut expose = interpreter.prefixes;
    expose.push(dir.to_path_buf());
    let memory_kib = config.memory_bytes / 1024;
    let command = sandbox::command(work, &expose, memory_kib, &interpreter.executable, &args);
    let output = run_bounded(command, work, config.timeout)?;
    if !output.success {
        let message = trim_message(&output.stderr, &[work, dir]);
        return Err(BuildError::Failed(if message.is_empty() {
            format!("{} failed without a message", tool(language).unwrap_or("the builder"))
        } else {
            message
        }));
    }
    // The build owned the directory: a symbolic link there must not make us read a host file.
    let out = work.join("out.wasm");
    if !std::fs::symlink_metadata(&out).is_ok_and(|meta| meta.file_type().is_file()) {
        return Err(BuildError::Failed("the builder wrote no component".to_owned()));
    }
    std::fs::read(out).context("reading the component").map_err(BuildError::Host)
}

/// The interpreter that runs a builder, resolved to the file it really is (a pyenv or nvm shim
/// needs the admin's environment, which the build does not get), and the directories it needs.
struct Interpreter {
    executable: PathBuf,
    prefixes: Vec<PathBuf>,
}

impl Interpreter {
    /// Asks `python` (isolated, without `site`) where it and its standard library are.
    fn python(python: &Path) -> Result<Interpreter, BuildError> {
        let script = "import os, sys; print(os.path.realpath(sys.executable)); \
                      print(os.path.realpath(sys.base_prefix))";
        let lines = ask(python, &["-I", "-S", "-c", script])?;
        let executable = PathBuf::from(&lines[0]);
        let mut prefixes: Vec<PathBuf> = lines.get(1).map(PathBuf::from).into_iter().collect();
        prefixes.extend(executable.parent().map(Path::to_path_buf));
        Ok(Interpreter { executable, prefixes })
    }

    /// Asks `node` where it is; its prefix is the directory above its `bin`.
    fn node(node: &Path) -> Result<Interpreter, BuildError> {
        let lines = ask(node, &["-p", "require('fs').realpathSync(process.execPath)"])?;
        let executable = PathBuf::from(&lines[0]);
        let prefix = executable.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
        Ok(Interpreter { prefixes: vec![prefix.to_path_buf()], executable })
    }
}

/// The non-empty lines `program args…` prints, run as the admin configured it (its environment
/// less `WASMJOB_*`): this runs no operator text.
fn ask(program: &Path, args: &[&str]) -> Result<Vec<String>, BuildError> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WASMJOB_") {
            command.env_remove(name);
        }
    }
    let output = command.output().with_context(|| format!("running {}", program.display()))?;
    let lines: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect();
    if !output.status.success() || lines.is_empty() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(anyhow::anyhow!(
            "{} does not say where it is: {}",
            program.display(),
            stderr.trim()
        )
        .into());
    }
    Ok(lines)
}

/// A fresh directory for one build, removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
        let name = format!("wasmjob-build-{:016x}", rand::random::<u64>());
        let temp = std::env::temp_dir();
        let temp = temp.canonicalize().unwrap_or(temp);
        let path = temp.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let scratch = Scratch(path);
        if sandbox::is_root() {
            let id = Some(sandbox::BUILD_ID);
            std::os::unix::fs::chown(&scratch.0, id, id)
                .with_context(|| format!("giving {} to the build user", scratch.0.display()))?;
        }
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Finished {
    success: bool,
    stderr: String,
}

/// Runs `command` in its own process group, its output going to files in `work`; kills the
/// group when it runs past `timeout`.
fn run_bounded(
    mut command: Command,
    work: &Path,
    timeout: Duration,
) -> Result<Finished, BuildError> {
    // Created by us and read back through our own handle: the build may replace the name.
    let mut errors = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(work.join("builder.err"))
        .context("creating the error file")?;
    let stderr = errors.try_clone().context("sharing the error file")?;
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).process_group(0);
    let mut child = command.spawn().context("starting the builder")?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the builder")? {
            break status;
        }
        if started.elapsed() >= timeout {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
            return Err(BuildError::Timeout(timeout.as_secs()));
        }
        #[expect(clippy::disallowed_methods, reason = "a blocking thread waiting for a child")]
        std::thread::sleep(Duration::from_millis(50));
    };
    // A builder's helpers (componentize-js runs wizer) may outlive it: end them too.
    kill_group(child.id());
    let mut stderr = String::new();
    if errors.seek(SeekFrom::Start(0)).is_ok() {
        let _ = (&mut errors).take(256 * 1024).read_to_string(&mut stderr);
    }
    Ok(Finished { success: status.success(), stderr })
}

/// Kills process group `pgid` (the builder and whatever it started).
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The end of a builder's error output: at most [`MAX_MESSAGE_LINES`] non-empty lines (Rust
/// backtrace frames and our own wrapper's traceback lines dropped), with `paths` replaced by
/// nothing, so the message names the scratch file (`handler.py`) and no host directory.
fn trim_message(stderr: &str, paths: &[&Path]) -> String {
    let mut text = stderr.to_owned();
    for path in paths {
        let path = path.display().to_string();
        text = text.replace(&format!("{path}/"), "").replace(&path, "");
    }
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.trim().is_empty())
        .filter(|line| !line.starts_with("Traceback (most recent call last)"))
        .filter(|line| !line.trim_start().starts_with("File \"<string>\""))
        .filter(|line| !line.trim_start().starts_with("at ") || line.contains("handler."))
        .collect();
    let start = lines.len().saturating_sub(MAX_MESSAGE_LINES);
    let mut message = lines[start..].join("\n");
    if message.chars().count() > MAX_MESSAGE_CHARS {
        message = message.chars().take(MAX_MESSAGE_CHARS).collect::<String>() + "…";
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_the_error_and_lose_host_paths() {
        let scratch = Path::new("/tmp/wasmjob-build-abc");
        let dir = Path::new("/srv/builders");
        let python = "Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nAssertionError:   File \"/0/handler.py\", line 4\n    def run(self, t)\n                    ^\nSyntaxError: expected ':'\n\n\nCaused by:\n    SyntaxError: expected ':' (handler.py, line 4)\n";
        let node = "/tmp/wasmjob-build-abc/handler.mjs:2\n  return \"x\" +;\n              ^\n\nSyntaxError: Unexpected token ';'\n    at checkSyntax (node:internal/main/check_syntax:74:5)\n\nNode.js v20.20.2\n";
        let lost = "Error: /srv/builders/componentize-js/x.js failed\n";
        let got: Vec<String> =
            [python, node, lost].iter().map(|text| trim_message(text, &[scratch, dir])).collect();
        expect_test::expect![[r#"
            [
                "AssertionError:   File \"/0/handler.py\", line 4\n    def run(self, t)\n                    ^\nSyntaxError: expected ':'\nCaused by:\n    SyntaxError: expected ':' (handler.py, line 4)",
                "handler.mjs:2\n  return \"x\" +;\n              ^\nSyntaxError: Unexpected token ';'\nNode.js v20.20.2",
                "Error: componentize-js/x.js failed",
            ]
        "#]]
        .assert_debug_eq(&got);
    }

    #[test]
    fn the_cache_key_depends_on_language_and_text() {
        let keys = [
            cache_key(Language::Python, "a"),
            cache_key(Language::Python, "b"),
            cache_key(Language::Javascript, "a"),
        ];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_eq!(keys[0], cache_key(Language::Python, "a"));
    }
}
