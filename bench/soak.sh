#!/usr/bin/env bash
# The long-run soak on a GPU machine, from a GPU bundle (`cargo xtask gpu-bundle`):
#
#   bench/soak.sh [SECONDS]          # default 330; logs under $OUT/soak (OUT defaults to ./out)
#
# Runs at the same time, each for SECONDS:
# - the pipeline demo's soak (`pipeline --device cuda --size 256 --iters 2000
#   --streams two --seconds S`): tch -> XLA -> tch with an event wait each way, so every
#   XLA output PyTorch lets go of is released in stream order by the reaper;
# - the Python exchange's soak (`bench/gpu_soak.py S`, the bundled wheel with the
#   machine's torch and JAX): JAX -> PyTorch and PyTorch -> JAX through handoff.ordered
#   on a pool stream, owners dropped while the consumers' kernels are queued.
# Every 10 s it samples each process's GPU memory (nvidia-smi) and resident memory
# (/proc) into soak/memory.csv, then judges: both programs exit 0 (each checks its
# values, 0 pending and 0 leaked after its flush, 0 host syncs) and each process's
# GPU and resident memory is flat after the warm-up (the first fifth): the last sample
# at most max(2 %, 32 MiB) above the first. Exits non-zero on any failure.
set -u
HERE="$(cd "$(dirname "$0")/.." && pwd)"
BUNDLE="$HERE/gpu-bundle"
SECS="${1:-330}"
OUT="${OUT:-$HERE/out}"
LOGS="$OUT/soak"
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="/opt/torch/.venv/lib/python3.12/site-packages/torch/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HANDOFF_PJRT_PLUGIN="${HANDOFF_PJRT_PLUGIN:-/opt/torch/.venv/lib/python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so}"
export HANDOFF_REQUIRE_GPU=1
PY="${PYTHON:-/opt/torch/.venv/bin/python}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; } > "$LOGS/machine.txt"

SITE="$(mktemp -d)"
WHEEL="$(ls "$BUNDLE"/handoff-*.whl | head -n 1)"
"$PY" -m pip install --quiet --no-deps --no-index --target "$SITE" "$WHEEL" > "$LOGS/install.log" 2>&1 \
  || "$PY" -m zipfile -e "$WHEEL" "$SITE"

"$BUNDLE/bin/handoff-examples__pipeline" --device cuda --size 256 --iters 2000 --streams two \
  --seconds "$SECS" > "$LOGS/pipeline_soak.log" 2>&1 &
P_DEMO=$!
PYTHONPATH="$SITE" "$PY" "$HERE/bench/gpu_soak.py" "$SECS" > "$LOGS/python_soak.log" 2>&1 &
P_PY=$!

echo "t_s,process,pid,gpu_mib,rss_kib" > "$LOGS/memory.csv"
t0=$(date +%s)
while kill -0 "$P_DEMO" 2>/dev/null || kill -0 "$P_PY" 2>/dev/null; do
  t=$(( $(date +%s) - t0 ))
  smi="$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null)"
  for entry in "pipeline:$P_DEMO" "python:$P_PY"; do
    name="${entry%%:*}" pid="${entry##*:}"
    kill -0 "$pid" 2>/dev/null || continue
    gpu="$(echo "$smi" | awk -F', *' -v p="$pid" '$1 == p { print $2 }')"
    rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)"
    echo "$t,$name,$pid,${gpu:-},${rss:-}" >> "$LOGS/memory.csv"
  done
  # The whole device too: nvidia-smi may not see the processes' own figures in a container.
  echo "$t,device,0,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1)," >> "$LOGS/memory.csv"
  sleep 10
done
wait "$P_DEMO"; rc_demo=$?
wait "$P_PY"; rc_py=$?
rm -rf "$SITE"

"$PY" - "$LOGS/memory.csv" "$SECS" "$rc_demo" "$rc_py" <<'EOF' | tee "$LOGS/verdict.txt"
import csv, sys
path, secs, rc_demo, rc_py = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = list(csv.DictReader(open(path)))
failures = []
for name, rc in (("pipeline", rc_demo), ("python", rc_py), ("device", 0)):
    if rc != 0:
        failures.append(f"{name} exited {rc}")
    warm = [r for r in rows if r["process"] == name and float(r["t_s"]) >= secs / 5]
    for key, unit in (("gpu_mib", 1.0), ("rss_kib", 1 / 1024)):
        vals = [float(r[key]) * unit for r in warm if r[key].strip()]
        required = key == ("gpu_mib" if name == "device" else "rss_kib")
        if len(vals) < 2:
            if required:
                failures.append(f"{name}: {len(vals)} {key} samples after the warm-up")
            else:
                print(f"{name:8} {key:7}: not reported here (the device total is judged)")
            continue
        first, last, peak = vals[0], vals[-1], max(vals)
        flat = last - first <= max(0.02 * first, 32.0)
        print(f"{name:8} {key:7}: first after warm-up {first:9.1f} MiB, last {last:9.1f} MiB, "
              f"peak {peak:9.1f} MiB, {len(vals)} samples: {'flat' if flat else 'GREW'}")
        if not flat:
            failures.append(f"{name} {key} grew from {first:.1f} to {last:.1f} MiB")
print("soak: " + ("ok" if not failures else "FAILED: " + "; ".join(failures)))
sys.exit(1 if failures else 0)
EOF
rc=$?
grep -E '^soak: (round +[0-9]*[05] |[0-9]+ rounds|after)|^result:' "$LOGS/pipeline_soak.log" | tail -n 8
grep -E '"figure": "soak"|^result:' "$LOGS/python_soak.log"
exit $rc
