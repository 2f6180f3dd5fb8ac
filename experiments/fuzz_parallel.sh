#!/usr/bin/env bash
# The long fuzz study as parallel processes on one accelerator: each SEED:SCENES runs
# `fuzz.py --seed SEED --scenes SCENES --group SCENES` (one random structure, one compile, all its
# scenes in one vmapped program), and the counts of all processes are summed at the end.
# SEED:SCENES:F passes --mesh-fraction F (0 replays seeds drawn before that option), and
# SEED:SCENES:F:P passes --planar-fraction P too (0 replays runs made before that option; F may be empty).
# GROUP=N (environment) splits each process's scenes into groups of N new scenes of its one structure
# (`--one-structure`: still one compile); a process stopped by the time limit then still counts the
# groups it finished.
#   experiments/fuzz_parallel.sh LOGDIR STEPS TIMEOUT_S SEED:SCENES[:F[:P]] [SEED:SCENES[:F[:P]] ...]
# Used for experiments/results/fuzz_h100.md; on a GPU set XLA_PYTHON_CLIENT_PREALLOCATE=false.
# PYTHON: the interpreter (default python3; here .venv/bin/python).
set -u
python=${PYTHON:-python3}
logdir=$1 steps=$2 limit=$3
shift 3
mkdir -p "$logdir"
here=$(dirname "$0")
for spec in "$@"; do
  IFS=: read -r seed scenes mesh planar <<< "$spec"
  timeout "$limit" "$python" "$here/fuzz.py" --seed "$seed" --scenes "$scenes" --group "${GROUP:-$scenes}" --steps "$steps" \
    ${GROUP:+--one-structure} ${mesh:+--mesh-fraction "$mesh"} ${planar:+--planar-fraction "$planar"} > "$logdir/seed$seed.log" 2>&1 &
done
wait
"$python" - "$logdir" <<'PY'
import ast, collections, pathlib, re, sys
total, missing = collections.Counter(), []
for log in sorted(pathlib.Path(sys.argv[1]).glob("seed*.log")):
    text = log.read_text()
    found = re.search(r"^TOTAL (.*)$", text, re.M)
    if found is None:  # stopped by the limit: count the groups it finished
        missing.append(log.stem)
        print(log.stem, "did not finish:", text.strip().splitlines()[-1:] if text.strip() else "no output")
        found = re.findall(r"^\d+/\d+ scenes, \d+ s: (.*)$", text, re.M)
        if not found:
            continue
        counts = ast.literal_eval(found[-1])
    else:
        counts = ast.literal_eval(found.group(1))
    total.update(counts)
    print(log.stem, counts)
    for line in text.splitlines():
        if "FAIL" in line:
            print("  ", line)
print("ALL", dict(total), "unfinished (finished groups counted):", missing)
PY
