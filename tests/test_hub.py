"""scratch_transformer.hub: repo ids checked before any work, and a finished folder published without its
training leftovers (against the local Hub server of tests/hub_server.py)."""

import pytest

from scratch_transformer.hub import check_repo_id, push_output_dir


@pytest.mark.parametrize("repo_id, message", [
    (None, "--push_to_hub needs --hub_model_id"),
    ("", "--push_to_hub needs --hub_model_id"),
    ("not a valid id!!", "malformed hub_model_id"),
    ("name-without-user", "must look like 'user/name'"),
])
def test_bad_repo_ids_are_refused(repo_id, message):
    with pytest.raises(ValueError, match=message):
        check_repo_id(repo_id)


def test_a_good_repo_id_is_returned():
    assert check_repo_id("user/scratch-de-en") == "user/scratch-de-en"


def test_push_publishes_the_model_files_but_not_the_training_leftovers(hub_server, tmp_path):
    from huggingface_hub import HfApi

    folder = tmp_path / "run"
    (folder / "checkpoint-10").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "README.md", "tokenizer.json", "trainer_state.json",
                 "training_args.bin", "eval_results.json", "checkpoint-10/model.safetensors", "all_results.json"):
        (folder / name).write_text(name)
    commit = push_output_dir(str(folder), "user/hub-unit-test")
    files = set(HfApi().list_repo_files("user/hub-unit-test"))
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json", "all_results.json"} <= files
    assert not files & {"trainer_state.json", "training_args.bin", "eval_results.json",
                        "checkpoint-10/model.safetensors"}
    assert len(commit) == 40
