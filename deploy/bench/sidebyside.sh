#!/usr/bin/env bash
# Side by side on this machine, one load generator (sim load, Envoy RLS v3,
# 50 concurrent callers), in interleaved rounds, so that the machine's drift
# falls on every target alike:
#   floor   sim floor: Envoy RLS answering OK and doing nothing else, with the
#           gRPC server and options regiond serves with (the protocol's floor)
#   redis   regiond on a local redis-server: a token bucket per API key,
#           10,000 uniform keys (deploy/bench/rules.yaml, /search)
#   memory  regiond on its own memory (--dev with the same rules)
#   hot     regiond on Redis, one key far over its limit (/hot)
# For each: checks a second (median of the rounds) and its ratio to the
# floor's (also round by round, and regiond on Redis ÷ the peer's), CPU per check (the server's, and redis-server's: utime + stime
# from /proc) and, for regiond, allocations per check (go_memstats_mallocs_total).
# Then, in an open loop at half the floor's median peak, p50 and p99 of the
# floor and of regiond on Redis and in memory, and their ratios.
# ROUNDS (default 3) and DUR (each run, default 10s) set the length. Needs
# redis-server, curl and Go. A peer built outside the repository (see the
# README) joins the rounds with PEER=host:port (Envoy RLS), PEER_PID (its
# process, for CPU) and PEER_DOMAIN (the domain its configuration limits);
# it should use this script's redis-server (REDIS_PORT, default 16379),
# started before it with REDIS_KEEP=1 and left running.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-10s}
REDIS_PORT=${REDIS_PORT:-16379}
FLOOR=127.0.0.1:18091
REDIS_GRPC=127.0.0.1:18081 REDIS_HTTP=127.0.0.1:18080
MEM_GRPC=127.0.0.1:18083 MEM_HTTP=127.0.0.1:18082
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
	[ -n "${REDIS_KEEP:-}" ] || redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

go build -tags vtprotobuf -o "$work/regiond" ./cmd/regiond
go build -tags vtprotobuf -o "$work/sim" ./cmd/sim
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--dir "$work" --logfile "$work/redis.log"
	until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
fi
redis_pid=$(redis-cli -p "$REDIS_PORT" info server | awk -F: '/^process_id/ {print $2 + 0}')
"$work/sim" floor -grpc-addr "$FLOOR" 2>"$work/floor.log" &
floor_pid=$! && pids+=("$floor_pid")
"$work/regiond" --redis "redis://127.0.0.1:$REDIS_PORT/0" --rules deploy/bench/rules.yaml \
	--grpc-addr "$REDIS_GRPC" --http-addr "$REDIS_HTTP" --log-level warn 2>"$work/regiond-redis.log" &
rpid=$! && pids+=("$rpid")
"$work/regiond" --dev --rules deploy/bench/rules.yaml \
	--grpc-addr "$MEM_GRPC" --http-addr "$MEM_HTTP" --log-level warn 2>"$work/regiond-memory.log" &
mpid=$! && pids+=("$mpid")
until curl -sf "http://$REDIS_HTTP/readyz" >/dev/null && curl -sf "http://$MEM_HTTP/readyz" >/dev/null; do sleep 0.1; done
until grep -q serving "$work/floor.log"; do sleep 0.1; done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks
ticks=$(getconf CLK_TCK)
mallocs() { curl -sf "http://$1/metrics" | awk '/^go_memstats_mallocs_total / {printf "%d", $2}'; }

