//! `wasmjob calendar list|get|apply -f|delete|import-ics`: business calendars through the API.
//!
//! `apply` creates the calendar a JSON file names, or replaces it when it exists, so that a
//! calendar kept in a repository is applied the same way every time. It checks nothing the
//! admin checks: the admin's refusal is the error.

use serde_json::Value;

use super::table::encode;
use super::{Api, ClientError, ExitKind};
use crate::cli::client::CalendarCommand;

/// Runs one `wasmjob calendar` command.
pub(super) async fn calendar(api: &Api, command: CalendarCommand) -> Result<(), ClientError> {
    match command {
        CalendarCommand::List => api.table(
            &api.call("GET", "/calendars", None).await?,
            &["name", "time_zone", "description", "updated_at"],
        ),
        CalendarCommand::Get { name } => {
            api.record(&api.call("GET", &format!("/calendars/{}", encode(&name)), None).await?)
        }
        CalendarCommand::Apply { file } => {
            let usage = |message: String| ClientError::new(ExitKind::Usage, message);
            let text = std::fs::read_to_string(&file)
                .map_err(|error| usage(format!("{}: {error}", file.display())))?;
            let body: Value = serde_json::from_str(&text)
                .map_err(|error| usage(format!("{}: not JSON: {error}", file.display())))?;
            let Some(name) = body["name"].as_str().map(encode) else {
                return Err(usage(format!("{}: the calendar needs a `name`", file.display())));
            };
            let exists = match api.call("GET", &format!("/calendars/{name}"), None).await {
                Ok(_) => true,
                Err(error) if error.kind == ExitKind::NotFound => false,
                Err(error) => return Err(error),
            };
            let applied = if exists {
                api.call("PUT", &format!("/calendars/{name}"), Some(body)).await?
            } else {
                api.call("POST", "/calendars", Some(body)).await?
            };
            api.record(&applied)
        }
        CalendarCommand::Delete { name } => {
            api.call("DELETE", &format!("/calendars/{}", encode(&name)), None).await?;
            api.done(&format!("deleted calendar {name}"))
        }
        CalendarCommand::ImportIcs { name, file, included } => {
            let bytes = std::fs::read(&file).map_err(|error| {
                ClientError::new(ExitKind::Usage, format!("{}: {error}", file.display()))
            })?;
            let path = format!("/calendars/{}/ics?included={included}", encode(&name));
            let request =
                api.request("POST", &path).header("content-type", "text/calendar").body(bytes);
            api.record(&api.send(request).await?)
        }
    }
}
