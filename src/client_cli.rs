//! The command-line client of the operator REST API: `wasmjob job|run|log|version|group|
//! executors|admins|calendar|workflow`, and the cluster as a file:
//! `wasmjob export|diff|apply|schema` (`apply.rs`, `manifest.rs`).
//!
//! Each command is one or a few calls to `/api/v1` with the bearer token; people get aligned
//! tables or `key: value` lines, scripts get the API's JSON with `--json`. `wasmjob log RUN
//! --follow` reads the run's Server-Sent Events stream, resuming with `Last-Event-ID` when the
//! connection drops.
//!
//! The admin's URL and the token come from a flag, the environment or the config file
//! ([`config_file`]), in that order.
//!
//! Errors are one line on stderr, and the exit code says what kind ([`ExitKind`]). This module
//! is only a client: it knows the API's JSON, never the admin's code.

mod apply;
mod backfill;
mod calendar;
pub mod config_file;
mod log;
pub mod manifest;
mod table;
mod workflow;
mod xxl_import;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::cli::client::{
    AdminsCommand, ApplyArgs, CalendarCommand, ConnectArgs, DiffArgs, ExecutorsCommand, ExportArgs,
    GroupCommand, ImportXxlArgs, JobCommand, JobFields, LogArgs, RunCommand, VersionCommand,
    WorkflowCommand,
};

/// What a client command was asked to do.
#[derive(Debug)]
pub enum ClientCommand {
    /// `wasmjob job …` (boxed: a job's fields make it the largest by far).
    Job(ConnectArgs, Box<JobCommand>),
    /// `wasmjob run …`.
    Run(ConnectArgs, RunCommand),
    /// `wasmjob log RUN [--follow]`.
    Log(LogArgs),
    /// `wasmjob version …`.
    Version(ConnectArgs, VersionCommand),
    /// `wasmjob group …`.
    Group(ConnectArgs, GroupCommand),
    /// `wasmjob executors …`.
    Executors(ConnectArgs, ExecutorsCommand),
    /// `wasmjob admins …`.
    Admins(ConnectArgs, AdminsCommand),
    /// `wasmjob calendar …`.
    Calendar(ConnectArgs, CalendarCommand),
    /// `wasmjob workflow …`.
    Workflow(ConnectArgs, WorkflowCommand),
    /// `wasmjob export`.
    Export(ExportArgs),
    /// `wasmjob diff -f FILE`.
    Diff(DiffArgs),
    /// `wasmjob apply -f FILE`.
    Apply(ApplyArgs),
    /// `wasmjob schema`: the document's JSON Schema; needs no admin.
    Schema,
    /// `wasmjob import xxl-job --from URL`.
    ImportXxlJob(ImportXxlArgs),
}

impl ClientCommand {
    /// The client command `command` is, or `command` back when it is not one.
    pub fn from_cli(
        command: crate::cli::Command,
    ) -> Result<ClientCommand, Box<crate::cli::Command>> {
        use crate::cli::Command;
        Ok(match command {
            Command::Job(args) => ClientCommand::Job(args.connect, Box::new(args.command)),
            Command::Run(args) => ClientCommand::Run(args.connect, args.command),
            Command::Log(args) => ClientCommand::Log(args),
            Command::Version(args) => ClientCommand::Version(args.connect, args.command),
            Command::Group(args) => ClientCommand::Group(args.connect, args.command),
            Command::Executors(args) => ClientCommand::Executors(args.connect, args.command),
            Command::Admins(args) => ClientCommand::Admins(args.connect, args.command),
            Command::Calendar(args) => ClientCommand::Calendar(args.connect, args.command),
            Command::Workflow(args) => ClientCommand::Workflow(args.connect, args.command),
            Command::Export(args) => ClientCommand::Export(args),
            Command::Diff(args) => ClientCommand::Diff(args),
            Command::Apply(args) => ClientCommand::Apply(args),
            Command::Schema => ClientCommand::Schema,
            Command::Import(crate::cli::client::ImportArgs {
                command: crate::cli::client::ImportCommand::XxlJob(args),
            }) => ClientCommand::ImportXxlJob(args),
            other => return Err(Box::new(other)),
        })
    }
}

