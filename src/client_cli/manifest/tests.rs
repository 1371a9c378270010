//! The document's reading and writing, and the plan's cases as a table.

use std::collections::BTreeMap;

use expect_test::{Expect, expect};

use super::*;

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn job(key: &str) -> JobDoc {
    let (group, name) = key.split_once('/').unwrap_or(("g", key));
    JobDoc::new(group, name)
}

fn current_job(id: i64, doc: JobDoc) -> CurrentJob {
    CurrentJob { id, doc, versions: Vec::new() }
}

/// An admin with group `g` (id 1) and the given jobs; alarms readable and none.
fn admin(jobs: Vec<CurrentJob>) -> Current {
    Current {
        groups: vec![(1, GroupDoc::new("g"))],
        jobs,
        alarms: Some(Vec::new()),
        ..Current::default()
    }
}

fn document(jobs: Vec<JobDoc>) -> Document {
    Document { groups: vec![GroupDoc::new("g")], jobs, ..Document::default() }
}

/// The diff and the steps, one a line.
fn check(document: &Document, current: &Current, prune: bool, expected: Expect) {
    let files = BTreeMap::from([("new.wasm".to_owned(), SHA_B.to_owned())]);
    let text = match plan(document, current, &files, prune) {
        Ok(plan) => {
            let steps: String = plan.steps.iter().map(|step| format!("{step:?}\n")).collect();
            let steps: String =
                steps.lines().map(|line| format!("> {}\n", abbreviate(line))).collect();
            format!("{}{steps}", plan.render())
        }
        Err(error) => format!("refused: {error}\n"),
    };
    expected.assert_eq(&text);
}

/// A step's debug text without the job's fields.
fn abbreviate(line: &str) -> String {
    match line.find("doc: JobDoc") {
        Some(at) => format!("{}doc: …", &line[..at]),
        None => line.to_owned(),
    }
}

