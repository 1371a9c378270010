-- The run indexes that served the lifecycle's scans (due pending runs, expired leases, passed
-- deadlines, an executor's running runs, the count of unfinished runs) led with `state`, so every
-- state change of every run moved an entry in each of them. Each now holds only the runs in the
-- state its scan looks for: a run enters and leaves the few that concern it, and an ended run is
-- in none of them.
--
-- MariaDB has no partial indexes (no `where` on an index): each index below holds every run,
-- led by the column of PostgreSQL's predicate, so that a scan of one state reads only that
-- state's entries. An index is dropped `on` its table.

drop index runs_pending on runs;
create index runs_pending on runs (state, trigger_time);

drop index runs_leases on runs;
create index runs_leases on runs (state, lease_until);

drop index runs_deadlines on runs;
create index runs_deadlines on runs (state, deadline);

drop index runs_by_executor on runs;
create index runs_by_executor on runs (state, executor_address, dispatched_at);

drop index runs_by_state on runs;
create index runs_unfinished on runs (state, id);
