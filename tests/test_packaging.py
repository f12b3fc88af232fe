"""The package as users install it: a wheel, installed into a fresh folder, is complete (code files, the model
card template) and renders a card without the repository beside it."""

import importlib.util
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO_ROOT

RENDER = """
import scratch_transformer, scratch_transformer.card as card
assert scratch_transformer.__file__.startswith({target!r}), scratch_transformer.__file__
values = dict(model_name="m", repo_id="user/m", src_lang="de", tgt_lang="en", dataset_name="multi30k",
              dataset_id="multi30k", test_split="test", bleu=40.1, chrf=60.2, bleu_signature="sig", num_beams=4,
              decoding="beam 4", d_model=8, num_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.1,
              norm="post-LN", num_parameters="1", vocab_size=100, example_source="Ein Hund.", training_summary="t")
print(card.DEFAULT_TEMPLATE)
print(card.render_model_card(values).content)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # the venv's own setuptools when it has one (fast, offline); else pip fetches it into an isolated build
    no_isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *no_isolation, "-w", str(out),
                    str(REPO_ROOT)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("scratch_transformer-*.whl")
    return path


def test_wheel_holds_the_code_and_the_card_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("configuration_scratch_transformer.py", "modeling_scratch_transformer.py", "translation.py",
                 "pipeline_scratch_transformer.py", "hub_card.md"):
        assert f"scratch_transformer/{name}" in names, name
    card = zipfile.ZipFile(wheel).read("scratch_transformer/hub_card.md")
    assert card == (REPO_ROOT / "hub_card.md").read_bytes()  # the real template, not a dangling link


def test_installed_wheel_renders_a_model_card(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-c", RENDER.format(target=str(target))], cwd=tmp_path,
                          env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    template, content = done.stdout.split("\n", 1)
    assert template.startswith(str(target))
    assert "| 40.1 |" in content and "user/m" in content
