//! The admin⇄executor wire format: XXL-JOB's executor protocol (2.2–3.4, tolerant of 3.5),
//! extended for Wasm, and the HTTP client both sides use to speak it.
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

mod client;

use serde::{Deserialize, Serialize};

pub use self::client::{
    Client, ClientOptions, EXCERPT_CHARS, MAX_REPLY_BYTES, ProtocolError, excerpt, join_url,
};

/// The header that carries the access token.
pub const ACCESS_TOKEN_HEADER: &str = "XXL-JOB-ACCESS-TOKEN";
/// The header that names the calling application (sent, and accepted, for compatibility).
pub const APP_NAME_HEADER: &str = "XXL-JOB-APPNAME";
/// `registryGroup` of executors.
pub const REGISTRY_GROUP_EXECUTOR: &str = "EXECUTOR";
/// `glueType` of uploaded Wasm modules.
pub const GLUE_WASM: &str = "GLUE_WASM";

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
}

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

/// `/log`: a page of a run's log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LogParam {
    /// The run's trigger time (ms); XXL-JOB spells it `logDateTim`.
    #[serde(alias = "logDateTime")]
    pub log_date_tim: i64,
    /// The run's id.
    pub log_id: i64,
    /// The first line wanted, 1-based.
    pub from_line_num: i64,
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
    /// (reconciliation). XXL-JOB executors do not send it, and are never reconciled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_runs: Option<Vec<i64>>,
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HandleCallbackParam {
    /// The run's id.
    pub log_id: i64,
    /// The run's trigger time (ms).
    #[serde(alias = "logDateTime")]
    pub log_date_tim: i64,
    /// 200 success, 500 failure, 502 timeout.
    pub handle_code: i32,
    /// The handler's message.
    pub handle_msg: Option<String>,
    /// wasmjob: fuel a successful run consumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel_used: Option<i64>,
    /// wasmjob: when the executor started the handler (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    /// XXL-JOB 2.2 reports the result here instead of `handleCode`/`handleMsg`.
    #[serde(skip_serializing)]
    pub execute_result: Option<ReturnT<String>>,
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
    /// The wrapped form some clients send.
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

/// The entries of one `/api/callback` body, each parsed on its own.
#[derive(Debug, Clone, Default)]
pub struct Callbacks {
    /// The entries that parsed.
    pub results: Vec<HandleCallbackParam>,
    /// Why each other entry was refused.
    pub refused: Vec<String>,
}

/// Reads an `/api/callback` body (a bare array or `{callbackList: [...]}`) so that one bad entry
/// cannot sink the batch: invalid UTF-8 and lone UTF-16 surrogate escapes (which a strict parser
/// refuses for the whole document) become U+FFFD, and each entry is parsed alone. `Err` only
/// when the body as a whole is not a batch.
pub fn parse_callbacks(body: &[u8]) -> Result<Callbacks, String> {
    let lossy = String::from_utf8_lossy(body);
    let text = repair_surrogates(&lossy);
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| format!("invalid request body: {error}"))?;
    let entries = match value {
        serde_json::Value::Array(entries) => entries,
        serde_json::Value::Object(mut object) => match object.remove("callbackList") {
            Some(serde_json::Value::Array(entries)) => entries,
            _ => {
                return Err(
                    "invalid request body: expected an array or {callbackList: [...]}".into()
                );
            }
        },
        _ => return Err("invalid request body: expected an array or {callbackList: [...]}".into()),
    };
    let mut callbacks = Callbacks::default();
    for entry in entries {
        let log_id = entry.get("logId").cloned();
        match serde_json::from_value::<HandleCallbackParam>(entry) {
            Ok(result) => callbacks.results.push(result),
            Err(error) => {
                let log_id = log_id.map_or_else(|| "?".to_owned(), |id| id.to_string());
                callbacks.refused.push(format!("logId {log_id}: {error}"));
            }
        }
    }
    Ok(callbacks)
}

/// Replaces `\uXXXX` escapes of UTF-16 surrogates that do not form a pair with `\ufffd`.
fn repair_surrogates(text: &str) -> std::borrow::Cow<'_, str> {
    fn escape_at(bytes: &[u8], at: usize) -> Option<u16> {
        let hex = bytes.get(at..at + 6)?;
        if &hex[..2] != b"\\u" {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    }
    if !text.contains("\\u") {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        let Some(unit) = escape_at(bytes, at) else {
            // Another escape (`\\`, `\"`, …): skip it whole so its second byte is not read
            // as the start of an escape.
            at += 2;
            continue;
        };
        let paired = match unit {
            0xD800..=0xDBFF => {
                escape_at(bytes, at + 6).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low))
            }
            0xDC00..=0xDFFF => false,
            _ => true,
        };
        if paired {
            at += if (0xD800..=0xDBFF).contains(&unit) { 12 } else { 6 };
            continue;
        }
        out.push_str(&text[copied..at]);
        out.push_str("\\ufffd");
        at += 6;
        copied = at;
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}

