//! Rolling upgrades and readiness: an earlier build's database and executor data opened by this
//! build, admins started together on one database, an admin older than its database, and
//! `/readyz` of the admin and the executor as what they depend on comes and goes.
//!
//! The earlier build's files are fixtures under `tests/fixtures/upgrade/<commit>/`, written by
//! `tests/fixtures/upgrade/make.sh` with that build (its README says how); they are copied to a
//! temp dir before they are opened, never changed in place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row;
use wasmjob::admin::{self, AppState, router};
use wasmjob::executor;
use wasmjob::storage::Db;
use wasmjob::storage::testing::{
    create_postgres_database, drop_postgres_database, fetch_all, postgres_database,
};

use crate::support::app::{admin_config, executor_config};
use crate::support::cluster::{Proc, free_port};
use crate::support::{ACCESS_TOKEN, ADMIN_TOKEN, Api, Backend, backends, wait_until};

/// The fixtures of the build before rolling upgrades were supported.
const FIXTURE: &str = "tests/fixtures/upgrade/d01d270";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE)
}

/// Copies the directory `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// `GET url` without credentials: the status and the body as JSON (or text), or `None` while
/// nothing answers there.
async fn probe(url: &str) -> Option<(StatusCode, Value)> {
    let reply = reqwest::get(url).await.ok()?;
    let status = reply.status();
    let text = reply.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

/// The upgrade: the SQLite database and the executor data directory an earlier build left when
/// it was killed (one run running, one waiting behind it in the executor's queue) are opened by
/// this build's admin and executor, as real processes. The migrations this build adds are
/// applied; the runs that were unfinished end (their executor is gone, and the executor's
/// journal counts them as cut short); the old jobs run again, on their old versions.
#[tokio::test]
async fn an_earlier_builds_database_and_executor_data_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_dir(), dir.path());
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("fixture.json")).unwrap())
            .unwrap();

    let admin_port = free_port();
    let database_url = format!("sqlite:{}", dir.path().join("wasmjob.db").display());
    let admin_args = [
        "admin",
        "--listen",
        &format!("127.0.0.1:{admin_port}"),
        "--database-url",
        &database_url,
        "--admin-token",
        ADMIN_TOKEN,
        "--access-token",
        ACCESS_TOKEN,
        "--heartbeat-secs",
        "1",
    ];
    let mut admin = Proc::outside_cluster(dir.path(), "admin", admin_port, strings(&admin_args));
    admin.start("").await;
    let executor_port = free_port();
    let executor_url = format!("http://127.0.0.1:{executor_port}");
    let executor_dir = dir.path().join("executor").display().to_string();
    let executor_args = [
        "executor",
        "--listen",
        &format!("127.0.0.1:{executor_port}"),
        "--address",
        &executor_url,
        "--admin-url",
        &admin.url(),
        "--app-name",
        "default",
        "--data-dir",
        &executor_dir,
        "--access-token",
        ACCESS_TOKEN,
        "--heartbeat-secs",
        "1",
    ];
    let mut executor =
        Proc::outside_cluster(dir.path(), "executor", executor_port, strings(&executor_args));
    executor.start("").await;
    let api = Api {
        http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap(),
        base: admin.url(),
        token: ADMIN_TOKEN.to_owned(),
    };
    api.wait_for_executors(1).await;

    // The runs the earlier build left unfinished end. Their executor is gone, so the sweep
    // ends them: `timed_out` once their deadline (the sleeper's 600 s timeout and the grace
    // period after it) has passed, which it has for a fixture older than that, else `lost`.
    for run_id in fixture["unfinished"].as_array().unwrap() {
        let run = api
            .wait_until(&format!("run {run_id} of the earlier build ends"), || async {
                let (_, run) = api.get(&format!("/api/v1/logs/{run_id}")).await;
                let state = run["state"].as_str().unwrap_or_default().to_owned();
                (!["pending", "dispatching", "running"].contains(&state.as_str())).then_some(run)
            })
            .await;
        let state = run["state"].as_str().unwrap();
        assert!(["timed_out", "lost"].contains(&state), "{run}\nadmin:\n{}", admin.log_tail());
    }
    // The finished ones are as they were.
    for run_id in fixture["finished"].as_array().unwrap() {
        let (status, run) = api.get(&format!("/api/v1/logs/{run_id}")).await;
        assert_eq!((status, &run["state"]), (StatusCode::OK, &json!("success")), "{run}");
    }
    // The old jobs run again on the versions the earlier build stored, fetched and compiled by
    // (or taken from the cache of) this build's executor.
    for (job, param, said) in [("hello", "again", "hello, again"), ("sleeper", "10", "slept 10 ms")]
    {
        let job_id = fixture["jobs"][job].as_i64().unwrap();
        let (status, trigger) =
            api.post(&format!("/api/v1/jobs/{job_id}/trigger"), json!({"param": param})).await;
        assert_eq!(status, StatusCode::OK, "{trigger}");
        let run = api.finished_run(trigger["log_ids"][0].as_i64().unwrap()).await;
        assert_eq!(run["state"], "success", "{job}: {run}\nexecutor:\n{}", executor.log_tail());
        let log = api.log_content(run["id"].as_i64().unwrap()).await;
        assert!(log.contains(said) || run["handle_msg"].as_str().unwrap().contains(said), "{log}");
    }
    // Both are ready, and the admin shows the executor's version and protocol.
    for url in [admin.url(), executor_url.clone()] {
        let (status, body) = probe(&format!("{url}/readyz")).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{url}: {body}");
    }
    let (_, executors) = api.get("/api/v1/executors").await;
    let ours = executors
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["address"] == executor_url)
        .unwrap_or_else(|| panic!("{executors}"));
    assert_eq!(ours["version"], env!("CARGO_PKG_VERSION"), "{ours}");
    assert_eq!(ours["protocol"], "wasmjob", "{ours}");
    executor.kill();
    admin.kill();
}

