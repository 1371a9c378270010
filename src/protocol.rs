//! The admin⇄executor wire format: XXL-JOB's executor protocol (2.2 to 3.5), extended for Wasm,
//! and the HTTP client both sides use to speak it.
//!
//! Bodies are written so that every generation reads them; where the generations cannot be
//! served by one body (the trigger route, the callback form), [`Generation`] says which to use.
//!
//! Every call is a `POST` with a JSON body, answered with HTTP 200 and the envelope
//! `{"code":200|500|502,"msg":…,"content":…}` (also sent as `data` for 3.3+ readers).
//! The access token travels in `XXL-JOB-ACCESS-TOKEN`. Unknown fields are ignored, missing ones
//! take XXL-JOB's defaults, and a wrong type is an error (the envelope says which field).
//!
//! wasmjob's own extension: `/runs` takes a JSON array of `TriggerParam`s and answers with the
//! array of their envelopes, in order, as `content` of one envelope; an admin sends it only to
//! executors that do not refuse it, and XXL-JOB executors get one `/run` per trigger.
//!
//! Only this module and the http modules define wire types. It does not decide anything:
//! admin and executor logic live in their modules.
#![warn(missing_docs)]

mod body;
mod callbacks;
mod client;
mod keepalive;
pub mod pull;
mod text;
mod trigger_json;
mod workflow;

use serde::{Deserialize, Serialize};

pub use self::body::ProtocolJson;
pub use self::callbacks::{Callbacks, parse_callbacks};
pub use self::client::{Client, ClientOptions, MAX_REPLY_BYTES, ProtocolError};
pub use self::text::{EXCERPT_CHARS, excerpt, join_url};
pub use self::trigger_json::write_json_list;
pub use self::workflow::{NodeOutputParam, ShardOutputParam, WORKFLOW_INPUTS_LINE};

/// The header that carries the access token.
pub const ACCESS_TOKEN_HEADER: &str = "XXL-JOB-ACCESS-TOKEN";
/// The header that names the calling application (sent, and accepted, for compatibility).
pub const APP_NAME_HEADER: &str = "XXL-JOB-APPNAME";
/// `registryGroup` of executors.
pub const REGISTRY_GROUP_EXECUTOR: &str = "EXECUTOR";
/// `glueType` of uploaded Wasm modules.
pub const GLUE_WASM: &str = "GLUE_WASM";

/// The largest body an admin reads from an executor (`/api/registry`, `/api/callback`).
///
/// A wasmjob executor's largest requests fit well inside: a callback batch is at most
/// [`MAX_CALLBACK_BATCH`] results, each with a message of at most [`MAX_RESULT_MESSAGE_BYTES`]
/// written twice (as `handleMsg` and as 2.2's `executeResult.msg`), about 25 MB when every byte
/// of every message is a control character escaped as six; a beat lists at most
/// [`MAX_HELD_RUNS_PER_BEAT`] run ids of at most 20 bytes each, 40 MB. So does the callback batch
/// an XXL-JOB executor sends after an outage, the whole queue it kept meanwhile (80,000 results
/// are about 7 MB). Only a caller with the access token gets its body read.
pub const MAX_EXECUTOR_BODY_BYTES: usize = 64 * 1024 * 1024;
/// The most results a wasmjob executor sends in one `/api/callback`.
pub const MAX_CALLBACK_BATCH: usize = 500;
/// How the answer to `/api/callback` begins when the admin recorded part of the batch in its
/// time and asks for the whole batch again (`code 500`, as any refusal, so XXL-JOB executors
/// keep it and send it later; a result applies once, so the part recorded is ignored then). A
/// wasmjob executor backs off and sends the batch again, not each result alone.
pub const CALLBACK_BUSY: &str = "callback busy:";
/// The longest message a wasmjob executor reports for a run, in bytes.
pub const MAX_RESULT_MESSAGE_BYTES: usize = 4096;
/// The most run ids a wasmjob executor lists in one beat's `heldRuns`. An executor holding more
/// (an outbox grown through a long outage) beats without the list, still marked a wasmjob
/// executor by `holdsTriggers`, and is not reconciled until it holds fewer.
pub const MAX_HELD_RUNS_PER_BEAT: usize = 2_000_000;

/// A generation of XXL-JOB's protocol, where the generations differ on the wire.
///
/// Bodies are written so that every generation reads them (both `logDateTim` and `logDateTime`,
/// both `handleCode` and 2.2's `executeResult`); what cannot be said to all at once is chosen by
/// the peer's generation: the trigger route, the `XXL-JOB-APPNAME` header and the callback form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Generation {
    /// XXL-JOB 2.2 to 3.4, and wasmjob: `/run`, callbacks as a bare array, the access token alone.
    #[default]
    Classic,
    /// XXL-JOB 3.5: `/trigger`, `XXL-JOB-APPNAME` beside the token on every call, callbacks
    /// wrapped in `{"callbackList": [...]}`.
    V3_5,
}

