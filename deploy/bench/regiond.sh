#!/usr/bin/env bash
# Measures regiond with sim load on this machine, load generator included:
#   1. Envoy RLS and geoquota gRPC, 10,000 uniform keys, concurrency 50, a
#      token bucket on a local redis-server: peak requests/s and latency;
#   2. the same at half the peak rate: p99 there;
#   3. one hot key far over its limit: requests/s and Redis commands per
#      request (the denial cache keeps the flood away from Redis).
# DUR sets each run's length (default 20s). Needs redis-server and Go.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${DUR:-20s}
REDIS_PORT=${REDIS_PORT:-16379}
GRPC=127.0.0.1:${GRPC_PORT:-18081}
HTTP=127.0.0.1:${HTTP_PORT:-18080}
work=$(mktemp -d)
cleanup() {
	[ -n "${regiond_pid:-}" ] && kill "$regiond_pid" 2>/dev/null && wait "$regiond_pid" 2>/dev/null || true
	redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

go build -tags vtprotobuf -o "$work/regiond" ./cmd/regiond
go build -tags vtprotobuf -o "$work/sim" ./cmd/sim
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
	--dir "$work" --logfile "$work/redis.log"
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
"$work/regiond" --redis "redis://127.0.0.1:$REDIS_PORT/0" --rules deploy/bench/rules.yaml \
	--grpc-addr "$GRPC" --http-addr "$HTTP" --log-level warn 2>"$work/regiond.log" &
regiond_pid=$!
until curl -sf "http://$HTTP/readyz" >/dev/null; do sleep 0.1; done

load() { "$work/sim" load -target "$GRPC" -keys 10000 -concurrency 50 -duration "$DUR" "$@"; }
rate_of() { awk '/^requests\/s/ {print $2}'; }

echo "## peak, then half the peak"
for api in envoy grpc; do
	out=$(load -api "$api")
	echo "$out"
	peak=$(echo "$out" | rate_of)
	load -api "$api" -rate "$(awk -v p="$peak" 'BEGIN {printf "%d", p / 2}')"
	echo
done

echo "## one hot key over its limit"
for api in envoy grpc; do
	redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
	out=$(load -api "$api" -keys 1 -endpoint /hot -key-prefix "hot_$api")
	echo "$out"
	commands=$(redis-cli -p "$REDIS_PORT" info stats | awk -F: '/^total_commands_processed/ {print $2+0}')
	requests=$(echo "$out" | awk '/^requests / {print $2}')
	awk -v c="$commands" -v r="$requests" 'BEGIN {printf "Redis commands per request: %.5f (%d commands for %d requests)\n\n", (c - 1) / r, c - 1, r}'
done
