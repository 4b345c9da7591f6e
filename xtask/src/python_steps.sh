PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python ]; then PY=/opt/torch/.venv/bin/python; fi
# The wheel users install; the one with the test seams (cargo feature test-hooks).
WHEEL="$(ls "$HERE"/handoff-*.whl 2>/dev/null | head -n 1)"
HOOKS_WHEEL="$(ls "$HERE"/hooks/handoff-*.whl 2>/dev/null | head -n 1)"
COMPARED="$(ls "$HERE"/jax2torch-*.whl "$HERE"/torch_jax_interop-*.whl "$HERE"/chex-*.whl \
  "$HERE"/absl_py-*.whl "$HERE"/toolz-*.whl 2>/dev/null)"

# install <dir> <wheel>...: the wheels into <dir> with the machine's Python.
install() {
  local dir="$1" w; shift
  for w in "$@"; do
    "$PY" -m pip install --quiet --no-deps --no-index --target "$dir" "$w" || "$PY" -m zipfile -e "$w" "$dir"
  done
}

# py_step <name> <script in the bundle> <limit s> [args...]: with the shipped wheel.
py_step() { step_with "$WHEEL" "$@"; }
# hooks_step <name> <script in the bundle> <limit s> [args...]: with the hooks wheel (a
# script that switches routes in-process with the test seam _handoff._set_route).
hooks_step() { step_with "$HOOKS_WHEEL" "$@"; }

# step_with <handoff wheel> <name> <script in the bundle> <limit s> [args...]
step_with() {
  local wheel="$1" name="$2" script="$HERE/$3" limit="$4" rc
  shift 4
  if [ -n "${ONLY:-}" ] && [[ "$name" != *"$ONLY"* ]]; then return; fi
  echo "== $name $*"
  local log="$LOGS/$name.log"
  if [ -z "$wheel" ] || [ ! -f "$script" ]; then
    echo "SKIP $name: no handoff wheel for it or no $(basename "$script") in $HERE" >> "$SUMMARY"; return
  fi
  echo "   wheel: ${wheel#"$HERE"/}"
  local tmp; tmp="$(mktemp -d)"
  { echo "wheel: ${wheel#"$HERE"/}"; install "$tmp/site" "$wheel" $COMPARED; } > "$log" 2>&1
  PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" "$PY" "$script" "$@" >> "$log" 2>&1; rc=$?
  grep -E '^\{|^\||^handoff routes:|SKIPPED:|^note:|CHECK FAILED' "$log" | cut -c1-400 | sed 's/^/   /'
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1)); echo "   FAILED (exit $rc)"; tail -n 30 "$log" | sed 's/^/   | /'
    echo "FAIL $name exit=$rc" >> "$SUMMARY"
  else
    echo "ok   $name" >> "$SUMMARY"
  fi
  rm -rf "$tmp"
}

# The GPU checks (JSON lines; exit 1 on a failed check): ordering and lifetime per
# route (each route forced with _set_route: the hooks wheel); torch_function on CUDA
# (float64 gradcheck, None gradients, strides, misaligned views); handoff.ordered
# consumed by cuda.core.
hooks_step python_handoff python_gpu_h200.py 300
py_step python_gpu_training python_gpu_training.py 200
py_step python_cuda_core cuda_core_consumer.py 60
# PyTorch inside jax.jit (handoff.jax_function): gradients against PyTorch's, 0 host
# syncs in the callback, the GPU still busy after a step, time against the peers.
py_step python_jax_function jax_function_checks.py 240
# JAX work inside torch.cuda.graph: the crossings and torch_function captured and
# replayed against eager, and a training step captured (its time beside a PyTorch layer's).
py_step python_graph_crossings gpu_graph_checks.py 90 --probe crossings
py_step python_graph_ordered gpu_graph_checks.py 90 --probe ordered
py_step python_graph_torch_function gpu_graph_checks.py 90 --probe torch_function
# make_graphed_callables three ways; JAX arrays a replay overwrites (docs/RELIABILITY.md),
# with capture clients (the checks switch them on) and without (--control, the default).
# JAX's default flags throughout.
py_step python_graph_callables gpu_graph_checks.py 90 --probe graphed_callables
py_step python_graph_callables_global gpu_graph_checks.py 90 --probe graphed_callables --mode global
py_step python_graph_callables_control gpu_graph_checks.py 90 --probe graphed_callables --mode global --control
py_step python_graph_callables_prewarm gpu_graph_checks.py 90 --probe graphed_callables --mode global --prewarm 2
py_step python_graph_callables_sequential gpu_graph_checks.py 90 --probe graphed_callables --phases sequential
py_step python_graph_callables_pure gpu_graph_checks.py 90 --probe graphed_callables --pure
py_step python_graph_scratch gpu_graph_checks.py 90 --probe scratch --mode global
py_step python_graph_scratch_control gpu_graph_checks.py 90 --probe scratch --mode global --control
# Captured JAX work on a PJRT client of its own against JAX's: arrays a replay overwrites,
# make_graphed_callables beside an eager copy, the client's cost; XLA's command buffers
# on (the capture fails) and off per executable, with no XLA_FLAGS.
for probe in scratch graphed cost; do for client in shared private; do
  XLA_FLAGS= py_step python_graph_memory_${probe}_$client graph_memory_spike.py 60 --probe $probe --client $client