#[test]
fn an_admin_that_matches_changes_nothing() {
    let mut nightly = job("g/nightly");
    nightly.schedule_type = "CRON".into();
    nightly.schedule_conf = "0 0 2 * * ?".into();
    nightly.running = true;
    nightly.component = Some(ComponentRef { path: None, sha256: Some(SHA_A.into()) });
    let current = admin(vec![current_job(7, nightly.clone())]);
    // By path, the file's sha256 is what counts.
    let mut by_path = nightly.clone();
    by_path.component = Some(ComponentRef { path: Some("new.wasm".into()), sha256: None });
    let mut current_b = current.clone();
    current_b.jobs[0].doc.component = Some(ComponentRef { path: None, sha256: Some(SHA_B.into()) });
    check(
        &document(vec![nightly]),
        &current,
        false,
        expect![[r#"
        0 to create, 0 to change, 0 to delete, 2 unchanged
    "#]],
    );
    check(
        &document(vec![by_path]),
        &current_b,
        false,
        expect![[r#"
        0 to create, 0 to change, 0 to delete, 2 unchanged
    "#]],
    );
}

#[test]
fn what_is_new_is_created_fields_first_then_children_versions_and_start() {
    let mut parent = job("g/parent");
    parent.children = vec!["g/child".into()];
    parent.running = true;
    parent.schedule_type = "FIX_RATE".into();
    parent.schedule_conf = "60".into();
    parent.component = Some(ComponentRef { path: Some("new.wasm".into()), sha256: None });
    let mut child = job("g/child");
    child.glue_type = "BEAN".into();
    child.handler = Some("demoJobHandler".into());
    let mut document = document(vec![parent, child]);
    document.groups.push(GroupDoc { title: Some("Billing".into()), ..GroupDoc::new("billing") });
    check(
        &document,
        &admin(Vec::new()),
        false,
        expect![[r#"
        + group billing
            app_name: "billing"
            title: "Billing"
        + job g/parent
            children: ["g/child"]
            running: true
            schedule_conf: "60"
            schedule_type: "FIX_RATE"
            component: none → sha256:bbbbbbbbbbbb, uploaded from new.wasm
        + job g/child
            glue_type: "BEAN"
            handler: "demoJobHandler"
        3 to create, 0 to change, 0 to delete, 1 unchanged
        > CreateGroup(GroupDoc { app_name: "billing", title: Some("Billing"), address_type: "AUTO", addresses: [], max_concurrent_runs: 0 })
        > PutJob { id: None, doc: …
        > PutJob { id: None, doc: …
        > SetChildren { key: "g/parent" }
        > Upload { key: "g/parent" }
        > Start { key: "g/parent" }
    "#]],
    );
}

#[test]
fn a_change_names_each_field_and_swapped_children_are_set_after_every_put() {
    let (mut a, mut b) = (job("g/a"), job("g/b"));
    a.children = vec!["g/b".into()];
    let current = admin(vec![current_job(1, a.clone()), current_job(2, b.clone())]);
    // The file turns a→b into b→a and changes a's timeout.
    a.children.clear();
    a.timeout_secs = 30;
    b.children = vec!["g/a".into()];
    check(
        &document(vec![a, b]),
        &current,
        false,
        expect![[r#"
        ~ job g/a
            timeout_secs: (default) → 30
            children: "g/b" → ""
        ~ job g/b
            children: "" → "g/a"
        0 to create, 2 to change, 0 to delete, 1 unchanged
        > PutJob { id: Some(1), doc: …
        > SetChildren { key: "g/a" }
        > SetChildren { key: "g/b" }
    "#]],
    );
}

#[test]
fn a_component_held_in_the_history_is_activated_else_uploaded_else_refused() {
    let mut have = job("g/j");
    have.component = Some(ComponentRef { path: None, sha256: Some(SHA_A.into()) });
    let mut current = admin(vec![CurrentJob {
        id: 3,
        doc: have.clone(),
        versions: vec![(1, SHA_B.into()), (2, SHA_A.into())],
    }]);
    let mut rollback = have.clone();
    rollback.component = Some(ComponentRef { path: None, sha256: Some(SHA_B.into()) });
    check(
        &document(vec![rollback.clone()]),
        &current,
        false,
        expect![[r#"
        ~ job g/j
            component: sha256:aaaaaaaaaaaa → sha256:bbbbbbbbbbbb, version 1 activated
        0 to create, 1 to change, 0 to delete, 1 unchanged
        > Activate { key: "g/j", version: 1 }
    "#]],
    );
    current.jobs[0].versions = vec![(2, SHA_A.into())];
    check(
        &document(vec![rollback]),
        &current,
        false,
        expect![[r#"
        refused: job `g/j`: component sha256:bbbbbbbbbbbb is not among the job's versions here; give its `path`
    "#]],
    );
    let mut upload = have.clone();
    upload.component = Some(ComponentRef { path: Some("new.wasm".into()), sha256: None });
    check(
        &document(vec![upload.clone()]),
        &current,
        false,
        expect![[r#"
        ~ job g/j
            component: sha256:aaaaaaaaaaaa → sha256:bbbbbbbbbbbb, uploaded from new.wasm
        0 to create, 1 to change, 0 to delete, 1 unchanged
        > Upload { key: "g/j" }
    "#]],
    );
    upload.component =
        Some(ComponentRef { path: Some("new.wasm".into()), sha256: Some(SHA_A.into()) });
    check(
        &document(vec![upload]),
        &current,
        false,
        expect![[r#"
        refused: job `g/j`: the file `new.wasm` has sha256 bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb, the document says aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    "#]],
    );
}

#[test]
fn a_source_job_gets_its_source_uploaded_when_the_text_differs() {
    let mut have = job("g/py");
    have.glue_type = "GLUE_PYTHON".into();
    have.source = Some("print(1)\n".into());
    let current = admin(vec![current_job(4, have.clone())]);
    check(
        &document(vec![have.clone()]),
        &current,
        false,
        expect![[r#"
        0 to create, 0 to change, 0 to delete, 2 unchanged
    "#]],
    );
    // A source read from its file compares by its text; the path is no field of the job.
    let mut from_file = have.clone();
    from_file.source_path = Some("jobs/py.py".into());
    check(
        &document(vec![from_file]),
        &current,
        false,
        expect![[r#"
        0 to create, 0 to change, 0 to delete, 2 unchanged
    "#]],
    );
    have.source = Some("print(1)\nprint(2)\n".into());
    check(
        &document(vec![have]),
        &current,
        false,
        expect![[r#"
        ~ job g/py
            source: 1 lines → 2 lines, uploaded
        0 to create, 1 to change, 0 to delete, 1 unchanged
        > Upload { key: "g/py" }
    "#]],
    );
}

#[test]
fn what_the_document_lacks_is_kept_and_listed_or_deleted_with_prune_but_groups_stay() {
    let mut current = admin(vec![current_job(5, job("g/old"))]);
    current.groups.push((2, GroupDoc::new("other")));
    current.calendars.push(CalendarDoc {
        name: "holidays".into(),
        time_zone: None,
        description: String::new(),
        excluded_dates: vec!["2026-10-01".into()],
        annual_dates: Vec::new(),
        weekdays: Vec::new(),
        daily_windows: Vec::new(),
        cron: Vec::new(),
        included_dates: Vec::new(),
    });
    current.alarms = Some(vec![(
        9,
        AlarmDoc {
            name: "ops".into(),
            url: "https://hooks.example/x".into(),
            group: None,
            secret: None,
        },
    )]);
    check(
        &document(Vec::new()),
        &current,
        false,
        expect![[r#"
        ! alarm ops
            not in the document: kept (--prune deletes it)
        ! job g/old
            not in the document: kept (--prune deletes it)
        ! calendar holidays
            not in the document: kept (--prune deletes it)
        ! group other
            not in the document: kept (groups are not deleted)
        0 to create, 0 to change, 0 to delete, 1 unchanged
    "#]],
    );
    check(
        &document(Vec::new()),
        &current,
        true,
        expect![[r#"
        - alarm ops
        - job g/old
        - calendar holidays
        ! group other
            not in the document: kept (groups are not deleted)
        0 to create, 0 to change, 3 to delete, 1 unchanged
        > DeleteAlarm { id: 9, name: "ops" }
        > DeleteJob { id: 5, key: "g/old" }
        > DeleteCalendar { name: "holidays" }
    "#]],
    );
}

#[test]
fn alarms_compare_without_their_secret_and_a_new_one_needs_it() {
    let alarm = AlarmDoc {
        name: "ops".into(),
        url: "https://hooks.example/x".into(),
        group: Some("g".into()),
        secret: None,
    };
    let mut current = admin(Vec::new());
    current.alarms = Some(vec![(9, alarm.clone())]);
    let with_secret = AlarmDoc { secret: Some("s3cret".into()), ..alarm.clone() };
    let mut doc = document(Vec::new());
    doc.alarms = vec![with_secret.clone()];
    check(
        &doc,
        &current,
        false,
        expect![[r#"
        0 to create, 0 to change, 0 to delete, 2 unchanged
    "#]],
    );
    doc.alarms = vec![AlarmDoc { url: "https://hooks.example/y".into(), ..with_secret }];
    check(
        &doc,
        &current,
        false,
        expect![[r#"
        ~ alarm ops
            url: "https://hooks.example/x" → "https://hooks.example/y"
        0 to create, 1 to change, 0 to delete, 1 unchanged
        > UpdateAlarm { id: 9, doc: AlarmDoc { name: "ops", url: "https://hooks.example/y", group: Some("g"), secret: Some("s3cret") } }
    "#]],
    );
    doc.alarms = vec![AlarmDoc { name: "new".into(), ..alarm.clone() }];
    check(
        &doc,
        &current,
        false,
        expect![[r#"
        refused: alarm `new`: a new alarm needs its `secret`
    "#]],
    );
    current.alarms = None;
    check(
        &doc,
        &current,
        false,
        expect![[r#"
        refused: the document has alarms, and this token may not read the admin's alarms (they are for admins)
    "#]],
    );
}

#[test]
fn references_to_what_exists_nowhere_are_refused() {
    type Change = fn(&mut JobDoc);
    let cases: [(&str, Change); 3] = [
        ("group", |job| job.group = "nowhere".into()),
        ("child", |job| job.children = vec!["g/nowhere".into()]),
        ("calendar", |job| job.calendar = Some("nowhere".into())),
    ];
    for (what, change) in cases {
        let mut doc = job("g/j");
        change(&mut doc);
        let refused = plan(&document(vec![doc]), &admin(Vec::new()), &BTreeMap::new(), false);
        let error = refused.expect_err(what);
        assert!(error.contains("nowhere") && error.contains(what), "{what}: {error}");
    }
    // Two jobs of one name in a group: refused only when the document names them.
    let twice = admin(vec![current_job(1, job("g/dup")), current_job(2, job("g/dup"))]);
    let error = plan(&document(vec![job("g/dup")]), &twice, &BTreeMap::new(), false);
    assert!(error.expect_err("named").contains("more than one job"));
    assert!(plan(&document(vec![job("g/other")]), &twice, &BTreeMap::new(), false).is_ok());
}

#[test]
fn documents_read_back_as_they_were_written_in_both_formats() {
    let mut nightly = job("g/nightly");
    nightly.schedule_type = "CRON".into();
    nightly.schedule_conf = "0 0 2 * * ?".into();
    nightly.running = true;
    nightly.param = "{\"day\": \"今天\"}\nline two".into();
    nightly.children = vec!["g/py".into()];
    nightly.fuel_limit = Some(1_000_000);
    nightly.component =
        Some(ComponentRef { path: Some("c/x.wasm".into()), sha256: Some(SHA_A.into()) });
    let mut py = job("g/py");
    py.glue_type = "GLUE_PYTHON".into();
    py.source = Some("def run(ctx):\n    return \"ok\"\n".into());
    let mut doc = document(vec![nightly, py]);
    doc.alarms.push(AlarmDoc {
        name: "ops".into(),
        url: "https://h/x".into(),
        group: None,
        secret: None,
    });
    for format in [Format::Toml, Format::Yaml] {
        let text = render(&doc, format).expect("renders");
        assert_eq!(parse(&text, format).as_ref(), Ok(&doc), "{format:?}:\n{text}");
    }
    // Defaults are left out.
    let text = render(&doc, Format::Toml).expect("renders");
    assert!(!text.contains("misfire_strategy") && !text.contains("retry_count"), "{text}");
}

#[test]
fn documents_that_cannot_be_applied_are_refused_with_the_reason() {
    let cases = [
        ("version = 2\n", "version: this wasmjob reads documents of version 1, not 2"),
        ("", "missing field `version`"),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\ncolour = \"red\"\n",
            "jobs[0].colour: unknown field `colour`, expected one of `group`",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\n",
            "job `g/a` is in the document twice",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\nchildren = [\"b\"]\n",
            "job `g/a`: child `b` is not `group/name`",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\nglue_type = \"BEAN\"\nhandler = \"h\"\n[jobs.component]\nsha256 = \"x\"\n",
            "job `g/a`: `component` is for GLUE_WASM jobs",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\nsource = \"print(1)\"\n",
            "job `g/a`: `source` and `source_path` are for GLUE_PYTHON and GLUE_JAVASCRIPT jobs",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\nglue_type = \"GLUE_PYTHON\"\nsource = \"x\"\nsource_path = \"a.py\"\n",
            "job `g/a`: give `source` or `source_path`, not both",
        ),
        (
            "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\n[jobs.component]\nsha256 = \"ABC\"\n",
            "job `g/a`: component sha256 `ABC` is not 64 lowercase hex digits",
        ),
    ];
    for (text, expected) in cases {
        let error = parse(text, Format::Toml).expect_err(text);
        assert!(error.contains(expected), "{text:?}: {error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }
    let error = parse(
        "version = 1\n[[jobs]]\ngroup = \"g\"\nname = \"a\"\ncolour = \"red\"\n",
        Format::Toml,
    );
    assert!(error.expect_err("unknown").ends_with("(line 5, column 1)"));
}

#[test]
fn the_json_schema_describes_the_document_with_local_references() {
    let schema = json_schema();
    let text = schema.to_string();
    assert!(!text.contains("#/components/"), "{text}");
    for name in ["JobDoc", "GroupDoc", "CalendarDoc", "AlarmDoc", "ComponentRef"] {
        assert!(schema["$defs"][name].is_object(), "{name} in {text}");
    }
    assert_eq!(schema["required"], serde_json::json!(["version"]));
    assert_eq!(schema["$defs"]["JobDoc"]["required"], serde_json::json!(["group", "name"]));
    assert_eq!(schema["$defs"]["JobDoc"]["additionalProperties"], serde_json::json!(false));
}

#[test]
fn the_fields_read_from_the_api_are_the_documents() {
    let fields = fields_of("JobDoc");
    assert_eq!(fields.len(), 33, "{fields:?}");
    assert!(fields.contains("running") && fields.contains("description") && !fields.contains("id"));
    assert!(fields_of("CalendarDoc").contains("included_dates"));
}
