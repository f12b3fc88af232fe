"""scratch_transformer.paths: which names are local paths (never a Hub request) and what a model folder lacks."""

import pytest

from scratch_transformer.paths import (
    local_parent,
    looks_like_local_path,
    missing_model_message,
    missing_path_message,
    model_folder_problem,
    train_first_hint,
)


@pytest.mark.parametrize("name", ["/abs/model", "./model", "../shared/data", "~/model", "a/b/c", "a\\b", "bad name!"])
def test_path_like_names_are_local(name):
    assert looks_like_local_path(name)


def test_owner_name_is_a_hub_id_unless_the_owner_folder_exists_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not looks_like_local_path("user/scratch-de-en") and not looks_like_local_path("bert-base")
    (tmp_path / "outputs").mkdir()
    assert looks_like_local_path("outputs/multi30k_de_en") and local_parent("outputs/multi30k_de_en") == "outputs"
    message = missing_path_message("--model", "outputs/multi30k_de_en")
    assert message.startswith("--model outputs/multi30k_de_en: no such folder") and "outputs/ exists here" in message


def test_a_name_in_outputs_is_local_before_outputs_exists(tmp_path, monkeypatch):
    """Issue 54: the main job's folder, named before it was trained, once went to the Hub (no outputs/ here)."""
    monkeypatch.chdir(tmp_path)
    assert looks_like_local_path("outputs/multi30k_de_en") and not (tmp_path / "outputs").exists()
    assert not looks_like_local_path("outputs") and not looks_like_local_path("output/model")  # Hub ids still
    assert missing_model_message("outputs/multi30k_de_en") == (
        "no such folder (train it first: python scripts/train_translation.py configs/multi30k_de_en.json; "
        "or give a Hub id)")
    assert train_first_hint("./outputs/multi30k_en_de") == "python scripts/train_translation.py configs/multi30k_en_de.json"
    assert train_first_hint("docs/walkthrough_pictures/model") == "python docs/walkthrough.py"
    assert train_first_hint("~/m") == "python scripts/train_translation.py configs/multi30k_de_en.json --output_dir ~/m"


def test_model_folder_problem_names_what_is_missing_and_a_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-40").mkdir()
    problem = model_folder_problem(str(tmp_path), "--model_name_or_path")
    assert "no weights (model.safetensors), no tokenizer files" in problem and "no config.json" not in problem
    assert f"--model_name_or_path {tmp_path / 'checkpoint-40'}" in problem  # the newest, by step
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    assert "tokenizer" in model_folder_problem(str(tmp_path))
    assert model_folder_problem(str(tmp_path), needs_tokenizer=False) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_folder_problem(str(tmp_path)) is None


@pytest.mark.parametrize("damage", ["cut", "header", "one_byte"])
def test_model_folder_problem_names_weights_cut_short_or_corrupt(tmp_path, damage):
    """safetensors' 'incomplete metadata' / 'header too large' once reached users as a traceback."""
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    save_file({"weight": torch.ones(64)}, str(weights))
    data = weights.read_bytes()
    weights.write_bytes({"cut": data[: len(data) - 10], "header": data[:8] + b"{" * 40 + data[48:],
                         "one_byte": b"x"}[damage])
    assert model_folder_problem(str(tmp_path)).startswith("its model.safetensors is truncated or corrupt")


def test_script_refusals_are_one_line(tmp_path, capsys):
    """translate.py and the export refuse a bad --model with one line naming it, not argparse's usage block."""
    from conftest import load_script

    for name in ("translate", "export_ctranslate2"):
        argv = ["--model", str(tmp_path / "nowhere"), "Ein Hund."] if name == "translate" else \
            ["--model", str(tmp_path / "nowhere"), "--output_dir", str(tmp_path / "out")]
        with pytest.raises(SystemExit) as stop:
            load_script(name).main(argv)
        assert stop.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f": error: --model {tmp_path / 'nowhere'}: no such folder" in lines[0], lines
