"""Quality side by side: our Transformer and transformers' MarianMTModel trained by the same main job.

Run from the repository root:
    python -m benchmarks.quality                              # both models, the config's 25-minute budget each
    python -m benchmarks.quality --max_train_minutes 1 --output_dir /tmp/quality_check
    python -m benchmarks.quality --report_only                # the table of the runs already in --output_dir
    python -m benchmarks.quality --only marian --max_steps 20 # flags it does not know go to both runs

Writes a MarianConfig folder with the settings of the anchor run (docs: shared/docs/multi30k-anchor.md: post-LN,
ReLU, scaled embeddings, one embedding for encoder, decoder and output layer, activation dropout 0, layerdrop 0,
positions for the longest sequence, no forced EOS, so that both models decode the same way) at ours' size
(the config's --config_overrides, or the one passed through), then runs
`scripts/train_translation.py configs/multi30k_de_en.json` twice with the same flags: as shipped (ours) and with `--config_name <that folder> --config_overrides "" --long_run_dropout 0` (Marian, whose dropout stays the anchor's throughout). Same data, tokenizer settings,
batches, learning-rate schedule, precision (auto) and training-time budget; the pipeline gives both models the
tokenizer's vocabulary size and special ids, and the decoder starts from bos in both.

The two runs take turns on the machine (`--interleave_seconds`, 60 by default): both start, and every 60 s of
wall time the running one is paused (SIGTSTP, which the job's training clock leaves out) and the other continued
(SIGCONT), so that the cores never run both at once and a host whose speed drifts over the hour gives both
models the same mix of fast and slow minutes. Run one after the other (`--interleave_seconds 0`), the two runs
are half an hour apart, and a host that slows between them moves the steps each reaches, and so the margin.

Interrupted (a crash, a reboot), the same command again resumes each run from its last checkpoint on the same
schedule (the training clock travels in the checkpoint); the logs are appended to, each start dated. A second
benchmark into the same --output_dir while the first still runs is refused (it holds a lock on the folder).

Prints one Markdown table (parameters, precision, steps, training seconds and seconds per step, validation
BLEU, test BLEU/chrF of each test set), read from each run's all_results.json and trainer_state.json, and
writes it with the raw figures to --output_json (default: <output_dir>/quality.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "scripts/train_translation.py"
CONFIG = "configs/multi30k_de_en.json"
SIDES = ("ours", "marian")
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
# The anchor's Marian (shared/docs/multi30k-anchor.md): its size and dropouts (--marian_size anchor, the default),
# and the rest, which --marian_size ours keeps while taking ours' size and dropouts.
MARIAN_ANCHOR_SIZE = {
    "d_model": 256, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_layers": 3,
    "decoder_layers": 3, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024, "dropout": 0.1, "attention_dropout": 0.1,
}
MARIAN_ANCHOR = {
    "activation_function": "relu", "activation_dropout": 0.0, "scale_embedding": True,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0, "forced_eos_token_id": None,
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                epilog="Any other flag (e.g. --max_steps 20 --precision fp32) is passed to both runs.")
    p.add_argument("--output_dir", default="outputs/quality",
                   help="one folder per model inside (ours/, marian/) and the Marian config (marian_config/)")
    p.add_argument("--max_train_minutes", type=float, default=None,
                   help="training-time budget of each run (default: the config's)")
    p.add_argument("--only", choices=SIDES, default=None, help="run one side only (the table shows what exists)")
    p.add_argument("--report_only", action="store_true", help="run nothing: the table of the existing run folders")
    p.add_argument("--config", default=CONFIG, help="the main job's config file")
    p.add_argument("--marian_size", choices=("anchor", "ours"), default="anchor",
                   help="Marian's size and dropouts: the anchor's (d_model 256, 4 heads, 3+3 layers, FFN 1024, "
                        "dropout 0.1; default) or ours' (from the config's or the passed --config_overrides)")
    p.add_argument("--interleave_seconds", type=float, default=60.0,
                   help="wall seconds each run has the machine before the other takes its turn (both runs paused "
                        "and continued in turn; default 60); 0: one run after the other")
    p.add_argument("--output_json", default=None, help="default: <output_dir>/quality.json")
    args, passthrough = p.parse_known_args(argv)
    refuse_benchmark_flags(p, passthrough)
    if args.max_train_minutes is not None and args.max_train_minutes <= 0:
        p.error("--max_train_minutes must be positive")
    if not 0 <= args.interleave_seconds < float("inf"):
        p.error(f"--interleave_seconds must be 0 (one run after the other) or positive, got {args.interleave_seconds}")
    if args.interleave_seconds > 0 and not hasattr(signal, "SIGTSTP"):
        p.error("--interleave_seconds needs POSIX job-control signals (SIGTSTP / SIGCONT); pass 0 on this system")
    args.passthrough = passthrough
    args.output_json = args.output_json or os.path.join(args.output_dir, "quality.json")
    return args


def refuse_benchmark_flags(parser: argparse.ArgumentParser, passthrough: list[str]) -> None:
    """Exit with a parser error if the flags for the job name one the benchmark sets for each run itself."""
    for flag in ("--output_dir", "--config_name", "--model_name_or_path"):
        if any(item == flag or item.startswith(flag + "=") for item in passthrough):
            parser.error(f"{flag} is set by the benchmark for each run; it cannot be passed through")


def _flag_value(flags: list[str], name: str) -> str | None:
    """The last value given to --name in a flag list (`--name value` or `--name=value`), or None."""
    value = None
    for index, item in enumerate(flags):
        if item == f"--{name}" and index + 1 < len(flags):
            value = flags[index + 1]
        elif item.startswith(f"--{name}="):
            value = item.split("=", 1)[1]
    return value


def marian_config_values(config_file: str, passthrough: list[str], size: str = "anchor") -> dict:
    """MarianConfig fields of the anchor's Marian: at the anchor's size (`size` "anchor"), or at ours' (`size`
    "ours": ours' overrides, passed through or else the config file's, resolved by our config class and mapped to
    Marian's names). Positions cover the longest source or target the run allows."""
    from scratch_transformer import ScratchTransformerConfig
    from scratch_transformer.translation import _parse_overrides

    with open(REPO_ROOT / config_file, encoding="utf-8") as handle:
        shipped = json.load(handle)
    overrides = _flag_value(passthrough, "config_overrides")
    ours = ScratchTransformerConfig(**_parse_overrides(shipped.get("config_overrides") if overrides is None
                                                       else overrides))
    if ours.pre_layer_norm:
        raise ValueError("ours is pre-LN here, Marian is post-LN: the comparison needs pre_layer_norm false")
    lengths = [int(_flag_value(passthrough, name) or shipped.get(name, 128))
               for name in ("max_source_length", "max_target_length")]
    if size == "anchor":
        return {**MARIAN_ANCHOR_SIZE, "max_position_embeddings": max(lengths), **MARIAN_ANCHOR}
    return {
        "d_model": ours.d_model, "encoder_attention_heads": ours.num_heads, "decoder_attention_heads": ours.num_heads,
        "encoder_layers": ours.encoder_layers, "decoder_layers": ours.decoder_layers,
        "encoder_ffn_dim": ours.d_ff, "decoder_ffn_dim": ours.d_ff, "dropout": ours.dropout,
        "attention_dropout": ours.attention_dropout, "max_position_embeddings": max(lengths), **MARIAN_ANCHOR,
    }


