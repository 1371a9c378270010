//! The platform's data: ids, groups, jobs, run records and the strategy enums.
//!
//! Everything here is plain data plus the invariants that hold whatever stores or moves it.
//! No IO, no async, no clock: times arrive as parameters (milliseconds since the Unix epoch).
//! The wire spellings of the strategy enums are XXL-JOB's (`CRON`, `SERIAL_EXECUTION`, ...), so
//! one `FromStr`/`as_str` pair serves the REST API, the database and the executor protocol.
#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// Declares a `Copy` enum with its canonical spelling, `as_str`, `FromStr` and `Display`.
macro_rules! spelled_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The canonical spelling (XXL-JOB's where it has one).
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        kind: stringify!($name),
                        value: text.to_owned(),
                        expected: &[$($text,)+],
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// A spelling that names no value of a strategy enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`, expected one of: {}", expected.join(", "))]
pub struct UnknownValue {
    /// The enum's name.
    pub kind: &'static str,
    /// What was given.
    pub value: String,
    /// The accepted spellings.
    pub expected: &'static [&'static str],
}

spelled_enum! {
    /// How a job's fire times are computed.
    pub enum ScheduleType {
        /// Quartz-style cron expression with a seconds field.
        Cron => "CRON",
        /// Every N seconds from the previous fire.
        FixRate => "FIX_RATE",
        /// N seconds after the previous fire's runs ended (Spring's `fixedDelay`).
        FixDelay => "FIX_DELAY",
        /// Once, at one instant.
        Once => "ONCE",
        /// Never fires on its own: manual, API and parent triggers only.
        None => "NONE",
    }
}

spelled_enum! {
    /// How the wait before a failed run's retry grows with each attempt.
    pub enum RetryBackoff {
        /// The same interval before every retry.
        Fixed => "FIXED",
        /// The interval doubles with each retry: interval × 2^(attempt - 1).
        Exponential => "EXPONENTIAL",
    }
}

spelled_enum! {
    /// What the scheduler does with a fire it noticed too late.
    pub enum MisfireStrategy {
        /// Skip the missed fire and wait for the next one.
        DoNothing => "DO_NOTHING",
        /// Fire once now, then go on with the schedule.
        FireOnceNow => "FIRE_ONCE_NOW",
    }
}

spelled_enum! {
    /// How a trigger picks the executor(s) among the group's online addresses.
    pub enum RouteStrategy {
        /// The first address.
        First => "FIRST",
        /// The last address.
        Last => "LAST",
        /// Round robin per job.
        Round => "ROUND",
        /// A random address.
        Random => "RANDOM",
        /// MD5 hash ring keyed by job id.
        ConsistentHash => "CONSISTENT_HASH",
        /// The address used least often for this job.
        LeastFrequentlyUsed => "LEAST_FREQUENTLY_USED",
        /// The address used least recently for this job.
        LeastRecentlyUsed => "LEAST_RECENTLY_USED",
        /// The first address whose `/beat` answers.
        Failover => "FAILOVER",
        /// The first address whose `/idleBeat` says idle.
        Busyover => "BUSYOVER",
        /// One run per online executor, each with its shard index.
        ShardingBroadcast => "SHARDING_BROADCAST",
    }
}

spelled_enum! {
    /// How a sharded job's items are spread over its online executors (ElasticJob's strategies).
    pub enum ShardingStrategy {
        /// Equal runs of consecutive items; the remainder one each to the first executors.
        AverageAllocation => "AVERAGE_ALLOCATION",
        /// Average allocation over the executors in descending order when the job name's hash
        /// is even, ascending when odd.
        OdevitySortByName => "ODEVITY_SORT_BY_NAME",
        /// Average allocation over the executors rotated by the job name's hash.
        RotateServerByName => "ROTATE_SERVER_BY_NAME",
        /// Each item to the executor whose bucket holds the digit sum of name and item.
        ConsistentHash => "CONSISTENT_HASH",
    }
}

