#!/usr/bin/env bash
# Side-by-side on-disk size benchmark: Prometheus TSDB (promtool backfill),
# VictoriaMetrics (/api/v1/import/prometheus) and vtax (`vtax import`).
#
#   bench/size/run.sh [--vtax BIN] [--quick] [--keep] [--scratch DIR]
#                     [--results FILE] [--prom-max-block-duration DUR]
#                     [--check-values] INPUT.om...
#
# See bench/size/README.md.  Only 127.0.0.1 is used.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB=(python3 "$HERE/benchlib.py")
PROMTOOL=${PROMTOOL:-promtool}
VMBIN=${VICTORIA_METRICS:-victoria-metrics}
VTAX_TABLE=${VTAX_TABLE:-scraped}   # the table `vtax import` writes to
VTAX=""
QUICK=0
CHECK_VALUES=0
KEEP=0
SCRATCH=""
RESULTS="$HERE/results.md"
PROM_MBD=()
INPUTS=()

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --vtax) VTAX=${2:?--vtax needs a path}; shift 2 ;;
        --vtax=*) VTAX=${1#--vtax=}; shift ;;
        --quick) QUICK=1; shift ;;
        --check-values) CHECK_VALUES=1; shift ;;
        --keep) KEEP=1; shift ;;
        --scratch) SCRATCH=${2:?}; shift 2 ;;
        --results) RESULTS=${2:?}; shift 2 ;;
        --prom-max-block-duration) PROM_MBD=(--max-block-duration="${2:?}"); shift 2 ;;
        -h|--help) usage 0 ;;
        --) shift; INPUTS+=("$@"); break ;;
        -*) echo "unknown option $1" >&2; usage 2 ;;
        *) INPUTS+=("$1"); shift ;;
    esac
