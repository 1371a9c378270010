-- A job's wait before a failed run's retry: the first interval (0 retries at once, as XXL-JOB
-- does), how it grows (FIXED or EXPONENTIAL) and its cap (0 means one day). A retry run is
-- created pending, due at its instant, in the transaction that ends the failed run.
alter table jobs add column retry_interval_secs bigint not null default 0;
alter table jobs add column retry_backoff text not null default 'FIXED';
alter table jobs add column retry_max_interval_secs bigint not null default 0;
