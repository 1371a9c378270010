-- The run lifecycle as a state machine: an explicit state, the dispatcher's lease with a fencing
-- counter, the kill request, when an executor accepted the run and the admin's deadline for its
-- result, and the run a retry or child run follows. Indexes let the sweep's scans cost what
-- there is to do, not the size of the history.
-- MariaDB: `state` is a varchar because it is indexed (the states are short words); an index is
-- dropped `on` its table.
alter table runs add column state varchar(32) not null default 'pending';
alter table runs add column lease_owner text;
alter table runs add column lease_until bigint not null default 0;
alter table runs add column fence bigint not null default 0;
alter table runs add column kill_requested bigint not null default 0;
alter table runs add column dispatched_at bigint not null default 0;
alter table runs add column started_at bigint not null default 0;
alter table runs add column deadline bigint not null default 0;
alter table runs add column parent_run_id bigint;

update runs set state = case
    when handle_code = 200 then 'success'
    when handle_code = 502 then 'timed_out'
    when handle_code <> 0 then 'failed'
    when trigger_code = 200 then 'running'
    else 'pending'
end;
update runs set dispatched_at = trigger_time where state = 'running';

drop index runs_pending on runs;
create index runs_pending on runs (state, trigger_time);
create index runs_leases on runs (state, lease_until);
create index runs_deadlines on runs (state, deadline);
create index runs_by_executor on runs (state, executor_address, dispatched_at);
create index runs_by_state on runs (state, id);
create index runs_by_age on runs (created_at);
create index runs_by_parent on runs (parent_run_id);
