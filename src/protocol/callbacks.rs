//! An `/api/callback` body as an admin reads it: a bare array of results or XXL-JOB 3.5's
//! `{callbackList: [...]}`, each entry parsed on its own so that one bad entry cannot sink the
//! batch.

use serde::Deserialize;

use super::HandleCallbackParam;

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
///
/// The batch is read as the entries' raw text, each then parsed straight into its result: no
/// entry is built as a `serde_json::Value` first, but the one refused, for its `logId`.
pub fn parse_callbacks(body: &[u8]) -> Result<Callbacks, String> {
    /// `{callbackList: [...]}`, its other fields ignored.
    #[derive(Deserialize)]
    struct Wrapped<'a> {
        #[serde(rename = "callbackList", borrow)]
        callback_list: Option<Vec<&'a serde_json::value::RawValue>>,
    }
    const NOT_A_BATCH: &str = "invalid request body: expected an array or {callbackList: [...]}";
    let lossy = String::from_utf8_lossy(body);
    let text = repair_surrogates(&lossy);
    let invalid = |error: serde_json::Error| format!("invalid request body: {error}");
    let entries: Vec<&serde_json::value::RawValue> = match text.trim_start().as_bytes().first() {
        Some(b'[') => serde_json::from_str(&text).map_err(invalid)?,
        Some(b'{') => {
            let wrapped: Wrapped<'_> = serde_json::from_str(&text).map_err(|error| {
                if error.is_data() { NOT_A_BATCH.to_owned() } else { invalid(error) }
            })?;
            wrapped.callback_list.ok_or_else(|| NOT_A_BATCH.to_owned())?
        }
        _ => {
            // Not JSON, or JSON of another kind: say which.
            return Err(match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
                Ok(_) => NOT_A_BATCH.to_owned(),
                Err(error) => invalid(error),
            });
        }
    };
    let mut callbacks =
        Callbacks { results: Vec::with_capacity(entries.len()), refused: Vec::new() };
    for entry in entries {
        match serde_json::from_str::<HandleCallbackParam>(entry.get()) {
            Ok(result) => callbacks.results.push(result),
            Err(error) => {
                let log_id = serde_json::from_str::<serde_json::Value>(entry.get())
                    .ok()
                    .and_then(|entry| entry.get("logId").map(ToString::to_string))
                    .unwrap_or_else(|| "?".to_owned());
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
