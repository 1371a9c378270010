-- Console users with their role, browser sessions, personal API tokens, and the audit log.
-- Secrets are stored hashed: argon2id for passwords, sha256 for session and API tokens (both are
-- long random values, so a fast hash is enough and lets a request be looked up by it).
-- Child rows are deleted by the storage functions, not by cascades (SQLite leaves foreign keys off).

create table users (
    id bigserial primary key,
    name text not null unique,
    password_hash text not null,
    role text not null,
    group_ids text not null default '',
    failed_logins bigint not null default 0,
    locked_until bigint not null default 0,
    created_at bigint not null,
    updated_at bigint not null
);

create table sessions (
    token_hash text primary key,
    user_id bigint not null references users (id),
    csrf_token text not null,
    created_at bigint not null,
    expires_at bigint not null
);

create index sessions_by_user on sessions (user_id);
create index sessions_by_expiry on sessions (expires_at);

create table api_tokens (
    id bigserial primary key,
    user_id bigint not null references users (id),
    name text not null,
    token_hash text not null unique,
    created_at bigint not null,
    last_used_at bigint not null default 0
);

create index api_tokens_by_user on api_tokens (user_id);

-- One row per state change: who (a user, or the operator token), from which address, what
-- (an action and its target), and for changed things their JSON before and after.
create table audit (
    id bigserial primary key,
    at bigint not null,
    actor text not null,
    user_id bigint,
    source text not null default '',
    action text not null,
    target text not null default '',
    before_json text,
    after_json text
);

create index audit_by_time on audit (at, id);
