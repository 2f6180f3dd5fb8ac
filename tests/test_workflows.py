"""The workflows end to end on tiny configs: every CLI subcommand writes its outputs into
the run folder it prints; bad configs and model files fail with one line naming the problem."""

import re

import numpy as np
import pytest
from PIL import Image

from jaxsim_ncp import workflows
from jaxsim_ncp.cli import main

SYSID = """
[model]
path = "cube"
[recording]
episodes = 1
steps = 60
substeps = 2
height = [0.1, 0.11]    # dropped, not tossed: on the floor within the recording, so the size is observable
linear_speed = 0.0
noise_qpos = 0.0
noise_qvel = 0.0
[[param]]
field = "geom_size"
element = "cube"
init = 0.04
lower = 0.005
upper = 0.15
[fit]
horizon = 30
iterations = 6
learning_rate = 0.1
"""

MPC = """
[task]
name = "pusher"
[episodes]
count = 2
steps = 4
replan_every = 2
[gradient]
horizon = 4
iterations = 2
cfd_width = [0.0]
[sampling]
horizon = 4
num_samples = 4
"""


def run(argv, capsys):
    main(argv)
    out = capsys.readouterr().out
    folder = re.search(r"outputs in (\S+)", out).group(1)
    return out, folder


def test_sysid_cli_moves_the_size_towards_the_truth(tmp_path, capsys):
    config = tmp_path / "sysid.toml"
    config.write_text(SYSID)
    out, folder = run(["sysid", str(config), "--out", str(tmp_path)], capsys)
    rows = np.genfromtxt(f"{folder}/fit.csv", delimiter=",", skip_header=1)
    assert rows.shape == (6, 3)  # iteration, loss, geom_size[cube]
    assert rows[-1, 1] < rows[0, 1]  # the loss falls
    assert abs(rows[-1, 2] - 0.05) < abs(rows[0, 2] - 0.05)  # and the half-size moves towards 0.05
    assert Image.open(f"{folder}/sysid.png").size[0] > 400
    assert np.load(f"{folder}/recording.npz")["qpos"].shape == (1, 61, 7)


def test_mpc_cli_runs_every_planner_and_writes_results(tmp_path, capsys):
    config = tmp_path / "mpc.toml"
    config.write_text(MPC)
    out, folder = run(["mpc", str(config), "--out", str(tmp_path)], capsys)
    assert "gradient: " in out and "sampling: " in out
    lines = open(f"{folder}/results.csv").read().splitlines()
    assert len(lines) == 1 + 2 * 2
    gif = Image.open(f"{folder}/sampling.gif")
    assert gif.n_frames >= 2 and gif.size == (2 * 240, 180)


def test_simulate_cli_writes_states_and_a_video_that_moves(tmp_path, capsys):
    out, folder = run(["simulate", "pusher", "--batch", "2", "--steps", "12", "--video-worlds", "1", "--key", "near_goal",
                       "--out", str(tmp_path)], capsys)  # fmt: skip
    states = np.genfromtxt(f"{folder}/states.csv", delimiter=",", skip_header=1)
    assert states.shape == (2 * 12, 3 + 9 + 8) and np.all(np.isfinite(states))
    np.testing.assert_allclose(states[0, 3:8], [0.2, 0.02, 0.32, 0.02, 0.05], atol=0.02)  # from the keyframe, not qpos0
    gif = Image.open(f"{folder}/rollout.gif")
    frames = []
    for i in range(gif.n_frames):
        gif.seek(i)
        frames.append(np.asarray(gif.convert("RGB"), dtype=float))
    assert gif.n_frames >= 2 and frames[0].std() > 10  # a rendered scene, not a blank image
    assert np.abs(frames[-1] - frames[0]).mean() > 0.01  # the finger moved


