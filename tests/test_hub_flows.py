"""Every Hub flow end to end, with the real huggingface_hub / transformers / datasets clients against the
local Hub server of tests/hub_server.py (the conftest's session fixture `hub_server`).

One tiny model is trained once per module by scripts/train_translation.py with
`--push_to_hub --hub_model_id user/pushtest-tiny`, so the training script itself pushes. The tests then
check what landed in the repo, pull it back in a fresh process that cannot import this package,
push/pull through the transformers and datasets APIs, and the failure paths. Repo names start with
`pushtest-` (unique to this module: the server is shared by the whole session).
"""

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
from conftest import MULTI30K, REPO_ROOT
from helpers import BLOCKED_PREFIX, GUARD_SOURCE, TINY, common_flags, hf_subprocess_env, run_python, train_translation

pytestmark = pytest.mark.filterwarnings("ignore")

REPO_ID = "user/pushtest-tiny"
API_REPO_ID = "user/pushtest-api"
DATASET_REPO_ID = "user/pushtest-multi30k"
SENTENCES = ["Ein Hund läuft.", "Zwei Männer spielen Fußball auf einer Wiese.", "Eine Frau sitzt auf einer Bank."]
PIPELINE_SENTENCE = "Ein Hund läuft."
DATA_SPLITS = ["train", "val", "test_2016_flickr"]
DATA_CAPS = {"train": 200, "val": 20, "test_2016_flickr": 20}
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


# --------------------------------------------------------------------------------------
# a guard against any traffic that would leave the machine (this process; subprocesses carry their own)
# --------------------------------------------------------------------------------------

_guard = {}
exec(compile(GUARD_SOURCE, "<loopback guard>", "exec"), _guard)


@pytest.fixture(scope="module", autouse=True)
def loopback_only():
    _guard["install_guard"]()
    yield _guard["OUTSIDE"]
    _guard["remove_guard"]()


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def folder_digest(folder: Path) -> dict:
    """Relative path -> sha256 of every file (and '<dir>' for every folder) under `folder`."""
    digest = {}
    for path in sorted(Path(folder).rglob("*")):
        rel = path.relative_to(folder).as_posix()
        digest[rel] = "<dir>" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def translate(model, tokenizer, sentences, **generate_kwargs):
    import torch

    inputs = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                **generate_kwargs)
    return [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)]


# --------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(hub_server):
    import huggingface_hub
    from huggingface_hub import HfApi

    assert huggingface_hub.constants.ENDPOINT == hub_server.url
    return HfApi()


@pytest.fixture(scope="module")
def pushed_run(hub_server, tmp_path_factory):
    """A tiny Multi30k run whose training script pushes the finished folder to user/pushtest-tiny."""
    if not MULTI30K.is_dir():
        pytest.skip("Multi30k not found beside the repo")
    output_dir = tmp_path_factory.mktemp("pushtest") / "run"
    argv = common_flags(
        output_dir, dataset_name=MULTI30K, validation_split="val", test_split="test_2016_flickr",
        max_train_samples=1500, max_eval_samples=20, max_predict_samples=20, config_overrides=TINY,
        vocab_size=1000, max_steps=60, warmup_steps=20, learning_rate=3e-3, eval_strategy="no",
        num_beams=2, average_last_checkpoints=0, push_to_hub=True, hub_model_id=REPO_ID,
    )
    results = train_translation.main(argv)
    return output_dir, results


@pytest.fixture(scope="module")
def local_model(pushed_run):
    """The trained model and tokenizer, loaded in this process from the local output folder."""
    import scratch_transformer  # noqa: F401  (registers the Auto classes)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    output_dir, _ = pushed_run
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    return model, tokenizer


