-- A job's revision: bumped by every change an admin's copy of the job must see (the operator's
-- edits, start and stop, a new active version, a fire that ends the job), and by nothing else.
-- A fire that only moves the job to its next fire leaves it, and `updated_at`, as they are, so
-- an admin tells that the copies of the jobs it uses are current by reading these two numbers
-- instead of each whole job.
alter table jobs add column revision bigint not null default 0;
