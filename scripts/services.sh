#!/usr/bin/env bash
# Starts, stops and reports the local services Flywheel needs: a private
# PostgreSQL cluster, the Temporal dev server (CLI built once into a cache),
# and the Docker engine with the sandbox base image. Idempotent: a second
# `up` only checks health. Touches nothing outside its own state directory,
# cache directory and the ports it owns.
#
#   scripts/services.sh up      install what is missing, start, wait healthy
#   scripts/services.sh down    stop what this script started
#   scripts/services.sh status  one line per service
#   scripts/services.sh env     print the environment the tests and binary use
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${FLYWHEEL_STATE_DIR:-$ROOT/.flywheel}"
CACHE="${FLYWHEEL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flywheel}"
PG_PORT="${FLYWHEEL_PG_PORT:-55432}"
TEMPORAL_VERSION="v1.5.1"
TEMPORAL_PORT="${FLYWHEEL_TEMPORAL_PORT:-7233}"
TEMPORAL_UI_PORT="${FLYWHEEL_TEMPORAL_UI_PORT:-8233}"
TEMPORAL_CLI="$CACHE/temporal-$TEMPORAL_VERSION/temporal"
BIN="$STATE/bin/flywheel"
LOGS="$STATE/logs"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
	log "installing Debian packages: $*"
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq >/dev/null || as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local deadline=$((SECONDS + $1)) what=$2; shift 2
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "$what did not become ready in time (logs: $LOGS)"
		sleep 0.2
	done
}

# --- PostgreSQL -------------------------------------------------------------

pg_bindir() {
	local d
	for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && echo "$d"; done | sort -V | tail -1
}

# Postgres refuses to run as root, so a root caller runs it as the
# 'postgres' system user; its data directory must be reachable by that user.
pg_run() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_datadir() {
	local d="$STATE/postgres"
	if [ "$(id -u)" = 0 ]; then
		mkdir -p "$STATE"
		if ! runuser -u postgres -- test -x "$STATE"; then
			# A parent directory is closed to the postgres user: keep the
			# cluster in a per-checkout directory under /var/tmp instead.
			d="/var/tmp/flywheel-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)/postgres"
		fi
	fi
	echo "$d"
}

