//! The `overlapping_runs` figure: runs of a capped job executing at once beyond its cap, across
//! every executor, read from the journals (`accepted <logId> <jobId> <ms>`, `started <logId>
//! <ms>`, `finished <logId> <code> <ms>`).
//!
//! A run executes from its `started` line to its `finished` line on the same executor. A run
//! with no `finished` line died with its executor: it ran until that executor's first death
//! after its start (the scenario records each death), or, with none recorded, until the check.

use std::collections::HashMap;
use std::path::PathBuf;

/// A run's execution on one executor: its job and when it ran (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Execution {
    pub log_id: i64,
    pub job_id: i64,
    pub started_ms: i64,
    pub ended_ms: i64,
}

/// Every execution the journals of `executor_dirs` show, each ended by its `finished` line, by
/// the executor's first death after it started (`deaths`, by executor), or at `now_ms`.
pub(super) fn executions(
    executor_dirs: &[PathBuf],
    deaths: &[Vec<i64>],
    now_ms: i64,
) -> Vec<Execution> {
    let mut jobs: HashMap<i64, i64> = HashMap::new();
    let mut per_executor = Vec::new();
    for (index, dir) in executor_dirs.iter().enumerate() {
        let (mut started, mut finished) = (HashMap::new(), HashMap::new());
        for line in journal_lines(&dir.join("journal")) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |at: usize| fields.get(at).and_then(|field| field.parse::<i64>().ok());
            match (fields.first().copied(), number(1)) {
                (Some("accepted"), Some(log_id)) => {
                    if let Some(job_id) = number(2) {
                        jobs.insert(log_id, job_id);
                    }
                }
                (Some("started"), Some(log_id)) => {
                    if let Some(ms) = number(2) {
                        started.insert(log_id, ms);
                    }
                }
                (Some("finished"), Some(log_id)) => {
                    if let Some(ms) = number(3) {
                        finished.insert(log_id, ms);
                    }
                }
                _ => {}
            }
        }
        let died = deaths.get(index).cloned().unwrap_or_default();
        per_executor.push((started, finished, died));
    }
    let mut out = Vec::new();
    for (started, finished, died) in per_executor {
        for (log_id, started_ms) in started {
            let Some(job_id) = jobs.get(&log_id).copied() else { continue };
            let ended_ms = finished.get(&log_id).copied().unwrap_or_else(|| {
                died.iter().copied().filter(|at| *at >= started_ms).min().unwrap_or(now_ms)
            });
            out.push(Execution { log_id, job_id, started_ms, ended_ms });
        }
    }
    out.sort_by_key(|execution| (execution.job_id, execution.started_ms, execution.log_id));
    out
}

/// The executions that started while their job's cap (`caps`, by job; jobs without a cap are
/// not judged) was already taken by others, each with the runs it overlapped.
pub(super) fn overlapping(
    executions: &[Execution],
    caps: &HashMap<i64, i64>,
) -> Vec<(Execution, Vec<i64>)> {
    let mut found = Vec::new();
    for (index, execution) in executions.iter().enumerate() {
        let Some(cap) = caps.get(&execution.job_id).copied().filter(|cap| *cap > 0) else {
            continue;
        };
        // Sorted by job and start: the executions of the job that started before this one.
        let running: Vec<i64> = executions[..index]
            .iter()
            .filter(|other| other.job_id == execution.job_id)
            .filter(|other| other.ended_ms > execution.started_ms)
            .map(|other| other.log_id)
            .collect();
        if running.len() as i64 >= cap {
            found.push((*execution, running));
        }
    }
    found
}

fn journal_lines(journal: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(journal) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    paths.sort();
    let mut lines = Vec::new();
    for path in paths {
        // A torn last line (a process killed mid-write) does not parse and counts for nothing.
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        lines.extend(text.lines().map(str::to_owned));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(log_id: i64, job_id: i64, started_ms: i64, ended_ms: i64) -> Execution {
        Execution { log_id, job_id, started_ms, ended_ms }
    }

    #[test]
    fn overlaps_are_counted_past_the_cap_only() {
        let caps = HashMap::from([(1, 1), (2, 2)]);
        let mut executions = vec![
            // Job 1, cap 1: back to back is fine; 12 starts inside 11.
            run(10, 1, 0, 100),
            run(11, 1, 100, 200),
            run(12, 1, 150, 300),
            // Job 2, cap 2: two at once is fine, a third is not.
            run(20, 2, 0, 100),
            run(21, 2, 10, 100),
            run(22, 2, 50, 60),
            // Job 3 has no cap.
            run(30, 3, 0, 100),
            run(31, 3, 0, 100),
        ];
        executions.sort_by_key(|e| (e.job_id, e.started_ms, e.log_id));
        let found: Vec<(i64, Vec<i64>)> = overlapping(&executions, &caps)
            .into_iter()
            .map(|(execution, running)| (execution.log_id, running))
            .collect();
        assert_eq!(found, [(12, vec![11]), (22, vec![20, 21])]);
    }
}