/// The exit codes scripts can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// 1: the admin could not be reached, or failed (5xx).
    Unavailable = 1,
    /// 2: the command line is wrong (also clap's code).
    Usage = 2,
    /// 3: no such job, run, version or group.
    NotFound = 3,
    /// 4: no token, a wrong one, or one not allowed to do this.
    Refused = 4,
    /// 5: the admin refused the request as invalid or conflicting (another 4xx).
    Invalid = 5,
    /// 6: `log --follow` saw the run end other than in success.
    RunFailed = 6,
    /// 7: the config file is there but unreadable or invalid (or `--config` names no file).
    Config = 7,
    /// 8: `diff` found the admin and the document apart.
    Differs = 8,
}

/// A failed command: its kind and its one line.
#[derive(Debug)]
pub struct ClientError {
    kind: ExitKind,
    message: String,
}

impl ClientError {
    fn new(kind: ExitKind, message: impl Into<String>) -> ClientError {
        ClientError { kind, message: message.into() }
    }
}

/// Runs `command`; the process's exit code.
pub async fn run(command: ClientCommand) -> ExitCode {
    match dispatch(command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error.message);
            ExitCode::from(error.kind as u8)
        }
    }
}

async fn dispatch(command: ClientCommand) -> Result<(), ClientError> {
    match command {
        ClientCommand::Job(connect, command) => job(&Api::new(&connect)?, *command).await,
        ClientCommand::Run(connect, command) => run_command(&Api::new(&connect)?, command).await,
        ClientCommand::Log(args) => {
            log::log(&Api::new(&args.connect)?, args.run, args.follow).await
        }
        ClientCommand::Version(connect, command) => version(&Api::new(&connect)?, command).await,
        ClientCommand::Group(connect, command) => group(&Api::new(&connect)?, command).await,
        ClientCommand::Calendar(connect, command) => {
            calendar::calendar(&Api::new(&connect)?, command).await
        }
        ClientCommand::Workflow(connect, command) => {
            workflow::workflow(&Api::new(&connect)?, command).await
        }
        ClientCommand::Export(args) => apply::export(&Api::new(&args.connect)?, args).await,
        ClientCommand::Diff(args) => apply::diff(&Api::new(&args.connect)?, args).await,
        ClientCommand::Apply(args) => apply::apply(&Api::new(&args.connect)?, args).await,
        ClientCommand::ImportXxlJob(args) => {
            xxl_import::import(&Api::new(&args.connect)?, args).await
        }
        ClientCommand::Schema => {
            let schema = serde_json::to_string_pretty(&manifest::json_schema()).unwrap_or_default();
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(format!("{schema}\n").as_bytes()).map_err(|error| {
                ClientError::new(ExitKind::Unavailable, format!("stdout: {error}"))
            })
        }
        ClientCommand::Executors(connect, ExecutorsCommand::List) => {
            let api = Api::new(&connect)?;
            let list = api.call("GET", "/executors", None).await?;
            api.table(&list, &["app_name", "address", "mode", "last_heartbeat"])
        }
        ClientCommand::Admins(connect, AdminsCommand::List) => {
            let api = Api::new(&connect)?;
            let list = api.call("GET", "/admins", None).await?;
            api.table(&list, &["id", "address", "partition_count", "last_beat", "this"])
        }
    }
}

/// The admin's URL when no flag, variable or config file gives one.
const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:8080";
/// How long an upload is waited for: past the admin's default build timeout of 300 s, so a build
/// that the admin would still finish is not given up on here.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(330);

const JOB_COLUMNS: &[&str] =
    &["id", "group_id", "name", "schedule_type", "schedule_conf", "running", "next_fire_time"];
const RUN_COLUMNS: &[&str] =
    &["id", "job_id", "state", "trigger_type", "trigger_time", "executor_address", "handle_msg"];

