"""docs/walkthrough.py runs as a notebook (jupytext reads it, nbclient executes it on a Jupyter kernel), so the
walk-through cannot rot: every shape check, the copy task's 200/200 and the Multi30k model's attention hold."""

import os
import sys

import pytest
from conftest import MULTI30K, REPO_ROOT

WALKTHROUGH = REPO_ROOT / "docs" / "walkthrough.py"


def test_walkthrough_runs_as_a_notebook(tmp_path):
    jupytext = pytest.importorskip("jupytext", reason='the walk-through test needs jupytext (pip install ".[dev]")')
    nbclient = pytest.importorskip("nbclient", reason='the walk-through test needs nbclient (pip install ".[dev]")')
    pytest.importorskip("ipykernel", reason='the walk-through test needs ipykernel (pip install ".[dev]")')
    notebook = jupytext.read(WALKTHROUGH)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    pictures = tmp_path / "pictures"
    environment = {"WALKTHROUGH_OUTPUT": str(pictures), "MULTI30K": str(MULTI30K), "WALKTHROUGH_MODEL": "train",
                   "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # the kernel inherits this process's environment
    try:
        client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": str(REPO_ROOT / "docs")}})
        client.kernel_manager_class = _kernel_manager_for(sys.executable)
        client.execute()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    text = "".join(output.get("text", "") for output in outputs if output.get("output_type") == "stream")
    assert "copied 200/200 unseen sequences exactly" in text
    assert "multi-head attention: the package's module and the paper's formula agree" in text
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 6  # the figures are shown in the notebook, not only saved
    assert {path.name for path in pictures.glob("*.png")} == {
        "positional_encoding.png", "masks.png", "copy_learning_rate.png", "copy_cross_attention.png",
        "multi30k_attention.png", "multi30k_learning_rate.png"}


def _kernel_manager_for(python):
    """A kernel manager that starts the kernel with this interpreter (the venv running the tests), whatever
    kernelspec Jupyter finds first."""
    from jupyter_client.manager import KernelManager

    class ThisPythonKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            return [python, *command[1:]] if command and "python" in os.path.basename(command[0]) else command

    return ThisPythonKernelManager
