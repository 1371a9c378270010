//! A platform for one test: an admin (SQLite in a temp dir, or a fresh PostgreSQL or MySQL
//! database) and
//! an executor, both in-process on 127.0.0.1:0, with the group `default` and a client that
//! speaks the operator API.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wasmjob::admin::{self, Admin};
use wasmjob::config::{AdminConfig, ExecutorConfig, RunDefaults};
use wasmjob::executor::{self, Executor};

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
pub const ACCESS_TOKEN: &str = "test-access-token-0123456789";

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

/// SQLite always; PostgreSQL too when `WASMJOB_TEST_POSTGRES_URL` is set, and MySQL when
/// `WASMJOB_TEST_MYSQL_URL` is.
pub fn backends() -> Vec<Backend> {
    #[expect(clippy::disallowed_methods, reason = "test configuration")]
    let postgres = std::env::var("WASMJOB_TEST_POSTGRES_URL").is_ok();
    #[expect(clippy::disallowed_methods, reason = "test configuration")]
    let mysql = std::env::var("WASMJOB_TEST_MYSQL_URL").is_ok();
    if !postgres {
        eprintln!("WASMJOB_TEST_POSTGRES_URL is unset: skipping the PostgreSQL backend");
    }
    if !mysql {
        eprintln!("WASMJOB_TEST_MYSQL_URL is unset: skipping the MySQL backend");
    }
    let mut list = vec![Backend::Sqlite];
    if postgres {
        list.push(Backend::Postgres);
    }
    if mysql {
        list.push(Backend::Mysql);
    }
    list
}

/// A fresh database on `backend`'s server (`None` for SQLite), to drop with [`drop_database`].
pub async fn server_database(backend: Backend, label: &str) -> Option<String> {
    match backend {
        Backend::Sqlite => None,
        Backend::Postgres => wasmjob::storage::testing::postgres_database(label).await.unwrap(),
        Backend::Mysql => wasmjob::storage::testing::mysql_database(label).await.unwrap(),
    }
}

/// Drops a database made by [`server_database`].
pub async fn drop_database(url: &str) {
    if url.starts_with("mysql://") {
        wasmjob::storage::testing::drop_mysql_database(url).await.unwrap();
    } else {
        wasmjob::storage::testing::drop_postgres_database(url).await.unwrap();
    }
}

pub struct TestApp {
    pub api: Api,
    pub admin: Option<Admin>,
    pub executor: Option<Executor>,
    _dir: tempfile::TempDir,
    server_url: Option<String>,
}

/// A client of one admin's operator API.
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl TestApp {
    /// Admin and one executor registered in the group `default` (id 1).
    pub async fn start(backend: Backend) -> TestApp {
        TestApp::start_with(backend, |_| {}).await
    }

    /// As [`TestApp::start`], with the admin's configuration changed by `configure`.
    pub async fn start_with(backend: Backend, configure: impl FnOnce(&mut AdminConfig)) -> TestApp {
        wasmjob::telemetry::init_for_test();
        let dir = tempfile::tempdir().unwrap();
        let server_url = server_database(backend, "e2e").await;
        let database_url = server_url
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", dir.path().join("wasmjob.db").display()));
        let mut config = admin_config(database_url);
        configure(&mut config);
        let admin = admin::start(config).await.unwrap();
        admin.state.db.ensure_group("default", "Default", admin::now_ms()).await.unwrap();
        let base = admin.url();
        let executor =
            executor::start(executor_config(&base, dir.path().join("executor"))).await.unwrap();
        let api = Api { http: reqwest::Client::new(), base, token: ADMIN_TOKEN.to_owned() };
        api.wait_for_executors(1).await;
        TestApp { api, admin: Some(admin), executor: Some(executor), _dir: dir, server_url }
    }

    /// The executor's data directory (to restart it on the same cache).
    pub fn executor_dir(&self) -> PathBuf {
        self._dir.path().join("executor")
    }

    pub async fn stop(mut self) {
        if let Some(executor) = self.executor.take() {
            executor.stop().await;
        }
        if let Some(admin) = self.admin.take() {
            admin.stop().await;
        }
        if let Some(url) = &self.server_url {
            drop_database(url).await;
        }
    }
}

