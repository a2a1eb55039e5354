#!/usr/bin/env bash
# Rule evaluation time of the vtax-peers group over a synthetic fleet, in a real
# Prometheus. Generates NODES nodes x GPUS GPUs (gen_fleet.py) as OpenMetrics from a
# few minutes ago to SPAN_MIN minutes ahead, backfills them with `promtool tsdb
# create-blocks-from openmetrics`, starts `prometheus` on that TSDB with
# dashboards/alerts/vtax-rules.yml loaded, and samples
# prometheus_rule_group_last_duration_seconds for the group for WATCH_S seconds.
# The out-of-order window lets the rules' results, written at the present, land
# below the backfilled blocks that reach into the future.
#
# Usage: bench/fleet/run.sh   (NODES=1000 GPUS=8 CPUS=16 PORTS=4 CLUSTERS=4 WATCH_S=120)
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-1000} GPUS=${GPUS:-8} CPUS=${CPUS:-16} PORTS=${PORTS:-4}
CLUSTERS=${CLUSTERS:-4} WATCH_S=${WATCH_S:-120} SPAN_MIN=${SPAN_MIN:-15} PORT=${PORT:-19190}
work=$(mktemp -d "${TMPDIR:-/tmp}/vtax-fleet-XXXXXX")
prom_pid=
cleanup() { [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

now=$(date +%s)
t0=$(date +%s.%N)
python3 bench/fleet/gen_fleet.py "$work/fleet.om" --nodes "$NODES" --gpus "$GPUS" --cpus "$CPUS" \
  --ports "$PORTS" --clusters "$CLUSTERS" --start $((now - 120)) --end $((now + SPAN_MIN * 60)) --step-secs 15
t1=$(date +%s.%N)
promtool tsdb create-blocks-from openmetrics "$work/fleet.om" "$work/tsdb" >/dev/null
t2=$(date +%s.%N)
echo "generated $(wc -l < "$work/fleet.om") samples in $(echo "$t1 - $t0" | bc) s, backfilled in $(echo "$t2 - $t1" | bc) s"
rm "$work/fleet.om"

cat > "$work/prometheus.yml" <<YML
global:
  evaluation_interval: 5s
rule_files:
  - $PWD/dashboards/alerts/vtax-rules.yml
storage:
  tsdb:
    out_of_order_time_window: 1h
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$PORT" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
metric() { curl -fsS "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 ~ m && /vtax-peers/ {print $2}'; }
q() { curl -fsS "http://127.0.0.1:$PORT/api/v1/query" --data-urlencode "query=$1" \
  | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")'; }
for _ in $(seq 120); do curl -fsS "http://127.0.0.1:$PORT/-/ready" >/dev/null 2>&1 && break; sleep 1; done
sleep 15
durations=()
end=$(( $(date +%s) + WATCH_S ))
while [ "$(date +%s)" -lt "$end" ]; do
  durations+=("$(metric '^prometheus_rule_group_last_duration_seconds')")
  sleep 5
done
echo "series: $(q 'count({__name__=~"vtax_.+"})') backfilled, nodes with a z: $(q 'count(vtax:node_peer_z:worst)'), nodes over 4: $(q 'count(vtax:node_peer_z:worst > 4)')"
echo "vtax-peers: $(metric '^prometheus_rule_group_rules') rules, iterations $(metric '^prometheus_rule_group_iterations_total'), missed $(metric '^prometheus_rule_group_iterations_missed_total'), failures $(metric '^prometheus_rule_evaluation_failures_total')"
printf '%s\n' "${durations[@]}" | sort -g | awk '{d[NR]=$1} END {printf "last_duration over %d samples: min %.3f s, median %.3f s, max %.3f s\n", NR, d[1], d[int((NR+1)/2)], d[NR]}'
curl -fsS "http://127.0.0.1:$PORT/api/v1/rules" | python3 -c '
import json, sys
g = [g for g in json.load(sys.stdin)["data"]["groups"] if g["name"] == "vtax-peers"][0]
rules = sorted(g["rules"], key=lambda r: -r["evaluationTime"])
print("slowest rules in the last evaluation:")
for r in rules[:4]:
    what = r["name"] + (" (" + r["labels"]["signal"] + ")" if "signal" in r.get("labels", {}) else "")
    print("  %.3f s  %s" % (r["evaluationTime"], what))'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
