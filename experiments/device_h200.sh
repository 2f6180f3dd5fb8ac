#!/usr/bin/env bash
# The device session of 2026-12-04 (one H200, 15 minutes of device time in all): two calls on one
# machine start, each under a hard time limit.
#   experiments/device_h200.sh fuzz OUTDIR [PYTHON]   # ~300 s: the GPU-only NaN gradients of seed 3010
#                                                      # located step by step (fuzz_locate.py), and two new
#                                                      # structures' counts (fuzz_parallel.sh, groups of 400)
#   experiments/device_h200.sh bench OUTDIR [PYTHON]  # ~270 s: pile and humanoid forward, humanoid gradient, vs MJX
# The device session of 2026-12-04 (later), one call:
#   experiments/device_h200.sh fuzz4 OUTDIR [PYTHON]  # ~520 s: seed 3010's 4000 scenes replayed (the GPU-only NaN
#                                                      # groups, after the capsule-box quotient fix) beside three new
#                                                      # structures (Newton implicitfast, NCP, Newton pyramidal)
# For the next device session (prepared 2026-12-04, not yet run), one call:
#   experiments/device_h200.sh fuzz5 OUTDIR [PYTHON]  # ~530 s: seed 9002's NaN group again (its first group of 400,
#                                                      # after the subnormal-safe normalize) beside three structures
#                                                      # that compile fast (CPU: 22-35 s), toward 10^4 scenes x 500 steps
# Results: experiments/results/fuzz_h100.md and bench_gpu_h100.md (the H200 sections).
mode=$1 out=$2; py=${3:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
"$py" -c "import jax, mujoco, jaxsim_ncp; from mujoco import mjx; print(jax.__version__, mujoco.__version__, jax.devices())" || exit 1
here=$(dirname "$0")
if [ "$mode" = fuzz ]; then
  export XLA_FLAGS=--xla_gpu_autotune_level=0  # as the H100 runs that found the NaNs
  locate() { timeout 290 "$py" "$here/fuzz_locate.py" --seed 3010 --scenes 400 --make-group-seed "$1" --only "$2" --steps 500 \
    --save "$out" > "$out/locate_$2.txt" 2>&1; }
  locate 1384001605 49 &
  locate 2090122131 108 &
  GROUP=400 PYTHON=$py "$here/fuzz_parallel.sh" "$out/fuzz" 500 280 7011:4000 7016:4000 > "$out/fuzz_counts.txt" 2>&1 &
  wait
  tail -n 30 "$out"/locate_*.txt "$out/fuzz_counts.txt"
  tar czf "$out/fuzz_logs.tgz" -C "$out" fuzz && rm -rf "$out/fuzz"
elif [ "$mode" = fuzz4 ] || [ "$mode" = fuzz5 ]; then
  export XLA_FLAGS=--xla_gpu_autotune_level=0
  if [ "$mode" = fuzz4 ]; then limit=500 specs="3010:4000::0 9002:4000 9022:4000 9024:4000"
  else limit=520 specs="9002:4000 9011:4000 9020:4000 9021:4000"; fi
  # shellcheck disable=SC2086
  GROUP=400 PYTHON=$py "$here/fuzz_parallel.sh" "$out/fuzz" 500 $limit $specs > "$out/fuzz_counts.txt" 2>&1
  cat "$out/fuzz_counts.txt"; grep "scenes, " "$out"/fuzz/*.log | tail -n 40
  tar czf "$out/fuzz_logs.tgz" -C "$out" fuzz && rm -rf "$out/fuzz"
elif [ "$mode" = bench ]; then
  run() { local limit=$1 name=$2; shift 2; date +%T; timeout "$limit" "$py" "$@" > "$out/$name.txt" 2>&1; tail -n 6 "$out/$name.txt"; }
  run 75 fwd_pile_capped "$here/bench_contact.py" --models pile_capped --batch 1 64 --steps 5 --budget 4 --max-mem-gb 60
  run 90 fwd_humanoid "$here/bench_contact.py" --models humanoid --batch 8192 32768 --steps 100 --budget 6 --max-mem-gb 100
  run 110 grad_humanoid "$here/bench_grad.py" --models humanoid --configs implicit1 mjx --steps 100 --batch 1 --budget 8 \
    --repeats 3 --fd-models --max-mem-gb 60 --compile-allowance 90
  date +%T
fi