impl Api {
    /// Waits until group 1 has `count` online executors.
    pub async fn wait_for_executors(&self, count: usize) {
        self.wait_until("the executors register", || async {
            let (_, group) = self.get("/api/v1/groups/1").await;
            (group["online_addresses"].as_array().map_or(0, Vec::len) == count).then_some(())
        })
        .await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let reply = self.http.get(self.url(path)).bearer_auth(&self.token).send().await.unwrap();
        read(reply).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let reply = self
            .http
            .post(self.url(path))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        read(reply).await
    }

    pub async fn upload(&self, job_id: i64, bytes: Vec<u8>) -> (StatusCode, Value) {
        let reply = self
            .http
            .post(self.url(&format!("/api/v1/jobs/{job_id}/versions?remark=test")))
            .bearer_auth(&self.token)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        read(reply).await
    }

    /// Creates a job in group 1 from `fields` over sensible defaults; returns its id.
    pub async fn create_job(&self, fields: Value) -> i64 {
        let mut body = json!({"group_id": 1, "name": "test job", "schedule_type": "NONE"});
        for (key, value) in fields.as_object().unwrap() {
            body[key] = value.clone();
        }
        let (status, job) = self.post("/api/v1/jobs", body).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        job["id"].as_i64().unwrap()
    }

    /// The run record `log_id` once it has a result.
    pub async fn finished_run(&self, log_id: i64) -> Value {
        self.wait_until(&format!("run {log_id} ends"), || async {
            let (_, run) = self.get(&format!("/api/v1/logs/{log_id}")).await;
            (run["handle_code"].as_i64() != Some(0)).then_some(run)
        })
        .await
    }

    /// The whole log of run `log_id` (it must have ended).
    pub async fn log_content(&self, log_id: i64) -> String {
        let (status, page) = self.get(&format!("/api/v1/logs/{log_id}/content?from_line=1")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["content"].as_str().unwrap().to_owned()
    }

    /// Polls `probe` until it answers (a state reached over the network has no other signal).
    pub async fn wait_until<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        wait_until(what, probe).await
    }
}

/// Polls `probe` every 50 ms until it answers, for at most 30 s.
pub async fn wait_until<T, F, Fut>(what: &str, probe: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read(reply: reqwest::Response) -> (StatusCode, Value) {
    let status = reply.status();
    let text = reply.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

pub fn admin_config(database_url: String) -> AdminConfig {
    AdminConfig {
        advertise_url: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url,
        admin_token: ADMIN_TOKEN.to_owned(),
        access_token: ACCESS_TOKEN.to_owned(),
        heartbeat_interval: Duration::from_secs(30),
        max_module_bytes: 4 * 1024 * 1024,
        run_retention_days: Some(30),
        network: Default::default(),
        alarms: Default::default(),
        builders: wasmjob::config::BuilderConfig {
            dir: None,
            python: "python3".into(),
            node: "node".into(),
            timeout: Duration::from_secs(600),
            memory_bytes: 4096 * 1024 * 1024,
        },
        max_versions_per_job: 30,
        max_unfinished_runs: Some(10_000),
        callback_apply_within: wasmjob::admin::APPLY_WITHIN,
    }
}

pub fn executor_config(admin_url: &str, data_dir: PathBuf) -> ExecutorConfig {
    std::fs::create_dir_all(data_dir.join("handlers")).unwrap();
    ExecutorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        address: None,
        pull: false,
        admin_urls: vec![admin_url.to_owned()],
        app_name: "default".to_owned(),
        handlers_dir: Some(data_dir.join("handlers")),
        data_dir,
        access_token: ACCESS_TOKEN.to_owned(),
        limits: RunDefaults {
            fuel: 1_000_000_000_000,
            memory_bytes: 64 * 1024 * 1024,
            max_log_bytes: 1024 * 1024,
            log_retention_days: 30,
            max_concurrent_runs: 16,
            max_queue_per_job: 1000,
            max_queued_bytes: 256 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
        },
        heartbeat_interval: Duration::from_secs(30),
        network: Default::default(),
        admin_protocol: wasmjob::protocol::Generation::Classic,
    }
}
