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
    id integer primary key,
    owner text,
    fence integer not null default 0,
    lease_until integer not null default 0
);

with recursive n(i) as (select 0 union all select i + 1 from n where i < 255)
insert into partitions (id) select i from n;

create table admins (
    owner text primary key,
    address text not null default '',
    member text not null default '',
    started_at integer not null,
    seen_at integer not null
);
