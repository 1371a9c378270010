-- The key that lets a fire create its runs once led with the job: each run's entry went to that
-- job's place in the index, so under load a group of fires wrote a page of the index for nearly
-- every run in it. Led by the fire time, which only grows, a fire's entries go to the index's
-- end, where the fires before it wrote theirs. The key is the same four columns, as unique;
-- every read of it names both the job and the fire time. `runs_by_job` still leads with the job
-- for the runs' foreign key.
alter table runs drop index runs_by_fire,
    add unique index runs_by_fire (fire_time, job_id, shard_index, attempt);
