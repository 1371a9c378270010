-- The first schema: executor groups, the registry, jobs, module blobs with job versions, runs.
-- Times are milliseconds since the Unix epoch (bigint) so both dialects read them alike.
--
-- MariaDB/MySQL: every table is InnoDB in utf8mb4 with the binary collation, so comparisons and
-- keys are case- and accent-sensitive as in PostgreSQL and 4-byte characters (emoji) round-trip.
-- InnoDB cannot index `text`, so a text column that is (or later becomes) part of a key or index
-- is a `varchar`; the lengths keep every key under InnoDB's 3072 bytes (768 utf8mb4 characters).
-- Free text that may exceed 64 KiB (parameters, messages) is `mediumtext`; blobs are `longblob`.
-- Foreign keys are table constraints named as PostgreSQL names them (MySQL 8.x parses and
-- ignores a `references` clause written on the column; MariaDB 10.5+ honours it, but would name
-- it `jobs_ibfk_1`). InnoDB needs an index on the referencing columns of a foreign key and makes
-- one, so `jobs` (group_id) and `job_versions` (sha256) get an index PostgreSQL does not have.
-- Unique keys are named constraints too, with PostgreSQL's names (MariaDB would name a column's
-- `unique` after the column), so later migrations can name them alike.

create table groups (
    id bigint not null auto_increment primary key,
    app_name varchar(255) not null,
    title text not null,
    address_type text not null,
    addresses text not null default '',
    created_at bigint not null,
    updated_at bigint not null,
    constraint groups_app_name_key unique (app_name)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- The key's three columns may hold 767 characters together (InnoDB's 3072-byte limit): the
-- group (`EXECUTOR`), the application name (64 at most, as the admin checks) and the address.
create table registry (
    registry_group varchar(64) not null,
    registry_key varchar(191) not null,
    registry_value varchar(512) not null,
    updated_at bigint not null,
    primary key (registry_group, registry_key, registry_value)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create table jobs (
    id bigint not null auto_increment primary key,
    group_id bigint not null,
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
    param mediumtext not null,
    child_job_ids text not null default '',
    alarm_email text,
    fuel_limit bigint,
    memory_limit_mb bigint,
    running bigint not null default 0,
    next_fire_ms bigint not null default 0,
    active_version bigint,
    created_at bigint not null,
    updated_at bigint not null,
    constraint jobs_group_id_fkey foreign key (group_id) references groups (id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index jobs_due on jobs (running, next_fire_ms);

create table modules (
    sha256 varchar(64) not null primary key,
    size bigint not null,
    bytes longblob not null,
    created_at bigint not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create table job_versions (
    job_id bigint not null,
    version bigint not null,
    sha256 varchar(64) not null,
    size bigint not null,
    remark text not null,
    created_at bigint not null,
    primary key (job_id, version),
    constraint job_versions_job_id_fkey foreign key (job_id) references jobs (id) on delete cascade,
    constraint job_versions_sha256_fkey foreign key (sha256) references modules (sha256)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- One row per run. `fire_time` is set only for schedule fires: with `shard_index` and `attempt`
-- it is unique per job, so no two schedulers can ever create the same fire twice.
-- MariaDB: the unique key is named as PostgreSQL names it, so 0010 can find it by that name;
-- `executor_address` is a varchar because 0003 indexes it.
create table runs (
    id bigint not null auto_increment primary key,
    job_id bigint not null,
    executor_address varchar(512),
    trigger_type text not null,
    trigger_time bigint not null,
    fire_time bigint,
    param mediumtext not null,
    trigger_code bigint not null default 0,
    trigger_msg mediumtext not null default '',
    handle_time bigint not null default 0,
    handle_code bigint not null default 0,
    handle_msg mediumtext not null default '',
    shard_index bigint not null default 0,
    shard_total bigint not null default 1,
    attempt bigint not null default 0,
    version bigint,
    sha256 text,
    claimed_at bigint not null default 0,
    created_at bigint not null,
    constraint runs_job_id_fire_time_shard_index_attempt_key
        unique (job_id, fire_time, shard_index, attempt)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index runs_by_job on runs (job_id, id);
create index runs_pending on runs (trigger_code, claimed_at);