/// The migrations as the database records them, and its tables and columns: what an admin that
/// refuses to start must leave as it found.
async fn schema_snapshot(url: &str) -> Vec<String> {
    sqlx::any::install_default_drivers();
    let url = match url.strip_prefix("sqlite:") {
        Some(path) => format!("sqlite://{path}?mode=rw"),
        None => url.to_owned(),
    };
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let mut snapshot = Vec::new();
    let migrations = "select version, description, \
                      case when success then 'applied' else 'failed' end as ok \
                      from _sqlx_migrations order by version";
    // Read as the admin reads, so that MariaDB's text columns arrive as text.
    for row in fetch_all(&pool, migrations, &[]).await.unwrap() {
        let version: i64 = row.get("version");
        let description: String = row.get("description");
        let ok: String = row.get("ok");
        snapshot.push(format!("migration {version} {description} {ok}"));
    }
    let columns = if url.starts_with("sqlite:") {
        "select m.name || '.' || p.name as col from sqlite_master m, pragma_table_info(m.name) p \
         where m.type = 'table' order by 1"
    } else if url.starts_with("mysql:") {
        "select concat(table_name, '.', column_name) as col \
         from information_schema.columns where table_schema = database() order by 1"
    } else {
        "select table_name || '.' || column_name as col from information_schema.columns \
         where table_schema = 'public' order by 1"
    };
    for row in fetch_all(&pool, columns, &[]).await.unwrap() {
        snapshot.push(row.get("col"));
    }
    pool.close().await;
    snapshot
}