spelled_enum! {
    /// What an executor does with a trigger for a job that is already running.
    pub enum BlockStrategy {
        /// Queue it behind the running one.
        SerialExecution => "SERIAL_EXECUTION",
        /// Refuse it; the trigger fails.
        DiscardLater => "DISCARD_LATER",
        /// Kill the running one and its queue, run this one.
        CoverEarly => "COVER_EARLY",
    }
}

spelled_enum! {
    /// Where a job's handler comes from.
    pub enum GlueType {
        /// An uploaded, versioned Wasm component fetched by digest.
        GlueWasm => "GLUE_WASM",
        /// A handler the executor already has (a component in its handlers dir, or a registered bean).
        Bean => "BEAN",
        /// Versions uploaded as Python text, built into components by the admin; run as `GLUE_WASM`.
        GluePython => "GLUE_PYTHON",
        /// Versions uploaded as JavaScript text, built into components by the admin; run as `GLUE_WASM`.
        GlueJavascript => "GLUE_JAVASCRIPT",
    }
}

impl GlueType {
    /// The language of this glue type's uploaded versions; `None` for `BEAN`, which has none.
    pub fn language(self) -> Option<Language> {
        match self {
            GlueType::GlueWasm => Some(Language::Wasm),
            GlueType::GluePython => Some(Language::Python),
            GlueType::GlueJavascript => Some(Language::Javascript),
            GlueType::Bean => None,
        }
    }

    /// Whether a run of it names an uploaded component by digest (every type but `BEAN`): source
    /// text never leaves the admin, executors get the component it was built into.
    pub fn runs_a_version(self) -> bool {
        self != GlueType::Bean
    }
}

spelled_enum! {
    /// What a job version was uploaded as.
    pub enum Language {
        /// A component, uploaded as it is.
        Wasm => "wasm",
        /// Python text, built with componentize-py.
        Python => "python",
        /// JavaScript text, built with componentize-js.
        Javascript => "javascript",
    }
}

spelled_enum! {
    /// Why a run exists.
    pub enum TriggerType {
        /// The cron or fix-rate schedule fired.
        Cron => "CRON",
        /// An operator asked for it.
        Manual => "MANUAL",
        /// A program asked for it through the API.
        Api => "API",
        /// A failed run is tried again.
        Retry => "RETRY",
        /// A parent job succeeded.
        Parent => "PARENT",
        /// A late fire, fired once now.
        Misfire => "MISFIRE",
        /// A backfill asked for a past instant of the schedule (`admin::backfill`).
        Backfill => "BACKFILL",
        /// A node of a workflow run started (`crate::workflow`).
        Workflow => "WORKFLOW",
    }
}

spelled_enum! {
    /// How an executor group learns its addresses.
    pub enum AddressType {
        /// From the executors' heartbeats.
        Auto => "AUTO",
        /// From the group's configuration.
        Manual => "MANUAL",
    }
}

spelled_enum! {
    /// Where a run is in its life (see `lifecycle` for the transitions).
    pub enum RunState {
        /// Created, waiting for its instant and a dispatcher.
        Pending => "pending",
        /// A dispatcher holds a lease on it and is routing or sending it.
        Dispatching => "dispatching",
        /// An executor accepted it; its result is awaited.
        Running => "running",
        /// The handler succeeded.
        Success => "success",
        /// The handler failed, or no executor took the run.
        Failed => "failed",
        /// The handler ran out of time (on the executor, or past the admin's deadline).
        TimedOut => "timed_out",
        /// An operator killed it.
        Killed => "killed",
        /// Its executor no longer holds it (restarted, gone, or never confirmed it).
        Lost => "lost",
        /// Never sent on purpose: its job was stopped before the fire went out, or its job's
        /// concurrency cap was reached and its block strategy is `DISCARD_LATER`.
        Skipped => "skipped",
    }
}

impl RunState {
    /// Whether the run has ended: no event changes a terminal state.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Pending | RunState::Dispatching | RunState::Running)
    }
}

/// XXL-JOB's result codes, used for `trigger_code` and `handle_code`.
pub mod code {
    /// Not known yet: the trigger is pending or the handler is running.
    pub const PENDING: i32 = 0;
    /// Success.
    pub const SUCCESS: i32 = 200;
    /// Failure.
    pub const FAILURE: i32 = 500;
    /// The handler ran out of time.
    pub const TIMEOUT: i32 = 502;
}

