#!/bin/bash
# CPU time (user and system, from /proc/PID/stat) per request of each process
# on one request's path, for already running processes: send N requests
# (oha, 16 connections, closed loop) through Envoy at URL, and read the
# clock ticks of every PID before and after. Rounds interleave the setups.
# Times per request move with the machine's load less than throughput does.
#
#   bench/tools/cpu-per-request.sh N ROUNDS name=URL:PID[,PID...] ...
#   e.g. bench/tools/cpu-per-request.sh 20000 3 tcp=http://127.0.0.1:10000/allow:$ENVOY,$SHIM,$REDIS
set -eu
N=$1; R=$2; shift 2
ticks() { awk '{print $14 + $15}' /proc/"$1"/stat; }
for round in $(seq 1 "$R"); do
  for spec in "$@"; do
    name=${spec%%=*}; rest=${spec#*=}; url=${rest%:*}; pids=${rest##*:}
    oha -n 500 -c 16 --no-tui --output-format quiet "$url"
    before=(); for p in ${pids//,/ }; do before+=("$(ticks "$p")"); done
    oha -n "$N" -c 16 --no-tui --output-format quiet "$url"
    line="round $round $name:"; i=0
    for p in ${pids//,/ }; do
      us=$(( ($(ticks "$p") - before[i]) * 1000000 / $(getconf CLK_TCK) / N ))
      line="$line $(cat /proc/"$p"/comm)=${us}us"; i=$((i + 1))
    done
    echo "$line"
  done
done
