"""The model card (README.md) made from the project's `hub_card.md` template with huggingface_hub."""

import json
import os
from pathlib import Path

import torch
import transformers
from huggingface_hub import EvalResult, ModelCard, ModelCardData

# The repository's top-level hub_card.md, reached through the package's link to it (scratch_transformer/hub_card.md
# -> ../hub_card.md), which wheels and non-editable installs carry as a plain file.
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "hub_card.md"


def render_model_card(results: dict, template_path: str | os.PathLike | None = None) -> ModelCard:
    """Fill `hub_card.md` with a run's results; the YAML metadata carries a model-index with the BLEU.

    Args:
        results: keys model_name, repo_id, src_lang, tgt_lang, dataset_name, dataset_id, test_split,
            bleu, chrf, bleu_signature, num_beams, license, and the model sizes shown in the card; optionally
            test_sets, a list of {"split", "bleu", "chrf"} (one table row and model-index entry each; the
            headline test_split/bleu/chrf alone otherwise); custom_code, False for a model of transformers' own
            classes (e.g. Marian: no code travels with it), which drops the custom_code tag; transformers_version
            and torch_version, the versions the model was trained and scored with (this process's by default).
        template_path: a Jinja/Markdown template; defaults to the repository's hub_card.md. Besides the
            results' keys it gets `repo_id_literal` and `example_source_literal`, the two as Python string
            literals (quotes and backslashes escaped) for the card's code, which must run as printed.
    Returns:
        huggingface_hub.ModelCard (save with `.save(path)`).
    Raises:
        FileNotFoundError: when the template is missing.
    """
    template_path = Path(template_path or DEFAULT_TEMPLATE)
    if not template_path.is_file():
        raise FileNotFoundError(f"model card template not found: {template_path} (pass --card_template)")
    test_sets = results.get("test_sets") or [{"split": results["test_split"], "bleu": results["bleu"],
                                              "chrf": results["chrf"]}]
    card_data = ModelCardData(
        language=[results["src_lang"], results["tgt_lang"]],
        license=results.get("license", "mit"),
        library_name="transformers",
        tags=["translation", "scratch_transformer"] + (["custom_code"] if results.get("custom_code", True) else []),
        datasets=[results["dataset_id"]],
        metrics=["bleu", "chrf"],
        pipeline_tag="translation",
        model_name=results["model_name"],
        eval_results=[
            EvalResult(task_type="translation", dataset_type=results["dataset_id"], dataset_name=results["dataset_name"],
                       dataset_split=row["split"], metric_type=metric, metric_value=row[metric],
                       metric_name=metric.upper() if metric == "bleu" else "chrF")
            for row in test_sets for metric in ("bleu", "chrf")
        ],
    )
    literals = {f"{key}_literal": json.dumps(str(results.get(key, "")), ensure_ascii=False)  # valid Python too
                for key in ("repo_id", "example_source")}
    versions = {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
    return ModelCard.from_template(card_data, template_path=str(template_path), **{**versions, **results, **literals})