async fn job(api: &Api, command: JobCommand) -> Result<(), ClientError> {
    match command {
        JobCommand::List => api.table(&api.call("GET", "/jobs", None).await?, JOB_COLUMNS),
        JobCommand::Get { id } => api.record(&api.call("GET", &format!("/jobs/{id}"), None).await?),
        JobCommand::Create(fields) => {
            let mut body = Map::new();
            body.insert("schedule_type".into(), json!("NONE"));
            set_fields(&mut body, &fields);
            for required in ["group_id", "name"] {
                if !body.contains_key(required) {
                    let flag = required.replace('_', "-");
                    return Err(ClientError::new(ExitKind::Usage, format!("--{flag} is required")));
                }
            }
            api.record(&api.call("POST", "/jobs", Some(Value::Object(body))).await?)
        }
        JobCommand::Update { id, fields } => {
            let current = api.call("GET", &format!("/jobs/{id}"), None).await?;
            let mut body: Map<String, Value> = current
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(key, value)| JOB_BODY_FIELDS.contains(&key.as_str()) && !value.is_null())
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            set_fields(&mut body, &fields);
            api.record(&api.call("PUT", &format!("/jobs/{id}"), Some(Value::Object(body))).await?)
        }
        JobCommand::Delete { id } => {
            api.call("DELETE", &format!("/jobs/{id}"), None).await?;
            api.done(&format!("job {id} deleted"))
        }
        JobCommand::Start { id } => {
            api.record(&api.call("POST", &format!("/jobs/{id}/start"), Some(json!({}))).await?)
        }
        JobCommand::Stop { id } => {
            api.record(&api.call("POST", &format!("/jobs/{id}/stop"), Some(json!({}))).await?)
        }
        JobCommand::Trigger { id, param } => {
            let body = match param {
                Some(param) => json!({"param": param}),
                None => json!({}),
            };
            let reply = api.call("POST", &format!("/jobs/{id}/trigger"), Some(body)).await?;
            if api.json {
                return api.print_json(&reply);
            }
            let ids: Vec<String> = reply["log_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|id| id.to_string())
                .collect();
            api.line(&ids.join("\n"))
        }
        command @ (JobCommand::Backfill { .. }
        | JobCommand::Backfills { .. }
        | JobCommand::BackfillPause { .. }
        | JobCommand::BackfillResume { .. }
        | JobCommand::BackfillCancel { .. }) => backfill::command(api, command).await,
    }
}

/// The fields `PUT /jobs/{id}` takes (it refuses others).
const JOB_BODY_FIELDS: &[&str] = &[
    "group_id",
    "name",
    "schedule_type",
    "schedule_conf",
    "time_zone",
    "misfire_strategy",
    "route_strategy",
    "block_strategy",
    "timeout_secs",
    "retry_count",
    "retry_interval_secs",
    "retry_backoff",
    "retry_max_interval_secs",
    "glue_type",
    "handler",
    "param",
    "child_job_ids",
    "alarm_email",
    "fuel_limit",
    "memory_limit_mb",
    "misfire_threshold_ms",
    "sharding_total_count",
    "sharding_item_parameters",
    "sharding_strategy",
    "alarm_silence_secs",
    "max_concurrent_runs",
    "calendar",
    "description",
    "owner",
];

fn set_fields(body: &mut Map<String, Value>, fields: &JobFields) {
    let JobFields {
        group_id,
        name,
        schedule_type,
        schedule_conf,
        param,
        route_strategy,
        timeout_secs,
        retry_count,
        retry_interval_secs,
        retry_backoff,
        retry_max_interval_secs,
        glue_type,
        handler,
        calendar,
    } = fields.clone();
    let given = [
        ("group_id", group_id.map(Value::from)),
        ("name", name.map(Value::from)),
        ("schedule_type", schedule_type.map(Value::from)),
        ("schedule_conf", schedule_conf.map(Value::from)),
        ("param", param.map(Value::from)),
        ("route_strategy", route_strategy.map(Value::from)),
        ("timeout_secs", timeout_secs.map(Value::from)),
        ("retry_count", retry_count.map(Value::from)),
        ("retry_interval_secs", retry_interval_secs.map(Value::from)),
        ("retry_backoff", retry_backoff.map(Value::from)),
        ("retry_max_interval_secs", retry_max_interval_secs.map(Value::from)),
        ("glue_type", glue_type.map(Value::from)),
        ("handler", handler.map(Value::from)),
        ("calendar", calendar.map(Value::from)),
    ];
    for (key, value) in given {
        if let Some(value) = value {
            body.insert(key.to_owned(), value);
        }
    }
}

