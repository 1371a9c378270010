//! The command-line client end to end: `wasmjob job|version|run|log|group|executors|calendar|
//! workflow` as real processes against a `wasmjob standalone` process, tables, `--json`, exit
//! codes, `--follow`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::sample_job;
use crate::support::standalone::spawn_standalone;

/// Runs the client with the admin's URL and token from the environment.
pub(crate) struct Client {
    pub(crate) url: String,
    pub(crate) token: String,
}

impl Client {
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .args(args)
            .env("WASMJOB_ADMIN_URL", &self.url)
            .env("WASMJOB_TOKEN", &self.token)
            .output()
            .unwrap()
    }

    /// Runs the client with `input` on its standard input.
    pub(crate) fn run_with_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
            .args(args)
            .env("WASMJOB_ADMIN_URL", &self.url)
            .env("WASMJOB_TOKEN", &self.token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed; its stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?} failed: {}\n{stderr}", output.status);
        String::from_utf8(output.stdout).unwrap()
    }

    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        serde_json::from_str(&self.ok(&args)).unwrap()
    }

    /// Runs a command that must fail with `code`; its one line of stderr.
    pub(crate) fn fails(&self, args: &[&str], code: i32) -> String {
        let output = self.run(args);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
        assert!(stderr.starts_with("error: "), "{stderr:?}");
        stderr
    }
}

fn write_component(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, sample_job(name)).unwrap();
    path.display().to_string()
}

