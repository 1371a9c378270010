//! `wasmjob import xxl-job` end to end: XXL-JOB's tables of each layout (2.2, 2.3 to 3.4, 3.5),
//! written here from XXL-JOB's published schema, in a MariaDB database of their own, with rows as
//! an XXL-JOB admin leaves them; imported into a real `wasmjob standalone`, compared field by
//! field, imported again (nothing changes), then changed in XXL-JOB and imported once more.
//!
//! It needs MySQL or MariaDB: `WASMJOB_TEST_MYSQL_URL` names a server and a user who may create
//! databases (`mysql://wasmjob:wasmjob@127.0.0.1:3306`); without it the tests skip, saying so.

use serde_json::Value;
use sqlx::{Connection, Executor, MySqlConnection};

use crate::cli::Client;
use crate::files::find;
use crate::support::standalone::spawn_standalone;

/// The server, or `None` (and a line saying so) when the tests are to skip.
fn server() -> Option<String> {
    #[expect(clippy::disallowed_methods, reason = "test configuration")]
    let url = std::env::var("WASMJOB_TEST_MYSQL_URL");
    match url {
        Ok(url) => Some(url.trim_end_matches('/').to_owned()),
        Err(_) => {
            eprintln!("WASMJOB_TEST_MYSQL_URL is unset: skipping the XXL-JOB import from MySQL");
            None
        }
    }
}

/// A fresh database on `server` holding `statements`; its URL. Dropped first if a run before
/// left it.
fn database(server: &str, name: &str, statements: &[&str]) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut connection = MySqlConnection::connect(server).await.unwrap();
        connection.execute(format!("drop database if exists {name}").as_str()).await.unwrap();
        connection
            .execute(format!("create database {name} character set utf8mb4").as_str())
            .await
            .unwrap();
        connection.execute(format!("use {name}").as_str()).await.unwrap();
        for statement in statements {
            connection.execute(*statement).await.unwrap();
        }
        connection.close().await.unwrap();
    });
    format!("{server}/{name}")
}

fn execute(url: &str, statement: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut connection = MySqlConnection::connect(url).await.unwrap();
        connection.execute(statement).await.unwrap();
        connection.close().await.unwrap();
    });
}

/// `xxl_job_group` as 2.2 to 3.4 have it (`title`) or as 3.5 has it (`name`).
fn group_table(title: &str) -> String {
    format!(
        "CREATE TABLE `xxl_job_group` (
          `id` int(11) NOT NULL AUTO_INCREMENT,
          `app_name` varchar(64) NOT NULL,
          `{title}` varchar(64) NOT NULL,
          `address_type` tinyint(4) NOT NULL DEFAULT '0',
          `address_list` text,
          `update_time` datetime DEFAULT NULL,
          PRIMARY KEY (`id`)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
    )
}