PULL_SCRIPT = BLOCKED_PREFIX + '''try:
    import scratch_transformer  # noqa: F401
except ImportError:
    package_importable = False
else:
    package_importable = True

import torch
import transformers
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

hf_home_before = sorted(os.listdir(os.environ["HF_HOME"])) if os.path.isdir(os.environ["HF_HOME"]) else []
config = AutoConfig.from_pretrained(repo_id, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=True).eval()
inputs = tokenizer(sentences, return_tensors="pt", padding=True)
with torch.no_grad():
    output = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=1,
                            do_sample=False)
greedy = [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)]

pipe = transformers.pipeline(model=repo_id, trust_remote_code=True)
pipeline_output = pipe(pipeline_sentence)

modules = os.path.join(os.environ["HF_HOME"], "modules", "transformers_modules")
print("RESULT " + json.dumps({
    "package_importable": package_importable,
    "package_loaded": any(name.split(".")[0] == "scratch_transformer" for name in sys.modules),
    "hf_home_before": hf_home_before,
    "config_class": f"{type(config).__module__}.{type(config).__name__}",
    "model_class": f"{type(model).__module__}.{type(model).__name__}",
    "pipeline_class": f"{type(pipe).__module__}.{type(pipe).__name__}",
    "pipeline_num_beams": pipe.model.generation_config.num_beams,
    "cached_code": sorted(name for _, _, files in os.walk(modules) for name in files if name.endswith(".py")),
    "greedy": greedy,
    "pipeline": pipeline_output,
    "outside": OUTSIDE,
}, ensure_ascii=False))
'''


@pytest.fixture(scope="module")
def pulled(pushed_run, tmp_path_factory):
    """Pull user/pushtest-tiny in a fresh interpreter that cannot import scratch_transformer (empty HF_HOME)."""
    work = tmp_path_factory.mktemp("pull")
    hf_home = work / "hf_home_pull"
    hf_home.mkdir()
    env = hf_subprocess_env(hf_home)
    result = run_python(PULL_SCRIPT, [REPO_ROOT, REPO_ID, json.dumps(SENTENCES), PIPELINE_SENTENCE], env, work)
    return result, hf_home


# --------------------------------------------------------------------------------------
# 1. what the training script pushed
# --------------------------------------------------------------------------------------


