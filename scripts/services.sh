#!/usr/bin/env bash
# Makes sure the two local database servers the tests talk to answer
# before any test runs: Postgres (127.0.0.1:5432) and MariaDB
# (127.0.0.1:3306), unless SLUICE_TEST_POSTGRES_URL or SLUICE_TEST_MYSQL_URL
# points the tests elsewhere. (The Redis tests start their own servers.)
# Each gets a while to come up; one that still does not
# answer is started the way the `sql_sinks` outage tests start it again
# and waited for again. Why this is needed: those tests stop and start the
# machine's Postgres and MariaDB, so after a run the servers are processes
# of that run, and whatever ends a run's processes (a session's end, a
# killed test binary mid-outage) can leave them down for the next one.
# One that cannot be brought up stops the run here with its name, rather
# than every test that needs it failing one by one after a 30 s pool
# timeout each. Never stops or restarts a service that is running.
set -euo pipefail

postgres_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
mariadb_up() { mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; }

wait_for() { # check seconds
  local i
  for ((i = 0; i < $2; i++)); do
    "$1" && return 0
    sleep 1
  done
  "$1"
}

start_postgres() {
  local version
  version="$(ls /etc/postgresql | sort -V | tail -n 1)"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
}
start_mariadb() { start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd; }

ensure() { # name check start
  wait_for "$2" 10 && return 0
  echo "services: $1 does not answer on its local port; starting it" >&2
  "$3" >&2 || true
  wait_for "$2" 60 && return 0
  echo "services: $1 is not reachable on 127.0.0.1; the tests need it (see README, Tests)" >&2
  return 1
}

[ -n "${SLUICE_TEST_POSTGRES_URL:-}" ] || ensure Postgres postgres_up start_postgres
[ -n "${SLUICE_TEST_MYSQL_URL:-}" ] || ensure MariaDB mariadb_up start_mariadb