/// `xxl_job_info`'s columns from `author` on, the same in every layout.
const INFO_COMMON: &str = "
  `author` varchar(64) DEFAULT NULL,
  `alarm_email` varchar(255) DEFAULT NULL,
  `executor_route_strategy` varchar(50) DEFAULT NULL,
  `executor_handler` varchar(255) DEFAULT NULL,
  `executor_param` varchar(512) DEFAULT NULL,
  `executor_block_strategy` varchar(50) DEFAULT NULL,
  `executor_timeout` int(11) NOT NULL DEFAULT '0',
  `executor_fail_retry_count` int(11) NOT NULL DEFAULT '0',
  `glue_type` varchar(50) NOT NULL,
  `glue_source` mediumtext,
  `glue_remark` varchar(128) DEFAULT NULL,
  `glue_updatetime` datetime DEFAULT NULL,
  `child_jobid` varchar(255) DEFAULT NULL,
  `trigger_status` tinyint(4) NOT NULL DEFAULT '0',
  `trigger_last_time` bigint(13) NOT NULL DEFAULT '0',
  `trigger_next_time` bigint(13) NOT NULL DEFAULT '0',
  `add_time` datetime DEFAULT NULL,
  `update_time` datetime DEFAULT NULL,
  PRIMARY KEY (`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

const LOGGLUE: &str = "CREATE TABLE `xxl_job_logglue` (
  `id` int(11) NOT NULL AUTO_INCREMENT,
  `job_id` int(11) NOT NULL,
  `glue_type` varchar(50) DEFAULT NULL,
  `glue_source` mediumtext,
  `glue_remark` varchar(128) NOT NULL,
  `add_time` datetime DEFAULT NULL,
  `update_time` datetime DEFAULT NULL,
  PRIMARY KEY (`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// A layout's statements: its tables, two groups, four jobs and a GLUE history.
fn tables(layout: &str) -> Vec<String> {
    let (title, info, name) = match layout {
        "2.2" => (
            "title",
            "`job_group` int(11) NOT NULL, `job_cron` varchar(128) NOT NULL, `job_desc` varchar(255) NOT NULL,",
            "job_desc",
        ),
        "3.5" => (
            "name",
            "`job_group` int(11) NOT NULL, `name` varchar(255) NOT NULL, `schedule_type` varchar(50) NOT NULL DEFAULT 'NONE', `schedule_conf` varchar(128) DEFAULT NULL, `misfire_strategy` varchar(50) NOT NULL DEFAULT 'DO_NOTHING',",
            "name",
        ),
        _ => (
            "title",
            "`job_group` int(11) NOT NULL, `job_desc` varchar(255) NOT NULL, `schedule_type` varchar(50) NOT NULL DEFAULT 'NONE', `schedule_conf` varchar(128) DEFAULT NULL, `misfire_strategy` varchar(50) NOT NULL DEFAULT 'DO_NOTHING',",
            "job_desc",
        ),
    };
    let schedule = |cron: &str, misfire: &str| match layout {
        "2.2" => (String::from("`job_cron`"), format!("'{cron}'")),
        _ => (
            String::from("`schedule_type`, `schedule_conf`, `misfire_strategy`"),
            if cron.is_empty() {
                format!("'NONE', NULL, '{misfire}'")
            } else {
                format!("'CRON', '{cron}', '{misfire}'")
            },
        ),
    };
    let job = |id: i64, group: i64, desc: &str, cron: &str, misfire: &str, rest: &str| {
        let (columns, values) = schedule(cron, misfire);
        format!(
            "INSERT INTO xxl_job_info (`id`, `job_group`, `{name}`, {columns}, `author`, `alarm_email`,
              `executor_route_strategy`, `executor_handler`, `executor_param`, `executor_block_strategy`,
              `executor_timeout`, `executor_fail_retry_count`, `glue_type`, `glue_source`, `glue_remark`,
              `child_jobid`, `trigger_status`, `add_time`, `update_time`)
             VALUES ({id}, {group}, '{desc}', {values}, {rest}, NOW(), NOW())"
        )
    };
    vec![
        group_table(title),
        format!("CREATE TABLE `xxl_job_info` (`id` int(11) NOT NULL AUTO_INCREMENT, {info} {INFO_COMMON}"),
        LOGGLUE.to_owned(),
        format!(
            "INSERT INTO xxl_job_group (`id`, `app_name`, `{title}`, `address_type`, `address_list`, `update_time`) VALUES
              (1, 'xxl-job-executor-sample', '示例执行器', 0, NULL, NOW()),
              (2, 'billing', 'Billing', 1, 'http://10.0.0.7:9999/,http://10.0.0.8:9999/', NOW())"
        ),
        job(1, 1, "测试任务1 📦", "0 0 0 * * ? *", "DO_NOTHING",
            "'XXL', 'ops@example.com', 'ROUND', 'demoJobHandler', 'day=1', 'DISCARD_LATER', 60, 2, 'BEAN', '', 'GLUE代码初始化', '2', 1"),
        job(2, 2, "settle", "", "DO_NOTHING",
            "'李伟', '', 'SHARDING_BROADCAST', 'settleHandler', '', 'SERIAL_EXECUTION', 0, 0, 'BEAN', '', '', '', 0"),
        job(3, 1, "cleanup", "0 */5 * * * ?", "FIRE_ONCE_NOW",
            "'XXL', '', 'FIRST', '', '', 'SERIAL_EXECUTION', 0, 0, 'GLUE_SHELL', '#!/bin/bash\\necho cleanup', 'v2', '', 1"),
        job(4, 1, "script", "0 0 3 * * ?", "DO_NOTHING",
            "'XXL', '', 'FIRST', '', '', 'SERIAL_EXECUTION', 0, 0, 'GLUE_PYTHON', 'print(\"v2\")', 'v2', '', 1"),
        "INSERT INTO xxl_job_logglue (`job_id`, `glue_type`, `glue_source`, `glue_remark`, `add_time`) VALUES
          (3, 'GLUE_SHELL', '#!/bin/bash\\necho v1', 'v1', NOW()),
          (4, 'GLUE_PYTHON', 'print(\"v1\")', 'v1', NOW())"
            .to_owned(),
    ]
}

