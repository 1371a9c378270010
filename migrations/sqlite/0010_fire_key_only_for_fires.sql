-- The key that lets a fire create its runs once, unique on (job_id, fire_time, shard_index,
-- attempt), held an entry for every run, though only a schedule fire's runs (and their retries
-- and children) have a fire time: a manual or API run has none, can never conflict (nulls are
-- distinct), and still took an entry at a random place (by job) in that index, a page written
-- per run under load. The key is now a unique index over the runs that have a fire time, which
-- is every run it ever told apart. `runs_by_parent`, whose entries for runs without a parent no
-- query reads, likewise keeps only runs that have one.
--
-- SQLite cannot drop a table's unique constraint, so the table is rebuilt with the same columns,
-- every row and id kept, and the id sequence carried over (ids of deleted runs are never reused).

create table runs_rebuilt (
    id integer primary key autoincrement,
    job_id bigint not null,
    executor_address text,
    trigger_type text not null,
    trigger_time bigint not null,
    fire_time bigint,
    param text not null,
    trigger_code bigint not null default 0,
    trigger_msg text not null default '',
    handle_time bigint not null default 0,
    handle_code bigint not null default 0,
    handle_msg text not null default '',
    shard_index bigint not null default 0,
    shard_total bigint not null default 1,
    attempt bigint not null default 0,
    version bigint,
    sha256 text,
    claimed_at bigint not null default 0,
    created_at bigint not null,
    fuel_used bigint,
    state text not null default 'pending',
    lease_owner text,
    lease_until bigint not null default 0,
    fence bigint not null default 0,
    kill_requested bigint not null default 0,
    dispatched_at bigint not null default 0,
    started_at bigint not null default 0,
    deadline bigint not null default 0,
    parent_run_id bigint,
    sharding_items text not null default ''
);

insert into runs_rebuilt (id, job_id, executor_address, trigger_type, trigger_time, fire_time,
    param, trigger_code, trigger_msg, handle_time, handle_code, handle_msg, shard_index,
    shard_total, attempt, version, sha256, claimed_at, created_at, fuel_used, state, lease_owner,
    lease_until, fence, kill_requested, dispatched_at, started_at, deadline, parent_run_id,
    sharding_items)
select id, job_id, executor_address, trigger_type, trigger_time, fire_time, param, trigger_code,
    trigger_msg, handle_time, handle_code, handle_msg, shard_index, shard_total, attempt, version,
    sha256, claimed_at, created_at, fuel_used, state, lease_owner, lease_until, fence,
    kill_requested, dispatched_at, started_at, deadline, parent_run_id, sharding_items
from runs;

delete from sqlite_sequence where name = 'runs_rebuilt';
insert into sqlite_sequence (name, seq) select 'runs_rebuilt', seq from sqlite_sequence where name = 'runs';

drop table runs;
alter table runs_rebuilt rename to runs;

create unique index runs_by_fire on runs (job_id, fire_time, shard_index, attempt)
    where fire_time is not null;
create index runs_by_job on runs (job_id, id);
create index runs_by_age on runs (created_at);
create index runs_by_parent on runs (parent_run_id) where parent_run_id is not null;
create index runs_pending on runs (trigger_time) where state = 'pending';
create index runs_leases on runs (lease_until) where state = 'dispatching';
create index runs_deadlines on runs (deadline) where state = 'running';
create index runs_by_executor on runs (executor_address, dispatched_at) where state = 'running';
create index runs_unfinished on runs (state, id) where state in ('pending', 'dispatching', 'running');
