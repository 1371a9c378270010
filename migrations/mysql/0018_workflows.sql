-- Workflows: a DAG of one group's jobs (`crate::workflow`), and their runs.
--
-- A workflow keeps the JSON document the API takes (`spec`), and its schedule as a job keeps
-- one: a started workflow (`running`) fires at `next_fire_ms`, which a fire moves by
-- compare-and-set in the transaction that creates its run, so two admins fire it once. A workflow run keeps the document
-- as it was triggered, so an update of the workflow changes no run under way. Each node of a
-- run has a row: its state (waiting | starting | running | succeeded | failed | skipped), its
-- round (how many times it was started: a retry by hand starts it again), and, once it ended,
-- its output (the ok messages of its runs, JSON) or why it failed without runs (`reason`).
-- A workflow run's state: running | success | failed | killed.
--
-- Every change of a workflow run's nodes first bumps its `version`: that row lock orders the
-- transactions that decide for one workflow run, so each reads what the one before committed.
--
-- MariaDB has no partial indexes: `workflow_nodes_starting` is led by the state, and
-- `runs_by_workflow_node` holds the runs of no workflow too (their nulls never collide).
create table workflows (
    id bigint not null auto_increment primary key,
    group_id bigint not null,
    name text not null,
    spec mediumtext not null,
    schedule_type varchar(32) not null default 'NONE',
    schedule_conf text not null default '',
    time_zone text,
    misfire_strategy text not null default 'DO_NOTHING',
    running bigint not null default 0,
    next_fire_ms bigint not null default 0,
    created_by text not null default '',
    created_at bigint not null,
    updated_at bigint not null,
    constraint workflows_group_id_fkey foreign key (group_id) references groups (id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index workflows_by_group on workflows (group_id, id);
create index workflows_due on workflows (running, next_fire_ms);

create table workflow_runs (
    id bigint not null auto_increment primary key,
    workflow_id bigint not null,
    group_id bigint not null,
    spec mediumtext not null,
    trigger_type text not null,
    state varchar(32) not null default 'running',
    version bigint not null default 0,
    created_by text not null default '',
    created_at bigint not null,
    updated_at bigint not null,
    ended_at bigint not null default 0
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index workflow_runs_by_workflow on workflow_runs (workflow_id, id);

create table workflow_nodes (
    workflow_run_id bigint not null,
    node bigint not null,
    state varchar(32) not null default 'waiting',
    round bigint not null default 0,
    reason text not null default '',
    output mediumtext not null default '',
    updated_at bigint not null,
    started_at bigint not null default 0,
    ended_at bigint not null default 0,
    primary key (workflow_run_id, node),
    constraint workflow_nodes_workflow_run_id_fkey foreign key (workflow_run_id)
        references workflow_runs (id) on delete cascade
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- Nodes decided to start whose runs are not created yet: a crash in between leaves them here.
create index workflow_nodes_starting on workflow_nodes (state, updated_at);

-- The node a run does the work of. A node's runs are unique per round, shard and attempt, so
-- no node is started twice in one round, whoever tries.
alter table runs add column workflow_run_id bigint;
alter table runs add column workflow_node bigint;
alter table runs add column workflow_round bigint;

create unique index runs_by_workflow_node
    on runs (workflow_run_id, workflow_node, workflow_round, shard_index, attempt);
