//! A trigger's body written by hand, byte for byte as `serde_json` writes it: the admin writes
//! one for every run it sends, and `serde_json` escapes each key and string a byte at a time,
//! most of what writing a trigger cost.

use std::fmt::Display;

use super::{ProtocolError, TriggerParam};

impl ProtocolError {
    /// Why a body for `target` could not be written (a trigger's nested lists failed to
    /// serialize): nothing was sent.
    pub fn unwritable(target: impl Display, error: &serde_json::Error) -> Self {
        ProtocolError::NotAllowed {
            reason: format!("{target}: the body cannot be written: {error}"),
        }
    }
}

impl TriggerParam {
    /// Appends this trigger to `out` as JSON, exactly as `serde_json::to_writer` writes it.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"jobId\":");
        int(out, self.job_id);
        out.extend_from_slice(b",\"executorHandler\":");
        string(out, &self.executor_handler);
        out.extend_from_slice(b",\"executorParams\":");
        string(out, &self.executor_params);
        out.extend_from_slice(b",\"executorBlockStrategy\":");
        string(out, &self.executor_block_strategy);
        out.extend_from_slice(b",\"executorTimeout\":");
        int(out, self.executor_timeout);
        out.extend_from_slice(b",\"logId\":");
        int(out, self.log_id);
        out.extend_from_slice(b",\"logDateTime\":");
        int(out, self.log_date_time);
        out.extend_from_slice(b",\"glueType\":");
        string(out, &self.glue_type);
        out.extend_from_slice(b",\"glueSource\":");
        string(out, &self.glue_source);
        out.extend_from_slice(b",\"glueUpdatetime\":");
        int(out, self.glue_updatetime);
        out.extend_from_slice(b",\"broadcastIndex\":");
        int(out, self.broadcast_index);
        out.extend_from_slice(b",\"broadcastTotal\":");
        int(out, self.broadcast_total);
        if let Some(attempt) = self.attempt {
            out.extend_from_slice(b",\"attempt\":");
            int(out, attempt);
        }
        if let Some(fuel_limit) = self.fuel_limit {
            out.extend_from_slice(b",\"fuelLimit\":");
            int(out, fuel_limit);
        }
        if let Some(memory_limit_mb) = self.memory_limit_mb {
            out.extend_from_slice(b",\"memoryLimitMb\":");
            int(out, memory_limit_mb);
        }
        if let Some(items) = &self.sharding_items {
            out.extend_from_slice(b",\"shardingItems\":");
            serde_json::to_writer(&mut *out, items)?;
        }
        if let Some(not_before) = self.not_before {
            out.extend_from_slice(b",\"notBefore\":");
            int(out, not_before);
        }
        if let Some(inputs) = &self.workflow_inputs {
            out.extend_from_slice(b",\"workflowInputs\":");
            serde_json::to_writer(&mut *out, inputs)?;
        }
        if let Some(reply_to) = &self.reply_to {
            out.extend_from_slice(b",\"replyTo\":");
            string(out, reply_to);
        }
        out.push(b'}');
        Ok(())
    }
}

/// Appends `triggers` to `out` as a JSON array, as `serde_json` writes a list of them.
pub fn write_json_list<'a>(
    triggers: impl IntoIterator<Item = &'a TriggerParam>,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    out.push(b'[');
    for (at, trigger) in triggers.into_iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        trigger.write_json(out)?;
    }
    out.push(b']');
    Ok(())
}

fn int(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// `text` as a JSON string, escaped as `serde_json` escapes it: `"` and `\`, the control
/// characters with a short escape by it, the others as `\u00XX`; nothing else.
fn string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    // Checked without stopping early, so that the check is a few instructions a byte.
    let plain = !bytes
        .iter()
        .fold(false, |seen, &byte| seen | (byte < 0x20) | (byte == b'"') | (byte == b'\\'));
    if plain {
        out.extend_from_slice(bytes);
    } else {
        let mut start = 0;
        for (at, &byte) in bytes.iter().enumerate() {
            let short: &[u8] = match byte {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0x08 => b"\\b",
                0x0c => b"\\f",
                0..0x20 => b"",
                _ => continue,
            };
            out.extend_from_slice(&bytes[start..at]);
            if short.is_empty() {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let escaped = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xf)],
                ];
                out.extend_from_slice(&escaped);
            } else {
                out.extend_from_slice(short);
            }
            start = at + 1;
        }
        out.extend_from_slice(&bytes[start..]);
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{NodeOutputParam, ShardOutputParam, ShardingItemParam};

    /// Every string a trigger may carry, escapes and all: control characters with and without a
    /// short escape, quotes, backslashes, DEL, and text past ASCII.
    const TEXTS: [&str; 8] = [
        "",
        "demoJobHandler",
        "say \"hi\" \\ to C:\\temp",
        "lines\nand\ttabs\rand\u{8}\u{c}",
        "\u{0}\u{1}\u{1f}\u{7f}",
        "北京 — café ✓ 🚀",
        "end with a quote\"",
        "\\",
    ];

    #[test]
    fn a_trigger_is_written_as_serde_json_writes_it() {
        let mut triggers = vec![TriggerParam::default()];
        for (at, text) in TEXTS.iter().enumerate() {
            let at = at as i64;
            let text = text.to_string();
            triggers.push(TriggerParam {
                job_id: at,
                executor_handler: text.clone(),
                executor_params: format!("{text}{text}"),
                executor_block_strategy: "SERIAL_EXECUTION".to_owned(),
                executor_timeout: -at,
                log_id: i64::MAX - at,
                log_date_time: i64::MIN + at,
                glue_type: "GLUE_WASM".to_owned(),
                glue_source: text.clone(),
                glue_updatetime: 1_764_590_400_000,
                broadcast_index: at,
                broadcast_total: 8,
                attempt: (at % 2 == 0).then_some(at),
                fuel_limit: (at % 3 == 0).then_some(1_000_000_000),
                memory_limit_mb: (at % 2 == 1).then_some(64),
                sharding_items: (at % 2 == 0)
                    .then(|| vec![ShardingItemParam { item: 3, parameter: text.clone() }]),
                not_before: (at % 3 == 1).then_some(-1),
                workflow_inputs: (at % 3 == 2).then(|| {
                    let output = ShardOutputParam { shard: 0, message: text.clone() };
                    let node = NodeOutputParam {
                        node: text.clone(),
                        job_id: at,
                        state: "succeeded".to_owned(),
                        outputs: vec![output],
                    };
                    vec![node]
                }),
                reply_to: (at % 2 == 1).then(|| format!("http://127.0.0.1:8080/{text}")),
            });
        }
        for trigger in &triggers {
            let mut written = Vec::new();
            trigger.write_json(&mut written).unwrap();
            let expected = serde_json::to_vec(trigger).unwrap();
            assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&expected));
            let read: TriggerParam = serde_json::from_slice(&written).unwrap();
            assert_eq!(&read, trigger);
        }
        for count in [0, 1, triggers.len()] {
            let mut written = Vec::new();
            write_json_list(&triggers[..count], &mut written).unwrap();
            let listed: Vec<&TriggerParam> = triggers[..count].iter().collect();
            assert_eq!(written, serde_json::to_vec(&listed).unwrap());
        }
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        for byte in 0..=0x7fu8 {
            let text = String::from(char::from(byte));
            let mut written = Vec::new();
            string(&mut written, &text);
            assert_eq!(written, serde_json::to_vec(&text).unwrap(), "byte {byte:#04x}");
        }
    }
}
