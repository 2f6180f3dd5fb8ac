"""The notebooks execute end to end in their fast mode (JAXSIM_NCP_FAST=1: tiny sizes, the same
code as the full runs, whose figures are in the README)."""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).parent.parent / "notebooks"


@pytest.mark.parametrize("name", ["quickstart", "sysid_cube", "mpc"])
def test_notebook_executes(name, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSIM_NCP_FAST", "1")
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "outputs must be stripped in git"
    # run in a copy of the folder layout so outputs land in tmp_path (configs are read from ../configs)
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    (tmp_path / "configs").symlink_to(NOTEBOOKS.parent / "configs")
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}) or "image/gif" in o.get("data", {})]
    assert images, "the notebook shows its plots"
