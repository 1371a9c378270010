//! The conversion of XXL-JOB's rows into a document, case by case.

use super::*;
use crate::client_cli::manifest::CurrentJob;
use crate::storage::xxl_job::{XxlGlue, XxlGroup, XxlJob, XxlLayout};

fn group(id: i64, app_name: &str) -> XxlGroup {
    XxlGroup {
        id,
        app_name: app_name.to_owned(),
        title: "示例执行器".to_owned(),
        address_type: 0,
        address_list: String::new(),
    }
}

fn job(id: i64, name: &str, glue_type: &str) -> XxlJob {
    XxlJob {
        id,
        job_group: 1,
        name: name.to_owned(),
        author: "XXL".to_owned(),
        alarm_email: String::new(),
        schedule_type: "CRON".to_owned(),
        schedule_conf: "0 0 0 * * ? *".to_owned(),
        misfire_strategy: "DO_NOTHING".to_owned(),
        route_strategy: "FIRST".to_owned(),
        handler: if glue_type == "BEAN" { "demoJobHandler".to_owned() } else { String::new() },
        param: String::new(),
        block_strategy: "SERIAL_EXECUTION".to_owned(),
        timeout_secs: 0,
        retry_count: 0,
        glue_type: glue_type.to_owned(),
        glue_source: String::new(),
        child_job_ids: String::new(),
        trigger_status: 1,
    }
}

fn database(groups: Vec<XxlGroup>, jobs: Vec<XxlJob>) -> XxlDatabase {
    XxlDatabase { layout: XxlLayout::V2_3, groups, jobs, glue_history: Vec::new() }
}

fn find<'a>(converted: &'a Converted, name: &str) -> &'a JobDoc {
    converted.document.jobs.iter().find(|job| job.name == name).expect(name)
}

#[test]
fn a_bean_job_keeps_every_field_and_its_handler_and_children_by_name() {
    let mut parent = job(1, "测试任务1", "BEAN");
    parent.alarm_email = " ops@example.com ".to_owned();
    parent.route_strategy = "SHARDING_BROADCAST".to_owned();
    parent.block_strategy = "COVER_EARLY".to_owned();
    parent.timeout_secs = 30;
    parent.retry_count = 3;
    parent.param = "a=1".to_owned();
    parent.child_job_ids = "2, 2,99".to_owned();
    let mut child = job(2, "child", "BEAN");
    child.schedule_type = "NONE".to_owned();
    child.schedule_conf = String::new();
    let converted =
        convert(&database(vec![group(1, "billing")], vec![parent, child]), &Current::default());
    let parent = find(&converted, "测试任务1");
    assert_eq!(
        (parent.glue_type.as_str(), parent.handler.as_deref(), parent.running),
        ("BEAN", Some("demoJobHandler"), true)
    );
    assert_eq!(
        (parent.schedule_type.as_str(), parent.schedule_conf.as_str()),
        ("CRON", "0 0 0 * * ? *")
    );
    assert_eq!(
        (parent.route_strategy.as_str(), parent.block_strategy.as_str()),
        ("SHARDING_BROADCAST", "COVER_EARLY")
    );
    assert_eq!((parent.timeout_secs, parent.retry_count, parent.param.as_str()), (30, 3, "a=1"));
    assert_eq!(parent.alarm_email.as_deref(), Some("ops@example.com"));
    assert_eq!(
        (parent.owner.as_str(), parent.description.as_str()),
        ("XXL", "Imported from XXL-JOB job 1.")
    );
    assert_eq!(parent.children, vec!["billing/child".to_owned()]);
    // A job without a schedule is not started, whatever XXL-JOB's status says.
    assert!(!find(&converted, "child").running);
    assert_eq!(
        converted.notes,
        vec!["job billing/测试任务1: child job `99` is not among XXL-JOB's jobs: left out"]
    );
    let group = &converted.document.groups[0];
    assert_eq!((group.app_name.as_str(), group.title.as_deref()), ("billing", Some("示例执行器")));
}

#[test]
fn sources_that_cannot_run_here_are_imported_stopped_with_the_reason() {
    for glue in ["GLUE_GROOVY", "GLUE_SHELL", "GLUE_PHP", "GLUE_POWERSHELL", "GLUE_PYTHON2"] {
        let mut shell = job(7, "cleanup", glue);
        shell.glue_source = "#!/bin/bash\necho hi".to_owned();
        let converted = convert(&database(vec![group(1, "g")], vec![shell]), &Current::default());
        let doc = find(&converted, "cleanup");
        assert_eq!(
            (doc.glue_type.as_str(), doc.running, doc.handler.as_deref()),
            ("GLUE_WASM", false, None)
        );
        assert!(
            doc.description.starts_with("Imported from XXL-JOB job 7. Stopped: its "),
            "{}",
            doc.description
        );
        assert!(doc.description.contains(glue), "{}", doc.description);
        assert_eq!(recorded_id(&doc.description), Some(7));
        assert_eq!(converted.notes.len(), 1, "{glue}: {:?}", converted.notes);
    }
    let mut no_handler = job(8, "bean", "BEAN");
    no_handler.handler = " ".to_owned();
    let converted = convert(&database(vec![group(1, "g")], vec![no_handler]), &Current::default());
    assert!(find(&converted, "bean").description.contains("a BEAN job with no handler name"));
}

