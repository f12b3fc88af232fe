"""benchmarks/quality.py and a model of another architecture (transformers' Marian) in the main job: a Marian
config through `_build_model` at the shipped size, a refused override, the table read back from run folders,
and (slow) both sides end to end on tiny data."""

import json
import time
import types
from pathlib import Path

import pytest
from conftest import MULTI30K, REPO_ROOT
from helpers import TINY, tiny_run_flags, train_translation

from benchmarks import quality
from scratch_transformer.training import count_parameters
from scratch_transformer.translation import _build_model

SHIPPED = json.loads((REPO_ROOT / quality.CONFIG).read_text())


def model_args(**values):
    defaults = {"model_name_or_path": None, "config_name": None, "config_overrides": None,
                "attn_implementation": "eager", "trust_remote_code": False}
    return types.SimpleNamespace(**{**defaults, **values})


@pytest.fixture(scope="module")
def multi30k_tokenizer():
    """The main job's tokenizer: joint BPE of 8000 tokens on Multi30k's training split (about 3 s)."""
    from scratch_transformer.data import load_translation_dataset
    from scratch_transformer.tokenization import train_tokenizer

    train = load_translation_dataset(str(MULTI30K), "de", "en", splits=["train"])["train"]
    return train_tokenizer(list(train["de"]) + list(train["en"]), vocab_size=SHIPPED["vocab_size"],
                           min_frequency=2, model_max_length=128)


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
    return quality.write_marian_config(tmp_path_factory.mktemp("marian_config"),
                                       quality.marian_config_values(quality.CONFIG, []))


def test_marian_config_gets_the_tokenizer_and_the_anchor_size(marian_folder, multi30k_tokenizer):
    tok = multi30k_tokenizer
    model = _build_model(model_args(config_name=str(marian_folder), config_overrides=""), tok)
    config = model.config
    assert type(model).__name__ == "MarianMTModel"
    assert len(tok) == 8000
    assert (config.vocab_size, config.decoder_vocab_size) == (len(tok), len(tok))
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (tok.pad_token_id, tok.bos_token_id,
                                                                               tok.eos_token_id) == (0, 1, 2)
    assert config.decoder_start_token_id == tok.bos_token_id  # both models start decoding from bos
    assert config.forced_eos_token_id is None and model.generation_config.forced_eos_token_id is None
    assert tuple(model.final_logits_bias.shape) == (1, len(tok))
    # the anchor's settings (shared/docs/multi30k-anchor.md) at the shipped size
    assert (config.d_model, config.encoder_attention_heads, config.decoder_attention_heads, config.encoder_layers,
            config.decoder_layers, config.encoder_ffn_dim, config.decoder_ffn_dim) == (256, 4, 4, 3, 3, 1024, 1024)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.1, 0.0)
    assert (config.encoder_layerdrop, config.decoder_layerdrop) == (0.0, 0.0)
    assert config.activation_function == "relu" and config.scale_embedding and config.share_encoder_decoder_embeddings
    assert config.max_position_embeddings == 128 and config._attn_implementation == "eager"
    assert model.lm_head.weight is model.model.shared.weight is model.model.encoder.embed_tokens.weight
    # 7.64 M as in the anchor, counting Marian's frozen sinusoid tables (2 x 128 x 256); trainable, ours' 7.58 M
    assert count_parameters(model, trainable_only=False) == 7_643_136
    assert count_parameters(model) == 7_577_600
    ours = _build_model(model_args(config_overrides=SHIPPED["config_overrides"]), tok)
    assert type(ours).__name__ == "ScratchTransformerForConditionalGeneration"
    assert count_parameters(ours) == count_parameters(ours, trainable_only=False) == 7_577_600