fn imports_each_field_once(layout: &str) {
    let Some(server) = server() else { return };
    let name = format!("xxl_import_{}_{}", layout.replace('.', "_"), std::process::id());
    let statements = tables(layout);
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    let url = database(&server, &name, &statements);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (_standalone, admin_url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let cli = Client { url: admin_url, token };

    // A dry run says what it would do and does nothing.
    let dry = cli.ok(&["import", "xxl-job", "--from", &url, "--dry-run"]);
    assert!(
        dry.contains(&format!(
            "XXL-JOB {} tables: 2 groups, 4 jobs",
            match layout {
                "2.2" => "2.2",
                "3.5" => "3.5",
                _ => "2.3 to 3.4",
            }
        )),
        "{dry}"
    );
    assert!(dry.contains("+ job xxl-job-executor-sample/测试任务1 📦"), "{dry}");
    assert!(
        dry.contains("note: job xxl-job-executor-sample/cleanup: stopped: its GLUE_SHELL source"),
        "{dry}"
    );
    assert_eq!(cli.json(&["job", "list"]), Value::Array(Vec::new()));

    let imported = cli.ok(&["import", "xxl-job", "--from", &url]);
    let jobs = cli.json(&["job", "list"]);
    let groups = cli.json(&["group", "list"]);
    let billing = groups.as_array().unwrap().iter().find(|g| g["app_name"] == "billing").unwrap();
    assert_eq!(billing["address_type"], "MANUAL");
    let sample = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["app_name"] == "xxl-job-executor-sample")
        .unwrap();
    assert_eq!(sample["title"], "示例执行器");

    let first = find(&jobs, "测试任务1 📦");
    let settle = find(&jobs, "settle");
    let expected = [
        ("group_id", sample["id"].clone()),
        ("glue_type", "BEAN".into()),
        ("handler", "demoJobHandler".into()),
        ("schedule_type", "CRON".into()),
        ("schedule_conf", "0 0 0 * * ? *".into()),
        ("misfire_strategy", "DO_NOTHING".into()),
        ("route_strategy", "ROUND".into()),
        ("block_strategy", "DISCARD_LATER".into()),
        ("timeout_secs", 60.into()),
        ("retry_count", 2.into()),
        ("param", "day=1".into()),
        ("alarm_email", "ops@example.com".into()),
        ("owner", "XXL".into()),
        ("description", "Imported from XXL-JOB job 1.".into()),
        ("child_job_ids", serde_json::json!([settle["id"]])),
        ("running", true.into()),
    ];
    for (field, value) in expected {
        assert_eq!(first[field], value, "{layout}: {field} of {first}");
    }
    assert_eq!(
        (settle["owner"].as_str(), settle["route_strategy"].as_str()),
        (Some("李伟"), Some("SHARDING_BROADCAST"))
    );
    assert_eq!(
        (settle["group_id"].clone(), settle["running"].clone()),
        (billing["id"].clone(), false.into())
    );
    let cleanup = find(&jobs, "cleanup");
    assert_eq!(
        (cleanup["glue_type"].as_str(), cleanup["running"].as_bool()),
        (Some("GLUE_WASM"), Some(false))
    );
    assert!(
        cleanup["description"]
            .as_str()
            .unwrap()
            .contains("Stopped: its GLUE_SHELL source cannot run here")
    );
    if layout != "2.2" {
        assert_eq!(cleanup["misfire_strategy"], "FIRE_ONCE_NOW");
    }
    // The Python script is XXL-JOB's kind (a plain script, not a handler of the job world): it
    // does not build, and the job stays stopped with the builder's reason.
    let script = find(&jobs, "script");
    assert_eq!(
        (script["glue_type"].as_str(), script["running"].as_bool()),
        (Some("GLUE_PYTHON"), Some(false))
    );
    assert!(script["description"].as_str().unwrap().contains("did not build"), "{script}");
    assert!(imported.contains("job xxl-job-executor-sample/script: stopped"), "{imported}");

    // Again: nothing to do.
    let again = cli.ok(&["import", "xxl-job", "--from", &url]);
    assert!(again.contains("0 to create, 0 to change, 0 to delete"), "{again}");
    assert!(!again.contains("build job"), "{again}");
    // Job by job: what stays as it is is listed too.
    assert!(again.contains("= job billing/settle\n"), "{again}");
    assert_eq!(cli.json(&["job", "list"]), jobs);

    // Renamed and changed in XXL-JOB: the same job here follows, by its recorded id.
    let rename = match layout {
        "3.5" => "UPDATE xxl_job_info SET name = 'renamed', executor_timeout = 90 WHERE id = 1",
        _ => "UPDATE xxl_job_info SET job_desc = 'renamed', executor_timeout = 90 WHERE id = 1",
    };
    execute(&url, rename);
    let changed = cli.ok(&["import", "xxl-job", "--from", &url]);
    assert!(changed.contains("renamed to xxl-job-executor-sample/renamed"), "{changed}");
    let after = cli.json(&["job", "list"]);
    assert_eq!(after.as_array().map(Vec::len), Some(4), "{after}");
    let renamed = find(&after, "renamed");
    assert_eq!(
        (renamed["id"].clone(), renamed["timeout_secs"].clone()),
        (first["id"].clone(), 90.into())
    );
    execute(&server, &format!("drop database {name}"));
}

