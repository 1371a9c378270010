//! The confinement of a build process: what of the host it sees, as whom it runs, what it inherits.
//!
//! A build runs operator text (a Python handler's top level during componentize-py's
//! pre-initialization; a JavaScript handler's during Wizer), so the process that runs it gets:
//! - no inherited environment: `PATH` is fixed, `HOME` and `TMPDIR` are its scratch directory;
//! - with `bwrap` (Debian's `bubblewrap`): a read-only view of the host's filesystem in which only
//!   the scratch directory is writable, a private `/tmp`, `/proc` and `/dev`, and new PID, IPC,
//!   UTS and network namespaces (so no network at all, the loopback included);
//! - where the admin runs as root, the user `nobody` (through `setpriv` inside the sandbox, with
//!   every capability dropped); directories it needs that `nobody` could not reach (a Python under
//!   `/root`) are mounted, read-only, on an empty `tmpfs` covering the unreachable one, so the rest
//!   of that directory (root's home) stays hidden.
//!
//! Without a working `bwrap` (or, as root, without `setpriv`) the build runs unconfined as the
//! admin's user, with the clean environment only, and the admin logs a warning once.
//! This module does not choose the builder's arguments or read its output; `builders` does.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The `PATH` of every build.
const BUILD_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The user and group a build runs as when the admin is root (`nobody`, `nogroup` on Debian).
pub(super) const BUILD_ID: u32 = 65534;
/// Where `bwrap` and `setpriv` are looked for (never the admin's `PATH`).
const TOOL_DIRS: [&str; 3] = ["/usr/bin", "/bin", "/usr/local/bin"];
/// Enters the scratch directory, applies the data-size limit and runs the builder.
const LAUNCH: &str = r#"cd "$0" && ulimit -d "$1" && shift && exec "$@""#;

/// How builds are confined on this host, decided by the first build.
#[derive(Debug, Clone)]
enum Mode {
    /// Namespaces through `bwrap`; `setpriv` switches to [`BUILD_ID`] when the admin is root.
    Bwrap { bwrap: PathBuf, setpriv: Option<PathBuf> },
    /// No namespaces: the admin's user and filesystem view, a clean environment.
    Bare,
}

/// Whether this process runs as root (so a build is switched to [`BUILD_ID`]).
pub(super) fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// `program args…` as a confined build in `work`, limited to `memory_kib` of data, seeing `expose`
/// (the interpreter and the builders) read-only.
pub(super) fn command(
    work: &Path,
    expose: &[PathBuf],
    memory_kib: u64,
    program: &Path,
    args: &[OsString],
) -> Command {
    let mut inner: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        LAUNCH.into(),
        work.into(),
        memory_kib.max(1).to_string().into(),
        program.into(),
    ];
    inner.extend(args.iter().cloned());
    let mut command = match mode() {
        Mode::Bwrap { bwrap, setpriv } => {
            let mut command = Command::new(bwrap);
            command.args(mount_args(work, expose, setpriv.is_some()));
            command.args(namespace_args(setpriv.is_some()));
            command.arg("--");
            if let Some(setpriv) = setpriv {
                command.arg(setpriv).args(drop_args());
            }
            command.args(&inner).current_dir("/");
            command
        }
        Mode::Bare => {
            let mut command = Command::new(&inner[0]);
            command.args(&inner[1..]);
            command
        }
    };
    command
        .env_clear()
        .env("PATH", BUILD_PATH)
        .env("HOME", work)
        .env("TMPDIR", work)
        .env("LANG", "C.UTF-8")
        .env("RUST_BACKTRACE", "0");
    command
}

/// The confinement of this host, probed once; a warning says what is missing.
fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    MODE.get_or_init(|| {
        let root = is_root();
        let Some(bwrap) = find_tool("bwrap") else {
            tracing::warn!(
                "bwrap not found: builds of Python and JavaScript source run without namespaces, \
                 as the admin's user, seeing its filesystem; install bubblewrap"
            );
            return Mode::Bare;
        };
        let setpriv = match (root, find_tool("setpriv")) {
            (false, _) => None,
            (true, Some(setpriv)) => Some(setpriv),
            (true, None) => {
                tracing::warn!(
                    "setpriv not found: builds of Python and JavaScript source run without \
                     namespaces, as root; install util-linux's setpriv"
                );
                return Mode::Bare;
            }
        };
        let mut probe = Command::new(&bwrap);
        probe.args(["--ro-bind", "/", "/"]).args(namespace_args(root)).arg("--");
        if let Some(setpriv) = &setpriv {
            probe.arg(setpriv).args(drop_args());
        }
        let probed = probe
            .arg("/bin/true")
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .output();
        match probed {
            Ok(output) if output.status.success() => Mode::Bwrap { bwrap, setpriv },
            Ok(output) => {
                tracing::warn!(
                    error = %String::from_utf8_lossy(&output.stderr).trim(),
                    "bwrap cannot make a sandbox here: builds of Python and JavaScript source run \
                     without namespaces, as the admin's user, seeing its filesystem"
                );
                Mode::Bare
            }
            Err(error) => {
                tracing::warn!(%error, "bwrap does not run: builds run without namespaces");
                Mode::Bare
            }
        }
    })
    .clone()
}

