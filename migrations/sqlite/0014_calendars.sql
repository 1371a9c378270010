-- Business calendars: instants the jobs that name one do not fire at. The rules are kept as
-- written, a JSON object of lists (schedule::calendar documents them), read whole with the row.
-- A job names its calendar by name, the key of the API; the reference makes deleting a
-- calendar a job names fail, even against a job saved at the same moment.
create table calendars (
    id integer primary key autoincrement,
    name text not null unique,
    time_zone text,
    description text not null default '',
    rules text not null,
    created_at bigint not null,
    updated_at bigint not null
);

alter table jobs add column calendar text references calendars (name);

create index jobs_calendar on jobs (calendar) where calendar is not null;