def test_marian_keeps_the_anchors_size_unless_asked_for_ours():
    """Ours may change its shape (the recipe study's lever); Marian stays the anchor's model by default."""
    wide = ["--config_overrides", "d_model=320,num_heads=4,encoder_layers=2,decoder_layers=2,d_ff=1280,dropout=0.2"]
    shape = ("d_model", "encoder_attention_heads", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "dropout")
    anchor = quality.marian_config_values(quality.CONFIG, wide)
    assert tuple(anchor[k] for k in shape) == (256, 4, 3, 3, 1024, 0.1)
    assert anchor["attention_dropout"] == 0.1 and anchor["max_position_embeddings"] == 128
    matched = quality.marian_config_values(quality.CONFIG, wide, size="ours")
    assert tuple(matched[k] for k in shape) == (320, 4, 2, 2, 1280, 0.2)
    assert quality.parse_args(["--marian_size", "ours"]).marian_size == "ours"
    assert quality.parse_args([]).marian_size == "anchor"


def test_marians_run_keeps_the_anchors_dropout_throughout():
    """Ours may raise its dropout for a long run (--long_run_dropout, in the config or passed through); Marian's run
    turns it off (the anchor trains at dropout 0.1 throughout), and the flag comes after the passed ones, so it wins."""
    args = quality.parse_args(["--long_run_dropout", "0.3", "--max_steps", "2"])
    ours, marian = quality.run_command(args, "ours", None), quality.run_command(args, "marian", Path("m"))
    assert ours[ours.index("--long_run_dropout") + 1] == "0.3" and ours.count("--long_run_dropout") == 1
    flag = len(marian) - 1 - marian[::-1].index("--long_run_dropout")
    assert marian[flag + 1] == "0" and flag > marian.index("--max_steps")
    assert marian[marian.index("--config_name") + 1] == "m"


def test_long_run_dropout_for_marian_is_refused_before_anything_is_written(marian_folder, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="MarianMTModel has none"):
        train_translation.main(tiny_run_flags(out, config_name=marian_folder, config_overrides="",
                                              long_run_dropout=0.3, max_steps=2))
    assert not out.exists()


def test_a_forced_eos_in_the_config_becomes_the_tokenizers_eos(marian_folder, multi30k_tokenizer):
    model = _build_model(model_args(config_name=str(marian_folder),
                                    config_overrides="forced_eos_token_id=0,encoder_layers=1"), multi30k_tokenizer)
    assert model.config.forced_eos_token_id == multi30k_tokenizer.eos_token_id == 2
    assert model.generation_config.forced_eos_token_id == 2
    assert model.config.encoder_layers == 1 and len(model.model.encoder.layers) == 1


def test_overrides_naming_a_field_the_marian_config_lacks_are_refused(marian_folder, multi30k_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"unknown config field 'num_heads' for MarianConfig \(model_type "
                                         r"'marian'\); did you mean 'num_attention_heads'"):
        _build_model(model_args(config_name=str(marian_folder), config_overrides="d_model=64,num_heads=4"),
                     multi30k_tokenizer)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="unknown config field 'd_ff' for MarianConfig"):
        train_translation.main(tiny_run_flags(out, config_name=marian_folder, config_overrides="d_ff=64"))
    assert not out.exists()  # refused before anything was written


def test_too_few_positions_for_the_lengths_are_refused(marian_folder, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"128 positions \(max_position_embeddings\).*allow 200 tokens"):
        train_translation.main(tiny_run_flags(out, config_name=marian_folder, config_overrides="",
                                              max_source_length=200))
    assert not out.exists()


def write_run(folder, model_type, steps, seconds, bleu, **extra):
    """A finished run folder as the main job leaves it (the files the table reads)."""
    folder.mkdir(parents=True)
    results = {"num_parameters": 1000 + steps, "num_parameters_with_frozen": 2000 + steps, "precision": "bf16",
               "eval_bleu": bleu, "test_sets": {split: {"bleu": bleu + i, "chrf": 50.0 + i, "sentences": 10}
                                                for i, split in enumerate(quality.TEST_SETS)}, **extra}
    state = {"global_step": steps, "stateful_callbacks": {"WallClockBudgetCallback": {
        "args": {"max_minutes": 1.0}, "attributes": {"training_seconds": seconds}}}}
    (folder / "all_results.json").write_text(json.dumps(results))
    (folder / "trainer_state.json").write_text(json.dumps(state))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [f"{model_type}_cls"]}))


