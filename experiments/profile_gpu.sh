#!/usr/bin/env bash
# Device-time profiles of ours and MJX side by side (experiments/profile_step.py), each under a
# hard time limit so that the whole set fits one device call (about 5 minutes on an H100).
#   experiments/profile_gpu.sh OUTDIR [PYTHON]
out=$1; py=${2:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
prof() { local limit=$1 name=$2; shift 2; date +%T; timeout "$limit" "$py" experiments/profile_step.py --top 30 "$@" > "$out/$name.txt" 2>&1; tail -n 3 "$out/$name.txt"; }
prof 90 prof_pile_capped_b1_ours --model pile_capped --batch 1 --steps 5
prof 90 prof_pile_capped_b1_mjx --model pile_capped --batch 1 --steps 5 --sim mjx
prof 80 prof_humanoid_b8192_ours --model humanoid --batch 8192 --steps 10
prof 80 prof_humanoid_b8192_mjx --model humanoid --batch 8192 --steps 10 --sim mjx
date +%T