def test_bench_cli_compares_with_mjx(tmp_path, capsys):
    out, folder = run(["bench", "--models", "cube", "--batch", "2", "--steps", "3", "--horizons", "--compile-repeats", "1",
                       "--out", str(tmp_path)], capsys)  # fmt: skip
    header, row = open(f"{folder}/bench.csv").read().splitlines()
    value = dict(zip(header.split(","), row.split(",")))
    assert float(value["steps_per_s"]) > 0 and float(value["speed_ratio"]) > 0
    assert float(value["step_compile_s"]) > 0 and float(value["step_compile_ratio"]) > 0
    assert int(value["batched_devices"]) == 1 and float(value["batched_speed_ratio"]) > 0  # through jsn.batched


def test_bench_scenes_are_the_pile_and_four_colliding_humanoids(tmp_path):
    """#15's benchmark scenes beyond the bundled models: the 100-cube pile and four humanoids in one
    scene (loaded by MuJoCo only: nothing is compiled)."""
    import mujoco

    pile = mujoco.MjModel.from_xml_path(workflows.bench_model_path("pile", tmp_path))
    assert (pile.nbody, pile.nv, pile.ngeom) == (101, 600, 101)
    humanoids = mujoco.MjModel.from_xml_path(workflows.bench_model_path("humanoids4", tmp_path))
    one = mujoco.MjModel.from_xml_path(workflows.bench_model_path("humanoid", tmp_path))
    assert humanoids.nv == 4 * one.nv and humanoids.nu == 4 * one.nu
    # the humanoids touch each other: some pair of geoms from different humanoids can collide
    root = humanoids.body_rootid[humanoids.geom_bodyid]
    can = (humanoids.geom_contype[:, None] & humanoids.geom_conaffinity[None, :]) != 0
    assert np.any(can & (root[:, None] != root[None, :]) & (root[:, None] > 0) & (root[None, :] > 0))
    with pytest.raises(workflows.ConfigError, match="model file not found"):
        workflows.bench_model_path("piles", tmp_path)


@pytest.mark.parametrize(
    "argv, text, message",
    [
        (["sysid", "{tmp}/missing.toml"], None, "config file not found"),
        (["sysid", "{tmp}/c.toml"], SYSID.replace("[fit]", "[fit]\nhorizn = 3"), "[fit]: unknown key(s) horizn"),
        (["sysid", "{tmp}/c.toml"], SYSID.replace('"cube"', '"nowhere.xml"', 1), "model file not found: nowhere.xml"),
        (["sysid", "{tmp}/c.toml"], SYSID.replace('element = "cube"', 'element = "ball"'), "no geom named 'ball'"),
        (["sysid", "{tmp}/c.toml"], SYSID.replace("init = 0.04", "init = 0.2"), "must lie strictly inside its bounds"),
        (["mpc", "{tmp}/c.toml"], MPC.replace('"pusher"', '"snooker"'), "unknown task 'snooker'"),
        (["mpc", "{tmp}/c.toml"], "[task\n", "not valid TOML"),
        (["mpc", "{tmp}/c.toml"], MPC.replace("cfd_width = [0.0]", 'cfd_width = [0.3]\ncfd_pairs = [["finger", "puck"]]'),
         "no geom named 'puck'"),
        (["mpc", "{tmp}/c.toml"], MPC.replace("iterations = 2", "iterations = 2\nknots = 9"),
         "[gradient] knots must be None or an integer from 2 to the horizon (4)"),
        (["mpc", "{tmp}/c.toml"], MPC.replace("iterations = 2", 'iterations = 2\nknots = "3"'),
         "[gradient] knots must be None or an integer from 2 to the horizon (4), got '3'"),
        (["mpc", "{tmp}/c.toml"], MPC.replace("iterations = 2", "iterations = 2\nline_search = 0.5"),
         "[gradient] line_search must be a list of positive scales"),
        (["simulate", "{tmp}/bad.xml"], "<mujoco><worldbody><geom type='sphere'/></worldbody>", "bad.xml"),
    ],
)
def test_bad_config_or_model_is_one_clear_line(tmp_path, capsys, argv, text, message):
    if text is not None:
        (tmp_path / argv[1].split("/")[-1]).write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and message in err and len(err.splitlines()) == 1, err
