"""scratch_transformer.paths: which names are local paths (never a Hub request) and what a model folder lacks."""

import pytest

from scratch_transformer.paths import local_parent, looks_like_local_path, missing_path_message, model_folder_problem


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


def test_model_folder_problem_names_what_is_missing_and_a_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-40").mkdir()
    problem = model_folder_problem(str(tmp_path), "--model_name_or_path")
    assert "no weights (model.safetensors), no tokenizer files" in problem and "no config.json" not in problem
    assert f"--model_name_or_path {tmp_path / 'checkpoint-40'}" in problem  # the newest, by step
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert "tokenizer" in model_folder_problem(str(tmp_path))
    assert model_folder_problem(str(tmp_path), needs_tokenizer=False) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_folder_problem(str(tmp_path)) is None
