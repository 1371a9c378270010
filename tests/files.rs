//! Jobs as files end to end: `wasmjob apply|diff|export|schema` as real processes against two
//! `wasmjob standalone` processes. A document applied, applied again (nothing changes), exported
//! with its components, applied to a fresh admin and exported again (the same document), run
//! there, changed and pruned.

use std::path::Path;

use serde_json::Value;

use crate::cli::Client;
use crate::support::sample_job;
use crate::support::standalone::spawn_standalone;

/// A client of a fresh standalone whose data is in `dir/name`.
fn admin(dir: &Path, name: &str) -> (crate::support::standalone::Standalone, Client) {
    let data_dir = dir.join(name);
    let (standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    (standalone, Client { url, token })
}

const DOCUMENT: &str = r#"
version = 1

[[groups]]
app_name = "billing"
title = "Billing ✓"
max_concurrent_runs = 4

[[calendars]]
name = "holidays"
time_zone = "Asia/Shanghai"
excluded_dates = ["2026-10-01/2026-10-07"]
weekdays = ["SUN"]

[[jobs]]
group = "default"
name = "hello 🚀"
running = true
schedule_type = "CRON"
schedule_conf = "0 0 3 * * ?"
calendar = "holidays"
retry_count = 2
children = ["billing/settle"]
param = "多语言"
component = { path = "components/hello.wasm" }

[[jobs]]
group = "billing"
name = "settle"
glue_type = "BEAN"
handler = "settleHandler"
route_strategy = "ROUND"

[[alarms]]
name = "ops"
url = "http://127.0.0.1:9/hook"
group = "billing"
secret = "a shared secret of the team"
"#;

#[test]
fn a_document_applies_once_exports_and_recreates_the_jobs_on_a_fresh_admin() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a) = admin(dir.path(), "a");
    let (_b, b) = admin(dir.path(), "b");
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("components")).unwrap();
    std::fs::write(work.join("components/hello.wasm"), sample_job("hello")).unwrap();
    let file = work.join("cluster.toml");
    std::fs::write(&file, DOCUMENT).unwrap();
    let file = file.to_str().unwrap();

    // The diff says what is missing and exits 8; a dry run changes nothing.
    let diff = a.run(&["diff", "-f", file]);
    assert_eq!(diff.status.code(), Some(8), "{diff:?}");
    let diff = String::from_utf8(diff.stdout).unwrap();
    assert!(diff.contains("+ job default/hello 🚀"), "{diff}");
    assert!(diff.contains("5 to create, 0 to change"), "{diff}");
    a.ok(&["apply", "-f", file, "--dry-run"]);
    assert_eq!(a.json(&["job", "list"]), Value::Array(Vec::new()));

    // Applied: every field as the document says, the job started with its component.
    let applied = a.ok(&["apply", "-f", file]);
    assert!(applied.contains("applied 8 changes"), "{applied}");
    let jobs = a.json(&["job", "list"]);
    let hello = find(&jobs, "hello 🚀");
    let settle = find(&jobs, "settle");
    assert_eq!(hello["running"], true);
    assert_eq!(hello["calendar"], "holidays");
    assert_eq!(hello["param"], "多语言");
    assert_eq!(hello["child_job_ids"], serde_json::json!([settle["id"]]));
    assert_eq!(settle["route_strategy"], "ROUND");
    assert_eq!(hello["active_version"], 1);

    // Applied again, and as its diff: nothing to do.
    let again = a.ok(&["apply", "-f", file]);
    assert!(again.contains("0 to create, 0 to change, 0 to delete"), "{again}");
    assert!(!again.contains("applied"), "{again}");
    a.ok(&["diff", "-f", file]);

    // Exported with the components, applied to a fresh admin, exported again: the same text.
    let exported = work.join("a/cluster.toml");
    std::fs::create_dir_all(work.join("a")).unwrap();
    let out = exported.to_str().unwrap();
    let components = work.join("a/components");
    a.ok(&["export", "-o", out, "--components", components.to_str().unwrap()]);
    let text = std::fs::read_to_string(&exported).unwrap();
    assert!(text.contains("path = \"components/"), "{text}");
    assert!(!text.contains("secret"), "secrets are never exported:\n{text}");
    // The secret is needed to create the alarm elsewhere.
    let refused = b.fails(&["apply", "-f", out], 5);
    assert!(refused.contains("alarm `ops`: a new alarm needs its `secret`"), "{refused}");
    let with_secret =
        text.replace("name = \"ops\"\n", "name = \"ops\"\nsecret = \"another shared secret\"\n");
    std::fs::write(&exported, &with_secret).unwrap();
    b.ok(&["apply", "-f", out]);
    std::fs::create_dir_all(work.join("b")).unwrap();
    let again = work.join("b/cluster.toml");
    let b_components = work.join("b/components");
    b.ok(&[
        "export",
        "-o",
        again.to_str().unwrap(),
        "--components",
        b_components.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
    // YAML reads back the same.
    let yaml = b.ok(&["export", "--format", "yaml"]);
    let yaml_file = work.join("a/cluster.yaml");
    std::fs::write(
        &yaml_file,
        yaml.replace("name: ops\n", "name: ops\n  secret: another shared secret\n"),
    )
    .unwrap();
    let same = b.ok(&["diff", "-f", yaml_file.to_str().unwrap()]);
    assert!(same.contains("0 to create, 0 to change, 0 to delete"), "{same}");

    // The recreated job runs its component on the fresh admin.
    let jobs = b.json(&["job", "list"]);
    let id = find(&jobs, "hello 🚀")["id"].to_string();
    let run = b.ok(&["job", "trigger", &id]).trim().to_owned();
    b.ok(&["log", &run, "--follow"]);

    // A change and a prune: the fields that changed are named, the dropped job is deleted.
    let changed = DOCUMENT
        .replace("0 0 3 * * ?", "0 30 4 * * ?")
        .replace("children = [\"billing/settle\"]\n", "")
        .split("[[jobs]]\ngroup = \"billing\"")
        .next()
        .unwrap()
        .to_owned()
        + "[[alarms]]\nname = \"ops\"\nurl = \"http://127.0.0.1:9/hook\"\ngroup = \"billing\"\n";
    std::fs::write(file, &changed).unwrap();
    let kept = a.run(&["diff", "-f", file]);
    let kept = String::from_utf8(kept.stdout).unwrap();
    assert!(kept.contains("schedule_conf: \"0 0 3 * * ?\" → \"0 30 4 * * ?\""), "{kept}");
    assert!(kept.contains("! job billing/settle"), "{kept}");
    let pruned = a.ok(&["apply", "-f", file, "--prune"]);
    assert!(pruned.contains("- job billing/settle"), "{pruned}");
    let jobs = a.json(&["job", "list"]);
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    assert_eq!(find(&jobs, "hello 🚀")["schedule_conf"], "0 30 4 * * ?");
    let again = a.ok(&["apply", "-f", file, "--prune"]);
    assert!(again.contains("0 to create, 0 to change, 0 to delete"), "{again}");
}

#[test]
fn a_document_the_admin_cannot_take_changes_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a) = admin(dir.path(), "a");
    let file = dir.path().join("bad.toml");
    let cases = [
        (
            "version = 1\n[[jobs]]\ngroup = \"default\"\nname = \"x\"\nretries = 3\n",
            "unknown field `retries`",
        ),
        ("version = 1\n[[jobs]]\ngroup = \"nowhere\"\nname = \"x\"\n", "no group `nowhere`"),
        (
            "version = 1\n[[jobs]]\ngroup = \"default\"\nname = \"x\"\ncomponent = { path = \"missing.wasm\" }\n",
            "missing.wasm",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"default\"\nname = \"x\"\nglue_type = \"GLUE_PYTHON\"\nsource_path = \"jobs/missing.py\"\n",
            "source_path `jobs/missing.py`",
        ),
    ];
    for (text, reason) in cases {
        std::fs::write(&file, text).unwrap();
        let error = a.run(&["apply", "-f", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&error.stderr);
        assert!(!error.status.success() && stderr.contains(reason), "{text}: {stderr}");
    }
    // The admin's own refusal names the step; what came before it stays applied.
    std::fs::write(
        &file,
        "version = 1\n[[jobs]]\ngroup = \"default\"\nname = \"x\"\nschedule_type = \"CRON\"\nschedule_conf = \"every day\"\n",
    )
    .unwrap();
    let refused = a.fails(&["apply", "-f", file.to_str().unwrap()], 5);
    assert!(refused.contains("creating job default/x: 400"), "{refused}");
    assert_eq!(a.json(&["job", "list"]), Value::Array(Vec::new()));

    // The schema needs no admin and describes the document.
    let schema: Value = serde_json::from_str(&a.ok(&["schema"])).unwrap();
    assert_eq!(schema["$defs"]["JobDoc"]["properties"]["running"]["type"], "boolean");
}