#[test]
fn python_and_node_sources_are_built_with_their_history_once() {
    let mut python = job(3, "py", "GLUE_PYTHON");
    python.glue_source = "print('v3')".to_owned();
    let mut node = job(4, "js", "GLUE_NODEJS");
    node.glue_source = "console.log(1)".to_owned();
    node.trigger_status = 0;
    let mut db = database(vec![group(1, "g")], vec![python, node]);
    let glue = |id, job_id, glue_type: &str, source: &str| XxlGlue {
        id,
        job_id,
        glue_type: glue_type.to_owned(),
        glue_source: source.to_owned(),
        glue_remark: "v".to_owned(),
    };
    db.glue_history = vec![
        glue(1, 3, "GLUE_PYTHON", "print('v1')"),
        glue(2, 3, "GLUE_SHELL", "echo"),
        glue(3, 3, "GLUE_PYTHON", "print('v2')"),
        glue(4, 3, "GLUE_PYTHON", "print('v3')"),
    ];
    let converted = convert(&db, &Current::default());
    assert_eq!(
        converted.builds,
        vec![
            Build {
                key: "g/py".into(),
                sources: vec!["print('v1')".into(), "print('v2')".into(), "print('v3')".into()],
                start: true,
            },
            Build { key: "g/js".into(), sources: vec!["console.log(1)".into()], start: false },
        ]
    );
    let doc = find(&converted, "js");
    assert_eq!(
        (doc.glue_type.as_str(), doc.running, doc.source.as_deref()),
        ("GLUE_JAVASCRIPT", false, None)
    );

    // Imported before: built, it is started and nothing is built again; built up to v2, only
    // v3 goes up; refused before with the same source, it is left as it is.
    let have = |id, source: Option<&str>, description: &str| {
        let mut doc = JobDoc::new("g", "py");
        doc.glue_type = "GLUE_PYTHON".into();
        doc.source = source.map(str::to_owned);
        doc.description = description.to_owned();
        Current { jobs: vec![CurrentJob { id, doc, versions: Vec::new() }], ..Current::default() }
    };
    let built = convert(&db, &have(50, Some("print('v3')"), "Imported from XXL-JOB job 3."));
    assert_eq!(built.builds.iter().filter(|b| b.key == "g/py").count(), 0);
    assert!(find(&built, "py").running);
    let older = convert(&db, &have(50, Some("print('v2')"), "Imported from XXL-JOB job 3."));
    assert_eq!(older.builds[0].sources, vec!["print('v3')".to_owned()]);
    let refused = format!(
        "Imported from XXL-JOB job 3. Stopped: its GLUE_PYTHON source did not build (source sha256:{}): 422",
        digest("print('v3')")
    );
    let again = convert(&db, &have(50, None, &refused));
    assert_eq!(again.builds.iter().filter(|b| b.key == "g/py").count(), 0);
    assert_eq!(find(&again, "py").description, refused);
}

#[test]
fn jobs_are_found_by_their_recorded_id_and_renamed_and_names_twice_get_their_id() {
    let db = database(
        vec![group(1, "g")],
        vec![job(1, "report", "BEAN"), job(2, "report", "BEAN"), job(3, " ", "BEAN")],
    );
    let mut renamed = JobDoc::new("g", "old name");
    renamed.description = "Imported from XXL-JOB job 1.".into();
    let current = Current {
        jobs: vec![CurrentJob { id: 40, doc: renamed, versions: Vec::new() }],
        ..Current::default()
    };
    let converted = convert(&db, &current);
    let names: Vec<&str> = converted.document.jobs.iter().map(|job| job.name.as_str()).collect();
    assert_eq!(names, ["report (xxl-job 1)", "report (xxl-job 2)", "xxl-job 3"]);
    assert_eq!(converted.renames.len(), 1);
    assert_eq!(
        (converted.renames[0].0, converted.renames[0].1.name.as_str()),
        (40, "report (xxl-job 1)")
    );
}

#[test]
fn groups_entered_by_hand_keep_their_addresses() {
    let mut manual = group(1, "billing");
    manual.address_type = 1;
    manual.address_list = "http://10.0.0.1:9999/, http://10.0.0.2:9999".to_owned();
    let mut empty = group(2, "empty");
    empty.address_type = 1;
    empty.title = "empty".to_owned();
    let converted = convert(&database(vec![manual, empty], Vec::new()), &Current::default());
    let [billing, empty] = &converted.document.groups[..] else { panic!("two groups") };
    assert_eq!(billing.address_type, "MANUAL");
    assert_eq!(billing.addresses, ["http://10.0.0.1:9999", "http://10.0.0.2:9999"]);
    assert_eq!((empty.address_type.as_str(), empty.title.as_deref()), ("AUTO", None));
    assert_eq!(converted.notes.len(), 1);
}
