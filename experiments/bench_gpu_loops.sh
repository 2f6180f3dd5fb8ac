#!/usr/bin/env bash
# GPU session of 2026-11-26 (late) in experiments/results/bench_gpu_h100.md: the Newton solver's
# while_loops against full-count scans (newton_early_exit=True/False), the capped pile (B=1, 64)
# and the humanoid (B=8192) side by side with MJX, the humanoid's 100-step gradient against MJX's
# reverse mode, and a device profile of the pile with scans; each under a hard time limit so the
# whole set fits one device call (about 8 minutes on an H100).
#   experiments/bench_gpu_loops.sh OUTDIR [PYTHON]
out=$1; py=${2:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
run() { local limit=$1 name=$2; shift 2; date +%T; timeout "$limit" "$py" "$@" > "$out/$name.txt" 2>&1; tail -n 4 "$out/$name.txt"; }
fixed='{"newton_early_exit": false}'
run 120 pile_capped experiments/bench_contact.py --models pile_capped --batch 1 --steps 5 --budget 5 --max-mem-gb 60
run 70 pile_capped_fixed experiments/bench_contact.py --models pile_capped --batch 1 --steps 5 --budget 5 --max-mem-gb 60 --sims ours --options "$fixed"
run 130 humanoid experiments/bench_contact.py --models humanoid --batch 8192 --steps 100 --budget 8 --max-mem-gb 60
run 70 humanoid_fixed experiments/bench_contact.py --models humanoid --batch 8192 --steps 100 --budget 8 --max-mem-gb 60 --sims ours --options "$fixed"
run 150 grad_humanoid experiments/bench_grad.py --models humanoid --configs fwd1 implicit1 mjx --steps 100 --batch 1 --budget 10 \
  --repeats 3 --fd-models --max-mem-gb 60 --compile-allowance 100
run 150 pile_capped_b64 experiments/bench_contact.py --models pile_capped --batch 64 --steps 5 --budget 5 --max-mem-gb 60
run 70 pile_capped_b64_fixed experiments/bench_contact.py --models pile_capped --batch 64 --steps 5 --budget 5 --max-mem-gb 60 --sims ours --options "$fixed"
run 70 prof_pile_fixed experiments/profile_step.py --top 30 --model pile_capped --batch 1 --steps 5 --options "$fixed"
date +%T
