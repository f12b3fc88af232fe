"""Test settings. The HF clients read their endpoint at import time, so the environment for the
local Hub server (loopback HF_ENDPOINT, no Xet, a fresh HF_HOME) is set here, before any test
module imports an HF library."""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

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