def test_training_script_pushed_the_output_folder(api, pushed_run):
    output_dir, results = pushed_run
    files = api.list_repo_files(REPO_ID)
    print(f"\nfiles in {REPO_ID}: {files}")
    expected = ["model.safetensors", "config.json", "configuration_scratch_transformer.py",
                "modeling_scratch_transformer.py", "pipeline_scratch_transformer.py", "generation_config.json",
                "tokenizer.json", "tokenizer_config.json", "README.md", "training_curve.png", "all_results.json"]
    for name in expected:
        assert name in files, name
    assert sorted((output_dir).glob("checkpoint-*")), "the run should have left checkpoints locally"
    assert not [f for f in files if f.startswith("checkpoint-") or "/checkpoint-" in f]
    assert not [f for f in files if f in ("trainer_state.json", "training_args.bin") or f.startswith("runs/")]
    assert api.repo_info(REPO_ID).sha == results["hub_commit"]
    assert len(results["hub_commit"]) == 40

    # every pushed file is byte-identical to the local one
    from huggingface_hub import hf_hub_download

    for name in expected:
        assert Path(hf_hub_download(REPO_ID, name)).read_bytes() == (output_dir / name).read_bytes(), name

    config = json.loads(Path(hf_hub_download(REPO_ID, "config.json")).read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_scratch_transformer.ScratchTransformerConfig",
        "AutoModel": "modeling_scratch_transformer.ScratchTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_scratch_transformer.ScratchTransformerForConditionalGeneration",
    }
    assert config["custom_pipelines"] == {"translation": {
        "impl": "pipeline_scratch_transformer.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}}
    generation = json.loads(Path(hf_hub_download(REPO_ID, "generation_config.json")).read_text())
    assert generation["num_beams"] == 2 and generation["max_length"] == 40


def test_model_card_from_the_hub_matches_results(api, pushed_run):
    from huggingface_hub import ModelCard, hf_hub_download

    output_dir, results = pushed_run
    card = ModelCard.load(REPO_ID)
    hub_results = json.loads(Path(hf_hub_download(REPO_ID, "all_results.json")).read_text())
    assert hub_results == json.loads((output_dir / "all_results.json").read_text())
    bleu = [r.metric_value for r in card.data.eval_results if r.metric_type == "bleu"]
    chrf = [r.metric_value for r in card.data.eval_results if r.metric_type == "chrf"]
    assert bleu == [hub_results["test_bleu"]] == [results["test_bleu"]]
    assert chrf == [hub_results["test_chrf"]]
    assert card.data.pipeline_tag == "translation"
    assert card.data.language == ["de", "en"]
    hub_card_data = api.model_info(REPO_ID).card_data  # the server parses the README's YAML as the Hub does
    assert [r.metric_value for r in hub_card_data.eval_results if r.metric_type == "bleu"] == bleu


# --------------------------------------------------------------------------------------
# 2 + 4. pull in a process without this package; the shipped pipeline
# --------------------------------------------------------------------------------------


def test_pull_without_the_package_matches_local_model(pulled, local_model):
    result, hf_home = pulled
    model, tokenizer = local_model
    assert result["package_importable"] is False and result["package_loaded"] is False
    assert result["hf_home_before"] == []  # nothing was cached before the pull
    for key in ("config_class", "model_class", "pipeline_class"):
        assert result[key].startswith("transformers_modules."), result[key]
    assert result["model_class"].endswith(".modeling_scratch_transformer.ScratchTransformerForConditionalGeneration")
    assert result["pipeline_class"].endswith(".pipeline_scratch_transformer.TranslationPipeline")
    assert {"configuration_scratch_transformer.py", "modeling_scratch_transformer.py",
            "pipeline_scratch_transformer.py"} <= set(result["cached_code"])
    assert (hf_home / "modules" / "transformers_modules").is_dir()
    assert result["outside"] == []

    expected = translate(model, tokenizer, SENTENCES, num_beams=1, do_sample=False)
    print(f"\ngreedy translations (local == pulled): {expected}")
    assert result["greedy"] == expected
    assert all(isinstance(text, str) for text in expected) and any(expected)


def test_pipeline_from_the_hub_matches_local_model(pulled, local_model):
    result, _ = pulled
    model, tokenizer = local_model
    assert model.generation_config.num_beams == 2 == result["pipeline_num_beams"]
    expected = translate(model, tokenizer, [PIPELINE_SENTENCE])  # the generation config: beam 2, max_length 40
    assert result["pipeline"] == [{"translation_text": expected[0]}]


def test_in_process_pipeline_on_the_pulled_model(pushed_run, local_model):
    import scratch_transformer
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tokenizer = local_model
    pulled_model = AutoModelForSeq2SeqLM.from_pretrained(REPO_ID, trust_remote_code=True).eval()
    pulled_tokenizer = AutoTokenizer.from_pretrained(REPO_ID, trust_remote_code=True)
    assert pulled_model.config.name_or_path == REPO_ID
    pipe = scratch_transformer.TranslationPipeline(model=pulled_model, tokenizer=pulled_tokenizer)
    output = pipe(PIPELINE_SENTENCE)
    assert output == [{"translation_text": translate(model, tokenizer, [PIPELINE_SENTENCE])[0]}]
    greedy = pipe(SENTENCES, num_beams=1)
    assert [item["translation_text"] for item in greedy] == translate(model, tokenizer, SENTENCES, num_beams=1)


# --------------------------------------------------------------------------------------
# 3. model.push_to_hub / tokenizer.push_to_hub, revisions
# --------------------------------------------------------------------------------------


def test_push_to_hub_api_and_revisions(api, pushed_run):
    import scratch_transformer  # noqa: F401
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    output_dir, _ = pushed_run
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    first = model.push_to_hub(API_REPO_ID)
    tokenizer_commit = tokenizer.push_to_hub(API_REPO_ID)
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    name = next(n for n, p in model.named_parameters() if ".encoder.layers.0." in n and p.dim() == 2)
    with torch.no_grad():
        model.get_parameter(name).mul_(2.0)
    second = model.push_to_hub(API_REPO_ID, commit_message="scale one tensor")
    print(f"\n{API_REPO_ID}: first model commit {first.oid}, tokenizer commit {tokenizer_commit.oid}, "
          f"second model commit {second.oid} (scaled {name})")

    assert len({first.oid, tokenizer_commit.oid, second.oid}) == 3
    assert api.repo_info(API_REPO_ID).sha == second.oid
    history = [c.commit_id for c in api.list_repo_commits(API_REPO_ID)]
    assert history[:3] == [second.oid, tokenizer_commit.oid, first.oid]
    files = api.list_repo_files(API_REPO_ID)
    for needed in ("model.safetensors", "config.json", "generation_config.json", "modeling_scratch_transformer.py",
                   "configuration_scratch_transformer.py", "pipeline_scratch_transformer.py", "tokenizer.json",
                   "tokenizer_config.json"):
        assert needed in files, needed
    assert "tokenizer.json" not in api.list_repo_files(API_REPO_ID, revision=first.oid)

    old = AutoModelForSeq2SeqLM.from_pretrained(API_REPO_ID, revision=first.oid, trust_remote_code=True)
    new = AutoModelForSeq2SeqLM.from_pretrained(API_REPO_ID, revision="main", trust_remote_code=True)
    old_state, new_state = old.state_dict(), new.state_dict()
    assert old_state.keys() == new_state.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(old_state[key], tensor), key
        expected = tensor * 2.0 if key == name else tensor
        assert torch.equal(new_state[key], expected), key
    assert not torch.equal(old_state[name], new_state[name])


# --------------------------------------------------------------------------------------
# 5. datasets: push Multi30k, load it back, train on it
# --------------------------------------------------------------------------------------


def test_dataset_push_load_and_train(api, hub_server, tmp_path, monkeypatch):
    import datasets

    from scratch_transformer.data import load_translation_dataset

    # load_dataset(repo_id) without data_files would also ask the dataset viewer at datasets-server.<host>,
    # and, for every Hub dataset, HEAD https://s3.amazonaws.com/... to count a download (errors swallowed after
    # up to 3 s). Both leave the machine: switch them off (HF_UPDATE_DOWNLOAD_COUNTS=0 does the latter at import).
    monkeypatch.setattr(datasets.config, "USE_PARQUET_EXPORT", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False)
    local = load_translation_dataset(str(MULTI30K), "de", "en", splits=DATA_SPLITS, max_samples=DATA_CAPS)
    assert {split: len(ds) for split, ds in local.items()} == DATA_CAPS
    local.push_to_hub(DATASET_REPO_ID)
    files = api.list_repo_files(DATASET_REPO_ID, repo_type="dataset")
    for split in DATA_SPLITS:
        assert [f for f in files if f.startswith(f"data/{split}-") and f.endswith(".parquet")], (split, files)

    from_hub = load_translation_dataset(DATASET_REPO_ID, "de", "en", splits=DATA_SPLITS)
    assert list(from_hub) == DATA_SPLITS
    for split in DATA_SPLITS:
        assert from_hub[split].column_names == ["de", "en"]
        assert from_hub[split].to_dict() == local[split].to_dict(), split

    seen = len(hub_server.requests)
    output_dir = tmp_path / "from_hub_dataset"
    results = train_translation.main(common_flags(
        output_dir, dataset_name=DATASET_REPO_ID, validation_split="val", test_split="test_2016_flickr",
        max_train_samples=100, max_eval_samples=8, max_predict_samples=8, config_overrides=TINY, vocab_size=300,
        max_steps=3, warmup_steps=2, learning_rate=1e-3, num_beams=1, average_last_checkpoints=0,
        save_strategy="no", eval_strategy="no", per_device_train_batch_size=16,
    ))
    assert results["train_steps"] == 3
    assert results["dataset_id"] == DATASET_REPO_ID
    assert results["all_results"]["test_samples"] == 8
    assert "hub_commit" not in results
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "README.md").is_file()
    writes = [r for r in hub_server.requests[seen:]
              if any(part in r[2] for part in ("/commit/", "/api/repos/create", "/preupload/", "/_lfs/upload"))]
    assert writes == []  # no push (and no repo creation) without --push_to_hub


# --------------------------------------------------------------------------------------
# 6. failures
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["not a valid id!!", "a/b/c"])
def test_malformed_hub_id_fails_before_training(bad_id, hub_server, tmp_path, monkeypatch):
    import scratch_transformer.translation as translation

    def no_data_loading(*args, **kwargs):
        raise AssertionError("data was loaded although the hub id is malformed")

    monkeypatch.setattr(translation, "load_translation_dataset", no_data_loading)
    output_dir = tmp_path / "never_written"
    seen = len(hub_server.requests)
    with pytest.raises(ValueError) as excinfo:
        train_translation.main(common_flags(output_dir, dataset_name=MULTI30K, validation_split="val",
                                     test_split="test_2016_flickr", config_overrides=TINY, max_steps=2,
                                     push_to_hub=True, hub_model_id=bad_id))
    assert repr(bad_id) in str(excinfo.value) or bad_id in str(excinfo.value)
    assert not output_dir.exists()
    assert hub_server.requests[seen:] == []


