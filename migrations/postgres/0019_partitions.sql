-- Partitioned scheduling: admins that share one database share its schedule.
--
-- A job (or workflow) is in partition `(id * 167) % 256`, which puts consecutive ids far
-- apart. An admin fires only the jobs of the partitions it holds: `owner` is its lease owner id, `lease_until` when the lease runs out
-- unless renewed, and `fence` is bumped by every take, so a fire commits only under the lease
-- it was planned under. `admins` lists the admins by their last beat; the live ones share the
-- partitions. `member` is an admin's host name and listen address: an admin that finds an
-- earlier admin of its own `member` (whose port it now holds, so it is dead) takes its
-- partitions at once instead of when their lease runs out.
create table partitions (
    id bigint primary key,
    owner text,
    fence bigint not null default 0,
    lease_until bigint not null default 0
);

insert into partitions (id) select generate_series(0, 255);

create table admins (
    owner text primary key,
    address text not null default '',
    member text not null default '',
    started_at bigint not null,
    seen_at bigint not null
);
