"""A/B timing of two commits in one process: the humanoid's rollouts and gradient, calls interleaved.

On a shared 2-core machine the same benchmark run twice, minutes apart, can differ by 30% (MJX's
humanoid gradient on this machine: 0.068 to 0.097 s in four runs of `bench_grad.py` within 20
minutes), more than most changes are worth. Here both versions of the package are imported side by
side (each commit's `jaxsim_ncp` extracted with `git archive` under another name), every workload is
compiled for both, and their calls alternate, so both see the same machine; the ratio of their
fastest fifth of calls is what to read.

Workloads, built by the benchmarks' own code for the MJX test humanoid (float32): ``fwdB`` =
`bench_contact.batched_rollout` over B worlds (T = 100 for B < 64, else 20); ``h4fwdB`` = the same for
the four humanoids (T = 20); ``grad`` =
`bench_grad.build`'s configuration (e), the 100-step implicit gradient at MJX's settings; ``gradB`` =
the same over B worlds (T = 20 for B >= 16); ``gradcK`` = ``grad`` with `rollout(checkpoint=K)`;
``ncpB`` = ``fwdB`` with the NCP solver (T = 20, or 5 for B >= 64). Each line also gives XLA's
temporary memory of the compiled program.

    .venv/bin/python experiments/bench_ab.py HEAD~1 HEAD
    .venv/bin/python experiments/bench_ab.py main WORKTREE --work fwd1,fwd256,grad --repeats 60

WORKTREE stands for the files of this checkout as they are (uncommitted changes included).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contact import batched_rollout  # noqa: E402
from bench_grad import build, solver_settings  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def extract(ref: str, name: str, into: pathlib.Path) -> str:
    """The package at `ref` (or the working tree for WORKTREE) as the importable package `name`."""
    target = into / name
    if ref == "WORKTREE":
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "jaxsim_ncp"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
        for f in files:
            dest = target / pathlib.Path(f).relative_to("jaxsim_ncp")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((ROOT / f).read_bytes())
    else:
        archive = subprocess.run(["git", "archive", ref, "jaxsim_ncp"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
        (into / "jaxsim_ncp").rename(target)
    for path in target.rglob("*.py"):  # the package's absolute imports of itself
        path.write_text(re.sub(r"\bjaxsim_ncp\b", name, path.read_text()))
    return name


def workloads(pkg: str, names: list[str]) -> dict:
    """{workload: (function, arguments)} with `pkg` as the `jaxsim_ncp` the builders import."""
    sys.modules["jaxsim_ncp"] = importlib.import_module(pkg)
    out = {}
    for w in names:
        if w.startswith("fwd"):
            batch = int(w[3:])
            out[w] = batched_rollout("humanoid", "ours", batch, 100 if batch < 64 else 20, seed=0)
        elif w.startswith("h4fwd"):  # the four colliding humanoids
            out[w] = batched_rollout("humanoids4", "ours", int(w[5:]), 20, seed=0)
        elif w.startswith("ncp"):
            batch = int(w[3:])
            out[w] = batched_rollout("humanoid", "ours", batch, 20 if batch < 64 else 5, seed=0, options=dict(solver="ncp"))
        elif w.startswith("grad"):  # gradB, or gradcK: the 100-step gradient with rollout(checkpoint=K)
            batch, checkpoint = (1, int(w[5:])) if w.startswith("gradc") else (int(w[4:] or 1), 0)
            fn, args = build("humanoid", "implicit1", solver_settings(None, "humanoid", full=False), 100 if batch < 16 else 20,
                             batch, 0, checkpoint)
            out[w] = (jax.jit(fn), args)
        else:
            raise ValueError(f"unknown workload {w!r} (fwdB, h4fwdB, ncpB, grad, gradB or gradcK)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs=2, help="two git refs (or WORKTREE): A, then B")
    parser.add_argument("--work", default="fwd1,fwd256,grad", help="comma-separated: fwdB (B worlds), h4fwdB, ncpB, grad, gradB, gradcK")
    parser.add_argument("--repeats", type=int, default=60, help="timed calls per version and workload")
    args = parser.parse_args()
    work = args.work.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        pkgs = [extract(ref, f"jaxsim_ncp_ab{i}", pathlib.Path(tmp)) for i, ref in enumerate(args.refs)]
        built = [workloads(p, work) for p in pkgs]
        print(f"A = {args.refs[0]}, B = {args.refs[1]}; ms per call: min / mean of the fastest fifth / median")
        for w in work:
            compiled, compile_s, temp_mb = [], [], []
            for b in built:
                fn, call_args = b[w]
                t0 = time.perf_counter()
                c = fn.lower(*call_args).compile()
                compile_s.append(time.perf_counter() - t0)
                mem = c.memory_analysis()
                temp_mb.append(float("nan") if mem is None else mem.temp_size_in_bytes / 1e6)
                jax.block_until_ready(c(*call_args))
                compiled.append((c, call_args))
            times = [[], []]
            for _ in range(args.repeats):
                for k, (c, call_args) in enumerate(compiled):
                    t0 = time.perf_counter()
                    jax.block_until_ready(c(*call_args))
                    times[k].append(time.perf_counter() - t0)
            fifth = [np.mean(np.sort(t)[: max(1, args.repeats // 5)]) * 1e3 for t in times]
            cols = [f"{'AB'[k]} {np.min(t) * 1e3:8.2f} / {fifth[k]:8.2f} / {np.median(t) * 1e3:8.2f} (compile {compile_s[k]:4.1f} s, temp {temp_mb[k]:.1f} MB)"
                    for k, t in enumerate(times)]
            print(f"{w:8s} {'   '.join(cols)}   B/A {fifth[1] / fifth[0]:.3f}", flush=True)


if __name__ == "__main__":
    main()