def write_marian_config(folder: str | Path, values: dict) -> Path:
    """A folder with the MarianConfig's config.json (vocabulary and special ids come from the run's tokenizer)."""
    from transformers import MarianConfig

    MarianConfig(**values).save_pretrained(folder)
    return Path(folder)


def run_command(args, side: str, marian_folder: Path | None) -> list[str]:
    command = [sys.executable, SCRIPT, args.config, "--output_dir", os.path.join(args.output_dir, side)]
    if args.max_train_minutes is not None:
        command += ["--max_train_minutes", f"{args.max_train_minutes:g}"]
    command += args.passthrough
    if side == "marian":  # the anchor's Marian: its config's dropout throughout (and its layers call F.dropout)
        command += ["--config_name", str(marian_folder), "--config_overrides", "", "--long_run_dropout", "0"]
    return command


def run_side(command: list[str], log_path: Path, log, tag: str = "quality") -> float:
    """Run one training job to the end, its output into log_path; returns its wall seconds. Progress lines go to
    `log`, prefixed with `[tag]` (the benchmark that runs the job).

    Raises:
        RuntimeError: the job failed (with the end of its log).
    """
    log(f"[{tag}] {shlex.join(command)}  (log: {log_path})")
    start = time.perf_counter()
    with _open_log(log_path, command) as handle:
        proc = subprocess.run(command, cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT, check=False,
                              env=dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"))
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"the run failed (exit {proc.returncode}) after {seconds:.0f} s; end of {log_path}:\n{tail}")
    log(f"[{tag}] done in {seconds:.0f} s")
    return seconds


