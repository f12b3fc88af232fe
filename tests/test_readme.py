"""README cannot drift from the code: every command in it is exercised here in a cheap form.

- `python scripts/train_translation.py ...`: parsed by the script's own parser (config file, flags and their
  checks), nothing trained;
- `python scripts/translate.py` / `export_ctranslate2.py`: parsed by theirs, no unknown flag left;
- inline flags (`--max_train_minutes 5 ...`): known to the training or the translation script;
- the install and test commands: the very lines CI (.ci/run) runs;
- Python blocks: run, with the trained model's folder replaced by a tiny model folder;
- any other command fails the test until it is given a form here.
"""

import re
import shlex

import pytest
from conftest import REPO_ROOT, load_script
from transformers import HfArgumentParser

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
# what .ci/run does, line for line (CI installs from scratch exactly as README says, then runs its tests)
CI_FORMS = {"python3 -m venv .venv": "python3 -m venv", ". .venv/bin/activate": "bin/activate",
            "pip install torch==2.13.0": "pip install --quiet torch==2.13.0",
            'pip install -e ".[dev]"': 'pip install --quiet -e ".[dev]"', "python -m pytest": "python -m pytest"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    """Every shell command of README's bash blocks (lines, split at &&) and inline `python ...` spans."""
    found = [part.strip() for block in blocks("bash") for line in block.splitlines() for part in line.split("&&")]
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    found += re.findall(r"`(python [^`]+)`", prose)
    return [command for command in found if command]


def test_readme_is_short_and_in_the_issues_order():
    assert len(README.splitlines()) <= 200
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings[:6] == ["Results at a glance", "Install", "Quick start", "Use it", "Fast inference",
                            "Your own data"]
    assert headings[-3:] == ["Tests", "Layout", "License and citation"]


def test_readme_has_commands_and_each_has_a_form_here():
    known = ("python scripts/train_translation.py ", "python scripts/translate.py ",
             "python scripts/export_ctranslate2.py ", "python scripts/show_attention.py ", "python scripts/demo.py ",
             "python docs/walkthrough.py", "python -m benchmarks.tables", "python -m pytest", 'pip install -e ".[demo]"')
    found = commands()
    assert len(found) >= 10
    unknown = [c for c in found if c not in CI_FORMS and not c.startswith(known)]
    assert not unknown, f"README commands without a test form: {unknown}"


def test_install_and_test_commands_are_what_ci_runs():
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in commands():
        if command in CI_FORMS:
            assert CI_FORMS[command] in ci, command
    assert "python -m pytest -m slow" in commands()


@pytest.mark.parametrize("command", [c for c in commands() if c.startswith("python scripts/train_translation.py ")])
def test_training_commands_parse(command, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the config paths are relative to the repository root
    train_translation = load_script("train_translation")
    argv = shlex.split(command)[2:]
    model_args, data_args, training_args = train_translation.parse_args([*argv, "--output_dir", str(tmp_path)])
    assert data_args.source_lang != data_args.target_lang and training_args.output_dir == str(tmp_path)


# the scripts parsed by their own argument dataclass (HfArgumentParser), and that dataclass's name
ARGUMENTS = {"translate": "TranslateArguments", "export_ctranslate2": "ExportArguments",
             "show_attention": "ShowAttentionArguments", "demo": "DemoArguments"}


@pytest.mark.parametrize("command", [c for c in commands()
                                     if c.startswith(tuple(f"python scripts/{name}.py " for name in ARGUMENTS))])
def test_script_commands_parse(command):
    words = shlex.split(command)
    name = words[1].split("/")[1].removesuffix(".py")
    arguments = getattr(load_script(name), ARGUMENTS[name])
    parsed = HfArgumentParser(arguments).parse_args_into_dataclasses(args=words[2:], return_remaining_strings=True)
    assert not [word for word in parsed[-1] if word.startswith("--")], command
    assert parsed[0].model.startswith("outputs/") or parsed[0].model in ("you/scratch-de-en", WALKTHROUGH_MODEL)


WALKTHROUGH_MODEL = "docs/walkthrough_pictures/model"  # where docs/walkthrough.py saves its translator


def test_the_walkthrough_saves_its_translator_where_readme_says():
    """README's demo command names the walk-through's model folder: the walk-through's own default (its pictures'
    folder, docs/walkthrough_pictures, then model/; tests/test_walkthrough.py loads what it saves there)."""
    source = (REPO_ROOT / "docs" / "walkthrough.py").read_text(encoding="utf-8")
    assert 'REPO / "docs" / "walkthrough_pictures"' in source and 'MODEL_DIR = OUT / "model"' in source
    assert f"python scripts/demo.py --model {WALKTHROUGH_MODEL}" in commands()


def test_the_walkthrough_and_the_demo_extra_exist():
    """`python docs/walkthrough.py` is executed by tests/test_walkthrough.py; the demo extra is a part of the
    browser extra that .ci/run installs for the browser test."""
    import tomllib

    assert "python docs/walkthrough.py" in commands() and (REPO_ROOT / "docs" / "walkthrough.py").is_file()
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["demo"]) <= set(extras["browser"])
    assert 'pip install --quiet -e ".[browser]"' in (REPO_ROOT / ".ci" / "run").read_text()


def test_inline_flags_are_known_to_the_training_or_translation_script():
    train_translation = load_script("train_translation")
    parsers = [HfArgumentParser((train_translation.ModelArguments, train_translation.DataTrainingArguments,
                                 train_translation.TranslationTrainingArguments)),
               HfArgumentParser(load_script("translate").TranslateArguments),
               HfArgumentParser(load_script("export_ctranslate2").ExportArguments)]
    options = {option for parser in parsers for action in parser._actions for option in action.option_strings}
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    flags = [flag for span in re.findall(r"`(--[^`]+)`", prose) for flag in span.split() if flag.startswith("--")]
    assert len(flags) >= 4
    assert set(flags) <= options, set(flags) - options


def test_python_blocks_run_on_a_tiny_model(tiny_model_dir, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    python = blocks("python")
    assert len(python) == 2
    for code in python:
        exec(compile(code.replace("outputs/multi30k_de_en", str(tiny_model_dir)), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("['") and printed[1].startswith("[{'translation_text': ")


def test_the_new_model_line_builds_the_papers_base_model():
    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

    assert "`ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(vocab_size=8000))`" in README
    config = ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(vocab_size=8000)).config
    assert (config.d_model, config.num_heads, config.encoder_layers, config.decoder_layers, config.d_ff) == \
           (512, 8, 6, 6, 2048)
