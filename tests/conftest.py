"""Test settings. The HF clients read their endpoint at import time, so the environment for the
local Hub server (loopback HF_ENDPOINT, no Xet, a fresh HF_HOME) is set here, before any test
module imports an HF library."""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from hub_fixtures import configure_hf_env  # noqa: E402  (imports nothing from HF)

_ROOT = Path(tempfile.mkdtemp(prefix="scratch_transformer_tests_"))
configure_hf_env(_ROOT)

from hub_fixtures import hub_server  # noqa: E402,F401  (session fixture)

REPO_ROOT = Path(__file__).resolve().parent.parent
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k" / "raw"


def load_script(name: str):
    """Import scripts/<name>.py as a module (scripts/ is not a package); registered in sys.modules so that
    dataclasses defined there pickle (Trainer saves TrainingArguments) and every test shares one copy."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def torch_threads_restored():
    """Give torch its thread count back after each test module: a module that sets 1 thread for bit-identical
    reductions (test_batching) once left it at 1 for every later module, and a seeded training test there learnt
    less than on the machine's cores."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def sigtstp_restored():
    """Give SIGTSTP its disposition back after each test: a training-time budget started in this process (a
    test that never calls on_train_end) handles it, and a later budget would leave a handler it did not set."""
    import signal

    if not hasattr(signal, "SIGTSTP"):
        yield
        return
    handler = signal.getsignal(signal.SIGTSTP)
    yield
    signal.signal(signal.SIGTSTP, handler)


TINY_SENTENCES = ["Ein Hund läuft über die Wiese.", "A dog runs across the meadow.", "Zwei Männer spielen Fußball.",
                  "Two men are playing football.", "Eine Frau sitzt auf einer Bank.", "A woman sits on a bench."]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A folder as a training run leaves it, in seconds: a tiny untrained model (code files and auto_map
    beside the weights, greedy, at most 12 tokens) and a BPE tokenizer trained on TINY_SENTENCES."""
    import torch

    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
    from scratch_transformer.tokenization import train_tokenizer

    folder = tmp_path_factory.mktemp("tiny_model")
    tokenizer = train_tokenizer(TINY_SENTENCES * 3, vocab_size=300, min_frequency=1, model_max_length=64)
    config = ScratchTransformerConfig(vocab_size=len(tokenizer), d_model=16, num_heads=2, encoder_layers=1,
                                      decoder_layers=1, d_ff=32, dropout=0.0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(config).eval()
    model.generation_config.max_length = 12
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
