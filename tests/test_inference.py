"""Inference entry points with bad input: translate() truncation, generate()'s argument checks, and
scripts/translate.py's --model / --input_file checks (a tiny model from the conftest fixture; seconds each)."""

import re
import socket
import warnings

import pytest
import torch
from conftest import load_script

translate_script = load_script("translate")
LONG = "Ein Hund läuft über die Wiese und zwei Männer spielen Fußball, eine Frau sitzt auf einer Bank."


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    import scratch_transformer  # noqa: F401  (registers the Auto classes)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def run_script(argv, capsys):
    """Run scripts/translate.py's main, expecting an argument error; returns (stderr, waits): the calls to
    time.sleep on the way (a retry with back-off waits; failing at once does not), whatever the machine's speed."""
    from unittest import mock

    with mock.patch("time.sleep") as sleep, pytest.raises(SystemExit):
        translate_script.main(argv)
    return capsys.readouterr().err, sleep.call_count


# --------------------------------------------------------------------------------------
# translate(): long sources
# --------------------------------------------------------------------------------------


def test_translate_warns_how_many_sources_were_truncated(model_and_tokenizer):
    from scratch_transformer.inference import translate

    model, tokenizer = model_and_tokenizer
    assert 8 < len(tokenizer(LONG)["input_ids"]) <= 60 and len(tokenizer("Ein Hund.")["input_ids"]) <= 8
    sentences = [LONG, "Ein Hund.", "", LONG + " " + LONG]
    with pytest.warns(UserWarning, match=r"^2 of 4 sentences are longer than max_source_length=8 tokens and were "
                                         r"truncated: their translations cover only the first 8 tokens"):
        truncated = translate(model, tokenizer, sentences, batch_size=2, max_source_length=8, num_beams=1)
    cut = tokenizer.decode(tokenizer(LONG, truncation=True, max_length=8)["input_ids"], skip_special_tokens=True)
    assert truncated[0] == translate(model, tokenizer, [cut], max_source_length=8, num_beams=1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing cut: no warning
        translate(model, tokenizer, [LONG, "Ein Hund.", ""], max_source_length=60, num_beams=1)


@pytest.mark.parametrize("bad", [0, -3, 2.5, None])
def test_translate_rejects_a_bad_max_source_length(model_and_tokenizer, bad):
    from scratch_transformer.inference import translate

    with pytest.raises(ValueError, match=f"max_source_length must be a positive integer, got {bad!r}"):
        translate(*model_and_tokenizer, ["Ein Hund."], max_source_length=bad)


# --------------------------------------------------------------------------------------
# generate(): attention_mask and num_beams
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_mask", [lambda m: m[:, :2], lambda m: m[:1], lambda m: m[0]],
                         ids=["too-short", "one-row-broadcast", "1d"])
@pytest.mark.parametrize("num_beams", [1, 2])
def test_generate_rejects_an_attention_mask_of_another_shape(model_and_tokenizer, make_mask, num_beams):
    model, tokenizer = model_and_tokenizer
    batch = tokenizer(["Ein Hund läuft über die Wiese.", "Ein Hund."], return_tensors="pt", padding=True)
    mask = make_mask(batch["attention_mask"])
    message = (re.escape(f"attention_mask has shape {tuple(mask.shape)} but input_ids is "
                         f"{tuple(batch['input_ids'].shape)}: it must be (batch, source length)"))
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=batch["input_ids"], attention_mask=mask, num_beams=num_beams)


def test_forward_rejects_an_attention_mask_that_does_not_fit_encoder_outputs(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = tokenizer(["Ein Hund läuft über die Wiese.", "Ein Hund."], return_tensors="pt", padding=True)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(batch["input_ids"], batch["attention_mask"])
        with pytest.raises(ValueError, match=r"attention_mask has shape \(1, \d+\) but encoder_outputs \(batch, "
                                             r"length\) is \(2, \d+\)"):
            model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"][:1],
                  decoder_input_ids=torch.ones(2, 1, dtype=torch.long))


