//! Figures for the console's dashboard, read from the run table.

use sqlx::Row;

use super::{Db, Result, parse_column};
use crate::model::RunState;

impl Db {
    /// Runs created at or after `since_ms`, counted by state, in the order of the states.
    pub async fn count_runs_by_state(&self, since_ms: i64) -> Result<Vec<(RunState, i64)>> {
        let rows = sqlx::query(
            "select state, count(*) as n from runs where created_at >= $1 group by state",
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut counts = rows
            .iter()
            .map(|row| Ok((parse_column::<RunState>(row, "state")?, row.try_get::<i64, _>("n")?)))
            .collect::<Result<Vec<_>>>()?;
        counts.sort_by_key(|(state, _)| RunState::ALL.iter().position(|s| s == state));
        Ok(counts)
    }
}