def test_report_only_reads_the_run_folders(tmp_path, capsys):
    write_run(tmp_path / "ours", "scratch_transformer", 100, 50.0, 30.0)
    write_run(tmp_path / "marian", "marian", 80, 60.0, 28.5)
    result = quality.main(["--report_only", "--output_dir", str(tmp_path)])
    ours, marian = result["runs"]["ours"], result["runs"]["marian"]
    assert (ours["steps"], ours["training_seconds"], ours["seconds_per_step"]) == (100, 50.0, 0.5)
    assert (marian["steps"], marian["seconds_per_step"], marian["eval_bleu"]) == (80, 0.75, 28.5)
    assert marian["test_sets"]["test_2017_mscoco"] == {"bleu": 30.5, "chrf": 52.0}
    printed = capsys.readouterr().out
    assert "| ours (scratch_transformer_cls) | 1,100 (2,100) | bf16 | 100 | 50 | 0.500 | 30.00 | 30.00 / 50.00 | " \
           "31.00 / 51.00 | 32.00 / 52.00 |" in printed
    assert "| marian (marian_cls) | 1,080 (2,080) | bf16 | 80 | 60 | 0.750 | 28.50 | 28.50 / 50.00 |" in printed
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["table"] == printed.strip() and saved["runs"]["marian"]["steps"] == 80


def test_the_table_says_which_dropout_each_side_ended_with(tmp_path):
    write_run(tmp_path / "ours", "scratch_transformer", 100, 50.0, 30.0, long_run_dropout=0.2, final_dropout=0.2,
              projected_epochs=17.46)
    write_run(tmp_path / "marian", "marian", 80, 60.0, 28.5)
    result = quality.main(["--report_only", "--output_dir", str(tmp_path)])
    assert result["runs"]["ours"]["projected_epochs"] == 17.46 and result["runs"]["marian"]["final_dropout"] is None
    assert "Dropout at the end of training (long-run dropout): ours 0.2 (17.46 epochs projected)." \
        in result["table"]


def test_the_table_says_config_overrides_shape_ours_only(tmp_path, capsys):
    write_run(tmp_path / "ours", "scratch_transformer", 100, 50.0, 30.0)
    write_run(tmp_path / "marian", "marian", 80, 60.0, 28.5)
    plain = quality.main(["--report_only", "--output_dir", str(tmp_path), "--seed", "7"])["table"]
    assert "Flags passed to both runs: `--seed 7`." in plain and "shapes ours only" not in plain
    shaped = quality.main(["--report_only", "--output_dir", str(tmp_path), "--config_overrides", "d_model=320",
                           "--marian_size", "ours"])["table"]
    assert ("Flags passed to both runs: `--config_overrides d_model=320`. `--config_overrides` shapes ours only"
            in shaped)
    assert "(`--marian_size ours`)" in shaped


def test_flags_the_benchmark_sets_cannot_be_passed_through(capsys):
    with pytest.raises(SystemExit):
        quality.parse_args(["--max_steps", "2", "--config_name", "x"])
    assert "--config_name is set by the benchmark" in capsys.readouterr().err


def passthrough_flags(**extra):
    """The flags of a tiny run for both sides (the benchmark sets --output_dir and, for Marian, --config_name)."""
    flags = tiny_run_flags("unused", test_split=",".join(quality.TEST_SETS), **extra)
    index = flags.index("--output_dir")
    return flags[:index] + flags[index + 2:]


