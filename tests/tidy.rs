use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn source(relative: &str) -> Vec<(String, String)> {
    rust_files(&root().join(relative))
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path.strip_prefix(root()).unwrap().display().to_string(), text)
        })
        .collect()
}

#[test]
fn every_source_file_says_what_it_is_for() {
    for (path, text) in source("src") {
        assert!(text.starts_with("//!"), "{path} does not start with a `//!` doc comment");
    }
}

#[test]
fn no_debugging_leftovers() {
    for (path, text) in source("src").into_iter().chain(source("tests")) {
        assert!(!text.contains(concat!("dbg", "!(")), "{path} has a dbg! call");
    }
}

#[test]
fn layering_holds() {
    let pure = [
        "src/access.rs",
        "src/backfill.rs",
        "src/backfill/",
        "src/model.rs",
        "src/netpolicy.rs",
        "src/partition.rs",
        "src/partition/",
        "src/lifecycle.rs",
        "src/lifecycle/",
        "src/schedule.rs",
        "src/schedule/",
        "src/routing.rs",
        "src/routing/",
        "src/workflow.rs",
        "src/workflow/",
    ];
    let io_crates = [
        "tokio",
        "sqlx",
        "rusqlite",
        "axum",
        "wasmtime",
        "reqwest",
        "crate::storage",
        "crate::runtime",
    ];
    for (path, text) in source("src") {
        let imports = |name: &str| {
            text.lines().any(|line| {
                let line = line.trim_start();
                (line.starts_with("use ") || line.contains(&format!("{name}::")))
                    && line.contains(name)
            })
        };
        if pure.iter().any(|prefix| path.starts_with(prefix)) {
            for name in io_crates {
                assert!(!imports(name), "{path} is pure (sync, IO-free) but uses {name}");
            }
            for name in ["crate::protocol", "crate::admin", "crate::executor"] {
                assert!(!text.contains(name), "{path} is pure but reaches into {name}");
            }
        }
        if path.starts_with("src/admin") {
            assert!(!text.contains("crate::executor"), "{path}: admin must not import executor");
        }
        if path.starts_with("src/executor") {
            assert!(!text.contains("crate::admin"), "{path}: executor must not import admin");
        }
        if !path.starts_with("src/storage") {
            assert!(!text.contains("sqlx::query"), "{path}: only storage holds SQL");
            assert!(!text.contains("rusqlite"), "{path}: only storage holds SQL");
        }
        if !path.starts_with("src/runtime/bindings.rs") {
            assert!(!text.contains("bindgen!"), "{path}: bindgen! belongs in runtime/bindings.rs");
        }
    }
}