/// An executor group (XXL-JOB's `xxl_job_group`): the executors one job may be routed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group's id.
    pub id: i64,
    /// The application name executors register under.
    pub app_name: String,
    /// A human title.
    pub title: String,
    /// Whether addresses come from heartbeats or configuration.
    pub address_type: AddressType,
    /// The configured addresses (used when `address_type` is `MANUAL`).
    pub addresses: Vec<String>,
    /// The most runs of all its jobs dispatching or running at once; 0 means no cap.
    pub max_concurrent_runs: i64,
}

/// What an operator says about a job: what to run, when, and how to route and run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The group whose executors run it.
    pub group_id: i64,
    /// A human name.
    pub name: String,
    /// How fire times are computed.
    pub schedule_type: ScheduleType,
    /// The cron expression or the rate in seconds; empty for `NONE`.
    pub schedule_conf: String,
    /// The IANA time zone cron fields are read in; `None` means UTC.
    pub time_zone: Option<String>,
    /// What to do with a late fire.
    pub misfire_strategy: MisfireStrategy,
    /// How late a fire may be and still count as on time, in ms (XXL-JOB: 5 000).
    pub misfire_threshold_ms: i64,
    /// How to pick executors.
    pub route_strategy: RouteStrategy,
    /// What an executor does when the job is already running.
    pub block_strategy: BlockStrategy,
    /// Wall-clock limit of one run, in seconds; 0 means none.
    pub timeout_secs: i64,
    /// How many times a failed run is tried again.
    pub retry_count: i64,
    /// The wait before the first retry, in seconds; 0 retries at once.
    pub retry_interval_secs: i64,
    /// How the wait grows with each further retry.
    pub retry_backoff: RetryBackoff,
    /// The longest wait before a retry, in seconds; 0 means [`MAX_RETRY_INTERVAL_SECS`].
    pub retry_max_interval_secs: i64,
    /// Where the handler comes from.
    pub glue_type: GlueType,
    /// For `BEAN`, the handler's name.
    pub handler: Option<String>,
    /// The parameter passed to every scheduled run.
    pub param: String,
    /// Jobs triggered when a run of this one succeeds.
    pub child_job_ids: Vec<i64>,
    /// Where failure alarms go.
    pub alarm_email: Option<String>,
    /// After an alarm for this job, further failures within this many seconds are silenced
    /// (counted into the next alarm); 0 alarms on every final failure.
    pub alarm_silence_secs: i64,
    /// The fuel budget of one run; `None` means the executor's default.
    pub fuel_limit: Option<i64>,
    /// The memory cap of one run in MiB; `None` means the executor's default.
    pub memory_limit_mb: Option<i64>,
    /// ElasticJob sharding: how many items each fire is split into; 0 when not sharded.
    pub sharding_total_count: i64,
    /// ElasticJob sharding: the items' parameters as given, `0=Beijing,1=Shanghai`.
    pub sharding_item_parameters: String,
    /// ElasticJob sharding: how items are spread over the executors.
    pub sharding_strategy: ShardingStrategy,
    /// The most of its runs dispatching or running at once, on all executors together; 0 means
    /// no cap. Past it a run waits, pending, or as the block strategy says.
    pub max_concurrent_runs: i64,
    /// The business calendar whose excluded instants the job does not fire at, by name.
    pub calendar: Option<String>,
    /// What the job is for, for people; empty when not given.
    pub description: String,
    /// Who answers for the job (XXL-JOB's author); empty when not given.
    pub owner: String,
}

/// The most child jobs a job may have ([`JobSpec::child_job_ids`], each listed once): one
/// success creates a run of each in one transaction.
pub const MAX_CHILD_JOBS: usize = 100;

/// The longest wait before a retry ([`JobSpec::retry_interval_secs`] and
/// [`JobSpec::retry_max_interval_secs`]): one day.
pub const MAX_RETRY_INTERVAL_SECS: i64 = 86_400;

/// The largest concurrency cap of a job or a group ([`JobSpec::max_concurrent_runs`]).
pub const MAX_CONCURRENT_RUNS_CAP: i64 = 10_000;