#[test]
fn an_xxl_job_2_2_database_imports_each_field_once() {
    imports_each_field_once("2.2");
}

#[test]
fn an_xxl_job_2_3_to_3_4_database_imports_each_field_once() {
    imports_each_field_once("2.4");
}

#[test]
fn an_xxl_job_3_5_database_imports_each_field_once() {
    imports_each_field_once("3.5");
}

/// A `GLUE_PYTHON` job whose scripts are handlers of the job world (as a team that moved its
/// scripts over would have them): its history becomes its versions, oldest first, the current
/// one active, and the job is started as XXL-JOB schedules it. Needs the builders too.
#[test]
fn python_handlers_from_xxl_job_become_versions_in_order() {
    let Some(server) = server() else { return };
    let Some(builders) = crate::support::builders::builders_dir() else { return };
    let first = crate::support::builders::sample_source("python/hello.py");
    let second = first.replace("hello, ", "hi, ");
    assert_ne!(first, second);
    let quoted = |source: &str| source.replace('\\', "\\\\").replace('\'', "\\'");
    let mut statements = tables("2.4");
    statements.truncate(4);
    statements.push(format!(
        "INSERT INTO xxl_job_info (`id`, `job_group`, `job_desc`, `schedule_type`, `schedule_conf`,
          `misfire_strategy`, `executor_route_strategy`, `executor_block_strategy`, `glue_type`,
          `glue_source`, `glue_remark`, `trigger_status`)
         VALUES (9, 1, 'greeter', 'CRON', '0 0 3 * * ?', 'DO_NOTHING', 'FIRST', 'SERIAL_EXECUTION',
          'GLUE_PYTHON', '{}', 'hi', 1)",
        quoted(&second)
    ));
    statements.push(format!(
        "INSERT INTO xxl_job_logglue (`job_id`, `glue_type`, `glue_source`, `glue_remark`)
         VALUES (9, 'GLUE_PYTHON', '{}', 'hello')",
        quoted(&first)
    ));
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    let name = format!("xxl_import_python_{}", std::process::id());
    let url = database(&server, &name, &statements);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    std::os::unix::fs::symlink(&builders, data_dir.join("builders")).unwrap();
    let (_standalone, admin_url) = spawn_standalone(&data_dir);
    let token = std::fs::read_to_string(data_dir.join("admin-token")).unwrap().trim().to_owned();
    let cli = Client { url: admin_url, token };

    let imported = cli.ok(&["import", "xxl-job", "--from", &url]);
    assert!(
        imported.contains("build job xxl-job-executor-sample/greeter: 2 source versions"),
        "{imported}"
    );
    let jobs = cli.json(&["job", "list"]);
    let greeter = find(&jobs, "greeter");
    assert_eq!(
        (greeter["glue_type"].as_str(), greeter["running"].as_bool()),
        (Some("GLUE_PYTHON"), Some(true)),
        "{greeter}"
    );
    let id = greeter["id"].to_string();
    let versions = cli.json(&["version", "list", &id]);
    let versions = versions.as_array().unwrap();
    assert_eq!(versions.len(), 2, "{versions:?}");
    let mut numbers: Vec<i64> = versions.iter().filter_map(|v| v["version"].as_i64()).collect();
    numbers.sort();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(versions.iter().find(|v| v["active"] == true).unwrap()["version"], 2);
    // The active version is XXL-JOB's current source.
    let exported: toml::Table = toml::from_str(&cli.ok(&["export"])).unwrap();
    let source = exported["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|job| job["name"].as_str() == Some("greeter")))
        .and_then(|job| job["source"].as_str().map(str::to_owned));
    assert_eq!(source.as_deref(), Some(second.as_str()));

    let again = cli.ok(&["import", "xxl-job", "--from", &url]);
    assert!(!again.contains("build job"), "{again}");
    assert!(again.contains("0 to create, 0 to change, 0 to delete"), "{again}");
    execute(&server, &format!("drop database {name}"));
}

/// A database that cannot be reached, or is not XXL-JOB's, stops the import before anything is
/// read from or written to the admin, with the reason on one line.
#[test]
fn a_database_that_is_unreachable_or_not_xxl_jobs_is_refused_with_the_reason() {
    let nowhere = Client { url: "http://127.0.0.1:1".to_owned(), token: "unused".to_owned() };
    let refused =
        nowhere.fails(&["import", "xxl-job", "--from", "mysql://root@127.0.0.1:1/xxl_job"], 1);
    assert!(refused.contains("connecting to the XXL-JOB database"), "{refused}");
    let Some(server) = server() else { return };
    let name = format!("xxl_import_empty_{}", std::process::id());
    let url = database(&server, &name, &["CREATE TABLE unrelated (id int)"]);
    let refused = nowhere.fails(&["import", "xxl-job", "--from", &url], 1);
    assert!(refused.contains("has no table xxl_job_info"), "{refused}");
    execute(&server, &format!("drop database {name}"));
}