#[test]
fn the_cli_drives_a_standalone_admin() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let cli = Client { url, token };

    // A job and its component.
    let job = cli.json(&["job", "create", "--group-id", "1", "--name", "ticker"]);
    let id = job["id"].as_i64().unwrap().to_string();
    let ticker = write_component(dir.path(), "ticker");
    let version = cli.json(&["version", "upload", &id, &ticker, "--remark", "first one"]);
    assert_eq!(
        (version["version"].as_i64(), version["remark"].as_str()),
        (Some(1), Some("first one"))
    );

    // Tables: a header and rows, columns aligned.
    let table = cli.ok(&["job", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ID  GROUP_ID  NAME"), "{table}");
    assert_eq!(lines.len(), 2, "{table}");
    assert_eq!(lines[0].find("NAME"), lines[1].find("ticker"), "{table}");
    let updated = cli.json(&["job", "update", &id, "--name", "ticks", "--param", "3,10"]);
    assert_eq!(
        (updated["name"].as_str(), updated["param"].as_str()),
        (Some("ticks"), Some("3,10"))
    );
    assert_eq!(updated["group_id"], 1, "fields not given stay");
    assert!(cli.ok(&["version", "list", &id]).contains("first one"));
    let executors = cli.ok(&["executors", "list"]);
    assert_eq!(executors.lines().count(), 2, "{executors}");
    let admins = cli.ok(&["admins", "list"]);
    assert_eq!(admins.lines().count(), 2, "{admins}");
    assert!(admins.contains("256"), "an admin alone holds every partition: {admins}");
    assert!(cli.ok(&["group", "list"]).lines().nth(1).unwrap().starts_with("1   default"));

    // Trigger, then follow the run's log to its end: every tick, in order, and exit 0.
    let run = cli.ok(&["job", "trigger", &id, "--param", "6,150"]).trim().to_owned();
    let followed = cli.ok(&["log", &run, "--follow"]);
    let ticks: Vec<&str> = followed
        .lines()
        .filter_map(|line| line.split_once("[INFO] tick").map(|(_, t)| t))
        .collect();
    assert_eq!(ticks, (1..=6).map(|i| format!(" {i} of 6")).collect::<Vec<_>>());
    assert_eq!(cli.ok(&["log", &run]), followed, "the log read afterwards is the same");
    let record = cli.json(&["run", "get", &run]);
    assert_eq!(record["state"], "success");
    let runs = cli.ok(&["run", "list", "--job-id", &id]);
    assert!(runs.lines().nth(1).unwrap().contains("success"), "{runs}");

    // A run that fails: `--follow` exits 6 with the run's message.
    let fail = cli.json(&["job", "create", "--group-id", "1", "--name", "fail"]);
    let fail_id = fail["id"].as_i64().unwrap().to_string();
    cli.ok(&["version", "upload", &fail_id, &write_component(dir.path(), "fail")]);
    let failed_run = cli.ok(&["job", "trigger", &fail_id, "--param", "boom"]).trim().to_owned();
    let error = cli.fails(&["log", &failed_run, "--follow"], 6);
    assert!(error.contains("failed on purpose: boom"), "{error}");

    // Exit codes: not found 3, refused 4, invalid 5, unreachable 1, usage 2.
    assert!(cli.fails(&["job", "get", "999"], 3).contains("404"));
    let wrong = Client { url: cli.url.clone(), token: "wrong-token-0123456789".into() };
    assert!(wrong.fails(&["job", "list"], 4).contains("401"));
    cli.fails(&["job", "create", "--group-id", "1", "--name", "x", "--schedule-type", "CRON"], 5);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gone = Client { url: format!("http://{closed}"), token: cli.token.clone() };
    let refused = gone.fails(&["job", "list"], 1);
    assert!(refused.to_lowercase().contains("connection refused"), "{refused}");
    assert_eq!(cli.run(&["job", "frobnicate"]).status.code(), Some(2));

    // A schedule of its own, far away: the job can be started and stopped.
    cli.ok(&[
        "job",
        "update",
        &id,
        "--schedule-type",
        "CRON",
        "--schedule-conf",
        "0 0 0 1 1 ? 2099",
    ]);
    assert_eq!(cli.json(&["job", "start", &id])["running"], true);
    assert_eq!(cli.json(&["job", "stop", &id])["running"], false);
    cli.ok(&["job", "delete", &id]);
    cli.fails(&["job", "get", &id], 3);
}

/// Runs the client with only what `env` sets among the variables it reads.
fn client(args: &[&str], env: &[(&str, &Path)], vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wasmjob"));
    command.args(args);
    for name in ["WASMJOB_ADMIN_URL", "WASMJOB_TOKEN", "XDG_CONFIG_HOME", "HOME"] {
        command.env_remove(name);
    }
    for (name, path) in env {
        command.env(name, path);
    }
    for (name, value) in vars {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn write_config(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn the_cli_reads_its_config_file_after_flags_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let nowhere = format!("http://{closed}");
    let wrong = "wrong-token-0123456789";
    let config = |admin_url: &str, token: &str| {
        format!("admin_url = \"{admin_url}\"\ntoken = \"{token}\"\n")
    };
    let status = |output: &Output| output.status.code();
    let one_line = |output: &Output| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
        stderr
    };

    // `~/.config/wasmjob/config.toml` alone is enough.
    let home = dir.path().join("home");
    let home_file = home.join(".config/wasmjob/config.toml");
    write_config(&home_file, &config(&url, &token));
    let list = client(&["job", "list", "--json"], &[("HOME", &home)], &[]);
    assert_eq!(status(&list), Some(0), "{list:?}");
    assert_eq!(serde_json::from_slice::<Value>(&list.stdout).unwrap(), serde_json::json!([]));

    // `$XDG_CONFIG_HOME/wasmjob/config.toml` comes before `~/.config`.
    let xdg = dir.path().join("xdg");
    write_config(&xdg.join("wasmjob/config.toml"), &config(&url, &token));
    write_config(&home_file, &config(&nowhere, wrong));
    let env = [("HOME", home.as_path()), ("XDG_CONFIG_HOME", xdg.as_path())];
    assert_eq!(status(&client(&["group", "list"], &env, &[])), Some(0));

    // The environment beats the file, and a flag beats the environment.
    write_config(&xdg.join("wasmjob/config.toml"), &config(&nowhere, wrong));
    assert_eq!(status(&client(&["group", "list"], &env, &[])), Some(1), "the file's URL is used");
    let vars = [("WASMJOB_ADMIN_URL", url.as_str()), ("WASMJOB_TOKEN", token.as_str())];
    assert_eq!(status(&client(&["group", "list"], &env, &vars)), Some(0));
    let vars = [("WASMJOB_ADMIN_URL", url.as_str())];
    let refused = client(&["group", "list"], &env, &vars);
    assert_eq!(status(&refused), Some(4), "the file's token, the environment's URL");
    assert!(one_line(&refused).contains("401"));
    let vars = [("WASMJOB_ADMIN_URL", url.as_str()), ("WASMJOB_TOKEN", wrong)];
    assert_eq!(status(&client(&["group", "list"], &env, &vars)), Some(4));
    assert_eq!(status(&client(&["group", "list", "--token", &token], &env, &vars)), Some(0));
    let flags = ["group", "list", "--admin-url", &url, "--token", &token];
    assert_eq!(status(&client(&flags, &env, &[])), Some(0));

    // `--config` names another file, which must exist.
    let named = dir.path().join("team.toml");
    write_config(&named, &config(&url, &token));
    let with_named = ["executors", "list", "--config", named.to_str().unwrap()];
    assert_eq!(status(&client(&with_named, &env, &[])), Some(0));
    let missing = dir.path().join("missing.toml");
    let gone = client(&["job", "list", "--config", missing.to_str().unwrap()], &env, &[]);
    assert_eq!(status(&gone), Some(7));
    assert!(one_line(&gone).contains("missing.toml"), "{gone:?}");

    // A bad file is one line naming it, and exit 7; a missing default file is no error.
    write_config(&xdg.join("wasmjob/config.toml"), "admin_url = \"http://a\"\ntoken = [1\n");
    let broken = client(&["job", "list"], &env, &[]);
    assert_eq!(status(&broken), Some(7));
    let line = one_line(&broken);
    assert!(line.starts_with("error: config file ") && line.contains("config.toml:2:"), "{line}");
    write_config(&xdg.join("wasmjob/config.toml"), "url = \"http://a\"\n");
    assert!(one_line(&client(&["job", "list"], &env, &[])).contains("unknown field `url`"));
    assert_eq!(status(&client(&flags, &env, &[])), Some(0), "not read when the flags say all");
    let empty = dir.path().join("empty");
    let no_token = client(&["job", "list"], &[("HOME", &empty)], &[]);
    assert_eq!(status(&no_token), Some(4));
    assert!(one_line(&no_token).contains("no token"), "{no_token:?}");
}

#[test]
fn the_cli_applies_imports_and_deletes_calendars() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let cli = Client { url, token };
    let file = dir.path().join("cn.json");
    std::fs::write(&file, r#"{"name": "cn", "time_zone": "Asia/Shanghai", "weekdays": ["SAT"]}"#)
        .unwrap();
    let file = file.display().to_string();
    // Applied once it is created, applied again it is replaced.
    assert_eq!(
        cli.json(&["calendar", "apply", "-f", &file])["weekdays"],
        serde_json::json!(["SAT"])
    );
    std::fs::write(&file, r#"{"name": "cn", "time_zone": "Asia/Shanghai", "weekdays": ["SUN"]}"#)
        .unwrap();
    assert_eq!(
        cli.json(&["calendar", "apply", "-f", &file])["weekdays"],
        serde_json::json!(["SUN"])
    );
    let table = cli.ok(&["calendar", "list"]);
    assert!(table.lines().nth(1).unwrap().starts_with("cn "), "{table}");
    let ics = dir.path().join("workdays.ics");
    std::fs::write(
        &ics,
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART;VALUE=DATE:20260927\nEND:VEVENT\nEND:VCALENDAR\n",
    )
    .unwrap();
    let imported =
        cli.json(&["calendar", "import-ics", "cn", &ics.display().to_string(), "--included"]);
    assert_eq!(imported["included_dates"], serde_json::json!(["2026-09-27"]));
    // A job names it; the calendar cannot go until the job does.
    let job =
        cli.json(&["job", "create", "--group-id", "1", "--name", "workdays", "--calendar", "cn"]);
    assert_eq!(job["calendar"], "cn");
    let id = job["id"].as_i64().unwrap().to_string();
    assert!(cli.fails(&["calendar", "delete", "cn"], 5).contains("409"));
    cli.ok(&["job", "delete", &id]);
    cli.ok(&["calendar", "delete", "cn"]);
    cli.fails(&["calendar", "get", "cn"], 3);
}

/// The fields of `wasmjob workflow run`'s first part, by name.
fn run_field<'a>(shown: &'a str, name: &str) -> &'a str {
    let line = shown.lines().find(|line| line.split_whitespace().next() == Some(name));
    line.and_then(|line| line.split_whitespace().nth(1)).unwrap_or_default()
}

#[test]
fn the_cli_creates_exports_and_runs_a_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let cli = Client { url, token };
    let hello = write_component(dir.path(), "hello");
    let mut job_ids = Vec::new();
    for name in ["extract", "load"] {
        let job = cli.json(&["job", "create", "--group-id", "1", "--name", name]);
        let id = job["id"].as_i64().unwrap();
        cli.ok(&["version", "upload", &id.to_string(), &hello]);
        job_ids.push(id);
    }
    let (extract, load) = (job_ids[0], job_ids[1]);

    // Created from a file; listed; exported as the very document it was created from.
    let document = json!({
        "name": "etl", "group_id": 1,
        "nodes": [
            {"name": "extract", "job_id": extract, "param": "extract"},
            {"name": "load", "job_id": load},
        ],
        "edges": [{"from": "extract", "to": "load"}],
        "schedule_type": "NONE",
        "schedule_conf": "",
        "misfire_strategy": "DO_NOTHING",
    });
    let file = dir.path().join("etl.json");
    std::fs::write(&file, serde_json::to_string_pretty(&document).unwrap()).unwrap();
    let id = cli.ok(&["workflow", "create", &file.display().to_string()]).trim().to_owned();
    assert!(id.parse::<i64>().is_ok(), "the new id alone: {id:?}");
    let table = cli.ok(&["workflow", "list"]);
    let lines: Vec<Vec<&str>> =
        table.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(lines, [vec!["ID", "NAME", "GROUP_ID", "NODES"], vec![&id, "etl", "1", "2"]]);
    assert_eq!(cli.ok(&["workflow", "list", "--group-id", "2"]).lines().count(), 1);
    let exported: Value = serde_json::from_str(&cli.ok(&["workflow", "get", &id])).unwrap();
    assert_eq!(exported, document);
    assert_eq!(cli.json(&["workflow", "get", &id])["id"].to_string(), id, "--json: the API's");

    // Replaced from standard input, with what `get` printed.
    let mut changed = exported.clone();
    changed["nodes"][1]["param"] = json!("load");
    let output = cli.run_with_stdin(&["workflow", "update", &id, "-"], &changed.to_string());
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout).unwrap(), format!("workflow {id} updated\n"));
    assert_eq!(serde_json::from_str::<Value>(&cli.ok(&["workflow", "get", &id])).unwrap(), changed);

    // Triggered, then watched until it ends: both nodes succeeded, each with its run.
    let run = cli.ok(&["workflow", "trigger", &id]).trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let shown = cli.ok(&["workflow", "run", &run]);
        match run_field(&shown, "state") {
            "success" => break shown,
            "running" => {}
            _ => panic!("workflow run {run} did not succeed:\n{shown}"),
        }
        assert!(Instant::now() < deadline, "workflow run {run} still running after 30 s:\n{shown}");
        #[expect(clippy::disallowed_methods, reason = "a sync test polling another process")]
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((run_field(&shown, "id"), run_field(&shown, "workflow_id")), (&*run, &*id));
    let nodes: Vec<Vec<&str>> = shown
        .lines()
        .skip_while(|line| !line.is_empty())
        .skip(1)
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(nodes[0], ["NAME", "JOB_ID", "STATE", "ROUND", "LOG_IDS", "REASON"], "{shown}");
    assert_eq!(nodes.len(), 3, "{shown}");
    for (node, (name, job)) in nodes[1..].iter().zip([("extract", extract), ("load", load)]) {
        assert_eq!(node[..4], [name, &*job.to_string(), "succeeded", "1"], "{shown}");
        assert_eq!(cli.json(&["run", "get", node[4]])["state"], "success", "{shown}");
    }
    let runs = cli.ok(&["workflow", "runs", &id]);
    let runs: Vec<Vec<&str>> = runs.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(runs[0], ["ID", "STATE", "TRIGGER_TYPE", "CREATED_AT", "ENDED_AT"]);
    assert_eq!((runs.len(), &runs[1][..3]), (2, &[&*run, "success", "MANUAL"][..]));

    // The API's refusals, with their reasons: an ended run, a node that did not fail, a cycle.
    assert!(cli.fails(&["workflow", "kill", &run], 5).contains("409"));
    assert!(cli.fails(&["workflow", "retry", &run, "load"], 5).contains("409"));
    assert!(cli.fails(&["workflow", "retry", &run, "nowhere"], 3).contains("node_not_found"));
    let cycle = json!({
        "name": "loop", "group_id": 1,
        "nodes": [
            {"name": "r", "job_id": extract}, {"name": "a", "job_id": load},
            {"name": "b", "job_id": load}, {"name": "c", "job_id": load},
        ],
        "edges": [
            {"from": "r", "to": "a"}, {"from": "a", "to": "b"},
            {"from": "b", "to": "c"}, {"from": "c", "to": "a"},
        ],
    });
    let cycle_file = dir.path().join("loop.json");
    std::fs::write(&cycle_file, cycle.to_string()).unwrap();
    let error = cli.fails(&["workflow", "create", &cycle_file.display().to_string()], 5);
    assert_eq!(
        error, "error: 400: the edges form a cycle: a → b → c → a (invalid_workflow)\n",
        "the API's reason"
    );
    assert_eq!(cli.ok(&["workflow", "list"]).lines().count(), 2, "nothing was created");

    cli.ok(&["workflow", "delete", &id]);
    cli.fails(&["workflow", "get", &id], 3);
    assert_eq!(cli.ok(&["workflow", "runs", &id]).lines().count(), 2, "its runs stay");
}
