-- Failed, timed-out and lost runs per job and UTC day of their creation, for the dashboard's
-- failing jobs, kept as the daily report is: the transaction that ends runs appends their
-- failures to job_failure_delta, the admin's report task folds those rows into job_failures,
-- and a read sums both, so the dashboard never scans the run table. Deleting runs (retention)
-- leaves the counts alone.
create table job_failures (
    day bigint not null,
    job_id bigint not null,
    runs bigint not null,
    primary key (day, job_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create table job_failure_delta (
    id bigint not null auto_increment primary key,
    day bigint not null,
    job_id bigint not null,
    runs bigint not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- MariaDB: `div`, not `/`, for PostgreSQL's truncating bigint division (see 0008).
insert into job_failures (day, job_id, runs)
    select created_at div 86400000, job_id, count(*)
    from runs
    where state in ('failed', 'timed_out', 'lost')
    group by created_at div 86400000, job_id;