/// Records a migration this build does not know, as a newer build would have applied it.
async fn add_future_migration(url: &str) {
    let url = match url.strip_prefix("sqlite:") {
        Some(path) => format!("sqlite://{path}?mode=rw"),
        None => url.to_owned(),
    };
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let checksum = if url.starts_with("postgres") { "'\\x00'::bytea" } else { "x'00'" };
    sqlx::query(&format!(
        "insert into _sqlx_migrations (version, description, success, checksum, execution_time) \
         values (9999, 'from the future', true, {checksum}, 1)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
}

/// An admin whose binary is older than the database's schema refuses to start, says why, and
/// changes nothing: on each database, in-process, and on SQLite as the real binary too.
#[tokio::test]
async fn an_admin_older_than_its_database_refuses_to_start_and_changes_nothing() {
    wasmjob::telemetry::init_for_test();
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let url = match backend {
            Backend::Sqlite => format!("sqlite:{}", dir.path().join("wasmjob.db").display()),
            Backend::Postgres | Backend::Mysql => {
                crate::support::server_database(backend, "future").await.unwrap()
            }
        };
        Db::connect(&url).await.unwrap().close().await;
        add_future_migration(&url).await;
        let before = schema_snapshot(&url).await;

        let error = match admin::start(admin_config(url.clone())).await {
            Ok(_) => panic!("{backend:?}: an admin started on a newer schema"),
            Err(error) => format!("{error:#}"),
        };
        for said in ["newer than this build", "migration 9999 (from the future)", "Nothing was"] {
            assert!(error.contains(said), "{backend:?}: {error}");
        }
        if backend == Backend::Sqlite {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_wasmjob"))
                .args(["admin", "--listen", "127.0.0.1:0", "--database-url", &url])
                .args(["--admin-token", ADMIN_TOKEN, "--access-token", ACCESS_TOKEN])
                .env("NO_COLOR", "1")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{stderr}");
            assert!(stderr.contains("newer than this build"), "{stderr}");
        }
        assert_eq!(schema_snapshot(&url).await, before, "{backend:?}: the database changed");
        if backend != Backend::Sqlite {
            crate::support::drop_database(&url).await;
        }
    }
}

/// Admins started together on one fresh PostgreSQL or MySQL database all start, and each
/// migration is applied once (sqlx's migrator holds a lock while it migrates: an advisory lock
/// on PostgreSQL, `GET_LOCK` on MySQL).
#[tokio::test]
async fn admins_started_together_migrate_a_fresh_database_once() {
    wasmjob::telemetry::init_for_test();
    for backend in backends() {
        let Some(url) = crate::support::server_database(backend, "together").await else {
            continue;
        };
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let url = url.clone();
            connects.spawn(async move { Db::connect(&url).await });
        }
        let mut dbs = Vec::new();
        while let Some(connected) = connects.join_next().await {
            dbs.push(connected.unwrap().unwrap_or_else(|error| panic!("{error:#}")));
        }
        for db in &dbs {
            db.schema_check().await.unwrap();
        }
        let migrations = schema_snapshot(&url).await;
        let applied: Vec<&String> =
            migrations.iter().filter(|line| line.starts_with("migration ")).collect();
        let dialect = if backend == Backend::Mysql { "mysql" } else { "postgres" };
        let files = std::fs::read_dir(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(dialect),
        )
        .unwrap()
        .count();
        assert_eq!(applied.len(), files, "{backend:?}: {applied:#?}");
        for db in dbs {
            db.close().await;
        }
        crate::support::drop_database(&url).await;
    }
}