/// The first of [`TOOL_DIRS`] holding `name`.
fn find_tool(name: &str) -> Option<PathBuf> {
    TOOL_DIRS.iter().map(|dir| Path::new(dir).join(name)).find(|path| path.is_file())
}

/// New namespaces for everything but the user when root (the user namespace would leave
/// [`BUILD_ID`] unmapped), and for the user too otherwise (bwrap needs it without root).
fn namespace_args(root: bool) -> Vec<&'static str> {
    let mut args = vec![
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ];
    if root {
        args.extend(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]);
    } else {
        args.push("--unshare-user");
    }
    args
}

/// `setpriv`'s switch to [`BUILD_ID`], keeping no capability and gaining none by `exec`.
fn drop_args() -> Vec<String> {
    let id = BUILD_ID.to_string();
    [
        "--reuid",
        &id,
        "--regid",
        &id,
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The filesystem view: the host read-only, `/tmp` (and every directory the build user could
/// not pass through) replaced by an empty read-only `tmpfs`, the `expose` paths under those
/// mounted back read-only, and `work` mounted writable.
fn mount_args(work: &Path, expose: &[PathBuf], other_user: bool) -> Vec<OsString> {
    let mut covers: BTreeSet<PathBuf> = BTreeSet::from([PathBuf::from("/tmp")]);
    if other_user {
        covers
            .extend(expose.iter().chain([&work.to_path_buf()]).filter_map(|p| hidden_ancestor(p)));
    }
    // A cover inside another one is already empty.
    let nested: Vec<PathBuf> = covers
        .iter()
        .filter(|c| covers.iter().any(|o| o != *c && c.starts_with(o)))
        .cloned()
        .collect();
    for path in nested {
        covers.remove(&path);
    }
    let mut args: Vec<OsString> =
        ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"].map(OsString::from).to_vec();
    for cover in &covers {
        args.extend(["--tmpfs".into(), cover.into()]);
    }
    let mut binds: Vec<(&Path, &str)> = expose
        .iter()
        .filter(|p| covers.iter().any(|c| p.starts_with(c)))
        .map(|p| (p.as_path(), "--ro-bind"))
        .collect();
    binds.push((work, "--bind"));
    binds.sort();
    for (path, how) in binds {
        if let Some(cover) = covers.iter().find(|c| path.starts_with(c)) {
            // Directories bwrap would make on its own are 0700 root: the build user could not pass.
            let mut between: Vec<&Path> =
                path.ancestors().skip(1).take_while(|a| a != cover).collect();
            between.reverse();
            for dir in between {
                args.extend(["--perms".into(), "0755".into(), "--dir".into(), dir.into()]);
            }
        }
        args.extend([how.into(), path.into(), path.into()]);
    }
    for cover in &covers {
        args.extend(["--remount-ro".into(), cover.into()]);
    }
    args
}

/// The outermost ancestor of `path` that others may not pass through, if any.
fn hidden_ancestor(path: &Path) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .skip(1)
        .find(|dir| std::fs::metadata(dir).is_ok_and(|meta| meta.permissions().mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_directories_are_covered_and_what_is_needed_mounted_back() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let hidden = dir.path().join("home");
        let python = hidden.join("py/versions/3");
        std::fs::create_dir_all(&python).expect("making dirs");
        std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let work = Path::new("/tmp/wasmjob-build-1");
        let args = mount_args(work, &[python.clone(), "/usr".into()], true);
        let text: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let text = text.join(" ").replace(&dir.path().display().to_string(), "T");
        // The temp dir itself may be under /tmp: then /tmp covers it and no cover of its own.
        let expected_cover = if dir.path().starts_with("/tmp") { "" } else { "--tmpfs T/home " };
        assert!(text.starts_with("--ro-bind / / --dev /dev --proc /proc --tmpfs /tmp "), "{text}");
        assert!(text.contains(expected_cover), "{text}");
        assert!(text.contains("--perms 0755 --dir T/home/py/versions --ro-bind T/home/py/versions/3 T/home/py/versions/3"), "{text}");
        assert!(text.contains("--bind /tmp/wasmjob-build-1 /tmp/wasmjob-build-1"), "{text}");
        assert!(!text.contains("--ro-bind /usr"), "{text}");
        assert!(
            text.ends_with("--remount-ro /tmp") || text.contains("--remount-ro /tmp "),
            "{text}"
        );
    }
}
