-- Concurrency caps: the most runs of a job, or of all the jobs of a group, dispatching or
-- running at once (0: no cap). A run of a capped job that finds no room waits pending with
-- `held` set, and is claimed when a run of its job or group ends.
--
-- MariaDB has no partial indexes: each index below is led by (or holds) the columns of
-- PostgreSQL's predicate.
alter table jobs add column max_concurrent_runs bigint not null default 0;
alter table groups add column max_concurrent_runs bigint not null default 0;
alter table runs add column held bigint not null default 0;

-- The runs in flight of a job, counted against its cap on every capped claim.
create index runs_in_flight on runs (job_id, state);
-- The held runs, released oldest first.
create index runs_held on runs (job_id, state, held, trigger_time, id);
-- Pending runs the sweep may claim: a held run waits for a release, not for its instant.
drop index runs_pending on runs;
create index runs_pending on runs (state, held, trigger_time);
