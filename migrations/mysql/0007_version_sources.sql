-- Job versions uploaded as source text (GLUE_PYTHON, GLUE_JAVASCRIPT): what each was uploaded as
-- (`wasm`, `python`, `javascript`) and, for source uploads, the text it was built from. The
-- component it was built into is stored by sha256 as every other version's.
-- MariaDB: a source may be larger than `text`'s 64 KiB (the admin takes up to 1 MiB).
alter table job_versions add column language text not null default 'wasm';
alter table job_versions add column source mediumtext;