@pytest.mark.slow
def test_both_sides_end_to_end_table_equals_the_runs_results(tmp_path, capsys):
    """Both models through the main job (2 steps, tiny model and data, checkpoints averaged): the table's figures
    are the runs' all_results.json / trainer_state.json values. About a minute."""
    flags = passthrough_flags(config_overrides=TINY + ",share_encoder_decoder_embeddings=true", save_steps=1,
                              average_last_checkpoints=2)
    result = quality.main(["--output_dir", str(tmp_path), "--max_train_minutes", "1", *flags])
    printed = capsys.readouterr().out
    marian_config = json.loads((tmp_path / "marian_config" / "config.json").read_text())
    assert (marian_config["d_model"], marian_config["encoder_ffn_dim"], marian_config["max_position_embeddings"]) == \
           (64, 128, 40)
    for side, architecture in (("ours", "ScratchTransformerForConditionalGeneration"), ("marian", "MarianMTModel")):
        folder = tmp_path / side
        results = json.loads((folder / "all_results.json").read_text())
        state = json.loads((folder / "trainer_state.json").read_text())
        run = result["runs"][side]
        assert run["architecture"] == architecture and run["steps"] == state["global_step"] == 2
        assert run["num_parameters"] == results["num_parameters"] and run["precision"] == results["precision"] == "fp32"
        assert run["training_seconds"] == state["stateful_callbacks"]["WallClockBudgetCallback"]["attributes"][
            "training_seconds"]
        assert run["eval_bleu"] == results["eval_bleu"]
        assert run["test_sets"] == {split: {"bleu": s["bleu"], "chrf": s["chrf"]}
                                    for split, s in results["test_sets"].items()}
        assert set(run["test_sets"]) == set(quality.TEST_SETS) and results["test_sets"]["test_2017_mscoco"][
            "sentences"] == 8
        assert "averaged_checkpoints" in results  # the averaging step ran on both models
        row = next(line for line in printed.splitlines() if line.startswith(f"| {side} ("))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1].startswith(f"{results['num_parameters']:,} (") and cells[3] == "2"
        assert cells[6] == f"{results['eval_bleu']:.2f}"
        assert cells[7:] == [f"{results['test_sets'][s]['bleu']:.2f} / {results['test_sets'][s]['chrf']:.2f}"
                             for s in quality.TEST_SETS]
        assert (folder / "README.md").is_file() and (folder / "model.safetensors").is_file()
    # the same sizes: one shared embedding each; Marian adds only its frozen position tables (2 x 40 x 64)
    ours, marian = result["runs"]["ours"], result["runs"]["marian"]
    assert ours["num_parameters"] == marian["num_parameters"]
    assert marian["num_parameters_with_frozen"] - marian["num_parameters"] == 2 * 40 * 64
    card = (tmp_path / "marian" / "README.md").read_text()
    assert "custom_code" not in card and "| 64 | 4 | 2 + 2 | 128 |" in card