def test_missing_repo_raises_a_clear_error(hub_server):
    from huggingface_hub.errors import RepositoryNotFoundError
    from transformers import AutoModelForSeq2SeqLM

    with pytest.raises(OSError) as excinfo:
        AutoModelForSeq2SeqLM.from_pretrained("user/does-not-exist", trust_remote_code=True)
    print(f"\nmissing repo: {type(excinfo.value).__name__}: {excinfo.value}")
    assert "user/does-not-exist" in str(excinfo.value)
    chain, error = [], excinfo.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, RepositoryNotFoundError) for e in chain), [type(e) for e in chain]


PUSH_DOWN_SCRIPT = '''
import importlib.util
import json
import sys
import time

# hub.py imports only huggingface_hub: load the file itself, so this process need not import torch
spec = importlib.util.spec_from_file_location("scratch_transformer_hub", sys.argv[1])
hub = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hub)
from huggingface_hub import constants

start = time.perf_counter()
try:
    hub.push_output_dir(sys.argv[2], "user/x")
except Exception as error:
    outcome = {"type": type(error).__name__, "message": str(error), "cause": type(error.__cause__).__name__}
else:
    outcome = {"type": None}
outcome.update(endpoint=constants.ENDPOINT, seconds=time.perf_counter() - start, outside=OUTSIDE)
print("RESULT " + json.dumps(outcome))
'''