#[test]
fn the_published_schema_accepts_what_export_writes_and_refuses_what_apply_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a) = admin(dir.path(), "a");
    std::fs::create_dir_all(dir.path().join("components")).unwrap();
    std::fs::write(dir.path().join("components/hello.wasm"), sample_job("hello")).unwrap();
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, DOCUMENT).unwrap();
    a.ok(&["apply", "-f", file.to_str().unwrap()]);

    let schema: Value = serde_json::from_str(&a.ok(&["schema"])).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let exported: toml::Table = toml::from_str(&a.ok(&["export"])).unwrap();
    let exported = serde_json::to_value(exported).unwrap();
    let errors: Vec<String> = validator.iter_errors(&exported).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?} in {exported}");
    let written: toml::Table = toml::from_str(DOCUMENT).unwrap();
    assert!(validator.is_valid(&serde_json::to_value(written).unwrap()));

    let refused = [
        serde_json::json!({"jobs": []}),
        serde_json::json!({"version": 1, "jobs": [{"group": "g"}]}),
        serde_json::json!({"version": 1, "jobs": [{"group": "g", "name": "n", "retries": 3}]}),
        serde_json::json!({"version": 1, "jobs": [{"group": "g", "name": "n", "running": "yes"}]}),
        serde_json::json!({"version": 1, "groups": [{"app_name": "g", "max_concurrent_runs": "4"}]}),
        serde_json::json!({"version": 1, "alarms": [{"name": "ops"}]}),
    ];
    for document in refused {
        assert!(!validator.is_valid(&document), "{document}");
    }
}

/// The job named `name` in a `job list --json`.
pub(crate) fn find<'a>(jobs: &'a Value, name: &str) -> &'a Value {
    jobs.as_array()
        .into_iter()
        .flatten()
        .find(|job| job["name"] == name)
        .unwrap_or_else(|| panic!("no job {name} in {jobs}"))
}
