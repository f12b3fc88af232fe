"""Helpers shared by the test modules (fixtures live in conftest.py): the training script and the flags of
tiny runs, subprocess environments, folder snapshots, and the pieces of the remote-code processes (a guard
that refuses any traffic leaving the machine, a header that makes this package unimportable)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import MULTI30K, REPO_ROOT, load_script

from scratch_transformer.checkpoints import is_complete_checkpoint

train_translation = load_script("train_translation")

TINY = "d_model=64,num_heads=4,encoder_layers=2,decoder_layers=2,d_ff=128,dropout=0.0"
HF_VARS = ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY", "NO_PROXY", "no_proxy")


def common_flags(output_dir, **extra):
    """Command-line flags of a small, quiet, seeded fp32 run into output_dir; `extra` adds or replaces flags."""
    flags = {
        "output_dir": str(output_dir), "per_device_train_batch_size": 32, "per_device_eval_batch_size": 64,
        "logging_steps": 5, "save_steps": 20, "save_total_limit": 3, "seed": 0, "disable_tqdm": True,
        "max_source_length": 40, "max_target_length": 40, "dataloader_num_workers": 0, "report_to": "none",
    }
    if not {"bf16", "fp16", "precision"} & set(extra):
        flags["precision"] = "fp32"  # the same on every machine (auto would pick bf16 where the CPU has it)
    flags.update(extra)
    argv = []
    for key, value in flags.items():
        argv += [f"--{key}", str(value)]
    return argv


def tiny_run_flags(output_dir, **extra):
    """Flags of a 2-step run of a tiny model; `extra` adds or replaces flags, a value of None drops one."""
    values = {"dataset_name": MULTI30K, "validation_split": "val", "test_split": "test_2016_flickr",
              "max_train_samples": 64, "max_eval_samples": 8, "max_predict_samples": 8, "config_overrides": TINY,
              "vocab_size": 300, "max_steps": 2, "average_last_checkpoints": 0, **extra}
    return common_flags(output_dir, **{key: value for key, value in values.items() if value is not None})


def steps_of_known_length(monkeypatch, seconds_per_step: float) -> list[float]:
    """Make the training-time budget's clock advance by exactly `seconds_per_step` at each training step and by
    nothing else (evaluation, saving, logging, the machine's speed), so that a budget run makes a known number of
    steps: ceil(budget / seconds_per_step); evaluation takes none of it. Returns the clock, a one-element list of seconds."""
    from scratch_transformer.training import WallClockBudgetCallback

    now = [1000.0]

    def step_begins(self, args, state, control, **kwargs):
        now[0] += seconds_per_step

    monkeypatch.setattr(WallClockBudgetCallback, "clock", staticmethod(lambda: now[0]))
    monkeypatch.setattr(WallClockBudgetCallback, "on_step_begin", step_begins)
    # evaluation takes no time on this clock, so its eval_runtime (real seconds) must not be left out of it
    monkeypatch.setattr(WallClockBudgetCallback, "on_evaluate", lambda self, *args, **kwargs: None)
    return now


STEPS_OF_KNOWN_LENGTH = """
import runpy, sys
from scratch_transformer.training import WallClockBudgetCallback

seconds, now = float(sys.argv.pop(1)), [1000.0]  # each training step takes `seconds` on the budget's clock
WallClockBudgetCallback.clock = staticmethod(lambda: now[0])
WallClockBudgetCallback.on_step_begin = lambda self, *args, **kwargs: now.__setitem__(0, now[0] + seconds)
WallClockBudgetCallback.on_evaluate = lambda self, *args, **kwargs: None  # the clock stood still: nothing to leave out
sys.argv.pop(0)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def steps_of_known_length_script(folder: Path, seconds_per_step: float, script: Path) -> list[str]:
    """The arguments that run `script` (then its own arguments) in a process, launcher or not, whose budget clock
    advances `seconds_per_step` a training step and nothing else, as `steps_of_known_length` does in this one."""
    wrapper = Path(folder) / "steps_of_known_length.py"
    wrapper.write_text(STEPS_OF_KNOWN_LENGTH, encoding="utf-8")
    return [str(wrapper), str(seconds_per_step), str(script)]


def subprocess_env(**extra):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def kill_at_checkpoint(argv: list[str], checkpoint: Path, log_path: Path, timeout: float = 300) -> None:
    """Run train_translation.py with argv in a subprocess (output into log_path) and SIGKILL it as soon as
    `checkpoint` is complete on disk. Fails the test when the run ends first or no such checkpoint appears
    within `timeout` seconds."""
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "train_translation.py"), *argv],
                                   cwd=REPO_ROOT, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and not is_complete_checkpoint(checkpoint):
                assert time.monotonic() < deadline, f"no {checkpoint.name} after {timeout:g} s"
                time.sleep(0.005)
            running = process.poll() is None
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
    assert running, "the run ended before it could be killed:\n" + log_path.read_text()[-3000:]


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- processes that load the model as remote code

