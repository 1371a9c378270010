//! `cargo xtask dist`: builds every release artifact of wasmjob into `dist/`, from a clean clone.
//!
//! The artifacts: the static `x86_64-unknown-linux-musl` binary (`dist/wasmjob`, stripped), a
//! tarball of it with the license, the docs, the example configuration, the systemd units and
//! the sample components, a Debian package built with `dpkg-deb` from cargo-deb's
//! `[package.metadata.deb]` table in the root `Cargo.toml`, and, when podman is installed, the
//! OCI image of the root `Containerfile`, saved as an archive.
//!
//! It installs what the build needs and can install (the Rust targets through rustup, the musl C
//! compiler through apt when run as root) and says what is missing otherwise. It does not
//! publish anything, and it does not test the artifacts: `.ci/dist` does.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The target of the released binary: static, so one file runs on any x86-64 Linux.
const TARGET: &str = "x86_64-unknown-linux-musl";

/// The target of the sample components.
const WASM_TARGET: &str = "wasm32-wasip2";

/// The Debian revision of the package built from a version of the crate.
const DEB_REVISION: &str = "1";

/// A failed step, said as a sentence for the person who ran the command.
#[derive(Debug)]
struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Error {
        Error(error.to_string())
    }
}

type Result<T> = std::result::Result<T, Error>;

/// Builds an [`Error`] from a format string.
macro_rules! error {
    ($($arg:tt)*) => { Error(format!($($arg)*)) };
}

const USAGE: &str = "usage: cargo xtask dist [--no-image] [--binary FILE]

  dist        builds into dist/: the static binary, its tarball, the Debian package and
              (with podman, unless --no-image) the OCI image as an archive
  --binary    packages FILE instead of building the static binary (to try the packaging
              with a binary built otherwise; the artifacts are then no release)";