def _open_log(log_path: Path, command: list[str]):
    """The job's log, opened for appending after a line that dates the start: rerun into the same --output_dir,
    an interrupted job resumes from its last checkpoint, and the log of its first part is kept above."""
    handle = open(log_path, "a", encoding="utf-8")
    handle.write(f"[{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC] {shlex.join(command)}\n")
    handle.flush()
    return handle


def _is_stopped(pid: int) -> bool:
    """Whether process pid is stopped (state T); False once it has exited."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:  # "pid (comm) state ...": comm may hold spaces
            return handle.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False  # gone
    except (OSError, IndexError):
        pass
    answer = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False)
    return answer.stdout.strip().startswith("T")


def run_interleaved(commands: dict[str, list[str]], log_paths: dict[str, Path], slice_seconds: float, log,
                    tag: str = "quality", stop_timeout: float = 120.0) -> dict[str, float]:
    """Run jobs in turns on one machine: each has it for `slice_seconds` of wall time, then is paused (SIGTSTP,
    which the training clock leaves out; WallClockBudgetCallback) and the next continued (SIGCONT), until all have
    ended. Never two run at once: the next starts only once the last is seen stopped.

    Returns:
        the wall seconds each job had the machine.

    Raises:
        RuntimeError: a job failed (with the end of its log; the others are killed, their checkpoints kept for a
            resume), or did not stop within stop_timeout seconds of its SIGTSTP.
    """
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    # Each job in a process group of its own, whose parent (this process) is in another group of the same
    # session: started from a background shell, the group would be orphaned and the kernel would drop SIGTSTP.
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    procs, handles, active_seconds = {}, {}, {}
    try:
        for name, command in commands.items():
            log(f"[{tag}] {shlex.join(command)}  (log: {log_paths[name]})")
            handles[name] = _open_log(log_paths[name], command)
            procs[name] = subprocess.Popen(command, cwd=REPO_ROOT, stdout=handles[name], stderr=subprocess.STDOUT,
                                           env=env, **group)
            active_seconds[name] = 0.0
            _pause(procs[name], stop_timeout)  # its start waits for its turn like the rest
        turn = list(procs)
        while turn:
            name = turn.pop(0)
            proc = procs[name]
            proc.send_signal(signal.SIGCONT)
            began = time.perf_counter()
            try:
                proc.wait(timeout=slice_seconds if turn else None)
            except subprocess.TimeoutExpired:
                _pause(proc, stop_timeout)
                active_seconds[name] += time.perf_counter() - began
                turn.append(name)
                continue
            active_seconds[name] += time.perf_counter() - began
            if proc.returncode != 0:
                tail = "".join(log_paths[name].read_text(encoding="utf-8", errors="replace")
                               .splitlines(keepends=True)[-30:])
                raise RuntimeError(f"the {name} run failed (exit {proc.returncode}); end of {log_paths[name]}:\n{tail}")
            log(f"[{tag}] {name} done after {active_seconds[name]:.0f} s of its turns")
        return active_seconds
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # an error or an interruption: SIGKILL ends a stopped process too
                proc.kill()
                proc.wait()
        for handle in handles.values():
            handle.close()


def _pause(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTSTP to proc, then wait until it is stopped (or has exited).

    Raises:
        RuntimeError: it was still running after timeout seconds.
    """
    proc.send_signal(signal.SIGTSTP)
    deadline = time.perf_counter() + timeout
    while proc.poll() is None and not _is_stopped(proc.pid):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"process {proc.pid} did not stop within {timeout:g} s of SIGTSTP")
        time.sleep(0.01)


