"""benchmarks/recipe.py: the proxy runs of the recipe study (their commands, the variants' flags against the
main job's parser and the model config, the table read back from run folders)."""

import json

import pytest
from conftest import REPO_ROOT
from helpers import train_translation
from test_quality_benchmark import write_run

from benchmarks import recipe
from scratch_transformer import ScratchTransformerConfig
from scratch_transformer.translation import _parse_overrides  # how the main job reads --config_overrides

SHIPPED = json.loads((REPO_ROOT / recipe.CONFIG).read_text())


def test_the_studys_shipped_overrides_are_the_configs():
    """Variants that change the model repeat the shipped overrides: they must not drift from the config file."""
    assert recipe.SHIPPED_OVERRIDES == SHIPPED["config_overrides"]


@pytest.mark.parametrize("name", list(recipe.VARIANTS))
def test_every_variant_parses_as_main_job_flags_and_builds_a_valid_config(name):
    args = recipe.parse_args(["--variants", name])
    command = recipe.run_command(args, name)
    assert command[1:3] == [recipe.SCRIPT, recipe.CONFIG]
    model_args, data_args, training_args = train_translation.parse_args(command[2:])
    assert (training_args.max_steps, training_args.schedule_on_budget, training_args.save_steps) == (500, False, 35)
    if "--warmup_steps" not in recipe.VARIANTS[name][0]:
        assert training_args.warmup_steps == SHIPPED["warmup_steps"] < 1  # the same share of the steps
    assert not training_args.do_predict and training_args.eval_strategy == "no"
    fields = dict(item.split("=", 1) for item in model_args.config_overrides.split(","))
    config = ScratchTransformerConfig(**_parse_overrides(model_args.config_overrides, ScratchTransformerConfig))
    flags = recipe.VARIANTS[name][0]
    if "--config_overrides" in flags:  # the change is in, the rest is as shipped
        changed = dict(item.split("=", 1) for item in flags[flags.index("--config_overrides") + 1].split(","))
        assert {key: fields[key] for key in changed} == changed
        assert config.d_model % config.num_heads == 0
    else:
        assert model_args.config_overrides == SHIPPED["config_overrides"]


def test_variant_flags_win_over_the_proxy_flags_and_passthrough_wins_over_both():
    args = recipe.parse_args(["--variants", "lr_2e-3", "--proxy_minutes", "2", "--learning_rate", "3e-3"])
    _, _, training_args = train_translation.parse_args(recipe.run_command(args, "lr_2e-3")[2:])
    assert training_args.learning_rate == 3e-3 and training_args.max_train_minutes == 2.0
    assert training_args.schedule_on_budget  # minutes: the schedule on the budget, as in the main job


def test_unknown_variants_and_a_non_positive_budget_are_refused(capsys):
    with pytest.raises(SystemExit):
        recipe.parse_args(["--variants", "baseline,no_such_lever"])
    assert "unknown variant(s) ['no_such_lever']" in capsys.readouterr().err
    for flag in ("--proxy_minutes", "--proxy_steps"):
        with pytest.raises(SystemExit):
            recipe.parse_args([flag, "0"])
        assert f"{flag} must be positive" in capsys.readouterr().err


def test_report_only_tables_the_existing_runs_in_the_variants_order(tmp_path, capsys):
    write_run(tmp_path / "init_paper", "scratch_transformer", 520, 360.0, 30.5)
    write_run(tmp_path / "baseline", "scratch_transformer", 500, 360.0, 28.0)
    result = recipe.main(["--report_only", "--output_dir", str(tmp_path)])
    assert list(result["runs"]) == ["baseline", "init_paper"]
    printed = capsys.readouterr().out
    assert "proxies of the main job (500 steps each)" in printed
    assert "| baseline | the shipped config | 500 | 0.720 | 28.00 / - |" in printed
    assert "| init_paper | the paper's init: Xavier linears, N(0, d^-1/2) embeddings | 520 | 0.692 | 30.50 / - |" \
        in printed
    assert json.loads((tmp_path / "recipe.json").read_text())["table"] == printed.strip()
