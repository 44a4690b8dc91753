#!/bin/bash
# The shim's own user-space instructions per decision, by the transport
# Envoy calls it over, counted by callgrind (repeatable on a loaded
# machine): the same fixed window (never full) decided N times through
# Envoy's Sluice filter over HTTP/2 (`POST /v1/check`, the binary wire) and
# N times through Envoy's native ratelimit filter over gRPC (the shim's RLS
# face, tonic and protobuf). One shim, one Redis, one Envoy per transport,
# oha through Envoy with 16 connections; the counts are the shim's alone.
#
#   bench/tools/transport-callgrind.sh DIST N
#   e.g. bench/tools/transport-callgrind.sh dist 2000
set -eu
DIST=$(realpath "$1"); N=$2
RESPONDER=${SLUICE_BENCH_RESPONDER:-target/release/sluice-bench-responder}
D=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
R=$(port); P=$(port); G=$(port); U=$(port)
cat > "$D/rls.json" <<'JSON'
{"policies": [{"name": "t", "match": {"domain": "d", "entries": {"generic_key": {"equals": "t"}}}, "key": [],
  "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]}]}
JSON
cat > "$D/wasm.json" <<'JSON'
{"policies": [{"name": "t", "match": {"path_prefix": "/"}, "key": [],
  "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]}]}
JSON
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
redis-server --port "$R" --save '' --appendonly no > "$D/redis.log" 2>&1 & pids+=($!)
"$RESPONDER" 127.0.0.1:"$U" > "$D/responder.log" 2>&1 & pids+=($!)
valgrind --tool=callgrind --callgrind-out-file="$D/out.%p" "$DIST/sluice" serve --listen 127.0.0.1:"$P" \
  --grpc-listen 127.0.0.1:"$G" --redis redis://127.0.0.1:"$R" --policy "$D/rls.json" > "$D/shim.log" 2>&1 &
VP=$!; pids+=($VP)
envoy_for() { # face policy shim -> listen port
  local face=$1 policy=$2 shim=$3 listen admin
  listen=$(port); admin=$(port)
  "$DIST/sluice" envoy-config --face "$face" --policy "$policy" --wasm "$DIST/sluice.wasm" --shim "$shim" \
    --listen 127.0.0.1:"$listen" --upstream 127.0.0.1:"$U" --admin 127.0.0.1:"$admin" > "$D/$face.yaml"
  envoy -c "$D/$face.yaml" --concurrency 1 --base-id "$listen" --log-level warn > "$D/$face.log" 2>&1 &
  pids+=($!)
  echo "$listen"
}
for _ in $(seq 1 60); do curl -s 127.0.0.1:"$P"/healthz > /dev/null && break; sleep 1; done
H2=$(envoy_for wasm "$D/wasm.json" 127.0.0.1:"$P")
GRPC=$(envoy_for rls "$D/rls.json" 127.0.0.1:"$G")
load() { oha -n "$2" -c 16 --no-tui --output-format quiet http://127.0.0.1:"$1"/x; }
for l in $H2 $GRPC; do for _ in $(seq 1 60); do [ "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:"$l"/x)" = 200 ] && break; sleep 1; done; done
count() { # name listen
  load "$2" 300
  callgrind_control --zero "$VP" > /dev/null
  load "$2" "$N"
  callgrind_control --dump="$1" "$VP" > /dev/null
  sleep 1
  local total
  total=$(grep -h -E "^(summary|totals):" $(grep -l "$1" "$D"/out.*) | head -1 | awk '{print $2}')
  echo "$1: $total instructions for $N decisions, $((total / N)) per decision"
}
count h2-binary "$H2"
count grpc-rls "$GRPC"
count h2-binary-again "$H2"
echo "($D)"