/// The default [`JobSpec::alarm_silence_secs`]: one alarm per job per five minutes.
pub const DEFAULT_ALARM_SILENCE_SECS: i64 = 300;

/// The default [`JobSpec::misfire_threshold_ms`]: XXL-JOB's fixed 5 s.
pub const DEFAULT_MISFIRE_THRESHOLD_MS: i64 = 5_000;

/// One ElasticJob sharding item a run processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardingItem {
    /// The item's number, from 0 to the job's `sharding_total_count` - 1.
    pub item: u32,
    /// Its parameter (empty when the job gives none).
    pub parameter: String,
}

/// A job: its spec plus what the platform keeps about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The job's id.
    pub id: i64,
    /// What the operator set.
    pub spec: JobSpec,
    /// Whether the scheduler fires it.
    pub running: bool,
    /// The next fire time (ms since the epoch), 0 when none.
    pub next_fire_ms: i64,
    /// The active version of its module, if any was uploaded.
    pub active_version: Option<i64>,
    /// When it was created (ms).
    pub created_at_ms: i64,
    /// When it was last changed (ms): by the operator, or by the fire that ended it.
    pub updated_at_ms: i64,
    /// Bumped by every change a copy of the job must see, and only by those: a fire that
    /// moves the job to its next fire leaves it (see `Db::job_stamps`).
    pub revision: i64,
}

/// One immutable version of a job's module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobVersion {
    /// The job it belongs to.
    pub job_id: i64,
    /// 1, 2, 3... per job.
    pub version: i64,
    /// The module's sha256, lowercase hex.
    pub sha256: String,
    /// The module's size in bytes.
    pub size: i64,
    /// The operator's remark.
    pub remark: String,
    /// When it was uploaded (ms).
    pub created_at_ms: i64,
    /// What it was uploaded as.
    pub language: Language,
    /// Whether its source text is stored (a version uploaded as Python or JavaScript).
    pub has_source: bool,
}

/// One run of a job (XXL-JOB's `xxl_job_log`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// The run's id (XXL-JOB's logId).
    pub id: i64,
    /// The job it ran.
    pub job_id: i64,
    /// The executor it was sent to, once routed.
    pub executor_address: Option<String>,
    /// Why it exists.
    pub trigger_type: TriggerType,
    /// The scheduled instant (ms): the cron fire time, or the request time for manual runs.
    pub trigger_time_ms: i64,
    /// The schedule fire this run belongs to (its retries too); `None` for manual, API and
    /// parent runs.
    pub fire_time_ms: Option<i64>,
    /// The parameter it runs with.
    pub param: String,
    /// 0 pending, 200 sent, 500 could not be sent.
    pub trigger_code: i32,
    /// Why the trigger failed or where it went.
    pub trigger_msg: String,
    /// When the executor reported the result (ms), 0 while running.
    pub handle_time_ms: i64,
    /// 0 running, 200 success, 500 failure, 502 timeout.
    pub handle_code: i32,
    /// The handler's message.
    pub handle_msg: String,
    /// This run's shard index.
    pub shard_index: i64,
    /// The number of shards.
    pub shard_total: i64,
    /// The ElasticJob sharding items it processes, in increasing order; empty when the job is
    /// not sharded.
    pub sharding_items: Vec<ShardingItem>,
    /// 0 for the first try, n for the n-th retry.
    pub attempt: i64,
    /// The module version it ran, for `GLUE_WASM` jobs.
    pub version: Option<i64>,
    /// That version's sha256.
    pub sha256: Option<String>,
    /// Fuel a successful run consumed, when its executor reported it.
    pub fuel_used: Option<i64>,
    /// Where it is in its life.
    pub state: RunState,
    /// The run this one follows: the failed run it retries, or the parent job's run.
    pub parent_run_id: Option<i64>,
    /// An operator asked to kill it while it was being sent or running.
    pub kill_requested: bool,
    /// When an executor accepted it (ms), 0 before that.
    pub dispatched_at_ms: i64,
    /// When the executor started its handler (ms), 0 if not reported.
    pub started_at_ms: i64,
    /// When it was first claimed for sending (ms), 0 if never.
    pub first_claimed_at_ms: i64,
    /// Pending because its job or group is at its concurrency cap: it is claimed when a run of
    /// that job or group ends.
    pub held: bool,
    /// The workflow node whose work it does, if any.
    pub node: Option<NodeOfRun>,
    /// When it was created (ms): the day of the daily report it counts in.
    pub created_at_ms: i64,
}

