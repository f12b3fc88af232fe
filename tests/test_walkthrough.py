"""docs/walkthrough.py runs as a notebook (jupytext reads it, nbclient executes it on a Jupyter kernel), so the
walk-through cannot rot: every shape check and every "why" it argues with a number holds (the notebook asserts
them; this test reads the numbers back from its output), and its default path ends with a translation and an
alignment the text points at. A cell of the test's own, run after the notebook's, checks from the kernel's
variables that the sets the text calls unseen are disjoint from the training sets; the translator it saves loads
with the Auto classes and translates."""

import json
import os
import re
import sys

import pytest
from conftest import REPO_ROOT

WALKTHROUGH = REPO_ROOT / "docs" / "walkthrough.py"


def test_walkthrough_runs_as_a_notebook(tmp_path):
    jupytext = pytest.importorskip("jupytext", reason='the walk-through test needs jupytext (pip install ".[dev]")')
    nbclient = pytest.importorskip("nbclient", reason='the walk-through test needs nbclient (pip install ".[dev]")')
    nbformat = pytest.importorskip("nbformat", reason='the walk-through test needs nbformat (pip install ".[dev]")')
    pytest.importorskip("ipykernel", reason='the walk-through test needs ipykernel (pip install ".[dev]")')
    notebook = jupytext.read(WALKTHROUGH)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    # one more cell, the test's own: from the kernel's variables, are the "unseen" test sets disjoint from training?
    notebook.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    pictures = tmp_path / "pictures"
    environment = {"WALKTHROUGH_OUTPUT": str(pictures), "WALKTHROUGH_MODEL": "none",
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
    assert "copied 200/200 unseen sequences exactly (none in the training set)" in text
    assert "multi-head attention: the package's module and the paper's formula agree" in text

    def number(pattern):
        match = re.search(pattern, text)
        assert match, f"the walk-through no longer prints {pattern!r}"
        return [float(group) for group in match.groups()]

    checked = json.loads(re.search(r"^CHECKED (.*)$", text, flags=re.M).group(1))
    # the copy task's 200 test sequences and §12's 100 test sentences are truly not in their training sets
    assert checked["copy_test"] == 200 and checked["copy_test_in_training"] == 0 and checked["copy_training"] > 10000
    assert checked["alignment_test"] == 100 and checked["alignment_test_in_training"] == 0
    assert checked["alignment_training_distinct"] == number(r"(\d+) distinct training pairs; 100 test sentences")[0]

    # why sqrt(d_k): q.k of unit-variance vectors has variance d_k = 64, scaled back to 1; the softmax saturates
    raw_variance, raw_peak, raw_gradient = number(r"q·k\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
    scaled_variance, scaled_peak, scaled_gradient = number(r"q·k / √d_k\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
    assert abs(raw_variance - 64) < 3 and abs(scaled_variance - 1) < 0.05
    assert raw_peak > 0.85 > 0.6 > scaled_peak and scaled_gradient > 3 * raw_gradient
    # why positions: self-attention without them is permutation-equivariant; with them it is not
    assert number(r"no positions:.*= ([\d.e+-]+)")[0] < 1e-5 and number(r"with positions:.*= ([\d.]+)")[0] > 0.1
    # why sinusoids: PE(pos + k) = M_k PE(pos), the matrix printed
    assert "M_3 for d_model = 4" in text and number(r"max \|M_3 PE\(pos\) - PE\(pos \+ 3\)\|.*: ([\d.e+-]+)")[0] < 1e-4
    # why heads: one head averages A (+1) and B (-1) away, two keep both
    assert "-> output [0. 0. 0. 0. 0. 0. 0. 0.]" in text and "-> output [ 1.  1.  1.  1. -1. -1. -1. -1.]" in text
    # the model's own masks: additive 0 / float32 minimum
    assert "values the model adds to the decoder's scores: [-3.4028234663852886e+38, 0.0]" in text
    # label smoothing: the target's entropy is the loss's floor; the translator's loss sits on it, its confidence ~0.9
    entropy, = number(r"target for label 3 of 10: .* entropy ([\d.]+) nats")
    assert abs(entropy - 0.5) < 0.01 and number(r"prediction = target: ([\d.]+) nats")[0] == entropy
    final_loss, floor = number(r"loss of the last 50 steps ([\d.]+) nats, the least .*: ([\d.]+)")
    assert abs(final_loss - floor) < 0.05
    smoothed, unsmoothed = number(r"translator \(ε = 0.1\) ([\d.]+), copier \(ε = 0\) ([\d.]+)")
    assert 0.85 < smoothed < 0.95 < 0.97 < unsmoothed
    # decoding by hand, with and without the cache, equals generate()
    by_hand = re.search(r"by hand: (\[.*\])", text).group(1)
    assert f"cached:  {by_hand}" in text and f"generate(): {by_hand}" in text
    without_cache, with_cache = number(r"decoder positions computed: (\d+) without the cache, (\d+) with it")
    assert without_cache == with_cache * (with_cache + 1) / 2
    # the default path ends with a translation and the alignment the text points at
    assert "Im Schnee spielen zwei Hunde. -> Two dogs play in the snow." in text
    assert "'▁dogs': '▁Hunde.'" in text and "'▁play': '▁spielen'" in text
    assert number(r"by layer: \{1: [\d.]+, 2: ([\d.]+)\}")[0] > 0.8  # measured on the 100 held-out sentences
    assert number(r"translated exactly: (\d+)/100")[0] >= 90
    # why warm-up: without it the copy model stalls near guessing (ln 13 = 2.56); with 30 steps of it, it learns
    without_warmup, with_warmup = number(r"([\d.]+) nats without warm-up, ([\d.]+) with 30 steps of warm-up")
    assert without_warmup > with_warmup + 0.5
    # the translator is saved where README's demo command looks, and loads and translates with the Auto classes
    saved = pictures / "model"
    assert f"the translator is saved in {saved}" in text
    import scratch_transformer  # noqa: F401  (registers the model with the Auto classes)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from scratch_transformer.attention_maps import model_problem

    assert model_problem(str(saved)) is None  # what scripts/demo.py and scripts/show_attention.py check first
    tokenizer, model = AutoTokenizer.from_pretrained(saved), AutoModelForSeq2SeqLM.from_pretrained(saved).eval()
    ids = model.generate(**tokenizer(["Im Schnee spielen zwei Hunde."], return_tensors="pt"), num_beams=1,
                         max_new_tokens=20)
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == "Two dogs play in the snow."
    assert re.search(r"walk-through done in \d+ s", text)
    assert text.count("\n") < 200  # quiet: no training framework's logs
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 7  # the figures are shown in the notebook, not only saved
    assert {path.name for path in pictures.glob("*.png")} == {
        "positional_encoding.png", "masks.png", "copy_cross_attention.png", "label_smoothing.png",
        "learning_rate_schedules.png", "translation_alignment.png", "translation_attention.png"}


CHECK_CELL = """
import json as _json
_copy = set(copy_test)
_alignment = {(german, english) for german, english, _ in held_out_sentences}
print("CHECKED", _json.dumps({
    "copy_test": len(copy_test), "copy_training": len(copy_training),
    "copy_test_in_training": len(_copy & copy_training),
    "alignment_test": len(_alignment), "alignment_training_distinct": len(set(pairs)),
    "alignment_test_in_training": len(_alignment & set(pairs))}))
"""


def _kernel_manager_for(python):
    """A kernel manager that starts the kernel with this interpreter (the venv running the tests), whatever
    kernelspec Jupyter finds first."""
    from jupyter_client.manager import KernelManager

    class ThisPythonKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            return [python, *command[1:]] if command and "python" in os.path.basename(command[0]) else command

    return ThisPythonKernelManager
