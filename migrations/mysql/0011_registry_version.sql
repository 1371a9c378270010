-- The version a wasmjob executor reported at its last registration (`version` in the registry
-- body); '' for XXL-JOB executors, which do not send it, and for rows written before this column.
-- The executors page shows it beside the peer kind, so a rolling upgrade can be watched.
alter table registry add column version text not null default '';