impl Generation {
    /// The executor route that takes a `TriggerParam`.
    pub fn trigger_path(self) -> &'static str {
        match self {
            Generation::Classic => "run",
            Generation::V3_5 => "trigger",
        }
    }

    /// Its spelling in flags and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Generation::Classic => "classic",
            Generation::V3_5 => "3.5",
        }
    }
}

impl std::str::FromStr for Generation {
    type Err = String;

    fn from_str(text: &str) -> Result<Generation, String> {
        match text {
            "classic" | "2.2" | "2.3" | "2.4" | "3.0" | "3.1" | "3.2" | "3.3" | "3.4" => {
                Ok(Generation::Classic)
            }
            "3.5" => Ok(Generation::V3_5),
            other => Err(format!(
                "`{other}` is not a protocol generation: `classic` (XXL-JOB 2.2 to 3.4) or `3.5`"
            )),
        }
    }
}

/// The reply envelope (XXL-JOB's `ReturnT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReturnT<T> {
    /// 200 success, 500 failure, 502 timeout.
    pub code: i32,
    /// The reason, for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg: Option<String>,
    /// The payload (XXL-JOB before 3.3).
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub content: Option<T>,
    /// The payload again (XXL-JOB 3.3 and later).
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
}

fn none<T>() -> Option<T> {
    None
}

impl<T: Clone> ReturnT<T> {
    /// A success with a payload.
    pub fn ok(payload: T) -> Self {
        ReturnT { code: 200, msg: None, content: Some(payload.clone()), data: Some(payload) }
    }

    /// The payload, wherever the sender put it.
    pub fn into_payload(self) -> Option<T> {
        self.content.or(self.data)
    }
}

impl ReturnT<String> {
    /// A success without payload.
    pub fn success() -> Self {
        ReturnT { code: 200, msg: None, content: None, data: None }
    }

    /// A failure with a reason.
    pub fn fail(msg: impl Into<String>) -> Self {
        ReturnT { code: 500, msg: Some(msg.into()), content: None, data: None }
    }
}

/// `/run`: one trigger of one job (XXL-JOB's `TriggerParam`, plus wasmjob's optional fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TriggerParam {
    /// The job's id.
    pub job_id: i64,
    /// For `BEAN`, the handler's name.
    pub executor_handler: String,
    /// The job's parameter.
    pub executor_params: String,
    /// `SERIAL_EXECUTION`, `DISCARD_LATER` or `COVER_EARLY`.
    pub executor_block_strategy: String,
    /// Wall-clock limit in seconds; 0 means none.
    pub executor_timeout: i64,
    /// The run's id.
    pub log_id: i64,
    /// The scheduled instant, ms since the epoch.
    pub log_date_time: i64,
    /// `BEAN`, `GLUE_WASM`, or one of XXL-JOB's script types (refused by wasmjob executors).
    pub glue_type: String,
    /// For `GLUE_WASM`, the module's sha256.
    pub glue_source: String,
    /// For `GLUE_WASM`, when the version was created (ms).
    pub glue_updatetime: i64,
    /// The shard index.
    pub broadcast_index: i64,
    /// The number of shards.
    pub broadcast_total: i64,
    /// wasmjob: 0 for the first try, n for the n-th retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    /// wasmjob: the fuel budget of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel_limit: Option<i64>,
    /// wasmjob: the memory cap of the run, in MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_mb: Option<i64>,
    /// wasmjob: the ElasticJob sharding items this run processes, for a sharded job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding_items: Option<Vec<ShardingItemParam>>,
    /// wasmjob: the run must not start before this instant (ms since the epoch). An admin sends
    /// a scheduled run a little ahead of its instant to an executor that registered with
    /// `holdsTriggers`, which accepts it at once and holds it (for at most
    /// [`MAX_HOLD_MS`]) until then; its block strategy applies at the instant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<i64>,
    /// wasmjob: for a run of a workflow node that passes inputs, the outputs of the nodes
    /// upstream of it, for the guest's `workflow` import. An XXL-JOB executor gets them in
    /// `executorParams` instead ([`WORKFLOW_INPUTS_LINE`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_inputs: Option<Vec<NodeOutputParam>>,
    /// wasmjob: the URL of the admin that sent the run (its `--advertise-url`, or the address
    /// it is bound to). An executor that has this URL among its admins delivers the run's
    /// result there first, so that the admin holding the send records the result with it; the
    /// executor never calls a URL it was not given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// The longest an executor holds a trigger sent ahead of its instant: a `notBefore` further