def test_push_with_the_server_down_keeps_the_folder(pushed_run, tmp_path):
    output_dir, _ = pushed_run
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{closed_port}"
    assert endpoint != os.environ["HF_ENDPOINT"]
    hf_home = tmp_path / "hf_home_down"
    before = folder_digest(output_dir)
    result = run_python(PUSH_DOWN_SCRIPT, [REPO_ROOT / "scratch_transformer" / "hub.py", output_dir],
                        hf_subprocess_env(hf_home, HF_ENDPOINT=endpoint), tmp_path, timeout=120)
    print(f"\nserver down ({result['seconds']:.1f} s): {result['type']}: {result['message']}")
    assert result["endpoint"] == endpoint
    assert result["seconds"] < 60  # no endless retrying
    assert result["type"] == "RuntimeError", result
    assert endpoint in result["message"] and "user/x" in result["message"] and str(output_dir) in result["message"]
    assert result["outside"] == []
    assert folder_digest(output_dir) == before


# --------------------------------------------------------------------------------------
# 7. nothing left the machine (runs last)
# --------------------------------------------------------------------------------------


def test_no_request_left_loopback(hub_server, loopback_only):
    assert loopback_only == []
    hosts = {host.rsplit(":", 1)[0] for _, host, _ in hub_server.requests}
    assert hosts and hosts <= {"127.0.0.1", "localhost"}, hosts
    paths = {path for _, _, path in hub_server.requests}
    assert any(path.startswith("/api/models/user/pushtest-tiny") for path in paths)
    assert any("/datasets/user/pushtest-multi30k" in path or "/api/datasets/user/pushtest-multi30k" in path
               for path in paths)