async fn run_command(api: &Api, command: RunCommand) -> Result<(), ClientError> {
    match command {
        RunCommand::List { job_id, status, limit } => {
            let mut query = format!("/logs?limit={limit}");
            if let Some(job_id) = job_id {
                query.push_str(&format!("&job_id={job_id}"));
            }
            if let Some(status) = status {
                query.push_str(&format!("&status={}", encode(&status)));
            }
            let page = api.call("GET", &query, None).await?;
            if api.json {
                return api.print_json(&page);
            }
            api.table(&page["items"], RUN_COLUMNS)
        }
        RunCommand::Get { id } => api.record(&api.call("GET", &format!("/logs/{id}"), None).await?),
        RunCommand::Kill { id } => {
            let reply = api.call("POST", &format!("/logs/{id}/kill"), Some(json!({}))).await?;
            if api.json {
                return api.print_json(&reply);
            }
            api.line(reply["message"].as_str().unwrap_or("kill sent"))
        }
    }
}

async fn version(api: &Api, command: VersionCommand) -> Result<(), ClientError> {
    let columns = &["version", "sha256", "size", "remark", "created_at", "active"];
    match command {
        VersionCommand::List { job } => {
            api.table(&api.call("GET", &format!("/jobs/{job}/versions"), None).await?, columns)
        }
        VersionCommand::Upload { job, file, remark } => {
            let bytes = std::fs::read(&file).map_err(|error| {
                ClientError::new(ExitKind::Usage, format!("reading {}: {error}", file.display()))
            })?;
            let path = format!("/jobs/{job}/versions?remark={}", encode(&remark));
            let request = api.request("POST", &path).header("content-type", "application/wasm");
            api.record(&api.upload(request.body(bytes)).await?)
        }
        VersionCommand::Activate { job, version } => {
            let path = format!("/jobs/{job}/versions/{version}/activate");
            api.record(&api.call("POST", &path, Some(json!({}))).await?)
        }
    }
}

async fn group(api: &Api, command: GroupCommand) -> Result<(), ClientError> {
    match command {
        GroupCommand::List => api.table(
            &api.call("GET", "/groups", None).await?,
            &["id", "app_name", "title", "address_type", "online_addresses"],
        ),
        GroupCommand::Get { id } => {
            api.record(&api.call("GET", &format!("/groups/{id}"), None).await?)
        }
        GroupCommand::Create { app_name, title, addresses } => {
            let mut body = json!({"app_name": app_name, "address_type": "AUTO"});
            if let Some(title) = title {
                body["title"] = json!(title);
            }
            if !addresses.is_empty() {
                body["address_type"] = json!("MANUAL");
                body["addresses"] = json!(addresses);
            }
            api.record(&api.call("POST", "/groups", Some(body)).await?)
        }
    }
}

/// A client of one admin.
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    json: bool,
}

