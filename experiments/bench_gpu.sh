#!/usr/bin/env bash
# The GPU benchmark session of experiments/results/bench_gpu_h100.md: the pile (capped and not) and
# the humanoid forward (one and four in a scene), and the capped pile's rollout gradient, side by side with MJX, each step
# under a hard time limit so that the whole session fits one device call (about 5 minutes).
#   experiments/bench_gpu.sh OUTDIR [PYTHON]
# On a machine without libEGL nothing sets MUJOCO_GL (see jaxsim_ncp/__init__.py).
out=$1; py=${2:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
run() { local limit=$1 name=$2; shift 2; date +%T; timeout "$limit" "$py" "$@" > "$out/$name.txt" 2>&1; }
run 100 fwd_pile_capped experiments/bench_contact.py --models pile_capped --batch 1 256 --steps 5 --budget 10 --max-mem-gb 60
run 60 fwd_humanoid experiments/bench_contact.py --models humanoid --batch 8192 --steps 100 --budget 10 --max-mem-gb 60
run 90 fwd_humanoids4 experiments/bench_contact.py --models humanoids4 --batch 1 4096 --steps 20 --budget 10 --max-mem-gb 60
run 90 fwd_pile experiments/bench_contact.py --models pile --batch 1 32 --steps 5 --budget 10 --max-mem-gb 60
run 80 grad_pile_capped_b64 experiments/bench_grad.py --models pile_capped --configs implicit1 mjx --pile-steps 5 --batch 64 \
  --pile-budget 10 --repeats 3 --fd-models --max-mem-gb 60
date +%T