def read_run(folder: str | Path) -> dict | None:
    """The figures of a finished run folder (all_results.json, trainer_state.json), or None without one.

    Training seconds are the training-time clock (evaluation excluded) that the budget callback saves in
    trainer_state.json; without a budget, the Trainer's train_runtime (evaluation included).
    """
    folder = Path(folder)
    results_path, state_path = folder / "all_results.json", folder / "trainer_state.json"
    if not results_path.is_file():
        return None
    results = json.loads(results_path.read_text(encoding="utf-8"))
    state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
    budget = (state.get("stateful_callbacks") or {}).get("WallClockBudgetCallback")
    budget = budget[-1] if isinstance(budget, list) else budget
    seconds = budget["attributes"]["training_seconds"] if budget else results.get("train_runtime")
    steps = state.get("global_step")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if (folder / "config.json").is_file() \
        else {}
    return {
        "folder": str(folder), "model_type": config.get("model_type"),
        "architecture": (config.get("architectures") or [None])[0],
        "num_parameters": results.get("num_parameters"),
        "num_parameters_with_frozen": results.get("num_parameters_with_frozen"),
        "precision": results.get("precision"), "steps": steps, "training_seconds": seconds,
        "seconds_per_step": seconds / steps if seconds is not None and steps else None,
        "epochs": results.get("epoch"), "train_loss": results.get("train_loss"),
        "eval_bleu": results.get("eval_bleu"), "eval_chrf": results.get("eval_chrf"),
        "averaged_checkpoints": results.get("averaged_checkpoints"), "final_dropout": results.get("final_dropout"),
        "projected_epochs": results.get("projected_epochs"),
        "test_sets": {split: {"bleu": scores["bleu"], "chrf": scores["chrf"]}
                      for split, scores in (results.get("test_sets") or {}).items()},
    }


def machine() -> dict:
    from benchmarks.report import cpu_model
    from scratch_transformer.training import native_bf16_cpu

    native, evidence = native_bf16_cpu()
    return {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "native_bf16": native, "bf16_evidence": evidence}


