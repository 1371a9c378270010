//! `wasmjob job backfill|backfills|backfill-pause|backfill-resume|backfill-cancel`: backfills
//! through `/api/v1`, and `--follow`, which polls the backfill and draws its progress on stderr
//! until it ends.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Api, ClientError, ExitKind};
use crate::cli::client::JobCommand;

/// How often `--follow` reads the backfill.
const POLL: Duration = Duration::from_millis(500);
/// The width of the progress bar, in characters.
const BAR_WIDTH: usize = 30;

const BACKFILL_COLUMNS: &[&str] =
    &["id", "state", "from", "to", "total", "done", "failed", "skipped", "running", "remaining"];

/// Runs one of the backfill commands of `wasmjob job`.
pub(super) async fn command(api: &Api, command: JobCommand) -> Result<(), ClientError> {
    match command {
        JobCommand::Backfill { id, from, to, max_concurrent, rerun, follow } => {
            let mut body = json!({"from": from, "to": to, "rerun": rerun});
            if let Some(max_concurrent) = max_concurrent {
                body["max_concurrent"] = max_concurrent.into();
            }
            let created = api.call("POST", &format!("/jobs/{id}/backfill"), Some(body)).await?;
            if !follow {
                return api.record(&created);
            }
            let Some(backfill_id) = created["id"].as_i64() else { return api.record(&created) };
            follow_backfill(api, backfill_id).await
        }
        JobCommand::Backfills { id } => {
            let list = api.call("GET", &format!("/jobs/{id}/backfills"), None).await?;
            if api.json {
                return api.print_json(&list);
            }
            api.table(&list["items"], BACKFILL_COLUMNS)
        }
        JobCommand::BackfillPause { backfill_id } => change(api, backfill_id, "pause").await,
        JobCommand::BackfillResume { backfill_id } => change(api, backfill_id, "resume").await,
        JobCommand::BackfillCancel { backfill_id } => change(api, backfill_id, "cancel").await,
        other => {
            Err(ClientError::new(ExitKind::Usage, format!("not a backfill command: {other:?}")))
        }
    }
}

async fn change(api: &Api, id: i64, action: &str) -> Result<(), ClientError> {
    api.record(&api.call("POST", &format!("/backfills/{id}/{action}"), Some(json!({}))).await?)
}

/// Polls backfill `id` until it is done or cancelled, drawing its progress on stderr (one line
/// redrawn on a terminal, a line per change otherwise), then prints it. Fails with
/// [`ExitKind::RunFailed`] if an instant failed or the backfill was cancelled.
async fn follow_backfill(api: &Api, id: i64) -> Result<(), ClientError> {
    let terminal = std::io::stderr().is_terminal();
    let mut last = String::new();
    let backfill = loop {
        let backfill = api.call("GET", &format!("/backfills/{id}"), None).await?;
        let line = progress_line(&backfill);
        if line != last {
            let mut stderr = std::io::stderr().lock();
            let _ = if terminal { write!(stderr, "\r{line}") } else { writeln!(stderr, "{line}") };
            let _ = stderr.flush();
            last = line;
        }
        if matches!(backfill["state"].as_str(), Some("done" | "cancelled")) {
            if terminal {
                let _ = writeln!(std::io::stderr());
            }
            break backfill;
        }
        tokio::time::sleep(POLL).await;
    };
    api.record(&backfill)?;
    let failed = backfill["failed"].as_i64().unwrap_or(0);
    let state = backfill["state"].as_str().unwrap_or_default();
    if failed > 0 || state == "cancelled" {
        return Err(ClientError::new(
            ExitKind::RunFailed,
            format!("backfill {id} ended {state} with {failed} failed instants"),
        ));
    }
    Ok(())
}

/// `[#########---------]  512/10000  done 500  failed 2  skipped 10  running 10  running`.
fn progress_line(backfill: &Value) -> String {
    let count = |field: &str| backfill[field].as_i64().unwrap_or(0);
    let total = count("total");
    let finished = count("done") + count("failed") + count("skipped");
    let filled = if total > 0 {
        usize::try_from(finished * BAR_WIDTH as i64 / total).unwrap_or(0).min(BAR_WIDTH)
    } else {
        BAR_WIDTH
    };
    format!(
        "[{}{}] {finished}/{total}  done {}  failed {}  skipped {}  running {}  {}",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        count("done"),
        count("failed"),
        count("skipped"),
        count("running"),
        backfill["state"].as_str().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_finished_instants() {
        let backfill = json!({"total": 100, "done": 40, "failed": 5, "skipped": 5, "running": 3,
            "state": "running"});
        expect_test::expect!["[###############---------------] 50/100  done 40  failed 5  skipped 5  running 3  running"]
            .assert_eq(&progress_line(&backfill));
    }
}