done; done
for cb in on off; do
  XLA_FLAGS= py_step python_graph_memory_command_buffers_$cb graph_memory_spike.py 60 --probe cost --client shared --depth 8 --command-buffers $cb
done
py_step python_graph_train gpu_graph_checks.py 120 --probe train --prune
# The same in global mode, torch.cuda.graph's default.
py_step python_graph_ordered_global gpu_graph_checks.py 90 --probe ordered --mode global
py_step python_graph_train_global gpu_graph_checks.py 120 --probe train --mode global --prune
# A capture that fails after a crossing, in global mode: the process goes on and exits
# cleanly; the same step without handoff beside it (a crash in both is not handoff's).
py_step python_graph_failed_global gpu_graph_checks.py 90 --probe failed_capture --mode global
py_step python_graph_failed_global_pure gpu_graph_checks.py 90 --probe failed_capture --mode global --pure
# The host cost of each crossing both ways (256x256 f32, median of 10,000 calls in
# turns, two rounds; each route forced with _set_route: the hooks wheel); where the JAX
# layer's dispatch time goes; a host-bound step under cProfile; one forward + backward of
# the JAX layer through torch_function against JAX's own dispatch (and its memory).
hooks_step python_host_cost python_host_cost.py 300
py_step python_dispatch_cost dispatch_cost.py 120
py_step python_crossing_parts crossing_parts.py 90
py_step python_layer_profile layer_profile.py 120 cuda 300
py_step python_profile_step profile_step.py 120 --steps 1500
py_step layer_cost layer_cost.py 180 --memory
# Training through a JAX layer: pure PyTorch, jax2torch, torch-jax-interop,
# handoff.torch_function and the JAX layer alone, an MLP and an attention block.
py_step train_three_way train_three_way.py 540
# The host-bound steps of PyTorch and handoff, each also captured into one CUDA graph.
py_step train_graph train_three_way.py 300 --bound host --variants torch handoff --graph --trials 0
# Both models under torch.compile (default mode; then reduce-overhead, CUDA graphs split
# around handoff's operators, with 100 steps against eager).
py_step train_compiled train_three_way.py 600 \
  --variants torch handoff torch_compiled handoff_compiled --trials 0
py_step train_reduce_overhead train_three_way.py 600 --reduce-overhead-check --compile-mode reduce-overhead \
  --variants torch_compiled handoff_compiled --trials 0

PREV="$(ls "$HERE"/prev/handoff-*.whl 2>/dev/null | head -n 1)"
if [ -n "$PREV" ] && { [ -z "${ONLY:-}" ] || [[ "wheel_ab" == *"$ONLY"* ]]; }; then
  echo "== wheel_ab (${PREV#"$HERE"/} against this bundle's wheel)"
  LOG="$LOGS/wheel_ab.log"
  rm -f "$LOGS"/wheel_ab_*.log
  TMP_PY="$(mktemp -d)"
  { install "$TMP_PY/new" "$WHEEL"; install "$TMP_PY/prev" "$PREV"; } > "$LOG" 2>&1
  ab_failed=""
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for which in prev new; do
      L="$LOGS/wheel_ab_${which}_$round.log"
      PYTHONPATH="$TMP_PY/$which${PYTHONPATH:+:$PYTHONPATH}" timeout 150 "$PY" "$HERE/train_three_way.py" \
        --label "$which" --bound gpu --variants torch handoff --trials 0 --warmup 3 --steps 10 --reps 3 \
        > "$L" 2>&1 || ab_failed="$ab_failed $which-$round=$?"
      grep -E '"figure": "env"|CHECK FAILED|SKIPPED:' "$L" | cut -c1-400 | sed "s/^/   $which $round: /"
    done
  done
  timeout 60 "$PY" "$HERE/train_three_way.py" --ab "$LOGS"/wheel_ab_*.log --ab-base prev >> "$LOG" 2>&1; rc=$?
  grep -E '^\{|^\||^ab:' "$LOG" | sed 's/^/   /'
  if [ -n "$ab_failed" ] || [ "$rc" -ne 0 ]; then
    failed=$((failed + 1)); echo "   FAILED (runs:${ab_failed:- ok}; report exit $rc)"
    echo "FAIL wheel_ab runs:${ab_failed:- ok} report=$rc" >> "$SUMMARY"
  else
    echo "ok   wheel_ab" >> "$SUMMARY"
  fi
  rm -rf "$TMP_PY"
fi
