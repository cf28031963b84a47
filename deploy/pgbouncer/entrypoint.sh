#!/bin/sh
# Write PgBouncer's user list from the environment (never baked into the image), then run it.
set -eu
umask 077
printf '"taskmesh" "%s"\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" > /etc/pgbouncer/userlist.txt
exec pgbouncer /etc/pgbouncer/pgbouncer.ini
