"""Where the test suite's time goes: per test, seconds of tracing, lowering and XLA compilation.

A pytest plugin (JAX's monitoring events, summed over each test's call phase; module
fixtures' compiles are not counted) and its summary. Each worker appends JSON lines to
``$COMPILE_PROFILE_DIR/<pid>.jsonl``:

    COMPILE_PROFILE_DIR=/tmp/prof PYTHONPATH=experiments \\
        .venv/bin/python -m pytest -n 2 -q -p compile_profile
    .venv/bin/python experiments/compile_profile.py /tmp/prof      # per file, slowest tests

Measured with it (2 cores, -n 2, 253 tests): tracing 600 s, lowering 185 s and XLA
compilation 2010 s of 3160 s in test calls before jitting forward/step and turning XLA's
MLIR fusion emitters off in the tests; 387 s and 893 s of 1613 s after.
2026-12-04 (347 tests, 856 s wall): tracing 375 s, lowering 150 s, compilation 913 s of 1671 s; the
6091 traces, 6892 lowerings and 6778 compilations under 0.25 s each (op-by-op dispatch, small
helpers) sum to 14, 53 and 80 s: the time is in the ~280 large programs, not in eager dispatch.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
import time

import pytest

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_seconds: collections.Counter = collections.Counter()
SMALL_SECONDS = 0.25


def pytest_configure(config):
    import jax.monitoring

    def listener(event, duration, **_):
        if event in _EVENTS:
            kind = _EVENTS[event]
            _seconds[kind] += duration
            _seconds[f"n_{kind}"] += 1
            if duration < SMALL_SECONDS:  # op-by-op dispatch and other small programs
                _seconds[f"small_{kind}"] += duration
                _seconds[f"n_small_{kind}"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _seconds.clear()
    start = time.perf_counter()
    yield
    out = pathlib.Path(os.environ.get("COMPILE_PROFILE_DIR", "compile_profile"))
    out.mkdir(parents=True, exist_ok=True)
    record = {"test": item.nodeid, "wall": time.perf_counter() - start, **{k: round(v, 3) for k, v in _seconds.items()}}
    with open(out / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def summarize(directory: str, top: int = 25) -> None:
    records = [json.loads(line) for path in pathlib.Path(directory).glob("*.jsonl") for line in open(path)]
    keys = ("wall", "trace", "lower", "compile")
    total = {k: sum(r.get(k, 0.0) for r in records) for k in keys}
    print(f"{len(records)} tests: " + ", ".join(f"{k} {v:.0f} s" for k, v in total.items()))
    for kind in ("trace", "lower", "compile"):
        n = sum(r.get(f"n_{kind}", 0) for r in records)
        n_small = sum(r.get(f"n_small_{kind}", 0) for r in records)
        small = sum(r.get(f"small_{kind}", 0.0) for r in records)
        print(f"  {kind}: {n} events, {n_small} under {SMALL_SECONDS} s summing to {small:.0f} s")
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        files[r["test"].split("::")[0]].update({k: r.get(k, 0.0) for k in keys})
    print(f"\n{'wall':>7} {'trace':>7} {'compile':>7}  file")
    for name, c in sorted(files.items(), key=lambda kv: -kv[1]["wall"]):
        print(f"{c['wall']:7.1f} {c['trace']:7.1f} {c['compile']:7.1f}  {name}")
    print(f"\n{'wall':>7} {'trace':>7} {'compile':>7}  test")
    for r in sorted(records, key=lambda r: -r["wall"])[:top]:
        print(f"{r['wall']:7.1f} {r.get('trace', 0):7.1f} {r.get('compile', 0):7.1f}  {r['test']}")


if __name__ == "__main__":
    summarize(sys.argv[1] if len(sys.argv) > 1 else "compile_profile")