def git_commit() -> str:
    def git(*command):
        return subprocess.run(["git", *command], cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(result: dict) -> str:
    m = result["machine"]
    splits = list(dict.fromkeys([*TEST_SETS, *(s for run in result["runs"].values() if run for s in run["test_sets"])]))
    lines = [
        f"## Quality side by side: ours and Marian, Multi30k {result['languages']}",
        "",
        (f"CPU {m['cpu_model']} ({m['logical_cpus']} logical CPUs), native bf16: "
         f"{'yes' if m['native_bf16'] else 'no'} ({m['bf16_evidence']}); {result['date']}, commit {result['commit']}; "
         f"budget {result['budget']}; test decoding: beam {result['num_beams']}."),
        "",
        "| model | parameters (with frozen) | precision | steps | training s | s/step | val BLEU | "
        + " | ".join(f"{split} BLEU / chrF" for split in splits) + " |",
        "|---|---:|---|---:|---:|---:|---:|" + "---:|" * len(splits),
    ]
    for side, run in result["runs"].items():
        if run is None:
            lines.append(f"| {side} | not run |" + " |" * (6 + len(splits)))
            continue
        scores = [run["test_sets"].get(split) for split in splits]
        lines.append(
            f"| {side} ({run['architecture']}) | {_number(run['num_parameters'], ',')} "
            f"({_number(run['num_parameters_with_frozen'], ',')}) | {run['precision'] or '-'} | {_number(run['steps'], 'd')} "
            f"| {_number(run['training_seconds'], '.0f')} | {_number(run['seconds_per_step'], '.3f')} "
            f"| {_number(run['eval_bleu'], '.2f')} | "
            + " | ".join("-" if s is None else f"{s['bleu']:.2f} / {s['chrf']:.2f}" for s in scores) + " |")
    dropouts = [f"{side} {run['final_dropout']:g}" + (f" ({run['projected_epochs']:g} epochs projected)"
                                                     if run.get("projected_epochs") is not None else "")
                for side, run in result["runs"].items() if run and run.get("final_dropout") is not None]
    if dropouts:
        lines += ["", "Dropout at the end of training (long-run dropout): " + ", ".join(dropouts) + "."]
    if result.get("passthrough"):
        lines += ["", f"Flags passed to both runs: `{shlex.join(result['passthrough'])}`."]
        if _flag_value(result["passthrough"], "config_overrides") is not None:
            lines[-1] += (" `--config_overrides` shapes ours only: Marian's run overrides it with an empty one and "
                          f"takes its own config folder (`--marian_size {result.get('marian_size', 'anchor')}`).")
    if result.get("interleave_seconds"):
        lines += ["", (f"The runs took turns on the machine, {result['interleave_seconds']:g} s of wall time each "
                       "(paused and continued; the training time leaves the pauses out).")]
    lines += ["", ("Training seconds exclude evaluation. Parameters: trainable, each shared tensor once; in brackets "
                   "with the frozen ones (Marian's sinusoidal position tables are frozen parameters, ours a buffer).")]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    out = Path(args.output_dir)
    with open(REPO_ROOT / args.config, encoding="utf-8") as handle:
        shipped = json.load(handle)
    sides = [args.only] if args.only else list(SIDES)
    from scratch_transformer.checkpoints import lock_output_dir, unlock_output_dir

    # held until the table is written (each run also locks its own folder); released (and its file removed) however
    # main ends
    lock = None if args.report_only else lock_output_dir(str(out))
    try:
        return _train_and_report(args, argv, out, shipped, sides, log)
    finally:
        unlock_output_dir(lock)


def _train_and_report(args, argv, out: Path, shipped: dict, sides: list[str], log) -> dict:
    """main's work once it holds the output folder: the runs (unless --report_only), then the table."""
    commands, wall = {}, {}
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)  # after the lock: a refused benchmark leaves no folder behind
        marian_folder = None
        if "marian" in sides:
            marian_folder = write_marian_config(out / "marian_config",
                                                marian_config_values(args.config, args.passthrough, args.marian_size))
        commands = {side: run_command(args, side, marian_folder) for side in sides}
        if args.interleave_seconds > 0 and len(sides) > 1:  # in turns: never two runs sharing the cores
            wall = run_interleaved(commands, {side: out / f"{side}.log" for side in sides}, args.interleave_seconds,
                                   log)
        else:
            for side in sides:  # one after the other
                wall[side] = run_side(commands[side], out / f"{side}.log", log)

    runs = {side: read_run(out / side) for side in SIDES}
    for side, run in runs.items():
        if run is not None:
            run["wall_seconds"] = wall.get(side)
            run["command"] = shlex.join(commands[side]) if side in commands else None
    minutes = args.max_train_minutes if args.max_train_minutes is not None else shipped.get("max_train_minutes")
    budget_steps = _flag_value(args.passthrough, "max_steps") or shipped.get("max_steps")
    result = {
        "command": shlex.join([sys.executable, "-m", "benchmarks.quality", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "machine": machine(),
        "languages": f"{shipped.get('source_lang')}->{shipped.get('target_lang')}",
        "budget": f"{minutes:g} min of training (or {budget_steps} steps)" if minutes else f"{budget_steps} steps",
        "num_beams": _flag_value(args.passthrough, "num_beams") or shipped.get("num_beams"),
        "passthrough": args.passthrough,
        "marian_size": args.marian_size,
        "interleave_seconds": args.interleave_seconds if len(commands) > 1 else None,
        "runs": runs,
    }
    result["table"] = markdown_table(result)
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(result["table"])
    log(f"[quality] wrote {args.output_json}")
    return result


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError, OSError) as error:
        sys.exit(f"python -m benchmarks.quality: error: {error}")
