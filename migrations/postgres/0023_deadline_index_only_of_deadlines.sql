-- The index of passed deadlines held every running run, and a run without a timeout has
-- deadline 0, which the sweep never looks for (`deadline > 0 and deadline < now`). It now holds
-- only the running runs that have a deadline: a run without a timeout (most XXL-JOB jobs, and
-- every job whose timeout is 0) no longer enters it when it is sent and leaves it when it ends.
drop index runs_deadlines;
create index runs_deadlines on runs (deadline) where state = 'running' and deadline > 0;
