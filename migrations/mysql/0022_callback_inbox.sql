-- The callbacks an admin acknowledged before it had applied all their results: each row holds
-- one executor's callback body as it came, the admin applying it (`owner`) and until when that
-- admin has it (`taken_until`, ms). The admin deletes the row once every result is applied;
-- another admin (or the next incarnation of the same one) takes a row whose owner died or
-- whose time ran out, and applies it again: a result applies once, so what was applied before
-- is ignored. `id` is chosen by the admin, at random.
create table callback_inbox (
    id bigint not null primary key,
    owner varchar(64) not null,
    taken_until bigint not null,
    received_at bigint not null,
    results bigint not null,
    body longtext not null
);
