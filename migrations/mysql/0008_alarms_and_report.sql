-- Alarms (webhooks, events, deliveries, per-job silence) and the daily run report.
--
-- An alarm event is inserted in the transaction of the change that causes it (a run's final
-- failure, an executor found lost); the admin's alarm task settles each event once (sent or
-- silenced) and delivers its deliveries, claimed under a lease, until each is delivered or has
-- failed every attempt.

alter table jobs add column alarm_silence_secs bigint not null default 300;
alter table registry add column lost_alarmed_at bigint not null default 0;

create table alarm_webhooks (
    id bigint not null auto_increment primary key,
    name varchar(255) not null,
    url text not null,
    secret text not null,
    group_id bigint,
    created_at bigint not null,
    updated_at bigint not null,
    constraint alarm_webhooks_name_key unique (name)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- kind: run_failed | executor_lost; status: new | sent | silenced.
-- MariaDB: `status` is a varchar because it is indexed.
create table alarm_events (
    id bigint not null auto_increment primary key,
    kind text not null,
    job_id bigint,
    run_id bigint,
    attempt bigint not null default 0,
    state text not null default '',
    message mediumtext not null default '',
    app_name text not null default '',
    executor_address text not null default '',
    created_at bigint not null,
    status varchar(32) not null default 'new',
    silenced_before bigint not null default 0
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index alarm_events_by_status on alarm_events (status, id);
create index alarm_events_by_job on alarm_events (job_id, id);

-- channel: webhook (target = the webhook's id) | email (target = the addresses);
-- state: pending | delivered | failed.
-- MariaDB: `state` is a varchar because it is indexed.
create table alarm_deliveries (
    id bigint not null auto_increment primary key,
    event_id bigint not null,
    channel text not null,
    target text not null,
    state varchar(32) not null default 'pending',
    attempts bigint not null default 0,
    next_attempt_at bigint not null,
    last_error mediumtext not null default '',
    lease_owner text not null default '',
    lease_until bigint not null default 0,
    created_at bigint not null,
    delivered_at bigint not null default 0
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index alarm_deliveries_due on alarm_deliveries (state, next_attempt_at);
create index alarm_deliveries_by_event on alarm_deliveries (event_id);

-- The last alarm sent for a job: the silence window counts from it.
create table alarm_silence (
    job_id bigint not null primary key,
    last_alarm_at bigint not null,
    last_event_id bigint not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- Runs per UTC day (created_at / 86400000) and state, the unfinished ones (pending, dispatching,
-- running) under 'running'. The run lifecycle keeps it in its own transactions: creating a run
-- adds one to its day's 'running', ending one moves it from 'running' to its state, as rows of
-- run_report_delta that the admin's report task folds into run_report. Deleting runs (retention)
-- leaves the counts alone.
-- MariaDB: `state` is a varchar in run_report because it is in the key.
create table run_report (
    day bigint not null,
    state varchar(32) not null,
    runs bigint not null,
    primary key (day, state)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create table run_report_delta (
    id bigint not null auto_increment primary key,
    day bigint not null,
    state text not null,
    runs bigint not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- MariaDB: `/` divides exactly (a decimal, which a bigint column would round, moving the later
-- half of each day to the next); `div` divides integers, truncating as PostgreSQL's bigint `/`.
insert into run_report (day, state, runs)
    select created_at div 86400000,
        case when state in ('pending', 'dispatching', 'running') then 'running' else state end,
        count(*)
    from runs
    group by created_at div 86400000,
        case when state in ('pending', 'dispatching', 'running') then 'running' else state end;