WORKER = """
import sys, time
# busy for `seconds` of its own running time, writing the wall clock every 10 ms while it runs
seconds, out = float(sys.argv[1]), open(sys.argv[2], "w")
done, last = 0.0, time.monotonic()
while done < seconds:
    time.sleep(0.01)
    now = time.monotonic()
    done += min(now - last, 0.05)  # a gap while stopped is not running time
    last = now
    out.write(f"{time.time()}\\n")
    out.flush()
sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTSTP"), reason="needs POSIX job control")
def test_interleaved_jobs_take_turns_and_never_run_at_once(tmp_path):
    """Two jobs of about 1.2 s each in turns of 0.3 s: both finish, and their running times do not overlap (two
    jobs running at once would interleave their clock readings every 10 ms, hundreds of switches)."""
    import sys

    commands = {name: [sys.executable, "-c", WORKER, "1.2", str(tmp_path / f"{name}.times")] for name in ("a", "b")}
    logs = {name: tmp_path / f"{name}.log" for name in commands}
    began = time.monotonic()
    active = quality.run_interleaved(commands, logs, 0.3, lambda msg: None)
    turns = (time.monotonic() - began) / 0.3  # more on a slow machine: the jobs' 1.2 s take longer there
    readings = sorted([(float(t), name) for name in commands
                       for t in (tmp_path / f"{name}.times").read_text().split()])
    switches = sum(1 for (_, x), (_, y) in zip(readings, readings[1:]) if x != y)
    assert {name for _, name in readings} == {"a", "b"}
    assert 3 <= switches <= turns + 2, (switches, turns)  # one switch a turn at most, plus start-up
    assert all(seconds >= 1.0 for seconds in active.values())  # 1.2 s, less up to 0.05 s counted per pause


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTSTP"), reason="needs POSIX job control")
def test_a_failed_interleaved_job_stops_the_benchmark_and_the_other_job(tmp_path):
    import sys

    commands = {"ours": [sys.executable, "-c", WORKER, "0.2", str(tmp_path / "a.times"), "3"],
                "marian": [sys.executable, "-c", WORKER, "30", str(tmp_path / "b.times")]}
    logs = {name: tmp_path / f"{name}.log" for name in commands}
    with pytest.raises(RuntimeError, match="the ours run failed \\(exit 3\\)"):
        quality.run_interleaved(commands, logs, 0.5, lambda msg: None)
    last = float((tmp_path / "b.times").read_text().split()[-1]) if (tmp_path / "b.times").exists() else 0.0

    time.sleep(0.3)  # killed: it writes no more
    assert ((tmp_path / "b.times").exists() is False) or float((tmp_path / "b.times").read_text().split()[-1]) == last


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTSTP"), reason="needs POSIX job control")
@pytest.mark.parametrize("interleave", [True, False])
def test_a_rerun_appends_to_the_logs_so_an_interrupted_runs_first_part_stays(tmp_path, interleave):
    """A rerun into the same --output_dir resumes the jobs from their checkpoints: their logs keep the first part."""
    import sys

    logs = {name: tmp_path / f"{name}.log" for name in ("ours", "marian")}
    for part in ("first part", "second part"):
        commands = {name: [sys.executable, "-c", f"print('{name} {part}')"] for name in logs}
        if interleave:
            quality.run_interleaved(commands, logs, 0.5, lambda msg: None)
        else:
            for name, command in commands.items():
                quality.run_side(command, logs[name], lambda msg: None)
    for name, path in logs.items():
        lines = path.read_text().splitlines()
        assert [line for line in lines if not line.startswith("[")] == [f"{name} first part", f"{name} second part"]
        starts = [line for line in lines if line.startswith("[")]
        assert len(starts) == 2 and all(" UTC] " in line and "print(" in line for line in starts)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs POSIX file locks")
def test_a_second_benchmark_into_the_same_output_dir_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """A rerun meant to resume an interrupted benchmark must not train beside one that is still going."""
    import subprocess
    import sys

    import os

    pytest.importorskip("fcntl")
    done = []
    monkeypatch.setattr(quality, "run_interleaved", lambda *args, **kwargs: done.append("trained") or {})
    monkeypatch.setattr(quality, "read_run", lambda folder: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the killed holder's lock file stays in there
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from scratch_transformer.checkpoints import lock_output_dir; "
        "lock = lock_output_dir(sys.argv[1]); print('locked', flush=True); time.sleep(60)"), str(tmp_path / "q")],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"in use by another run \\(pid {holder.pid},"):
            quality.main(["--output_dir", str(tmp_path / "q")])
        assert done == [] and not (tmp_path / "q").exists()  # refused before either run started, nothing made
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_interleave_seconds_must_be_zero_or_positive(value, capsys):
    with pytest.raises(SystemExit):
        quality.parse_args(["--interleave_seconds", value])
    assert "--interleave_seconds must be 0" in capsys.readouterr().err


@pytest.mark.parametrize("interleave", ["60", "0"])
def test_both_sides_take_turns_unless_interleave_is_0(tmp_path, monkeypatch, interleave):
    """By default the two runs go through run_interleaved (and the table says so); with 0, one after the other."""
    calls = []

    def fake_interleaved(commands, log_paths, slice_seconds, log, **kwargs):
        calls.append(("interleaved", tuple(commands), slice_seconds))
        for side in commands:
            write_run(tmp_path / side, side, 10, 5.0, 20.0)
        return {side: 1.0 for side in commands}

    def fake_side(command, log_path, log, tag="quality"):
        side = Path(command[command.index("--output_dir") + 1]).name
        calls.append(("after", side))
        write_run(tmp_path / side, side, 10, 5.0, 20.0)
        return 1.0

    monkeypatch.setattr(quality, "run_interleaved", fake_interleaved)
    monkeypatch.setattr(quality, "run_side", fake_side)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = quality.main(["--output_dir", str(tmp_path), "--interleave_seconds", interleave])
    # main let go of its folder's lock when it ended, and removed the file: a rerun takes it at once
    assert list((tmp_path / "cache" / "scratch_transformer" / "locks").iterdir()) == []
    if interleave == "60":
        assert calls == [("interleaved", ("ours", "marian"), 60.0)]
        assert "The runs took turns on the machine, 60 s of wall time each" in result["table"]
    else:
        assert calls == [("after", "ours"), ("after", "marian")] and "took turns" not in result["table"]
