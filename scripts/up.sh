#!/usr/bin/env bash
# Runs `flywheel up` in the background on top of the services that
# scripts/services.sh started, waits until it has served a workflow round
# trip, and prints its summary (gateway URL, Temporal UI, API key). The
# first start with a demo base builds that base (minutes), hence the wait.
#
#   scripts/up.sh start | stop | status
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${FLYWHEEL_STATE_DIR:-$ROOT/.flywheel}"
BIN="$STATE/bin/flywheel"
LOG="$STATE/logs/flywheel.log"
PID="$STATE/flywheel.pid"

running() { [ -s "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null; }
summary() { sed -n '/^Flywheel is up/,/^$/p' "$LOG" | tail -n +2; }

case "${1:-}" in
start)
	if running && grep -q '^Flywheel is up' "$LOG"; then
		summary; exit 0
	fi
	mkdir -p "$(dirname "$LOG")"
	cd "$ROOT"
	setsid nohup "$BIN" up --data-dir "$STATE/data" >"$LOG" 2>&1 </dev/null &
	echo $! >"$PID"
	deadline=$((SECONDS + 600))
	until grep -q '^Flywheel is up' "$LOG"; do
		if ! running; then tail -n 30 "$LOG" >&2; echo "flywheel up exited (log: $LOG)" >&2; exit 1; fi
		[ $SECONDS -lt $deadline ] || { tail -n 30 "$LOG" >&2; echo "flywheel up not ready after 600s (log: $LOG)" >&2; exit 1; }
		sleep 0.2
	done
	summary
	echo "  logs         $LOG   (stop: make down)"
	;;
stop)
	if running; then
		kill "$(cat "$PID")"
		for _ in $(seq 100); do running || break; sleep 0.1; done
	fi
	rm -f "$PID"
	;;
status)
	if running; then echo "flywheel: up (pid $(cat "$PID"))"; else echo "flywheel: down"; fi
	;;
*) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
esac
