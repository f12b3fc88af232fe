"""The model card's code runs as printed: rendered for a tiny saved model, each python block runs in a fresh
process that cannot import this package, with no "Do you wish to run the custom code?" prompt."""

import json
import re

import pytest
from conftest import REPO_ROOT
from helpers import BLOCKED_PREFIX, hf_subprocess_env, run_python  # the remote-code process of the Hub tests

SOURCE = 'Er sagt "Hallo" und geht \\ nach Hause.'  # quotes and a backslash must not break the printed code


RUN_SNIPPETS = '''
import builtins
import contextlib
import io

try:
    import scratch_transformer  # noqa: F401
except ImportError:
    package_importable = False
else:
    package_importable = True

prompts = []


def no_prompt(prompt=""):  # transformers' trust_remote_code question: record it, answer no
    prompts.append(prompt)
    return "n"


builtins.input = no_prompt
printed = []
for snippet in json.loads(sys.argv[5]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "<model card>", "exec"), {"__name__": "__main__"})
    printed.append(out.getvalue())
print("RESULT " + json.dumps({"package_importable": package_importable, "prompts": prompts, "printed": printed,
                              "package_loaded": any(n.split(".")[0] == "scratch_transformer" for n in sys.modules),
                              "outside": OUTSIDE}))
'''


def card_values(repo_id: str) -> dict:
    return {
        "model_name": "tiny", "repo_id": repo_id, "src_lang": "de", "tgt_lang": "en", "dataset_name": "Multi30k",
        "dataset_id": "bentrevett/multi30k", "test_split": "test_2016_flickr", "bleu": 1.0, "chrf": 2.0,
        "bleu_signature": "nrefs:1", "num_beams": 1, "decoding": "beam 1", "d_model": 16, "num_heads": 2,
        "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32, "dropout": 0.0, "norm": "post-LN",
        "num_parameters": "1", "vocab_size": 300, "example_source": SOURCE, "training_summary": "none",
    }


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.S | re.M)


def test_card_code_names_the_repo_and_asks_for_remote_code():
    from scratch_transformer.card import render_model_card

    blocks = python_blocks(render_model_card(card_values("user/tiny")).content)
    assert len(blocks) == 2
    for block in blocks:
        calls = re.findall(r"from_pretrained\((.*?)\)|pipeline\((.*?)\)", block)
        assert calls, block
        for call in ("".join(parts) for parts in calls):
            assert '"user/tiny"' in call and "trust_remote_code=True" in call, call


def test_card_names_the_transformers_the_code_runs_on_and_the_versions_it_was_trained_with():
    import torch
    import transformers

    from scratch_transformer.card import render_model_card

    text = " ".join(render_model_card(card_values("user/tiny")).content.split())
    assert "It runs on transformers 4.54 or newer, 4.x and 5.x alike" in text  # tests/test_remote_code.py
    assert (f"this model was trained and scored with transformers {transformers.__version__} and torch "
            f"{torch.__version__}.") in text
    given = render_model_card({**card_values("user/tiny"), "transformers_version": "5.0.0", "torch_version": "2.4.0"})
    assert "with transformers 5.0.0 and torch 2.4.0." in " ".join(given.content.split())


def test_card_code_runs_as_printed_without_the_package_or_a_prompt(tiny_model_dir, tmp_path):
    from scratch_transformer.card import render_model_card
    from scratch_transformer.inference import translate
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    blocks = python_blocks(render_model_card(card_values(str(tiny_model_dir))).content)
    hf_home = tmp_path / "hf_home"
    hf_home.mkdir()
    result = run_python(BLOCKED_PREFIX + RUN_SNIPPETS,
                        [REPO_ROOT, tiny_model_dir, "[]", "", json.dumps(blocks)], hf_subprocess_env(hf_home), tmp_path,
                        timeout=120)
    assert result["prompts"] == []
    assert not result["package_importable"] and not result["package_loaded"]
    assert result["outside"] == []

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir)
    expected = translate(model, AutoTokenizer.from_pretrained(tiny_model_dir), [SOURCE])[0]
    assert expected
    assert result["printed"][0].strip() == repr([expected])
    assert result["printed"][1].strip() == repr([{"translation_text": expected}])


if __name__ == "__main__":
    pytest.main([__file__])


def test_training_summary_names_token_batches():
    from types import SimpleNamespace

    from scratch_transformer.translation import _batch_summary

    assert _batch_summary(SimpleNamespace(max_tokens_per_batch=None, per_device_train_batch_size=8)) == "batch 8"
    assert (_batch_summary(SimpleNamespace(max_tokens_per_batch=4096, per_device_train_batch_size=8))
            == "batches of up to 4096 source and 4096 target tokens")