/// ahead (an admin's clock far off this executor's) is held only this long.
pub const MAX_HOLD_MS: i64 = 10_000;

/// One sharding item of a trigger: `{"item": 0, "parameter": "Beijing"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShardingItemParam {
    /// The item's number.
    pub item: u32,
    /// Its parameter (empty when the job gives none).
    pub parameter: String,
}

/// `/idleBeat` and `/kill`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobIdParam {
    /// The job's id.
    pub job_id: i64,
    /// wasmjob, `/kill` only: stop just this run (running or queued) instead of the whole job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_id: Option<i64>,
}

/// `/log`: a page of a run's log. Sent with the trigger time under both names, `logDateTim`
/// (XXL-JOB up to 3.4) and `logDateTime` (3.5), so every generation finds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "LogParamIn")]
pub struct LogParam {
    /// The run's trigger time (ms); XXL-JOB spells it `logDateTim` (`logDateTime` from 3.5).
    pub log_date_tim: i64,
    /// The run's id.
    pub log_id: i64,
    /// The first line wanted, 1-based.
    pub from_line_num: i64,
}

/// `LogParam` as read: either spelling of the time, or both.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct LogParamIn {
    log_date_tim: Option<i64>,
    log_date_time: Option<i64>,
    log_id: i64,
    from_line_num: i64,
}

impl From<LogParamIn> for LogParam {
    fn from(read: LogParamIn) -> LogParam {
        LogParam {
            log_date_tim: read.log_date_tim.or(read.log_date_time).unwrap_or_default(),
            log_id: read.log_id,
            from_line_num: read.from_line_num,
        }
    }
}

impl Serialize for LogParam {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            log_date_tim: i64,
            log_date_time: i64,
            log_id: i64,
            from_line_num: i64,
        }
        Wire {
            log_date_tim: self.log_date_tim,
            log_date_time: self.log_date_tim,
            log_id: self.log_id,
            from_line_num: self.from_line_num,
        }
        .serialize(serializer)
    }
}

/// The answer to `/log`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LogResult {
    /// The first line in this page.
    pub from_line_num: i64,
    /// The last line in this page (from - 1 when the page is empty).
    pub to_line_num: i64,
    /// The lines, each ending in a newline.
    pub log_content: String,
    /// The run is over and this page reaches the end of its log.
    pub is_end: bool,
}

/// `/api/registry` and `/api/registryRemove`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegistryParam {
    /// Always `EXECUTOR` for executors.
    pub registry_group: String,
    /// The executor's application name.
    pub registry_key: String,
    /// The executor's address.
    pub registry_value: String,
    /// wasmjob, `/api/registry` only: every run id this executor holds when it sends the beat
    /// (queued, running, or ended with a result not yet acknowledged by an admin). An admin
    /// ends the runs it believes are on this executor and that are not listed as `lost`
    /// (reconciliation). XXL-JOB executors do not send it, and are never reconciled; a wasmjob
    /// executor holding more than [`MAX_HELD_RUNS_PER_BEAT`] runs leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_runs: Option<Vec<i64>>,
    /// wasmjob, `/api/registry` only: this executor holds a trigger sent with `notBefore` until
    /// that instant, so an admin may send scheduled runs ahead of their instant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds_triggers: Option<bool>,
    /// wasmjob: the executor's version (`0.1.0`), shown by the admin beside the executor so
    /// that a rolling upgrade can be followed. XXL-JOB executors do not send it; XXL-JOB admins
    /// ignore it, as Java's JSON readers ignore every field they do not know.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What a wasmjob executor answers in `content` to `/run` (an XXL-JOB executor sends nothing).
///
/// A trigger is accepted at most once per `logId`, durably across executor restarts, so an
/// admin that sends a run again (it crashed before recording the first send) learns where the
/// run is instead of running it twice.
pub mod run_reply {
    /// The trigger was accepted now.
    pub const ACCEPTED: &str = "accepted";
    /// Accepted before; waiting in its job's queue.
    pub const QUEUED: &str = "queued";
    /// Accepted before; running now.
    pub const RUNNING: &str = "running";
    /// Accepted before; it ended and its result is in (or went through) the outbox.
    pub const REPORTED: &str = "reported";
    /// Accepted before a restart of the executor, and never finished: it will not run here.
    pub const LOST: &str = "lost";
}