/// `/readyz` of an admin names each check, and fails while the scheduler has not completed a
/// pass in the last 5 s (the router alone: no scheduler loop runs, its pulse is set by hand).
#[tokio::test]
async fn readyz_of_an_admin_fails_while_its_scheduler_is_stale() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("readyz.db").display());
    let db = Db::connect(&url).await.unwrap();
    let state = AppState::new(db, admin_config(url)).unwrap();
    let app = router(state.clone());
    let readyz = || async {
        let request = axum::http::Request::get("/readyz").body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    let now = admin::now_ms();
    let cases = [
        (None, StatusCode::SERVICE_UNAVAILABLE, "never"),
        (Some(now), StatusCode::OK, "now"),
        (Some(now - 1_000), StatusCode::OK, "a second ago"),
        (Some(now - 60_000), StatusCode::SERVICE_UNAVAILABLE, "a minute ago"),
    ];
    for (pass_at, expected, when) in cases {
        match pass_at {
            Some(at) => state.scheduler_pulse.beat(at),
            None => state.scheduler_pulse.clear(),
        }
        let (status, body) = readyz().await;
        assert_eq!(status, expected, "last pass {when}: {body}");
        assert_eq!(body["checks"]["database"], "ok", "{body}");
        assert_eq!(body["checks"]["schema"], "ok", "{body}");
        assert_eq!(body["ready"], expected == StatusCode::OK, "{body}");
        if expected != StatusCode::OK {
            assert_eq!(body["failed"], json!(["scheduler"]), "{body}");
        }
    }
    let (status, body) = probe_router(&app, "/healthz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
}

async fn probe_router(app: &axum::Router, path: &str) -> (StatusCode, String) {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let request = axum::http::Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// An admin started before its PostgreSQL database exists serves `/healthz`, and `/readyz`
/// with 503 naming the database, until the database is created; then it migrates it, starts,
/// and becomes ready.
#[tokio::test]
async fn readyz_of_an_admin_waits_for_its_database() {
    wasmjob::telemetry::init_for_test();
    let Some(url) = postgres_database("waits").await.unwrap() else {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping the admin that waits for it");
        return;
    };
    drop_postgres_database(&url).await.unwrap();
    let port = free_port();
    let mut config = admin_config(url.clone());
    config.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let starting = tokio::spawn(admin::start(config));
    let base = format!("http://127.0.0.1:{port}");

    let body = wait_until("the waiting admin answers /readyz", || async {
        probe(&format!("{base}/readyz")).await
    })
    .await;
    assert_eq!(body.0, StatusCode::SERVICE_UNAVAILABLE, "{}", body.1);
    assert_eq!(body.1["failed"], json!(["database"]), "{}", body.1);
    assert_eq!(probe(&format!("{base}/healthz")).await.unwrap().0, StatusCode::OK);
    let (status, _) = probe(&format!("{base}/api/v1/jobs")).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the API waits for the database too");
    assert!(!starting.is_finished(), "start returned without a database");

    create_postgres_database(&url).await.unwrap();
    let admin = tokio::time::timeout(Duration::from_secs(30), starting)
        .await
        .expect("the admin starts once its database answers")
        .unwrap()
        .unwrap();
    let (status, body) = wait_until("the admin is ready", || async {
        probe(&format!("{base}/readyz")).await.filter(|(status, _)| *status == StatusCode::OK)
    })
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["failed"], json!([]), "{body}");
    admin.stop().await;
    drop_postgres_database(&url).await.unwrap();
}

/// An executor started before its admin is not ready until the admin is up and accepted its
/// registration; then it is.
#[tokio::test]
async fn readyz_of_an_executor_waits_for_an_admin() {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let admin_url = format!("http://127.0.0.1:{port}");
    let executor =
        executor::start(executor_config(&admin_url, dir.path().join("executor"))).await.unwrap();
    let base = format!("http://{}", executor.local_addr);

    let (status, body) = probe(&format!("{base}/readyz")).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["failed"], json!(["registered"]), "{body}");
    assert_eq!(probe(&format!("{base}/healthz")).await.unwrap().0, StatusCode::OK);

    let mut config = admin_config(format!("sqlite:{}", dir.path().join("wasmjob.db").display()));
    config.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let admin = admin::start(config).await.unwrap();
    wait_until("the executor is ready", || async {
        probe(&format!("{base}/readyz")).await.filter(|(status, _)| *status == StatusCode::OK)
    })
    .await;
    executor.stop().await;
    admin.stop().await;
}