/// Compares two secrets in time that depends only on their lengths.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_param_reads_xxl_job_json() {
        let json = r#"{"jobId":7,"executorHandler":"demoJobHandler","executorParams":"x",
            "executorBlockStrategy":"SERIAL_EXECUTION","executorTimeout":0,"logId":42,
            "logDateTime":1700000000000,"glueType":"BEAN","glueSource":"","glueUpdatetime":0,
            "broadcastIndex":0,"broadcastTotal":1,"somethingNew":true}"#;
        let param: TriggerParam = serde_json::from_str(json).unwrap();
        assert_eq!((param.job_id, param.log_id, param.attempt), (7, 42, None));
        let wrong = serde_json::from_str::<TriggerParam>(r#"{"jobId":"seven"}"#).unwrap_err();
        assert!(wrong.to_string().contains("invalid type"), "{wrong}");
    }

    #[test]
    fn sharding_items_travel_only_when_there_are_some() {
        let plain = serde_json::to_string(&TriggerParam::default()).unwrap();
        assert!(!plain.contains("shardingItems"), "{plain}");
        let items = vec![ShardingItemParam { item: 2, parameter: "Guangzhou".to_owned() }];
        let sharded =
            TriggerParam { sharding_items: Some(items.clone()), ..TriggerParam::default() };
        let json = serde_json::to_string(&sharded).unwrap();
        assert!(json.contains(r#""shardingItems":[{"item":2,"parameter":"Guangzhou"}]"#), "{json}");
        let read: TriggerParam = serde_json::from_str(&json).unwrap();
        assert_eq!(read.sharding_items, Some(items));
    }

    #[test]
    fn callback_body_takes_both_forms() {
        let bare = r#"[{"logId":1,"logDateTim":5,"handleCode":200,"handleMsg":"ok"}]"#;
        let wrapped = r#"{"callbackList":[{"logId":1,"logDateTim":5,"handleCode":200}]}"#;
        for json in [bare, wrapped] {
            let list = serde_json::from_str::<CallbackBody>(json).unwrap().into_list();
            assert_eq!((list[0].log_id, list[0].handle_code), (1, 200));
        }
        let old = r#"[{"logId":2,"logDateTim":5,"executeResult":{"code":500,"msg":"boom"}}]"#;
        let list = serde_json::from_str::<CallbackBody>(old).unwrap().into_list();
        assert_eq!(list[0].code_and_msg(), (500, "boom".to_owned()));
    }

    #[test]
    fn one_bad_callback_entry_does_not_sink_the_batch() {
        let body = br#"[{"logId":1,"handleCode":200,"handleMsg":"lone \ud800 here"},
            {"logId":2,"handleCode":"x"},
            {"logId":3,"handleCode":500,"handleMsg":"pair \ud83d\ude00 and \\ud800 literal"}]"#;
        let parsed = parse_callbacks(body).unwrap();
        let messages: Vec<_> =
            parsed.results.iter().map(|r| (r.log_id, r.handle_msg.clone().unwrap())).collect();
        assert_eq!(
            messages,
            [
                (1, "lone \u{fffd} here".to_owned()),
                (3, "pair \u{1f600} and \\ud800 literal".to_owned())
            ]
        );
        assert_eq!(parsed.refused.len(), 1, "{:?}", parsed.refused);
        assert!(parsed.refused[0].starts_with("logId 2:"), "{:?}", parsed.refused);
        let invalid_utf8 = b"[{\"logId\":4,\"handleCode\":500,\"handleMsg\":\"\xff\"}]";
        let parsed = parse_callbacks(invalid_utf8).unwrap();
        assert_eq!(parsed.results[0].handle_msg.as_deref(), Some("\u{fffd}"));
        assert!(parse_callbacks(b"{\"x\":1}").is_err());
    }

    #[test]
    fn envelope_payload_from_content_or_data() {
        let old: ReturnT<i32> = serde_json::from_str(r#"{"code":200,"content":3}"#).unwrap();
        let new: ReturnT<i32> = serde_json::from_str(r#"{"code":200,"data":4}"#).unwrap();
        assert_eq!((old.into_payload(), new.into_payload()), (Some(3), Some(4)));
        let sent = serde_json::to_string(&ReturnT::ok(5)).unwrap();
        assert_eq!(sent, r#"{"code":200,"content":5,"data":5}"#);
    }

    #[test]
    fn secrets_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