#[test]
fn the_console_fetches_nothing_from_elsewhere() {
    let dir = root().join("src/admin/console");
    for sub in ["templates", "assets"] {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for needle in ["http://", "https://", "src=\"//", "href=\"//", "url(//", "@import"] {
                assert!(
                    !text.contains(needle),
                    "{}: `{needle}`: serve it from the binary",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn migrations_are_numbered_and_match_across_dialects() {
    let names = |dialect: &str| {
        let mut names: Vec<String> = std::fs::read_dir(root().join("migrations").join(dialect))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let sqlite = names("sqlite");
    assert_eq!(sqlite, names("postgres"), "each migration exists for every dialect");
    assert_eq!(sqlite, names("mysql"), "each migration exists for every dialect");
    // Numbers only grow; a gap is allowed, since two branches may each take the next number
    // and the one merged second keeps its own.
    let mut previous = 0;
    for name in &sqlite {
        let (number, rest) = name.split_once('_').unwrap_or(("", ""));
        let value: u32 = number.parse().unwrap_or(0);
        assert!(
            number.len() == 4 && value > previous,
            "{name}: migrations are numbered 0001, 0002, …, each above the one before"
        );
        previous = value;
        let stem = rest.strip_suffix(".sql").unwrap_or_else(|| panic!("{name}: not .sql"));
        assert!(
            stem.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}: snake_case"
        );
    }
}

/// The admin calls executors through one client, `protocol/client.rs`, which follows no
/// redirect, asks the executor address policy (resolving names itself), ignores proxies, trusts
/// the CA file and caps replies. Any other `reqwest` client must be one listed here, with why it
/// is not a client to executors.
#[test]
fn one_http_client_to_executors() {
    let allowed = [
        // The client to executors (and the executors' to their admins).
        "src/protocol/client.rs",
        // The command-line client of the operator API: it calls the admin URL its user gives,
        // through the proxy the user's environment names, and never an executor.
        "src/client_cli.rs",
        // Alarm webhooks: operator-configured URLs outside the cluster (chat, paging); it
        // follows no redirect and trusts the CA file, and never calls an executor.
        "src/admin/alarms/webhook.rs",
    ];
    for (path, text) in source("src") {
        let needles = [
            "reqwest::Client::builder",
            "reqwest::Client::new",
            "reqwest::Client::default",
            "reqwest::ClientBuilder",
            "reqwest::get(",
            "reqwest::blocking",
        ];
        // A client type imported by name could be built without its path.
        let imported = text.lines().any(|line| {
            let line = line.trim_start();
            line.starts_with("use reqwest") && line.contains("Client")
        });
        let builds_a_client = imported || needles.iter().any(|needle| text.contains(needle));
        assert!(
            !builds_a_client || allowed.contains(&path.as_str()),
            "{path} builds its own HTTP client: call executors through protocol::Client"
        );
    }
}

/// The modules that the file of module `from` (text `text`) in a folder names among `siblings`,
/// the other files of its folder: through `super::` or the folder's path from the crate root
/// (`crate::admin::http::`), alone or in a `{..}` list. Comments are not read.
fn sibling_imports(text: &str, folder_path: &str, siblings: &[String]) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = Vec::new();
    for prefix in ["super::".to_owned(), format!("{folder_path}::")] {
        for (at, _) in code.match_indices(&prefix) {
            let rest = &code[at + prefix.len()..];
            // `super::name::…`, or `super::{a, b::c, …}`.
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(list) => list[..list.find('}').unwrap_or(list.len())]
                    .split([',', ' ', '\n', '{'])
                    .map(|item| item.split("::").next().unwrap_or(""))
                    .collect(),
                None => {
                    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'));
                    let name = &rest[..end.unwrap_or(rest.len())];
                    // A path through the module (`name::item`), not an item of the parent.
                    if rest[name.len()..].starts_with("::") { vec![name] } else { vec![] }
                }
            };
            for name in names {
                if siblings.iter().any(|sibling| sibling == name)
                    && !named.contains(&name.to_owned())
                {
                    named.push(name.to_owned());
                }
            }
        }
    }
    named
}

/// Within one folder of `src/`, the files' imports of one another form no circle: a folder's
/// files can be read (and split further) from the one that imports none of the others.
#[test]
fn no_import_circle_between_files_of_one_folder() {
    let mut folders = vec![root().join("src")];
    let mut checked = 0;
    while let Some(folder) = folders.pop() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                if stem != "mod" && stem != "tests" && stem != "main" && stem != "lib" {
                    files.push((stem, std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        let relative = folder.strip_prefix(root().join("src")).unwrap().display().to_string();
        let folder_path = if relative.is_empty() {
            "crate".to_owned()
        } else {
            format!("crate::{}", relative.replace('/', "::"))
        };
        let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
        let edges: Vec<(String, Vec<String>)> = files
            .iter()
            .map(|(name, text)| {
                let others: Vec<String> = names.iter().filter(|n| *n != name).cloned().collect();
                (name.clone(), sibling_imports(text, &folder_path, &others))
            })
            .collect();
        // Depth-first from every file; a file met again on the current path closes a circle.
        fn visit(
            name: &str,
            edges: &[(String, Vec<String>)],
            path: &mut Vec<String>,
            done: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            if let Some(start) = path.iter().position(|n| n == name) {
                let mut circle = path[start..].to_vec();
                circle.push(name.to_owned());
                return Some(circle);
            }
            if done.iter().any(|n| n == name) {
                return None;
            }
            path.push(name.to_owned());
            let next = edges.iter().find(|(n, _)| n == name).map(|(_, to)| to.clone());
            for to in next.unwrap_or_default() {
                if let Some(circle) = visit(&to, edges, path, done) {
                    return Some(circle);
                }
            }
            path.pop();
            done.push(name.to_owned());
            None
        }
        let mut done = Vec::new();
        for name in &names {
            let circle = visit(name, &edges, &mut Vec::new(), &mut done);
            assert!(
                circle.is_none(),
                "src/{relative}: the files import one another in a circle: {}",
                circle.unwrap_or_default().join(" → ")
            );
        }
        checked += edges.iter().filter(|(_, to)| !to.is_empty()).count();
    }
    assert!(checked > 20, "the check found only {checked} files that import a sibling");
}

#[test]
fn the_import_circle_check_reads_the_forms_of_use() {
    let siblings = ["batch", "runs", "audit"].map(str::to_owned);
    let text = "//! [`x`](super::runs::X)\nuse super::batch::{Write, Written};\n\
                use super::{Db, audit::{self, AuditEntry}};\nfn f() { super::runs::claim(); }\n";
    assert_eq!(sibling_imports(text, "crate::storage", &siblings), ["batch", "audit", "runs"]);
    let text = "use crate::storage::runs::NewRun;\nuse super::Db;\n// super::audit::X\n";
    assert_eq!(sibling_imports(text, "crate::storage", &siblings), ["runs"]);
}

/// A source file is read in one sitting: none is longer than 600 lines, tests aside (split a
/// longer one by what its parts do, as `admin/dispatch/` is split by the run's phases).
#[test]
fn no_source_file_is_longer_than_600_lines() {
    for (path, text) in source("src") {
        if path.ends_with("/tests.rs") || path.contains("/tests/") {
            continue;
        }
        let lines = text.lines().count();
        assert!(lines <= 600, "{path}: {lines} lines");
    }
}