# A guard against any traffic that would leave the machine (exec'ed in the test process and prepended to
# every remote-code script).
GUARD_SOURCE = '''
import ipaddress as _ipaddress
import socket as _socket
import traceback as _traceback

OUTSIDE = []
_real_connect = _socket.socket.connect
_real_getaddrinfo = _socket.getaddrinfo


def _is_loopback(host):
    if isinstance(host, bytes):
        host = host.decode()
    if host is None or host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return _ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _caller():
    """Where the attempt came from (the innermost frames outside the socket module), for the failure message."""
    frames = [f for f in _traceback.extract_stack()[:-2] if not f.filename.endswith("socket.py")]
    return " <- ".join(f"{f.filename}:{f.lineno}" for f in frames[-6:][::-1])


def _guarded_connect(self, address):
    if self.family in (_socket.AF_INET, _socket.AF_INET6) and not _is_loopback(address[0]):
        OUTSIDE.append(["connect", str(address[0]), _caller()])
        raise OSError(f"test guard: connection to non-loopback address {address} refused")
    return _real_connect(self, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    if not _is_loopback(host):
        OUTSIDE.append(["getaddrinfo", str(host), _caller()])
        raise _socket.gaierror(f"test guard: name lookup of non-loopback host {host!r} refused")
    return _real_getaddrinfo(host, *args, **kwargs)


def install_guard():
    _socket.socket.connect = _guarded_connect
    _socket.getaddrinfo = _guarded_getaddrinfo


def remove_guard():
    _socket.socket.connect = _real_connect
    _socket.getaddrinfo = _real_getaddrinfo
'''

# The head of every remote-code script: a meta-path finder and a sys.path filter make scratch_transformer
# unimportable however it is installed; it reads repo_root, repo_id, sentences, pipeline_sentence from argv[1:5].
BLOCKED_PREFIX = '''import json
import os
import sys


class BlockScratchTransformer:
    """A meta-path finder that makes this package unimportable, however it is installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "scratch_transformer" or name.startswith("scratch_transformer."):
            raise ImportError(f"{name} is blocked in this process")
        return None


repo_root, repo_id, sentences, pipeline_sentence = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
sys.meta_path.insert(0, BlockScratchTransformer())
sys.path[:] = [p for p in sys.path if p not in ("", ".") and os.path.realpath(p) != os.path.realpath(repo_root)]
'''


def hf_subprocess_env(hf_home: Path, **overrides) -> dict:
    """A minimal environment: PATH and the HF_* variables of this process, a new HF_HOME, no PYTHONPATH."""
    env = {name: os.environ[name] for name in ("PATH", "HOME", "TMPDIR", "LANG") if name in os.environ}
    env.update({name: os.environ[name] for name in HF_VARS if name in os.environ})
    env.update(HF_HOME=str(hf_home), OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8", TOKENIZERS_PARALLELISM="false")
    env.update(overrides)
    return env


def run_python(script: str, args: list, env: dict, cwd: Path, timeout: float = 300) -> dict:
    """Run a script (with the loopback guard prepended) in a fresh interpreter; returns its RESULT json."""
    path = Path(cwd) / "script.py"
    path.write_text(GUARD_SOURCE + "\ninstall_guard()\n" + textwrap.dedent(script), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(path), *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


import torch  # noqa: E402

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration  # noqa: E402

TINY_LM_VOCAB = 40


def make_tiny_lm(**overrides):
    """A seeded 2+2-layer model of width 32 in eval mode (dropout 0), config fields overridden by `overrides`."""
    values = dict(vocab_size=TINY_LM_VOCAB, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64,
                  dropout=0.0, max_position_embeddings=64, init_std=0.3)
    values.update(overrides)
    torch.manual_seed(0)
    return ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(**values)).eval()


def make_tiny_lm_inputs():
    """Source ids (3, 9) right-padded to lengths 9, 6 and 3, their mask, and decoder ids (3, 7)."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, TINY_LM_VOCAB, (3, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    decoder_input_ids = torch.randint(3, TINY_LM_VOCAB, (3, 7), generator=g)
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask, decoder_input_ids
