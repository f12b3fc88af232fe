"""The code that travels with the weights, on the transformers users have.

A model folder is saved here as the main job saves it (transformers 5: TranslationTrainer.save_model writes the
weights, config with auto_map, the configuration/modeling/kernels/pipeline files and the tokenizer), then loaded
in a fresh interpreter whose transformers is 4.57 (its own site-packages folder, installed once by pip --target
into .compat/, which git ignores) and where this package cannot be imported: AutoTokenizer and
AutoModelForSeq2SeqLM with trust_remote_code=True, then generate() (greedy, beam, greedy with a static cache; sdpa
and eager attention) and the pipeline must give the very ids and texts that transformers 5 gives.

SCRATCH_TRANSFORMER_OTHER_TRANSFORMERS=4.54.1 python -m pytest tests/test_remote_code.py loads with another release
(4.54.1, 4.55.4, 4.56.2 and 5.0.0 passed, 2026-12-07; 4.53.3 stops at loading with the model file's one-line
ImportError).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT
from helpers import GUARD_SOURCE, hf_subprocess_env

OTHER_RELEASE = os.environ.get("SCRATCH_TRANSFORMER_OTHER_TRANSFORMERS", "4.57.6")  # the release to load with
COMPAT_DIR = REPO_ROOT / ".compat"  # in .gitignore

PAIRS = [("Ein Hund läuft über die Wiese.", "A dog runs across the meadow."),
         ("Zwei Männer spielen Fußball.", "Two men are playing football."),
         ("Eine Frau sitzt auf einer Bank.", "A woman sits on a bench."),
         ("Ein Kind spielt.", "A child is playing.")]
SOURCES = [PAIRS[0][0], PAIRS[3][0], "Eine Frau spielt Fußball.", PAIRS[1][0]]  # padded batch, one unseen sentence
# lengths given to each call (5.0 read generation_config.max_length as one token more than 4.57 and 5.25 do)
LENGTH = {"max_new_tokens": 15}
BEAMS = {"num_beams": 3, "num_return_sequences": 2, **LENGTH}
# what pip prints when no package registry answers (then the test is skipped, not failed)
UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
               "Network is unreachable", "Failed to establish a new connection", "ConnectTimeout", "ReadTimeout")


def transformers_v4_site() -> Path:
    """A folder holding transformers OTHER_RELEASE and its dependencies (not torch), made once by pip install --target
    and reused (a .complete marker is written last, so an interrupted install is made again)."""
    target = COMPAT_DIR / f"transformers-{OTHER_RELEASE}"
    if (target / ".complete").is_file():
        return target
    COMPAT_DIR.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=COMPAT_DIR, prefix=".staging-"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts",
         "--retries", "1", "--timeout", "30", "--target", str(staging), f"transformers=={OTHER_RELEASE}"],
        capture_output=True, text=True, timeout=900,
    )
    if proc.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if any(sign in proc.stderr for sign in UNREACHABLE):
            pytest.skip(f"transformers {OTHER_RELEASE} could not be installed: the package registry cannot be reached "
                        f"({last})")
        pytest.fail(f"pip install --target transformers=={OTHER_RELEASE} failed: {last}")
    (staging / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def torch_alone(folder: Path) -> Path:
    """A folder of links to torch and the distributions it requires (by its metadata), nothing else of this
    environment: the other packages here (transformers 5's huggingface_hub, accelerate, kernels, ...) must not be
    found by transformers 4."""
    from importlib.metadata import distribution, requires

    from packaging.requirements import Requirement

    names, todo = set(), ["torch"]
    while todo:
        name = todo.pop()
        if name not in names:
            names.add(name)
            for line in requires(name) or []:
                requirement = Requirement(line)
                if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                    todo.append(requirement.name)
    folder.mkdir()
    for name in names:
        dist = distribution(name)
        for top in {Path(str(file)).parts[0] for file in dist.files or ()}:
            source = Path(dist.locate_file(top))
            # modules, packages, and the .dist-info (transformers asks importlib.metadata whether torch is there)
            if (source.suffix in (".py", "", ".dist-info") and top not in ("..", "__pycache__", "bin")
                    and source.exists() and not (folder / top).exists()):  # a namespace (nvidia/) is linked once
                (folder / top).symlink_to(source)
    return folder


def train_tiny(model, tokenizer, steps: int = 40):
    """A few Adam steps on PAIRS, so that generate() gives real, varied ids (an untrained model repeats one token);
    on one thread (a fraction of a second; many times that on two threads of a busy machine)."""
    torch.set_num_threads(1)  # given back after the module (conftest)
    batch = tokenizer([de for de, _ in PAIRS], text_target=[en for _, en in PAIRS], return_tensors="pt",
                      padding=True)
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    return model.eval()


def save_as_the_main_job(model, tokenizer, folder: Path) -> None:
    """TranslationTrainer.save_model, as the main job calls it at the end of a run."""
    from transformers import Seq2SeqTrainingArguments

    from scratch_transformer.trainer import TranslationTrainer

    args = Seq2SeqTrainingArguments(output_dir=str(folder), report_to="none", use_cpu=True)
    TranslationTrainer(model=model, args=args, processing_class=tokenizer).save_model()


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """Two trained tiny models: the default (separate source / target embeddings, post-LN, ReLU) and shared
    embeddings with pre-LN and GELU, each saved as the main job saves it."""
    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
    from scratch_transformer.tokenization import train_tokenizer

    tokenizer = train_tokenizer([text for pair in PAIRS for text in pair] * 3, vocab_size=120, min_frequency=1,
                                model_max_length=64, initial_alphabet=None)
    folders = {}
    for name, extra in (("default", {}),
                        ("shared_preln_gelu", {"share_encoder_decoder_embeddings": True, "pre_layer_norm": True,
                                               "activation_function": "gelu"})):
        config = ScratchTransformerConfig(vocab_size=len(tokenizer), d_model=32, num_heads=4, encoder_layers=2,
                                          decoder_layers=2, d_ff=64, dropout=0.0, max_position_embeddings=64, **extra)
        torch.manual_seed(0)
        model = train_tiny(ScratchTransformerForConditionalGeneration(config), tokenizer)
        model.generation_config.max_length = 16
        folders[name] = tmp_path_factory.mktemp(name)
        save_as_the_main_job(model, tokenizer, folders[name])
    return folders


# Loads each folder as a user of transformers 4.x would (package not installed, trust_remote_code=True) and prints
# what it gives; the same script runs on 5.x in a subprocess of this interpreter for the reference.
LOAD_AND_TRANSLATE = '''
import importlib.util
import json
import sys
import warnings

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

folders, sources, beams, length = (json.loads(argument) for argument in sys.argv[1:5])
out = {"transformers": transformers.__version__, "torch": torch.__version__,
       "package_findable": importlib.util.find_spec("scratch_transformer") is not None, "models": {}}
for name, folder in folders.items():
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    result = {"tokenizer": type(tokenizer).__name__, "input_ids": batch["input_ids"].tolist()}
    for implementation in ("sdpa", "eager"):
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True,
                                                      attn_implementation=implementation).eval()
        with torch.no_grad():
            logits = model(**batch, decoder_input_ids=batch["input_ids"][:, :5]).logits
            result[implementation] = {
                "class": type(model).__module__ + "." + type(model).__name__,
                "lm_head_tied_to_decoder": model.lm_head.weight.data_ptr()
                == model.model.decoder.embed.embed_tokens.weight.data_ptr(),
                "logits": logits.tolist(),
                "greedy": model.generate(**batch, **length).tolist(),
                "beam": model.generate(**batch, **beams).tolist(),
                "static_cache": model.generate(**batch, cache_implementation="static", **length).tolist(),
            }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        translator = pipeline(model=folder, trust_remote_code=True)
        result["pipeline"] = [item["translation_text"] for item in translator(sources, **length)]
    out["models"][name] = result
print("RESULT " + json.dumps(out))
'''


def run_loader(folders: dict, python_path: list, tmp_path: Path, no_site: bool) -> tuple[dict, str]:
    """LOAD_AND_TRANSLATE in a fresh interpreter (cwd a new folder, network limited to loopback, HF offline);
    returns its result and its stderr."""
    work = tmp_path / ("v4" if no_site else "v5")
    work.mkdir()
    script = work / "load_and_translate.py"
    script.write_text(GUARD_SOURCE + "\ninstall_guard()\n" + textwrap.dedent(LOAD_AND_TRANSLATE), encoding="utf-8")
    env = hf_subprocess_env(work / "hf_home", HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1")
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(map(str, python_path))
    args = [json.dumps({k: str(v) for k, v in folders.items()}), json.dumps(SOURCES), json.dumps(BEAMS),
            json.dumps(LENGTH)]
    command = [sys.executable, *(["-S"] if no_site else []), str(script), *args]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, encoding="utf-8", timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


def test_saved_tokenizer_names_a_class_both_majors_know(model_folders):
    config = json.loads((model_folders["default"] / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
    for name in ("configuration", "modeling", "kernels", "pipeline"):
        assert (model_folders["default"] / f"{name}_scratch_transformer.py").is_file(), name


def test_remote_code_on_transformers_4_gives_the_ids_of_transformers_5(model_folders, tmp_path):
    """Essential, so in the default suite (about 20 s here; the first run also installs transformers 4.57 into
    .compat/, about a minute)."""
    site_v4 = transformers_v4_site()
    # -S: no site module, so no site-packages and no .pth file: the editable install of this package is not there
    v4, v4_stderr = run_loader(model_folders, [site_v4, torch_alone(tmp_path / "torch")], tmp_path, no_site=True)
    v5, _ = run_loader(model_folders, [], tmp_path, no_site=False)

    assert v4["transformers"] == OTHER_RELEASE and v5["transformers"].startswith("5.")
    assert not v4["package_findable"]
    assert "not initialized" not in v4_stderr and "newly initialized" not in v4_stderr, v4_stderr
    for name in model_folders:
        old, new = v4["models"][name], v5["models"][name]
        assert old["tokenizer"] == ("PreTrainedTokenizerFast" if OTHER_RELEASE[0] == "4" else "TokenizersBackend")
        assert old["input_ids"] == new["input_ids"]
        for implementation in ("sdpa", "eager"):
            a, b = old[implementation], new[implementation]
            assert a["class"].startswith("transformers_modules."), a["class"]  # the folder's code, not the package's
            assert a["lm_head_tied_to_decoder"] and b["lm_head_tied_to_decoder"]
            torch.testing.assert_close(torch.tensor(a["logits"]), torch.tensor(b["logits"]), rtol=1e-5, atol=1e-5)
            assert a["greedy"] == b["greedy"], (name, implementation)
            assert a["beam"] == b["beam"], (name, implementation)
            assert a["static_cache"] == b["static_cache"] == b["greedy"], (name, implementation)
        assert old["pipeline"] == new["pipeline"]
        # real translations (of the sentences it was trained on), not one repeated token: a mistake would show
        assert [new["pipeline"][i] for i in (0, 1, 3)] == [PAIRS[0][1], PAIRS[3][1], PAIRS[1][1]], new["pipeline"]