# run TARGET ADDR PID METRICS REDIS? [sim load flags…]: one run, one line
# of results appended to $work/results: target rate cpu_us_per_check allocs_per_check
run() {
	local name=$1 addr=$2 pid=$3 metrics=$4 withredis=$5
	shift 5
	local c0 r0 m0=0 c1 r1 m1=0 out rate n
	c0=$(cpu "$pid") r0=$(cpu "$redis_pid")
	[ -n "$metrics" ] && m0=$(mallocs "$metrics")
	out=$("$work/sim" load -api envoy -target "$addr" -concurrency 50 -duration "$DUR" -warmup 2s "$@")
	c1=$(cpu "$pid") r1=$(cpu "$redis_pid")
	[ -n "$metrics" ] && m1=$(mallocs "$metrics")
	rate=$(echo "$out" | awk '/^requests\/s/ {print $2}')
	# CPU and allocations count the warm-up too: divide by all requests sent
	# in the run, warm-up included (its rate is the run's).
	n=$(awk -v r="$rate" -v d="$DUR" 'BEGIN {sub(/s$/, "", d); print r * (d + 2)}')
	awk -v t="$name" -v r="$rate" -v n="$n" -v c="$((c1 - c0))" -v rc="$(( (r1 - r0) * withredis ))" -v m="$((m1 - m0))" -v hz="$ticks" \
		'BEGIN {printf "%s %.0f %.1f %.1f %.1f\n", t, r, c * 1e6 / hz / n, rc * 1e6 / hz / n, m / n}' >>"$work/results"
	echo "$out" | grep -E '^(requests|latency|first error)' | sed "s/^/  $name: /" >&2
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), $ROUNDS rounds of $DUR each, $(nproc) cores" >&2
for round in $(seq "$ROUNDS"); do
	echo "round $round" >&2
	run floor "$FLOOR" "$floor_pid" "" 0
	run redis "$REDIS_GRPC" "$rpid" "$REDIS_HTTP" 1 -keys 10000
	run memory "$MEM_GRPC" "$mpid" "$MEM_HTTP" 0 -keys 10000
	run hot "$REDIS_GRPC" "$rpid" "$REDIS_HTTP" 1 -keys 1 -endpoint /hot -key-prefix hot_
	if [ -n "${PEER:-}" ]; then
		run peer "$PEER" "$PEER_PID" "" 1 -keys 10000 -domain "${PEER_DOMAIN:-}"
	fi
done

median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
col() { awk -v t="$1" -v c="$2" '$1 == t {print $c}' "$work/results" | median; }
floor_rate=$(col floor 2)
echo
echo "| target | checks/s (median) | ÷ floor | server CPU µs/check | redis-server CPU µs/check | allocations/check |"
echo "| --- | --- | --- | --- | --- | --- |"
targets="floor redis memory hot"
[ -n "${PEER:-}" ] && targets="$targets peer"
for t in $targets; do
	awk -v t="$t" -v r="$(col "$t" 2)" -v f="$floor_rate" -v c="$(col "$t" 3)" -v rc="$(col "$t" 4)" -v m="$(col "$t" 5)" \
		'BEGIN {printf "| %s | %.0f | %.2f | %.1f | %.1f | %.1f |\n", t, r, r / f, c, rc, m}'
done

# Round by round: each target's checks a second ÷ the floor's of the same
# round (and regiond on Redis ÷ the peer's), and their median.
ratios() {
	awk -v a="$1" -v b="$2" '$1 == a {x[++n] = $2} $1 == b {y[++m] = $2}
		END {for (i = 1; i <= n && i <= m; i++) printf "%.2f\n", x[i] / y[i]}' "$work/results"
}
echo
echo "Round by round:"
echo
for t in ${targets#floor }; do
	[ "$t" = peer ] && continue
	echo "- $t ÷ floor: $(ratios "$t" floor | paste -sd' ') (median $(ratios "$t" floor | median))"
done
if [ -n "${PEER:-}" ]; then
	echo "- redis ÷ peer: $(ratios redis peer | paste -sd' ') (median $(ratios redis peer | median))"
fi

half=$(awk -v f="$floor_rate" 'BEGIN {printf "%d", f / 2}')
echo
echo "Open loop at $half checks/s (half the floor's median peak):"
echo
echo "| target | p50 | p99 | p99 ÷ floor's |"
echo "| --- | --- | --- | --- |"
lat() { "$work/sim" load -api envoy -target "$1" -concurrency 50 -duration "$DUR" -warmup 2s -keys 10000 -rate "$half" | awk '/^latency/ {print $3, $7}'; }
read -r fp50 fp99 < <(lat "$FLOOR")
echo "| floor | $fp50 | $fp99 | 1.00 |"
for t in redis memory; do
	addr=$REDIS_GRPC
	[ "$t" = memory ] && addr=$MEM_GRPC
	read -r p50 p99 < <(lat "$addr")
	awk -v t="$t" -v a="$p50" -v b="$p99" -v f="$fp99" 'function us(x) {
			if (x ~ /µs$/) return x + 0; if (x ~ /ms$/) return x * 1000; return x * 1e6 }
		BEGIN {printf "| %s | %s | %s | %.2f |\n", t, a, b, us(b) / us(f)}'
done