@pytest.mark.parametrize("name, value", [("num_beams", 0), ("num_beams", -1), ("num_return_sequences", 0)])
def test_generate_rejects_counts_below_one(model_and_tokenizer, name, value):
    model, tokenizer = model_and_tokenizer
    batch = tokenizer(["Ein Hund."], return_tensors="pt")
    with pytest.raises(ValueError, match=rf"^{name} must be a positive integer, got {value}$"):
        model.generate(**batch, **{name: value})


# --------------------------------------------------------------------------------------
# scripts/translate.py: --model and --input_file
# --------------------------------------------------------------------------------------


@pytest.fixture
def no_hub_calls(monkeypatch):
    from huggingface_hub import HfApi

    def refuse(*args, **kwargs):
        raise AssertionError("translate.py asked the Hub about a name that is a local path")

    monkeypatch.setattr(HfApi, "model_info", refuse)


def test_script_model_path_in_an_existing_local_folder_fails_at_once(tmp_path, monkeypatch, capsys, no_hub_calls):
    """outputs/multi30k_de_en before training: 'outputs/' exists here, so it is a path, not a Hub id."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    err, waits = run_script(["--model", "outputs/multi30k_de_en", "Ein Hund."], capsys)
    assert "--model outputs/multi30k_de_en: no such folder" in err
    assert "outputs/ exists here" in err
    assert waits == 0


@pytest.mark.parametrize("name", ["bad..name", "a/b/c", "./x", "~/nowhere-scratch-transformer"])
def test_script_model_that_cannot_be_a_hub_id_fails_as_a_missing_folder(tmp_path, monkeypatch, capsys, name,
                                                                         no_hub_calls):
    monkeypatch.chdir(tmp_path)
    err, _ = run_script(["--model", name, "Ein Hund."], capsys)
    assert f"--model {name}: no such folder" in err


def test_script_hub_id_with_the_hub_unreachable_fails_fast(monkeypatch, capsys, tmp_path):
    from huggingface_hub import constants

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.chdir(tmp_path)
    err, waits = run_script(["--model", "someone/multi30k_de_en", "Ein Hund."], capsys)
    assert f"--model someone/multi30k_de_en: no such local folder, and the Hub ({endpoint}) cannot be reached" in err
    assert waits == 0


def test_script_hub_id_not_on_the_hub_says_so(hub_server, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    err, waits = run_script(["--model", "user/inference-test-missing", "Ein Hund."], capsys)
    assert "--model user/inference-test-missing: no such local folder, and no such model on the Hub" in err
    assert waits == 0


def test_script_folder_without_a_model_says_so(tmp_path, capsys):
    empty = tmp_path / "run"
    empty.mkdir()
    err, _ = run_script(["--model", str(empty), "Ein Hund."], capsys)
    assert (f"--model {empty}: the folder holds no trained model (no config.json, no weights (model.safetensors), "
            "no tokenizer files (tokenizer.json / tokenizer_config.json))") in err
    assert "sentencepiece" not in err
    (empty / "checkpoint-20").mkdir()
    err, _ = run_script(["--model", str(empty), "Ein Hund."], capsys)
    assert f"its checkpoints do, e.g. --model {empty / 'checkpoint-20'}" in err


def test_script_tokenizer_missing_is_named(tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    err, _ = run_script(["--model", str(folder), "Ein Hund."], capsys)
    assert f"--model {folder}: the folder holds no trained model (no tokenizer files" in err


def test_script_missing_input_file_is_an_argument_error(tiny_model_dir, tmp_path, capsys):
    missing = tmp_path / "de.txt"
    err, _ = run_script(["--model", str(tiny_model_dir), "--input_file", str(missing)], capsys)
    assert f"--input_file {missing}: no such file" in err
    err, _ = run_script(["--model", str(tiny_model_dir), "--input_file", str(tmp_path)], capsys)
    assert f"--input_file {tmp_path}: a folder, not a file" in err


def test_script_warns_about_truncated_sources(tiny_model_dir):
    with pytest.warns(UserWarning, match=r"^1 of 2 sentences are longer than max_source_length=6 tokens"):
        out = translate_script.main(["--model", str(tiny_model_dir), "--max_source_length", "6", "--num_beams", "1",
                                     LONG, "Ein Hund."])
    assert len(out) == 2
