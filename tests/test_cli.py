"""The main job (`make demo`) runs end to end on a small batch and writes its plot."""

from jaxsim_ncp.cli import main


def test_demo_runs_and_writes_plot(tmp_path, capsys):
    main(["demo", "--batch", "4", "--steps", "20", "--opt-iters", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "steps/s" in out and "central FD" in out and "trajectory optimisation" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000
