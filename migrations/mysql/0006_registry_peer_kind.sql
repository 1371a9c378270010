-- What answers at each registered address, as its last registration showed: `wasmjob`, `xxl-job`
-- (XXL-JOB 2.2 to 3.4) or `xxl-job-3.5`; '' when unknown (rows written before this column).
-- Every admin of the database reads it, so each speaks to an executor in its protocol from the
-- first call, also after a restart and when the executor beats to another admin.
alter table registry add column peer_kind text not null default '';
create index registry_by_address on registry (registry_value);