/// What `dist` was asked for.
struct Options {
    image: bool,
    binary: Option<PathBuf>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options { image: true, binary: None };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--no-image" => options.image = false,
                "--binary" => {
                    let file =
                        args.next().ok_or_else(|| error!("--binary needs a file\n{USAGE}"))?;
                    options.binary = Some(PathBuf::from(file));
                }
                unknown => return Err(error!("unknown option `{unknown}`\n{USAGE}")),
            }
        }
        Ok(options)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("dist") => Options::parse(&args[1..]).and_then(|options| dist(&options)),
        _ => Err(error!("{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The repository root (the parent of this crate).
fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Runs `command` with its output passed through, failing unless it succeeds.
fn run(command: &mut Command) -> Result<()> {
    eprintln!("xtask: running {command:?}");
    let status = command.status().map_err(|error| error!("cannot run {command:?}: {error}"))?;
    if status.success() { Ok(()) } else { Err(error!("{command:?} failed: {status}")) }
}

/// Runs `command` and returns its standard output, failing unless it succeeds.
fn output(command: &mut Command) -> Result<String> {
    let out = command.output().map_err(|error| error!("cannot run {command:?}: {error}"))?;
    if !out.status.success() {
        return Err(error!(
            "{command:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` runs at all (`program --version`).
fn exists(program: &str) -> bool {
    Command::new(program).arg("--version").output().is_ok_and(|out| out.status.success())
}

/// The cargo that runs this task, so the build uses the same toolchain.
#[allow(
    clippy::disallowed_methods,
    reason = "a build tool, not the daemon: its environment is cargo's"
)]
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Adds a Rust target through rustup when it is missing; without rustup, trusts the toolchain.
fn ensure_rust_target(target: &str) -> Result<()> {
    if !exists("rustup") {
        return Ok(());
    }
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|line| line.trim() == target) {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", target]))
}

/// The bundled C code (SQLite, jemalloc, ring) is compiled for musl with `musl-gcc`: installs
/// Debian's `musl-tools` when it is missing and apt can, else says what to install.
fn ensure_musl_compiler() -> Result<()> {
    if exists_path("musl-gcc") {
        return Ok(());
    }
    let root = output(Command::new("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0");
    if root && exists("apt-get") {
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "musl-tools"])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    } else {
        Err(error!("`musl-gcc` is missing: install musl-tools (Debian, Ubuntu) or musl-gcc"))
    }
}

/// Whether `program` is on `PATH` (for programs without a `--version`).
#[allow(clippy::disallowed_methods, reason = "a build tool, not the daemon: it looks programs up")]
fn exists_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Removes `path` if it exists, then creates it as an empty directory.
fn fresh_dir(path: &Path) -> Result<()> {
    if path.exists() {
        fs::remove_dir_all(path)?;
    }
    fs::create_dir_all(path)?;
    Ok(())
}

/// Copies `from` to `to` (creating `to`'s directory) and sets its mode.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::copy(from, to)
        .map_err(|error| error!("cannot copy {} to {}: {error}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Sets every directory under `dir` (itself included) to 0755, whatever the umask made them.
fn normalize_dirs(dir: &Path) -> Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            normalize_dirs(&path)?;
        }
    }
    Ok(())
}

/// Every regular file under `dir`, as paths relative to it, sorted.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir) {
                files.push(relative.to_path_buf());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// What the build reads from the root `Cargo.toml`.
struct Manifest {
    version: String,
    description: String,
    deb: toml::Table,
}

impl Manifest {
    fn read(root: &Path) -> Result<Manifest> {
        let path = root.join("Cargo.toml");
        let text = fs::read_to_string(&path)?;
        let table: toml::Table =
            text.parse().map_err(|error| error!("{}: {error}", path.display()))?;
        let package = table
            .get("package")
            .and_then(toml::Value::as_table)
            .ok_or_else(|| error!("{}: no [package]", path.display()))?;
        let string = |key: &str| -> Result<String> {
            package
                .get(key)
                .and_then(toml::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| error!("{}: no package.{key}", path.display()))
        };
        let deb = package
            .get("metadata")
            .and_then(|metadata| metadata.get("deb"))
            .and_then(toml::Value::as_table)
            .cloned()
            .ok_or_else(|| error!("{}: no [package.metadata.deb]", path.display()))?;
        Ok(Manifest { version: string("version")?, description: string("description")?, deb })
    }

    /// A string field of the Debian table.
    fn deb_str(&self, key: &str) -> Result<&str> {
        self.deb
            .get(key)
            .and_then(toml::Value::as_str)
            .ok_or_else(|| error!("[package.metadata.deb] has no string `{key}`"))
    }

    /// A list-of-strings field of the Debian table (empty when absent).
    fn deb_strings(&self, key: &str) -> Vec<String> {
        self.deb
            .get(key)
            .and_then(toml::Value::as_array)
            .map(|values| values.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }
}

fn dist(options: &Options) -> Result<()> {
    let started = Instant::now();
    let root = root();
    let manifest = Manifest::read(&root)?;
    let dist = root.join("dist");
    fs::create_dir_all(&dist)?;

    ensure_rust_target(WASM_TARGET)?;
    let built = match &options.binary {
        Some(binary) => binary.clone(),
        None => {
            ensure_rust_target(TARGET)?;
            ensure_musl_compiler()?;
            run(cargo()
                .current_dir(&root)
                .args([
                    "build",
                    "--release",
                    "--locked",
                    "--package",
                    "wasmjob",
                    "--bin",
                    "wasmjob",
                ])
                .args(["--target", TARGET, "--target-dir", "target"]))?;
            root.join("target").join(TARGET).join("release/wasmjob")
        }
    };
    run(cargo()
        .current_dir(&root)
        .args(["build", "--release", "--locked", "--target", WASM_TARGET])
        .args([
            "--manifest-path",
            "sample-jobs/Cargo.toml",
            "--target-dir",
            "sample-jobs/target",
        ]))?;

    // The released binary: stripped (a third of the size), outside the target dir so that the
    // build's own output stays as cargo left it.
    let binary = dist.join("wasmjob");
    install(&built, &binary, 0o755)?;
    run(Command::new("strip").arg(&binary))?;

    let samples = sample_components(&root)?;
    let tarball = tarball(&root, &dist, &manifest, &binary, &samples)?;
    let deb = deb(&root, &dist, &manifest)?;
    let mut artifacts = vec![binary.clone(), tarball, deb];
    if options.image {
        if exists("podman") {
            artifacts.push(image(&root, &dist, &manifest, &samples)?);
        } else {
            eprintln!("xtask: podman is not installed: no OCI image (see Containerfile)");
        }
    }

    eprintln!("xtask: done in {:.0} s", started.elapsed().as_secs_f64());
    for artifact in artifacts {
        let size = fs::metadata(&artifact)?.len();
        eprintln!(
            "  {:>12} bytes  {}",
            size,
            artifact.strip_prefix(&root).unwrap_or(&artifact).display()
        );
    }
    Ok(())
}

/// The sample components built for `wasm32-wasip2`, by name.
fn sample_components(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("sample-jobs/target").join(WASM_TARGET).join("release");
    let mut components: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
        .collect();
    components.sort();
    if !components.iter().any(|path| path.ends_with("hello.wasm")) {
        return Err(error!("no hello.wasm in {}", dir.display()));
    }
    Ok(components)
}

/// The files of the tarball besides the binary and the samples: (source, place in the tarball).
fn documents() -> [(&'static str, &'static str); 8] {
    [
        ("LICENSE", "LICENSE"),
        ("README.md", "README.md"),
        ("docs/deploy.md", "docs/deploy.md"),
        ("deploy/config/admin.toml", "config/admin.toml"),
        ("deploy/config/executor.toml", "config/executor.toml"),
        ("deploy/config/standalone.toml", "config/standalone.toml"),
        ("deploy/systemd/wasmjob-admin.service", "systemd/wasmjob-admin.service"),
        ("deploy/systemd/wasmjob-executor.service", "systemd/wasmjob-executor.service"),
    ]
}

/// `dist/wasmjob-VERSION-TARGET.tar.gz`: one directory of that name.
fn tarball(
    root: &Path,
    dist: &Path,
    manifest: &Manifest,
    binary: &Path,
    samples: &[PathBuf],
) -> Result<PathBuf> {
    let name = format!("wasmjob-{}-{TARGET}", manifest.version);
    let stage = dist.join(&name);
    fresh_dir(&stage)?;
    install(binary, &stage.join("wasmjob"), 0o755)?;
    for (from, to) in documents() {
        install(&root.join(from), &stage.join(to), 0o644)?;
    }
    for sample in samples {
        let file = sample.file_name().ok_or_else(|| error!("{} has no name", sample.display()))?;
        install(sample, &stage.join("samples").join(file), 0o644)?;
    }
    normalize_dirs(&stage)?;
    let archive = dist.join(format!("{name}.tar.gz"));
    run(Command::new("tar")
        .current_dir(dist)
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "-czf"])
        .arg(&archive)
        .arg(&name))?;
    fs::remove_dir_all(&stage)?;
    Ok(archive)
}

/// `dist/wasmjob_VERSION-1_amd64.deb`, from `[package.metadata.deb]`: its `assets` (a
/// `target/release/` source is the binary in `dist/`), `conf-files` (plus every file under
/// `/etc`, as cargo-deb does), `maintainer-scripts`, `depends`, `section`, `priority`.
fn deb(root: &Path, dist: &Path, manifest: &Manifest) -> Result<PathBuf> {
    let version = format!("{}-{DEB_REVISION}", manifest.version);
    let stage = dist.join("deb");
    fresh_dir(&stage)?;

    let assets = manifest
        .deb
        .get("assets")
        .and_then(toml::Value::as_array)
        .ok_or_else(|| error!("[package.metadata.deb] has no `assets`"))?;
    for asset in assets {
        let fields: Vec<&str> =
            asset.as_array().into_iter().flatten().filter_map(toml::Value::as_str).collect();
        let [source, dest, mode] = fields[..] else {
            return Err(error!("asset {asset:?} is not [source, destination, mode]"));
        };
        let mode = u32::from_str_radix(mode, 8).map_err(|_| error!("asset {asset:?}: bad mode"))?;
        let source = match source.strip_prefix("target/release/") {
            Some(binary) => dist.join(binary),
            None => root.join(source),
        };
        let file = source.file_name().ok_or_else(|| error!("asset {asset:?} has no file name"))?;
        let dest =
            if dest.ends_with('/') { Path::new(dest).join(file) } else { PathBuf::from(dest) };
        install(&source, &stage.join(&dest), mode)?;
    }

    let doc = stage.join("usr/share/doc/wasmjob");
    let license = manifest.deb_str("copyright")?;
    fs::create_dir_all(&doc)?;
    fs::write(
        doc.join("copyright"),
        format!(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
             Upstream-Name: wasmjob\n\n\
             Files: *\nCopyright: {license}\nLicense: Apache-2.0\n \
             On Debian systems the full text of the Apache License 2.0 is in\n \
             /usr/share/common-licenses/Apache-2.0.\n"
        ),
    )?;
    fs::set_permissions(doc.join("copyright"), fs::Permissions::from_mode(0o644))?;

    let control = stage.join("DEBIAN");
    fs::create_dir_all(&control)?;
    let files = files_under(&stage)?;
    let files: Vec<&PathBuf> = files.iter().filter(|file| !file.starts_with("DEBIAN")).collect();

    let mut conffiles: BTreeSet<String> = manifest.deb_strings("conf-files").into_iter().collect();
    conffiles.extend(
        files
            .iter()
            .filter(|file| file.starts_with("etc"))
            .map(|file| format!("/{}", file.display())),
    );
    fs::write(
        control.join("conffiles"),
        conffiles.into_iter().map(|file| file + "\n").collect::<String>(),
    )?;

    let sums = output(Command::new("md5sum").current_dir(&stage).args(&files))?;
    fs::write(control.join("md5sums"), sums)?;

    let installed_kib: u64 = files
        .iter()
        .map(|file| fs::metadata(stage.join(file)).map(|meta| meta.len().div_ceil(1024)))
        .sum::<std::io::Result<u64>>()?;
    let extended: String = manifest
        .deb_str("extended-description")?
        .lines()
        .map(|line| if line.trim().is_empty() { " .\n".to_owned() } else { format!(" {line}\n") })
        .collect();
    fs::write(
        control.join("control"),
        format!(
            "Package: wasmjob\nVersion: {version}\nArchitecture: amd64\nMaintainer: {}\n\
             Installed-Size: {installed_kib}\nDepends: {}\nSection: {}\nPriority: {}\n\
             Description: {}\n{extended}",
            manifest.deb_str("maintainer")?,
            manifest.deb_str("depends")?,
            manifest.deb_str("section")?,
            manifest.deb_str("priority")?,
            manifest.description,
        ),
    )?;
    let scripts = root.join(manifest.deb_str("maintainer-scripts")?);
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        let source = scripts.join(script);
        if source.is_file() {
            install(&source, &control.join(script), 0o755)?;
        }
    }
    for file in ["control", "conffiles", "md5sums"] {
        fs::set_permissions(control.join(file), fs::Permissions::from_mode(0o644))?;
    }
    normalize_dirs(&stage)?;

    let package = dist.join(format!("wasmjob_{version}_amd64.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&package))?;
    fs::remove_dir_all(&stage)?;
    Ok(package)
}

/// Builds the root `Containerfile` as `localhost/wasmjob:VERSION` and saves it as
/// `dist/wasmjob-VERSION-oci.tar` (load it with `podman load -i`).
fn image(root: &Path, dist: &Path, manifest: &Manifest, samples: &[PathBuf]) -> Result<PathBuf> {
    // What the Containerfile copies besides the binary: an empty `/data` and the samples.
    let context = dist.join("image");
    fresh_dir(&context)?;
    fs::create_dir_all(context.join("data"))?;
    for sample in samples {
        let file = sample.file_name().ok_or_else(|| error!("{} has no name", sample.display()))?;
        install(sample, &context.join("samples").join(file), 0o644)?;
    }
    normalize_dirs(&context)?;
    let tag = format!("localhost/wasmjob:{}", manifest.version);
    run(Command::new("podman").current_dir(root).args([
        "build",
        "--file",
        "Containerfile",
        "--tag",
        &tag,
        "--tag",
        "localhost/wasmjob:latest",
        ".",
    ]))?;
    let archive = dist.join(format!("wasmjob-{}-oci.tar", manifest.version));
    if archive.exists() {
        fs::remove_file(&archive)?;
    }
    run(Command::new("podman")
        .args(["save", "--format", "oci-archive", "--output"])
        .arg(&archive)
        .arg(&tag))?;
    Ok(archive)
}
