-- The key that lets a fire create its runs once, unique on (job_id, fire_time, shard_index,
-- attempt), held an entry for every run, though only a schedule fire's runs (and their retries
-- and children) have a fire time: a manual or API run has none, can never conflict (nulls are
-- distinct), and still took an entry at a random place (by job) in that index, a page written
-- per run under load. The key is now a unique index over the runs that have a fire time, which
-- is every run it ever told apart. `runs_by_parent`, whose entries for runs without a parent no
-- query reads, likewise keeps only runs that have one.
--
-- MariaDB has no partial indexes. `runs_by_fire` is a plain unique index: InnoDB lets rows whose
-- fire_time is null repeat in it, so it enforces what the partial one does (but holds every run).
-- That is exactly the old key (0001 named it as PostgreSQL names the constraint), so the key is
-- renamed rather than created anew beside it and dropped (MariaDB warns of a duplicate index).
-- `runs_by_parent` is a plain index on the same column, so dropping and creating it changes
-- nothing here; it is kept so the statements follow PostgreSQL's.

alter table runs rename index runs_job_id_fire_time_shard_index_attempt_key to runs_by_fire;

drop index runs_by_parent on runs;
create index runs_by_parent on runs (parent_run_id);
