-- A job's description and owner: free text for people (XXL-JOB's `job_desc` and `author`), shown
-- by the console and the API, and where an import says why a job was left stopped.
alter table jobs add column description text not null default '';
alter table jobs add column owner text not null default '';
