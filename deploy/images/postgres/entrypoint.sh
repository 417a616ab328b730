#!/bin/sh
# First start: initdb into $PGDATA (the named volume) with POSTGRES_USER/POSTGRES_PASSWORD and
# create POSTGRES_DB; every start: run postgres on 0.0.0.0:5432 (password auth from the network).
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
  echo "postgres-entrypoint: set POSTGRES_PASSWORD" >&2; exit 1
fi
if [ "${1:-postgres}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
         --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  # a private server on the unix socket only: pg_isready -h 127.0.0.1 stays false meanwhile
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: initialised $PGDATA (database $POSTGRES_DB, user $POSTGRES_USER)"
fi
if [ "${1:-postgres}" = postgres ]; then
  shift || true
  exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