done
[ ${#INPUTS[@]} -gt 0 ] || usage 2
for f in "${INPUTS[@]}"; do
    [ -r "$f" ] || { echo "run.sh: cannot read input $f" >&2; exit 2; }
done
command -v "$PROMTOOL" >/dev/null || { echo "run.sh: promtool not found" >&2; exit 2; }
command -v "$VMBIN" >/dev/null || { echo "run.sh: victoria-metrics not found" >&2; exit 2; }
command -v curl >/dev/null || { echo "run.sh: curl not found" >&2; exit 2; }

if [ -z "$SCRATCH" ]; then
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/vtax-size-bench.XXXXXX")
else
    mkdir -p "$SCRATCH"
fi
SCRATCH=$(cd "$SCRATCH" && pwd)
JSONL="$SCRATCH/results.jsonl"
: > "$JSONL"

VM_PID=""
cleanup() {
    if [ -n "$VM_PID" ] && kill -0 "$VM_PID" 2>/dev/null; then
        kill -INT "$VM_PID" 2>/dev/null; wait "$VM_PID" 2>/dev/null
    fi
    if [ "$KEEP" = 0 ]; then rm -rf "$SCRATCH"; else echo "run.sh: scratch kept in $SCRATCH" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
dub() { if [ -e "$1" ]; then du -sb "$1" | cut -f1; else echo 0; fi; }
jget() { "${LIB[@]}" get "$1"; }
record() { "${LIB[@]}" record "$JSONL" "$@"; }

# ---------------------------------------------------------------- VictoriaMetrics
VM_URL=""
vm_start() {  # vm_start DATADIR LOG
    local port
    port=$("${LIB[@]}" free-port)
    VM_URL="http://127.0.0.1:$port"
    # -retentionPeriod=100y: the synthetic input is old-dated; samples older than
    #   now-retention are dropped on ingestion (vm_rows_ignored_total{reason="small_timestamp"}).
    # -search.disableCache: backfilling; keeps the rollup cache out of the picture.
    "$VMBIN" -storageDataPath="$1" -retentionPeriod=100y -httpListenAddr="127.0.0.1:$port" \
        -search.disableCache -search.maxUniqueTimeseries=10000000 -search.maxSamplesPerQuery=100000000000 \
        -search.maxQueryDuration=1h -search.maxExportDuration=1000000h \
        >>"$2" 2>&1 &
    VM_PID=$!
    if ! "${LIB[@]}" wait-http "$VM_URL/health" 120; then
        log "VictoriaMetrics did not come up; see $2"; vm_stop; return 1
    fi
}
vm_stop() {
    if [ -n "$VM_PID" ]; then
        kill -INT "$VM_PID" 2>/dev/null
        wait "$VM_PID" 2>/dev/null
        VM_PID=""
    fi
}

log "scratch: $SCRATCH"
log "measuring an empty VictoriaMetrics data directory"
EMPTY="$SCRATCH/vm-empty"
vm_start "$EMPTY/data" "$EMPTY.log" || exit 1
curl -sS --fail "$VM_URL/internal/force_flush" >/dev/null
vm_stop
VM_EMPTY_TOTAL=$(dub "$EMPTY/data")
VM_EMPTY_DI=$(( $(dub "$EMPTY/data/data") + $(dub "$EMPTY/data/indexdb") ))
record input="(empty database)" system="VictoriaMetrics raw" bytes="$VM_EMPTY_TOTAL" \
    notes="empty -storageDataPath after start+stop; data/+indexdb/ = $VM_EMPTY_DI B"

# ---------------------------------------------------------------- per input
idx=0
for IN in "${INPUTS[@]}"; do
    idx=$((idx + 1))
    name=$(basename "$IN")
    W="$SCRATCH/$idx-${name%.*}"
    mkdir -p "$W"
    log "== $name: reading input"
    STATS=$("${LIB[@]}" stats "$IN") || { log "cannot parse $IN"; continue; }
    NS=$(jget samples <<<"$STATS"); NSER=$(jget series <<<"$STATS")
    TMIN=$(jget min_ts_ms <<<"$STATS"); TMAX=$(jget max_ts_ms <<<"$STATS")
    log "   $NS samples, $NSER series, $(jget bytes <<<"$STATS") bytes, ts $TMIN..$TMAX"

    # ------------------------------------------------ promtool
    log "== $name: promtool tsdb create-blocks-from openmetrics"
    P="$W/prometheus"
    t0=$(now)
    if "$PROMTOOL" tsdb create-blocks-from openmetrics ${PROM_MBD[@]+"${PROM_MBD[@]}"} "$IN" "$P" >"$W/promtool.log" 2>&1; then
        t1=$(now)
        PB=$(dub "$P")
        META=$("${LIB[@]}" prom-meta "$P")
        STORED=$(jget samples <<<"$META"); BLOCKS=$(jget blocks <<<"$META")
        PSER=$(jget series <<<"$META")
        notes="$BLOCKS block(s), $(jget chunks <<<"$META") chunks; count from meta.json"
        if [ "$QUICK" = 0 ]; then
            # promtool 2.42 `tsdb dump` needs a wal/ dir (and creates chunks_head/): size is taken before.
            mkdir -p "$P/wal"
            read -r DN DS < <("$PROMTOOL" tsdb dump "$P" 2>"$W/promtool-dump.err" |
                awk '{ k = substr($0, 1, index($0, "} ")); if (k != p) { s++; p = k } n++ } END { print n + 0, s + 0 }')
            notes="$BLOCKS block(s), $(jget chunks <<<"$META") chunks; counted with tsdb dump"
            [ "$DN" = "$STORED" ] || notes="$notes; **meta.json says $STORED**"
            STORED=$DN; PSER=$DS
        fi
        [ "$STORED" = "$NS" ] || log "!!! MISMATCH promtool holds $STORED samples, input has $NS"
        record input="$name" system="promtool (Prometheus TSDB)" expected_samples="$NS" \
            stored_samples="$STORED" series="$PSER" bytes="$PB" wall_s="$(elapsed "$t0" "$t1")" notes="$notes"
        log "   $PB bytes, $STORED samples stored"
    else
        log "!!! promtool failed: $(tail -3 "$W/promtool.log")"
        record input="$name" system="promtool (Prometheus TSDB)" expected_samples="$NS" \
            notes="FAILED: $(tail -1 "$W/promtool.log" | tr -d '|')"
    fi

    # ------------------------------------------------ VictoriaMetrics
    log "== $name: VictoriaMetrics /api/v1/import/prometheus"
    V="$W/vm"
    PROMTXT="$W/input.prom"
    "${LIB[@]}" om2prom "$IN" "$PROMTXT" >/dev/null || { log "om2prom failed"; continue; }
    if vm_start "$V/data" "$W/vm.log"; then
        t0=$(now)
        code=$(curl -sS -o "$W/vm-import.out" -w '%{http_code}' -X POST -H 'Content-Type: text/plain' \
            -T "$PROMTXT" "$VM_URL/api/v1/import/prometheus")
        curl -sS --fail "$VM_URL/internal/force_flush" >/dev/null
        t1=$(now)
        for m in $("${LIB[@]}" months "$TMIN" "$TMAX"); do
            curl -sS --fail "$VM_URL/internal/force_merge?partition_prefix=$m" >/dev/null
        done
        sleep 1
        "${LIB[@]}" vm-settle "$VM_URL" 3600 >"$W/vm-settle.json"
        t2=$(now)
        VMM=$("${LIB[@]}" vm-metric "$VM_URL" vm_rows_inserted_total vm_rows_added_to_storage_total \
            vm_rows_ignored_total vm_rows_invalid_total vm_too_long_label_values_total vm_parts)
        vm_stop
        rm -f "$PROMTXT"
        VT=$(dub "$V/data")
        VD=$(dub "$V/data/data"); VI=$(dub "$V/data/indexdb"); VC=$(dub "$V/data/cache")
        VNET=$(( VD + VI - VM_EMPTY_DI ))
        # restart read-only-ish to count what it holds (after the size was taken)
        if vm_start "$V/data" "$W/vm.log"; then
            if [ "$QUICK" = 0 ]; then
                CNT=$("${LIB[@]}" vm-count "$VM_URL" "$TMIN" "$TMAX")
            else
                CNT=$("${LIB[@]}" vm-count-query "$VM_URL" "$TMIN" "$TMAX")
            fi
            VCMP=""
            if [ "$CHECK_VALUES" = 1 ]; then
                log "   comparing every value with /api/v1/export"
                CMPJ=$("${LIB[@]}" vm-compare "$VM_URL" "$IN" "$TMIN" "$TMAX")
                VCMP="; values not bit-exact: $(jget changed <<<"$CMPJ") changed, $(jget missing <<<"$CMPJ") missing (e.g. $(python3 -c 'import json,sys; print("; ".join(json.load(sys.stdin)["examples"][:2]))' <<<"$CMPJ"))"
            fi
            vm_stop
        else
            CNT='{"samples": null, "series": null, "method": "restart failed"}'
        fi
        STORED=$(jget samples <<<"$CNT"); VSER=$(jget series <<<"$CNT")
        ign=$(jget vm_rows_ignored_total <<<"$VMM"); inv=$(jget vm_rows_invalid_total <<<"$VMM")
        ign=${ign%.0}; inv=${inv%.0}
        [ "$STORED" = "$NS" ] || log "!!! MISMATCH VictoriaMetrics holds ${STORED:-?} samples, input has $NS (ignored=$ign invalid=$inv)"
        base="HTTP $code; ingest ${NS} rows, merge+settle $(elapsed "$t1" "$t2") s; counted via $(jget method <<<"$CNT"); rows ignored $ign, invalid $inv"
        record input="$name" system="VictoriaMetrics raw" expected_samples="$NS" stored_samples="$STORED" \
            series="$VSER" bytes="$VT" wall_s="$(elapsed "$t0" "$t1")" \
            notes="whole -storageDataPath: data/ $VD + indexdb/ $VI + cache/ $VC + rest; $base"
        record input="$name" system="VictoriaMetrics net" expected_samples="$NS" stored_samples="$STORED" \
            series="$VSER" bytes="$VNET" wall_s="$(elapsed "$t0" "$t1")" \
            notes="data/ + indexdb/ minus the same of an empty database ($VM_EMPTY_DI B); cache/ excluded${VCMP:-}"
        log "   raw $VT bytes (data $VD, indexdb $VI, cache $VC), net $VNET, ${STORED:-?} samples stored"
    else
        record input="$name" system="VictoriaMetrics raw" expected_samples="$NS" notes="FAILED to start"
    fi

    # ------------------------------------------------ vtax
    if [ -z "$VTAX" ]; then
        log "== $name: vtax skipped (no --vtax BIN given)"
        record input="$name" system="vtax" expected_samples="$NS" notes="skipped: no --vtax BIN given"
    elif [ ! -x "$VTAX" ] && ! command -v "$VTAX" >/dev/null; then
        log "== $name: vtax skipped: $VTAX is not an executable"
        record input="$name" system="vtax" expected_samples="$NS" notes="skipped: $VTAX not found / not executable"
    else
        log "== $name: vtax import"
        X="$W/vtax"
        t0=$(now)
        if "$VTAX" import --data-dir "$X" "$IN" >"$W/vtax.log" 2>&1; then
            t1=$(now)
            if [ -d "$X/tables" ]; then
                XB=$(dub "$X/tables"); what="du -sb DATA/tables"
            else
                XB=$(dub "$X"); what="no DATA/tables: du -sb DATA"
            fi
            XT=$(dub "$X")
            # the count vtax import prints ("Imported N samples ..."), if any
            said=$(grep -oiE '[0-9][0-9,_]* samples([^/]|$)' "$W/vtax.log" | head -1 | grep -oE '^[0-9,_]+' | tr -d ',_')
            STORED=""; XSER=""
            # independent count: read every row back with `vtax query TABLE --format json`
            # (one object per line; series = distinct metric+labels). Size was taken above.
            if [ "$QUICK" = 0 ] && read -r QN QS < <(set -o pipefail;
                    "$VTAX" query "$VTAX_TABLE" --data-dir "$X" --since 0 --format json 2>"$W/vtax-query.err" |
                    awk '{ i = index($0, "\"metric\""); j = index($0, ",\"value\""); k = substr($0, i, j - i)
                           if (!(k in s)) { s[k] = 1; ns++ } n++ } END { print n + 0, ns + 0 }') && [ "$QN" != 0 ]; then
                STORED=$QN; XSER=$QS
                notes="$what; counted with vtax query $VTAX_TABLE"
                [ -z "$said" ] || [ "$said" = "$QN" ] || notes="$notes; **vtax import said $said**"
            elif [ -n "$said" ]; then
                notes="$what; count as printed by vtax import (not independently verified)"
                STORED=$said
            else
                notes="$what; sample count not verified (vtax printed none, query unavailable)"
            fi
            [ -z "$STORED" ] || [ "$STORED" = "$NS" ] || log "!!! MISMATCH vtax holds $STORED samples, input has $NS"
            XCMP=()
            if [ "$CHECK_VALUES" = 1 ]; then
                log "   comparing every value with vtax query, bit for bit"
                CMPJ=$("${LIB[@]}" vtax-compare "$VTAX" "$X" "$VTAX_TABLE" "$IN")
                XCMP=(values_changed="$(jget changed <<<"$CMPJ")" values_missing="$(jget missing <<<"$CMPJ")")
                notes="$notes; values not bit-exact: $(jget changed <<<"$CMPJ") changed, $(jget missing <<<"$CMPJ") missing, $(jget extra <<<"$CMPJ") extra"
            fi
            record input="$name" system="vtax" expected_samples="$NS" stored_samples="$STORED" series="$XSER" \
                bytes="$XB" wall_s="$(elapsed "$t0" "$t1")" "${XCMP[@]}" notes="$notes; whole data dir $XT B"
            log "   $XB bytes"
        else
            rc=$?
            log "!!! vtax import failed (rc $rc): $(tail -3 "$W/vtax.log")"
            record input="$name" system="vtax" expected_samples="$NS" \
                notes="skipped: vtax import failed (rc $rc): $(tail -1 "$W/vtax.log" | tr -d '|' | cut -c1-200)"
        fi
    fi
done

# ---------------------------------------------------------------- report
{
    echo "# Size benchmark results"
    echo
    echo "Generated $(date -u +%Y-%m-%dT%H:%M:%SZ) by \`bench/size/run.sh$( [ "$QUICK" = 1 ] && echo ' --quick')$( [ "$CHECK_VALUES" = 1 ] && echo ' --check-values')$( [ -n "$VTAX" ] && echo " --vtax $VTAX") ${INPUTS[*]}\`"
    echo
    echo "- promtool: $("$PROMTOOL" --version 2>&1 | head -1)"
    echo "- VictoriaMetrics: $(dpkg-query -W -f='${Package} ${Version}' victoria-metrics 2>/dev/null || echo "$VMBIN")"
    echo "- vtax: ${VTAX:-not given}"
    echo "- machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(uname -r)"
    echo
    "${LIB[@]}" report "$JSONL"
    echo
    echo "bytes/sample = bytes on disk / samples in input. \"VictoriaMetrics net\" = data/ + indexdb/"
    echo "minus an empty database's; \"raw\" = du -sb of the whole -storageDataPath after shutdown."
    echo "Wall time: promtool = the create-blocks command; VictoriaMetrics = POST + force_flush (merge"
    echo "time in notes); vtax = the import command."
} > "$SCRATCH/results.md"
cat "$SCRATCH/results.md"
cp "$SCRATCH/results.md" "$RESULTS"
log "wrote $RESULTS"
