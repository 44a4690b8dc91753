#!/bin/bash
# The shim's own user-space instructions per decision, counted by callgrind
# (repeatable on a loaded machine, unlike times). Starts SHIM under valgrind
# against a running Redis, warms it with 300 checks, then counts N checks of
# one sliding window (scenario 2's body) sent by oha over 16 connections,
# in JSON or (`binary`) in the binary wire, as the filter sends it.
#
#   bench/tools/shim-callgrind.sh SHIM REDIS_URL PORT N [h2|h1] [json|binary]
#   e.g. bench/tools/shim-callgrind.sh dist/sluice redis://127.0.0.1:6379 18181 2000 h2 binary
set -eu
SHIM=$1; RURL=$2; P=$3; N=$4; H2=${5:-}; WIRE=${6:-json}
[ "$H2" = h1 ] && H2=
D=$(mktemp -d); BODY=$D/body
# The same check in the binary wire, as hex (bench/src/shim_alone.rs tests it).
BINARY=010000000a00000062656e63682d7368696d05000000616c6f6e65010000000100ca9a3be8030000000000000000000000000000000000
if [ "$WIRE" = binary ]; then
  echo "$BINARY" | xxd -r -p > "$BODY"; TYPE=application/x-sluice-binary
else
  echo '{"checks":[{"policy":"bench-shim","key":"alone","limits":[{"type":"sliding_window","limit":1000000000,"window_ms":1000}]}]}' > "$BODY"; TYPE=application/json
fi
valgrind --tool=callgrind --callgrind-out-file="$D/out.%p" "$SHIM" serve --listen 127.0.0.1:"$P" --redis "$RURL" > "$D/log" 2>&1 &
VP=$!
for _ in $(seq 1 60); do curl -s 127.0.0.1:"$P"/healthz > /dev/null && break; sleep 1; done
extra=(); [ -n "$H2" ] && extra=(--http2)
load() { oha -n "$1" -c 16 "${extra[@]}" --no-tui --output-format quiet -m POST -H "content-type: $TYPE" -D "$BODY" http://127.0.0.1:"$P"/v1/check; }
load 300
callgrind_control --zero "$VP" > /dev/null
load "$N"
callgrind_control --dump=measured "$VP" > /dev/null
sleep 1; kill "$VP"; wait "$VP" 2>/dev/null || true
total=$(grep -h -E "^(summary|totals):" $(grep -l measured "$D"/out.*) | head -1 | awk '{print $2}')
echo "$SHIM ${H2:-h1} $WIRE: $total instructions for $N decisions, $((total / N)) per decision ($D)"
