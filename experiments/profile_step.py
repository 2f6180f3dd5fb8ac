"""Where a batched rollout spends its device time: a `jax.profiler` trace of a compiled rollout,
summarised per kernel and per source line.

    python experiments/profile_step.py --model pile_capped --batch 1 --steps 5 [--sim mjx] [--out DIR]

The trace's device events (GPU kernels and copies, or XLA ops on the CPU) are matched to the
optimized HLO's instruction names, whose metadata gives the JAX source line, and summed. It also
prints how busy the device was over the timed calls: a low share means the program is bound by
kernel launches and host round trips (e.g. a `while_loop` condition read back per iteration), not
by arithmetic. Models and inputs are those of `bench_contact.py`.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from bench_contact import MODELS, batched_rollout  # noqa: E402

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_TABLE_ROW = re.compile(r"^(\d+) (.*)$")


def _tables(hlo_text: str) -> dict[str, dict[int, str]]:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables printed after the HLO."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
        elif current is not None and (m := _TABLE_ROW.match(line)):
            current[int(m.group(1))] = m.group(2)
        elif line.strip():
            current = None
    return tables


def hlo_sources(hlo_text: str) -> dict[str, tuple[str, str]]:
    """Instruction (and kernel) name -> (innermost source "file:line function", JAX op_name)."""
    t = _tables(hlo_text)
    ints = lambda row: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row)}  # noqa: E731

    def frame(fid: int) -> str:
        loc = ints(t.get("StackFrames", {}).get(fid, ""))
        fl = ints(t.get("FileLocations", {}).get(loc.get("file_location_id", -1), ""))
        if not fl:
            return "?"
        file = t["FileNames"].get(fl["file_name_id"], "?").strip('"')
        func = t["FunctionNames"].get(fl["function_name_id"], "?").strip('"')
        return f"{pathlib.Path(file).name}:{fl.get('line', '?')} {func}"

    out = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        op = _OP_NAME.search(m.group(2))
        fid = _FRAME_ID.search(m.group(2))
        val = (frame(int(fid.group(1))) if fid else "?", op.group(1) if op else "?")
        out[m.group(1)] = val
        out.setdefault(m.group(1).replace(".", "_"), val)  # GPU kernels are named after their fusion
    return out


def load_trace(log_dir: pathlib.Path) -> list[dict]:
    path = max(log_dir.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def summarise(events: list[dict], sources: dict[str, tuple[str, str]], wall_us: float, calls: int,
              steps: int, top: int) -> None:
    pname = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    device_pids = {p for p, n in pname.items() if "/device:" in n.lower() and "cpu" not in n.lower()}
    if not device_pids:  # the CPU backend: XLA ops run on host threads of the /host:CPU process
        device_pids = {p for p, n in pname.items() if "host" in n.lower() or "cpu" in n.lower()}
    dev = [e for e in events if e.get("ph") == "X" and e.get("pid") in device_pids
           and not str(e.get("name", "")).startswith(("$", "ThunkExecutor", "PjitFunction"))]
    print(f"device processes: {sorted(pname[p] for p in device_pids)}")
    busy = sum(float(e.get("dur", 0)) for e in dev)
    n = len(dev)
    per_step = max(calls * steps, 1)
    print(f"{calls} calls x {steps} steps: wall {wall_us / 1e3:.2f} ms, device events {n} "
          f"({n / per_step:.0f} per step), summed device time {busy / 1e3:.2f} ms "
          f"({100 * busy / max(wall_us, 1):.0f}% of wall)")

    def table(title: str, key) -> None:
        acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for e in dev:
            k = key(e)
            acc[k][0] += float(e.get("dur", 0))
            acc[k][1] += 1
        print(f"\n{title} (top {top} of {len(acc)} by time)")
        print(f"{'time ms':>9} {'share':>6} {'count':>8} {'per step':>8}  name")
        for k, (t, c) in sorted(acc.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"{t / 1e3:9.3f} {100 * t / max(busy, 1):5.1f}% {c:8d} {c / per_step:8.1f}  {k[:150]}")

    def hlo_name(e):
        args = e.get("args", {})
        return args.get("hlo_op") or args.get("long_name", "").split(" ")[0].lstrip("%") or e.get("name", "?")

    def src(e):
        name = hlo_name(e)
        return sources.get(name, sources.get(e.get("name", ""), ("?", "?")))

    table("by kernel / op", lambda e: e.get("name", "?"))
    table("by JAX source line", lambda e: src(e)[0])
    table("by JAX op_name (last 4 scopes)", lambda e: "/".join(src(e)[1].split("/")[-4:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="pile_capped")
    parser.add_argument("--sim", choices=["ours", "mjx"], default="ours")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2, help="timed calls inside the trace")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--options", default="{}", help="ours: jsn.from_mujoco overrides as JSON (bench_contact --options)")
    parser.add_argument("--out", default=None, help="keep the trace and the optimized HLO here")
    args = parser.parse_args()

    import jax

    fn, fargs = batched_rollout(args.model, args.sim, args.batch, args.steps, seed=0, options=json.loads(args.options))
    t0 = time.perf_counter()
    compiled = fn.lower(*fargs).compile()
    print(f"{args.sim} {args.model} B={args.batch} T={args.steps} on {jax.devices()[0].device_kind}: "
          f"compile {time.perf_counter() - t0:.1f} s")
    hlo = compiled.as_text()
    jax.block_until_ready(compiled(*fargs))
    log_dir = pathlib.Path(args.out or tempfile.mkdtemp(prefix="jsn_prof_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"{args.sim}_{args.model}_b{args.batch}.hlo.txt").write_text(hlo)
    with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            jax.block_until_ready(compiled(*fargs))
        wall_us = (time.perf_counter() - t0) * 1e6
    summarise(load_trace(log_dir), hlo_sources(hlo), wall_us, args.calls, args.steps, args.top)


if __name__ == "__main__":
    main()
