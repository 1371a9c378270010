-- Business calendars: instants the jobs that name one do not fire at. The rules are kept as
-- written, a JSON object of lists (schedule::calendar documents them), read whole with the row.
-- A job names its calendar by name, the key of the API; the reference makes deleting a
-- calendar a job names fail, even against a job saved at the same moment.
--
-- MariaDB: the rules may exceed 64 KiB (`mediumtext`). `jobs.calendar` is a varchar as the name
-- it references. The foreign key is a named table constraint (see 0001), added after
-- `jobs_calendar` so that InnoDB uses that index for it instead of making one. MariaDB has no
-- partial indexes: `jobs_calendar` is a plain index on the same column.
create table calendars (
    id bigint not null auto_increment primary key,
    name varchar(255) not null,
    time_zone text,
    description text not null default '',
    rules mediumtext not null,
    created_at bigint not null,
    updated_at bigint not null,
    constraint calendars_name_key unique (name)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

alter table jobs add column calendar varchar(255);

create index jobs_calendar on jobs (calendar);

alter table jobs add constraint jobs_calendar_fkey foreign key (calendar) references calendars (name);
