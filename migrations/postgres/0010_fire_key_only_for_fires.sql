-- The key that lets a fire create its runs once, unique on (job_id, fire_time, shard_index,
-- attempt), held an entry for every run, though only a schedule fire's runs (and their retries
-- and children) have a fire time: a manual or API run has none, can never conflict (nulls are
-- distinct), and still took an entry at a random place (by job) in that index, a page written
-- per run under load. The key is now a unique index over the runs that have a fire time, which
-- is every run it ever told apart. `runs_by_parent`, whose entries for runs without a parent no
-- query reads, likewise keeps only runs that have one.

create unique index runs_by_fire on runs (job_id, fire_time, shard_index, attempt)
    where fire_time is not null;
alter table runs drop constraint runs_job_id_fire_time_shard_index_attempt_key;

drop index runs_by_parent;
create index runs_by_parent on runs (parent_run_id) where parent_run_id is not null;
