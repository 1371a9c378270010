//! `wasmjob log RUN [--follow]`: a run's log read in pages, or followed as it grows over the
//! run's Server-Sent Events stream, resuming with `Last-Event-ID` when the connection drops.

use std::time::Duration;

use serde_json::Value;

use super::{Api, ClientError, ExitKind, unavailable};

/// Prints run `run`'s log; with `follow`, as it grows, until the run ends.
pub(super) async fn log(api: &Api, run: i64, follow: bool) -> Result<(), ClientError> {
    if !follow {
        let mut from_line = 1;
        loop {
            let page = api
                .call("GET", &format!("/logs/{run}/content?from_line={from_line}"), None)
                .await?;
            let content = page["content"].as_str().unwrap_or_default();
            api.write(content)?;
            let to_line = page["to_line"].as_i64().unwrap_or(from_line - 1);
            if page["is_end"].as_bool() != Some(false) || to_line < from_line {
                return Ok(());
            }
            from_line = to_line + 1;
        }
    }
    let mut last_id: Option<String> = None;
    let mut retries = 0;
    loop {
        let mut request = api.request("GET", &format!("/logs/{run}/stream"));
        if let Some(last) = &last_id {
            request = request.header("last-event-id", last);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if retries < 5 && last_id.is_some() => {
                retries += 1;
                tracing::debug!(%error, "reconnecting to the log stream");
                tokio::time::sleep(Duration::from_millis(200 << retries)).await;
                continue;
            }
            Err(error) => return Err(unavailable(&api.base, &error)),
        };
        let response = api.check(response).await?;
        match follow_stream(api, response, &mut last_id).await? {
            Some(end) => {
                let state = end["state"].as_str().unwrap_or("unknown");
                if state == "success" {
                    return Ok(());
                }
                let message = end["handle_msg"].as_str().unwrap_or_default();
                return Err(ClientError::new(
                    ExitKind::RunFailed,
                    format!("run {run} ended {state}: {message}"),
                ));
            }
            None if retries < 5 => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(200 << retries)).await;
            }
            None => {
                return Err(ClientError::new(
                    ExitKind::Unavailable,
                    "the log stream kept breaking",
                ));
            }
        }
    }
}

/// Prints the lines of one SSE connection; the `end` event's data, or `None` if the
/// connection ended first. `last_id` follows the lines printed.
async fn follow_stream(
    api: &Api,
    mut response: reqwest::Response,
    last_id: &mut Option<String>,
) -> Result<Option<Value>, ClientError> {
    let mut buffer = String::new();
    let (mut id, mut event, mut data): (Option<String>, Option<String>, Vec<String>) =
        (None, None, Vec::new());
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) | Err(_) => return Ok(None),
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(newline) = buffer.find('\n') {
            let line: String = buffer.drain(..=newline).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                let text = data.join("\n");
                match event.take().as_deref() {
                    Some("end") => {
                        return Ok(Some(serde_json::from_str(&text).unwrap_or(Value::Null)));
                    }
                    _ if id.is_some() => {
                        api.line(&text)?;
                        *last_id = id.take();
                    }
                    _ => {}
                }
                data.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
            match field {
                "id" => id = Some(value),
                "event" => event = Some(value),
                "data" => data.push(value),
                _ => {}
            }
        }
    }
}
