-- Console users with their role, browser sessions, personal API tokens, and the audit log.
-- Secrets are stored hashed: argon2id for passwords, sha256 for session and API tokens (both are
-- long random values, so a fast hash is enough and lets a request be looked up by it).
-- Child rows are deleted by the storage functions, not by cascades (SQLite leaves foreign keys off).
-- MariaDB: token hashes are sha256 in hex (64 characters). The user indexes of `sessions` and
-- `api_tokens` are declared in their tables, so the foreign keys use them from the start rather
-- than an index InnoDB makes for them. Keys and foreign keys carry PostgreSQL's names (see 0001).

create table users (
    id bigint not null auto_increment primary key,
    name varchar(255) not null,
    password_hash text not null,
    role text not null,
    group_ids text not null default '',
    failed_logins bigint not null default 0,
    locked_until bigint not null default 0,
    created_at bigint not null,
    updated_at bigint not null,
    constraint users_name_key unique (name)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create table sessions (
    token_hash varchar(64) not null primary key,
    user_id bigint not null,
    csrf_token text not null,
    created_at bigint not null,
    expires_at bigint not null,
    index sessions_by_user (user_id),
    constraint sessions_user_id_fkey foreign key (user_id) references users (id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index sessions_by_expiry on sessions (expires_at);

create table api_tokens (
    id bigint not null auto_increment primary key,
    user_id bigint not null,
    name text not null,
    token_hash varchar(64) not null,
    created_at bigint not null,
    last_used_at bigint not null default 0,
    constraint api_tokens_token_hash_key unique (token_hash),
    index api_tokens_by_user (user_id),
    constraint api_tokens_user_id_fkey foreign key (user_id) references users (id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

-- One row per state change: who (a user, or the operator token), from which address, what
-- (an action and its target), and for changed things their JSON before and after.
create table audit (
    id bigint not null auto_increment primary key,
    at bigint not null,
    actor text not null,
    user_id bigint,
    source text not null default '',
    action text not null,
    target text not null default '',
    before_json mediumtext,
    after_json mediumtext
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_nopad_bin;

create index audit_by_time on audit (at, id);
