#!/bin/sh
# Writes the secrets of compose.yaml into ../secrets/ (next to compose.yaml), once: the operator
# token, the admin-executor token, PostgreSQL's password and the admins' database URL. Existing
# files are kept.
#
# The containers run as different users (wasmjob as 10001, Prometheus as nobody, PostgreSQL's
# entrypoint as root), and compose mounts file secrets as they are on the host, so the files are
# readable by all and the directory by its owner only: on the host only the owner reaches them,
# and in a container only the secrets listed for its service are mounted.
set -eu
cd "$(dirname "$0")/.."
umask 077
mkdir -p secrets
chmod 0700 secrets
random() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
for name in admin-token access-token postgres-password; do
    [ -s "secrets/$name" ] || random > "secrets/$name"
done
[ -s secrets/database-url ] ||
    printf 'postgres://wasmjob:%s@postgres:5432/wasmjob' "$(cat secrets/postgres-password)" > secrets/database-url
chmod 0444 secrets/*
echo "secrets in $(pwd)/secrets; the operator token is secrets/admin-token"
