"""One entry point for the speed, memory and compile-time benchmarks against MJX (`jaxsim-ncp bench`).

    .venv/bin/python experiments/bench.py                       # cube + humanoid: forward vs batch, gradient vs horizon
    .venv/bin/python experiments/bench.py --models humanoid --batch --horizons 10 30 100 300 1000
    .venv/bin/python experiments/bench.py --models pile humanoids4 --batch 1 64 --steps 20 --horizons 10 100

Models: bundled names (cube, humanoid, ...), MJCF paths, and two generated scenes
(`workflows.BENCH_SCENES`): "pile", 100 free cubes stacked 5x5x4, and "humanoids4", mujoco-mjx's
test scene of four humanoids colliding with each other and the floor.

Forward part: steps/s and compile time of a jitted, vmapped rollout vs batch. Gradient part:
seconds, compile time and XLA's peak-memory estimate of a rollout gradient vs horizon, for
`rollout(checkpoint=False | True | "sqrt")` and MJX's reverse mode (`workflows.bench_gradient`).
Both run side by side with MJX in one process and write CSV and PNG into a run folder under
experiments/results/. The solver-specific studies are `bench_contact.py` (the 100-cube pile),
`bench_grad.py` (gradient settings), `bench_ncp.py` (the NCP) and `bench_smooth.py`.
"""

import pathlib
import sys

from jaxsim_ncp import cli

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--out" not in argv:
        argv += ["--out", str(pathlib.Path(__file__).parent / "results")]
    cli.main(["bench", *argv], cpu_cores=True)
