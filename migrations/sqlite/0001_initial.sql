-- The first schema: executor groups, the registry, jobs, module blobs with job versions, runs.
-- Times are milliseconds since the Unix epoch (bigint) so both dialects read them alike.

create table groups (
    id integer primary key autoincrement,
    app_name text not null unique,
    title text not null,
    address_type text not null,
    addresses text not null default '',
    created_at bigint not null,
    updated_at bigint not null
);

create table registry (
    registry_group text not null,
    registry_key text not null,
    registry_value text not null,
    updated_at bigint not null,
    primary key (registry_group, registry_key, registry_value)
);

create table jobs (
    id integer primary key autoincrement,
    group_id bigint not null references groups (id),
    name text not null,
    schedule_type text not null,
    schedule_conf text not null,
    time_zone text,
    misfire_strategy text not null,
    route_strategy text not null,
    block_strategy text not null,
    timeout_secs bigint not null,
    retry_count bigint not null,
    glue_type text not null,
    handler text,
    param text not null,
    child_job_ids text not null default '',
    alarm_email text,
    fuel_limit bigint,
    memory_limit_mb bigint,
    running bigint not null default 0,
    next_fire_ms bigint not null default 0,
    active_version bigint,
    created_at bigint not null,
    updated_at bigint not null
);

create index jobs_due on jobs (running, next_fire_ms);

create table modules (
    sha256 text primary key,
    size bigint not null,
    bytes blob not null,
    created_at bigint not null
);

create table job_versions (
    job_id bigint not null references jobs (id) on delete cascade,
    version bigint not null,
    sha256 text not null references modules (sha256),
    size bigint not null,
    remark text not null,
    created_at bigint not null,
    primary key (job_id, version)
);

-- One row per run. `fire_time` is set only for schedule fires: with `shard_index` and `attempt`
-- it is unique per job, so no two schedulers can ever create the same fire twice.
create table runs (
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
    unique (job_id, fire_time, shard_index, attempt)
);

create index runs_by_job on runs (job_id, id);
create index runs_pending on runs (trigger_code, claimed_at);
