-- The run indexes that served the lifecycle's scans (due pending runs, expired leases, passed
-- deadlines, an executor's running runs, the count of unfinished runs) led with `state`, so every
-- state change of every run moved an entry in each of them. Each now holds only the runs in the
-- state its scan looks for: a run enters and leaves the few that concern it, and an ended run is
-- in none of them.

drop index runs_pending;
create index runs_pending on runs (trigger_time) where state = 'pending';

drop index runs_leases;
create index runs_leases on runs (lease_until) where state = 'dispatching';

drop index runs_deadlines;
create index runs_deadlines on runs (deadline) where state = 'running';

drop index runs_by_executor;
create index runs_by_executor on runs (executor_address, dispatched_at) where state = 'running';

drop index runs_by_state;
create index runs_unfinished on runs (state, id) where state in ('pending', 'dispatching', 'running');
