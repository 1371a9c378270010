-- Backfills: runs for the past instants of a job's schedule, released a few at a time.
--
-- A backfill keeps the schedule it was created with (type, configuration, time zone, and the
-- anchor of a fixed rate), so its instants are a function of its row alone, whatever happens
-- to the job since. cursor_ms is the last instant released (from_ms - 1 before the first):
-- a release moves it with a compare-and-set, in the transaction that creates the instants'
-- runs, under the lease of the admin that drives the backfill.
-- state: running | paused | cancelled | done.
--
-- MariaDB has no partial indexes: `backfills_running` is led by the state PostgreSQL's predicate
-- names (a short varchar, so that it can be indexed), and `backfill_runs_by_run` holds the null
-- run ids too.
create table backfills (
    id bigint not null auto_increment primary key,
    job_id bigint not null,
    from_ms bigint not null,
    to_ms bigint not null,
    max_concurrent bigint not null,
    rerun bigint not null default 0,
    schedule_type text not null,
    schedule_conf text not null,
    time_zone text,
    anchor_ms bigint not null,
    total bigint not null,
    released bigint not null default 0,
    cursor_ms bigint not null,
    state varchar(32) not null default 'running',
    reason text not null default '',
    created_by text not null default '',
    lease_owner text,
    lease_until bigint not null default 0,
    created_at bigint not null,
    updated_at bigint not null,
    finished_at bigint not null default 0
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index backfills_by_job on backfills (job_id, id);
create index backfills_running on backfills (state, lease_until);

-- The runs a backfill created, one row per instant and shard; run_id is null for an instant
-- that already had a run (a backfill without rerun creates none there). The key keeps one run
-- per instant and shard per backfill, rerun or not; without rerun, the runs' own key on
-- (job_id, fire_time, shard_index, attempt) keeps one per instant across every fire and
-- backfill of the job.
create table backfill_runs (
    backfill_id bigint not null,
    instant bigint not null,
    shard_index bigint not null,
    run_id bigint,
    primary key (backfill_id, instant, shard_index)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index backfill_runs_by_run on backfill_runs (run_id);