/// One result in `/api/callback`.
///
/// Written for every generation at once: the trigger time as `logDateTim` and `logDateTime`
/// (3.5), and the result both as `handleCode`/`handleMsg` (2.3 and later) and as 2.2's
/// `executeResult: {code, msg}`. Readers of each generation ignore the fields they do not know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "CallbackIn")]
pub struct HandleCallbackParam {
    /// The run's id.
    pub log_id: i64,
    /// The run's trigger time (ms): `logDateTim`, or `logDateTime` from 3.5.
    pub log_date_tim: i64,
    /// 200 success, 500 failure, 502 timeout.
    pub handle_code: i32,
    /// The handler's message.
    pub handle_msg: Option<String>,
    /// wasmjob: fuel a successful run consumed.
    pub fuel_used: Option<i64>,
    /// wasmjob: when the executor started the handler (ms since the epoch).
    pub started_at: Option<i64>,
    /// XXL-JOB 2.2 reports the result here instead of `handleCode`/`handleMsg`. Read only: it
    /// is always written from `handleCode`/`handleMsg`.
    pub execute_result: Option<ReturnT<String>>,
    /// Never on the wire: the admin URL the executor delivers the result to first (its run's
    /// [`TriggerParam::reply_to`]). Not kept on disk either: after a restart the executor
    /// delivers in its admins' order.
    pub reply_to: Option<String>,
}

/// `HandleCallbackParam` as read: either spelling of the time, or both.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct CallbackIn {
    log_id: i64,
    log_date_tim: Option<i64>,
    log_date_time: Option<i64>,
    handle_code: i32,
    handle_msg: Option<String>,
    fuel_used: Option<i64>,
    started_at: Option<i64>,
    execute_result: Option<ReturnT<String>>,
}

impl From<CallbackIn> for HandleCallbackParam {
    fn from(read: CallbackIn) -> HandleCallbackParam {
        HandleCallbackParam {
            log_id: read.log_id,
            log_date_tim: read.log_date_tim.or(read.log_date_time).unwrap_or_default(),
            handle_code: read.handle_code,
            handle_msg: read.handle_msg,
            fuel_used: read.fuel_used,
            started_at: read.started_at,
            execute_result: read.execute_result,
            reply_to: None,
        }
    }
}

impl Serialize for HandleCallbackParam {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            log_id: i64,
            log_date_tim: i64,
            log_date_time: i64,
            handle_code: i32,
            handle_msg: Option<&'a str>,
            execute_result: ExecuteResult<'a>,
            #[serde(skip_serializing_if = "Option::is_none")]
            fuel_used: Option<i64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            started_at: Option<i64>,
        }
        /// 2.2's `ReturnT<String>`: it reads `code` and `msg`.
        #[derive(Serialize)]
        struct ExecuteResult<'a> {
            code: i32,
            msg: Option<&'a str>,
        }
        let (handle_code, handle_msg) = match &self.execute_result {
            Some(result) if self.handle_code == 0 => (result.code, result.msg.as_deref()),
            _ => (self.handle_code, self.handle_msg.as_deref()),
        };
        Wire {
            log_id: self.log_id,
            log_date_tim: self.log_date_tim,
            log_date_time: self.log_date_tim,
            handle_code,
            handle_msg,
            execute_result: ExecuteResult { code: handle_code, msg: handle_msg },
            fuel_used: self.fuel_used,
            started_at: self.started_at,
        }
        .serialize(serializer)
    }
}

/// An `/api/callback` body as XXL-JOB 3.5 admins read it: `{"callbackList": [...]}`.
#[derive(Debug, Serialize)]
pub struct CallbackList<'a> {
    /// The results.
    #[serde(rename = "callbackList")]
    pub callback_list: &'a [&'a HandleCallbackParam],
}

impl HandleCallbackParam {
    /// The result's code and message, whichever generation of the protocol sent it.
    pub fn code_and_msg(&self) -> (i32, String) {
        match &self.execute_result {
            Some(result) if self.handle_code == 0 => {
                (result.code, result.msg.clone().unwrap_or_default())
            }
            _ => (self.handle_code, self.handle_msg.clone().unwrap_or_default()),
        }
    }
}

/// The body of `/api/callback`: a bare array, or `{callbackList: [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CallbackBody {
    /// XXL-JOB's bare array.
    List(Vec<HandleCallbackParam>),
    /// XXL-JOB 3.5's wrapped form.
    Wrapped {
        /// The results.
        #[serde(rename = "callbackList")]
        callback_list: Vec<HandleCallbackParam>,
    },
}

impl CallbackBody {
    /// The results, whichever form they came in.
    pub fn into_list(self) -> Vec<HandleCallbackParam> {
        match self {
            CallbackBody::List(list) | CallbackBody::Wrapped { callback_list: list } => list,
        }
    }
}

#[cfg(test)]
mod tests;