impl Api {
    fn new(connect: &ConnectArgs) -> Result<Api, ClientError> {
        let location = config_file::location(
            connect.config.as_deref(),
            connect.xdg_config_home.as_deref(),
            connect.home.as_deref(),
        );
        // The file is read when it is named, or when a flag or the environment leaves something
        // unset: a broken default file does not stand in the way of a complete command line.
        let file = match &location {
            Some(location)
                if location.named || connect.admin_url.is_none() || connect.token.is_none() =>
            {
                config_file::load(location)
                    .map_err(|error| ClientError::new(ExitKind::Config, error.to_string()))?
            }
            _ => config_file::ConfigFile::default(),
        };
        let token = connect.token.clone().or(file.token).ok_or_else(|| {
            let place =
                location.map_or("a config file".to_owned(), |l| l.path.display().to_string());
            ClientError::new(
                ExitKind::Refused,
                format!(
                    "no token: pass --token, set WASMJOB_TOKEN or put `token = \"…\"` in {place}"
                ),
            )
        })?;
        let admin_url = connect
            .admin_url
            .clone()
            .or(file.admin_url)
            .unwrap_or_else(|| DEFAULT_ADMIN_URL.into());
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|error| ClientError::new(ExitKind::Unavailable, error.to_string()))?;
        let base = admin_url.trim_end_matches('/').to_owned();
        Ok(Api { http, base, token, json: connect.json })
    }

    fn request(&self, method: &str, path: &str) -> reqwest::RequestBuilder {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        self.http.request(method, format!("{}/api/v1{path}", self.base)).bearer_auth(&self.token)
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.send(request).await
    }

    /// A reply that is not JSON: a version's source text.
    async fn text(&self, method: &str, path: &str) -> Result<String, ClientError> {
        let request = self.request(method, path).timeout(Duration::from_secs(60));
        let response = request.send().await.map_err(|error| unavailable(&self.base, &error))?;
        let response = self.check(response).await?;
        response.text().await.map_err(|error| unavailable(&self.base, &error))
    }

    /// A reply's bytes: a version's component.
    async fn bytes(&self, method: &str, path: &str) -> Result<bytes::Bytes, ClientError> {
        let request = self.request(method, path).timeout(Duration::from_secs(300));
        let response = request.send().await.map_err(|error| unavailable(&self.base, &error))?;
        let response = self.check(response).await?;
        response.bytes().await.map_err(|error| unavailable(&self.base, &error))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        self.send_within(request, Duration::from_secs(60)).await
    }

    /// Sends a new version. The admin may build a source for up to its `--build-timeout-secs`
    /// (300 s unless set) before it answers, so the upload is waited for longer than that.
    async fn upload(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        self.send_within(request, UPLOAD_TIMEOUT).await
    }

    async fn send_within(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let request = request.timeout(timeout);
        let response = request.send().await.map_err(|error| unavailable(&self.base, &error))?;
        let response = self.check(response).await?;
        let text = response.text().await.map_err(|error| unavailable(&self.base, &error))?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The response if it succeeded, else its error as one line with its kind.
    async fn check(&self, response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let reason = match (body["code"].as_str(), body["message"].as_str()) {
            (Some(code), Some(message)) => format!("{message} ({code})"),
            _ => status.to_string(),
        };
        let kind = match status.as_u16() {
            401 | 403 => ExitKind::Refused,
            404 => ExitKind::NotFound,
            400..=499 => ExitKind::Invalid,
            _ => ExitKind::Unavailable,
        };
        Err(ClientError::new(kind, format!("{}: {reason}", status.as_u16())))
    }

    /// A list as an aligned table of `columns` (or its JSON).
    fn table(&self, list: &Value, columns: &[&str]) -> Result<(), ClientError> {
        if self.json {
            return self.print_json(list);
        }
        let rows: Vec<Vec<String>> = list
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| columns.iter().map(|column| cell(&item[*column])).collect())
            .collect();
        let header: Vec<String> = columns.iter().map(|column| column.to_uppercase()).collect();
        self.write(&render_table(&header, &rows))
    }

    /// One object as `key: value` lines (or its JSON).
    fn record(&self, record: &Value) -> Result<(), ClientError> {
        if self.json {
            return self.print_json(record);
        }
        let Some(fields) = record.as_object() else { return self.print_json(record) };
        let width = fields.keys().map(String::len).max().unwrap_or(0);
        let text: String =
            fields.iter().map(|(key, value)| format!("{key:<width$}  {}\n", cell(value))).collect();
        self.write(&text)
    }

    fn done(&self, message: &str) -> Result<(), ClientError> {
        if self.json {
            return self.print_json(&json!({"message": message}));
        }
        self.line(message)
    }

    fn print_json(&self, value: &Value) -> Result<(), ClientError> {
        let text = serde_json::to_string_pretty(value).unwrap_or_default();
        self.line(&text)
    }

    fn line(&self, text: &str) -> Result<(), ClientError> {
        self.write(&format!("{text}\n"))
    }

    fn write(&self, text: &str) -> Result<(), ClientError> {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|error| ClientError::new(ExitKind::Unavailable, format!("stdout: {error}")))
    }
}

/// An admin that did not answer, with the causes reqwest keeps under its own message ("operation
/// timed out", "connection refused"), which name what went wrong.
fn unavailable(base: &str, error: &reqwest::Error) -> ClientError {
    let mut message = format!("{base}: {error}");
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        message.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    ClientError::new(ExitKind::Unavailable, message)
}

#[cfg(test)]
mod tests;

use self::table::{cell, encode, render_table};
