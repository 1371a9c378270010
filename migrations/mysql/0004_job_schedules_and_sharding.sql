-- Per-job misfire threshold (XXL-JOB's fixed 5 s by default), ElasticJob sharding items on jobs
-- (how many, their parameters, the strategy), and the items each run processes, stored as
-- `item=parameter` pairs separated by commas (`0=Beijing,1=Shanghai`).
-- MariaDB: the item lists are `mediumtext`: up to 1000 items with parameters of any length may
-- exceed `text`'s 64 KiB.
alter table jobs add column misfire_threshold_ms bigint not null default 5000;
alter table jobs add column sharding_total_count bigint not null default 0;
alter table jobs add column sharding_item_parameters mediumtext not null default '';
alter table jobs add column sharding_strategy text not null default 'AVERAGE_ALLOCATION';
alter table runs add column sharding_items mediumtext not null default '';
