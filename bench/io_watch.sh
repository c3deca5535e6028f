#!/usr/bin/env bash
# Samples what could stall a GPU call's checkpoint writes, every IO_WATCH_S seconds (default 5), one line
# each: time, the kernel's dirty and writeback memory (kB, /proc/meminfo), the I/O pressure stall
# averages (/proc/pressure/io, "some" and "full" avg10 in %, "-" where the kernel has none), the GPU's
# utilisation (%). For the ~30/90/100 s checkpoint saves seen on warm H200 machines (docs/lra.md, "Slow
# checkpoint saves"): a stall the disk causes shows as high writeback and I/O pressure at that time.
#
#   bash bench/io_watch.sh LOG [PID] &    # until killed, or until process PID (e.g. $$) has ended
#   bash bench/io_watch.sh --summary LOG  # the samples where I/O pressure or writeback was high
set -u
if [ "${1:-}" = "--summary" ]; then
    log=${2:?usage: io_watch.sh --summary LOG}
    [ -s "$log" ] || { echo "io_watch: no samples in $log"; exit 0; }
    awk 'NR > 1 { n++; if ($3 > mw) mw = $3; if ($4 != "-" && $5 > mf) mf = $5
                  if (($4 != "-" && $5 >= 10) || $3 >= 102400) hot = hot "\n  " $0 }
         END { printf "io_watch: %d samples, max writeback %d kB, max I/O pressure full avg10 %.1f%%\n", n, mw, mf
               if (hot != "") printf "io_watch: samples with full avg10 >= 10%% or writeback >= 100 MiB:%s\n", hot }' "$log"
    exit 0
fi
log=${1:?usage: io_watch.sh LOG [PID]}
parent=${2:-}  # (a sampler left behind by a killed caller would keep the call's machine busy: it stops)
every=${IO_WATCH_S:-5}
echo "time dirty_kB writeback_kB io_some_avg10 io_full_avg10 gpu_util" > "$log"
while [ -z "$parent" ] || kill -0 "$parent" 2>/dev/null; do
    mem=$(awk '/^Dirty:/ {d = $2} /^Writeback:/ {w = $2} END {print d + 0, w + 0}' /proc/meminfo)
    if [ -r /proc/pressure/io ]; then
        psi=$(awk '{for (i = 2; i <= NF; i++) if ($i ~ /^avg10=/) v[$1] = substr($i, 7)}
                   END {print (v["some"] == "" ? "-" : v["some"]), (v["full"] == "" ? "-" : v["full"])}' /proc/pressure/io)
    else
        psi="- -"
    fi
    gpu=$(timeout 5 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null | head -1)
    echo "$(date +%T) $mem $psi ${gpu:--}" >> "$log"
    sleep "$every"
done