/// The node of a workflow run that a run does the work of. A node's runs are unique per
/// (workflow run, node, round, shard, attempt): a round is one start of the node (a retry by
/// hand starts a new one), and a shard's retries are its further attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeOfRun {
    /// The workflow run.
    pub workflow_run_id: i64,
    /// The node's index in the workflow's spec.
    pub node: i64,
    /// Which start of the node, from 1.
    pub round: i64,
}

/// Finds a cycle that giving job `job_id` (`None` for a new job) the children `children` would
/// close in the child-job graph `edges` (each job with its children). Returns the cycle as job
/// ids from `job_id` back to it, or `None` when the graph stays acyclic.
pub fn child_job_cycle(
    job_id: Option<i64>,
    children: &[i64],
    edges: &std::collections::HashMap<i64, Vec<i64>>,
) -> Option<Vec<i64>> {
    // A new job has no id yet, so nothing can lead back to it; only a self-reference by a
    // not-yet-created id is impossible too.
    let start = job_id?;
    // Depth-first search from each child for a path back to `start`, over the graph where
    // `start`'s edges are replaced by `children`.
    let mut stack: Vec<(i64, Vec<i64>)> = children.iter().map(|c| (*c, vec![start, *c])).collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((node, path)) = stack.pop() {
        if node == start {
            return Some(path);
        }
        if !seen.insert(node) {
            continue;
        }
        for next in edges.get(&node).map(Vec::as_slice).unwrap_or_default() {
            if *next == start || !seen.contains(next) {
                let mut longer = path.clone();
                longer.push(*next);
                stack.push((*next, longer));
            }
        }
    }
    None
}

/// A registry row: one executor's last heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The application name it registered under.
    pub app_name: String,
    /// The base URL the admin calls it at.
    pub address: String,
    /// The last heartbeat (ms).
    pub updated_at_ms: i64,
    /// What answers there, as its last registration showed (`wasmjob`, `xxl-job`,
    /// `xxl-job-3.5`); empty when unknown.
    pub peer_kind: String,
    /// The version it reported at its last registration; empty when it reported none.
    pub version: String,
}

/// A business calendar as an operator writes it: instants jobs naming it do not fire at.
///
/// Entries are kept as written and checked by `schedule::calendar::Calendar::parse`, which
/// documents their syntax; an instant is excluded when any exclusion matches it on the wall clock
/// of `time_zone`, unless its date is one of `included_dates`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CalendarSpec {
    /// The IANA time zone the rules are read in; `None` means UTC.
    pub time_zone: Option<String>,
    /// What the calendar is for.
    pub description: String,
    /// Excluded dates, `2026-10-01`, and ranges of dates, `2026-10-01/2026-10-07` (inclusive).
    pub excluded_dates: Vec<String>,
    /// Dates excluded every year, `05-01`.
    pub annual_dates: Vec<String>,
    /// Excluded days of the week, `SAT`.
    pub weekdays: Vec<String>,
    /// Excluded times of every day, `00:00-06:00` (the end excluded; `22:00-06:00` wraps).
    pub daily_windows: Vec<String>,
    /// Quartz cron expressions; an instant whose wall second matches one is excluded.
    pub cron: Vec<String>,
    /// Dates and ranges of dates that no exclusion applies to (make-up workdays).
    pub included_dates: Vec<String>,
}

/// A stored business calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarRecord {
    /// The calendar's name, unique; jobs name it.
    pub name: String,
    /// Its rules.
    pub spec: CalendarSpec,
    /// When it was created (ms).
    pub created_at_ms: i64,
    /// When it last changed (ms).
    pub updated_at_ms: i64,
}

#[cfg(test)]
mod tests;