pg_up() {
	local bindir data
	bindir="$(pg_bindir)"
	if [ -z "$bindir" ]; then
		apt_install postgresql
		bindir="$(pg_bindir)"
		[ -n "$bindir" ] || die "PostgreSQL server binaries not found after install"
	fi
	data="$(pg_datadir)"
	if [ ! -s "$data/PG_VERSION" ]; then
		log "creating private PostgreSQL cluster in $data"
		mkdir -p "$data"
		[ "$(id -u)" = 0 ] && chown -R postgres:postgres "$(dirname "$data")"
		chmod 700 "$data"
		pg_run "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$STATE/initdb.log" 2>&1 ||
			{ cat "$STATE/initdb.log" >&2; die "initdb failed"; }
		cat >>"$data/postgresql.conf" <<-CONF
			listen_addresses = '127.0.0.1'
			port = $PG_PORT
			unix_socket_directories = '$data'
			max_connections = 200
			shared_buffers = 256MB
			fsync = on
			synchronous_commit = on
			log_min_messages = warning
		CONF
	fi
	if ! pg_run "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
		log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
		pg_run "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >/dev/null ||
			{ tail -20 "$data/server.log" >&2; die "PostgreSQL did not start (port $PG_PORT taken?)"; }
	fi
	wait_for 30 "PostgreSQL" "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
	local psql=("$bindir/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt)
	"${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname='flywheel'" | grep -q 1 ||
		"${psql[@]}" -c "CREATE ROLE flywheel LOGIN CREATEDB"
	local db
	for db in flywheel flywheel_test; do
		"${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1 ||
			"${psql[@]}" -c "CREATE DATABASE $db OWNER flywheel"
	done
}

pg_down() {
	local bindir data
	bindir="$(pg_bindir)"; data="$(pg_datadir)"
	[ -n "$bindir" ] && [ -s "$data/PG_VERSION" ] || return 0
	if pg_run "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
		log "stopping PostgreSQL"
		pg_run "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null
	fi
}

# --- Temporal -----------------------------------------------------------------

temporal_cli() {
	if [ -x "$TEMPORAL_CLI" ] && "$TEMPORAL_CLI" --version >/dev/null 2>&1; then return 0; fi
	log "building the Temporal CLI $TEMPORAL_VERSION into $CACHE (once per machine, ~10 minutes cold)"
	mkdir -p "$(dirname "$TEMPORAL_CLI")"
	(cd /tmp && GOBIN="$(dirname "$TEMPORAL_CLI")" GOFLAGS= go install "github.com/temporalio/cli/cmd/temporal@$TEMPORAL_VERSION") ||
		die "building the Temporal CLI failed"
}

temporal_serving() {
	"$TEMPORAL_CLI" operator cluster health --address "127.0.0.1:$TEMPORAL_PORT" 2>/dev/null | grep -q SERVING
}

# A dev server can say SERVING yet fail every namespace read (seen after
# many runs on one SQLite file: "interrupted (9)"), so health includes one.
temporal_healthy() {
	temporal_serving && "$TEMPORAL_CLI" operator namespace describe --address "127.0.0.1:$TEMPORAL_PORT" \
		--namespace flywheel >/dev/null 2>&1
}

temporal_up() {
	temporal_cli
	if temporal_serving && ! temporal_healthy; then
		log "the Temporal dev server is up but cannot read its namespace; restarting it"
		temporal_down
		wait_for 30 "the old Temporal dev server to stop" eval '! temporal_serving'
	fi
	if ! temporal_healthy; then
		log "starting the Temporal dev server on 127.0.0.1:$TEMPORAL_PORT (UI :$TEMPORAL_UI_PORT)"
		mkdir -p "$LOGS"
		setsid nohup "$TEMPORAL_CLI" server start-dev \
			--ip 127.0.0.1 --port "$TEMPORAL_PORT" --ui-port "$TEMPORAL_UI_PORT" \
			--db-filename "$STATE/temporal.db" --namespace flywheel --log-level warn \
			--sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=normal \
			>"$LOGS/temporal.log" 2>&1 </dev/null &
		echo $! >"$STATE/temporal.pid"
		wait_for 90 "Temporal dev server" temporal_healthy
	fi
	"$BIN" temporal setup --temporal-address "127.0.0.1:$TEMPORAL_PORT" >/dev/null || die "registering the Temporal namespace and search attributes failed"
}

temporal_down() {
	if [ -s "$STATE/temporal.pid" ] && kill -0 "$(cat "$STATE/temporal.pid")" 2>/dev/null; then
		log "stopping the Temporal dev server"
		kill "$(cat "$STATE/temporal.pid")"
		local i; for i in $(seq 50); do kill -0 "$(cat "$STATE/temporal.pid")" 2>/dev/null || break; sleep 0.2; done
	fi
	rm -f "$STATE/temporal.pid"
}

# --- Docker and native libraries ---------------------------------------------

docker_up() {
	docker info >/dev/null 2>&1 || die "the Docker engine does not answer (is dockerd running and is DOCKER_HOST right?)"
	"$BIN" sandbox build >/dev/null || die "building the sandbox images failed"
}

# Debian packages the build and the sandbox images need: OpenBLAS for the
# trainer's SGEMM (cgo), mmdebstrap and busybox-static for the images.
native_libs() {
	local missing=()
	[ -e /usr/include/x86_64-linux-gnu/cblas.h ] || [ -e /usr/include/cblas.h ] || [ -e /usr/include/openblas/cblas.h ] ||
		missing+=(libopenblas-dev)
	command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
	dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
	[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

build() {
	mkdir -p "$(dirname "$BIN")"
	# -buildvcs=auto stamps the git revision into `flywheel version` even where
	# GOFLAGS turns it off.
	(cd "$ROOT" && go build -buildvcs=auto -o "$BIN" ./cmd/flywheel)
}

env_lines() {
	cat <<-ENV
		export FLYWHEEL_DATABASE_URL='postgres://flywheel@127.0.0.1:$PG_PORT/flywheel?sslmode=disable'
		export FLYWHEEL_TEST_DATABASE_URL='postgres://flywheel@127.0.0.1:$PG_PORT/flywheel_test?sslmode=disable'
		export FLYWHEEL_TEMPORAL_ADDRESS='127.0.0.1:$TEMPORAL_PORT'
		export FLYWHEEL_TEMPORAL_CLI='$TEMPORAL_CLI'
		export FLYWHEEL_STATE_DIR='$STATE'
	ENV
}

case "${1:-}" in
up)
	mkdir -p "$STATE" "$LOGS"
	native_libs
	build
	pg_up
	temporal_up
	docker_up
	log "services ready: postgres 127.0.0.1:$PG_PORT, temporal 127.0.0.1:$TEMPORAL_PORT, UI http://127.0.0.1:$TEMPORAL_UI_PORT"
	;;
down)
	temporal_down
	pg_down
	;;
status)
	if pg_isready -q -h 127.0.0.1 -p "$PG_PORT" 2>/dev/null; then echo "postgres: up (127.0.0.1:$PG_PORT)"; else echo "postgres: down"; fi
	if [ -x "$TEMPORAL_CLI" ] && temporal_healthy; then echo "temporal: up (127.0.0.1:$TEMPORAL_PORT)"; else echo "temporal: down"; fi
	if docker info >/dev/null 2>&1; then echo "docker: up"; else echo "docker: down"; fi
	;;
env) env_lines ;;
*) echo "usage: $0 {up|down|status|env}" >&2; exit 2 ;;
esac
