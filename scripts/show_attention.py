"""Draw what a trained model attends to when it translates a sentence: every layer and head of the encoder's
self-attention, the decoder's self-attention and the encoder-decoder (cross) attention.

Examples:
    python scripts/show_attention.py --model outputs/multi30k_de_en "Zwei Hunde spielen im Schnee." --output attention.png
    python scripts/show_attention.py --model outputs/multi30k_de_en "Ein Mann fährt Fahrrad." --kinds cross --layers 3
    # also the masks of the padded batch of every sentence given, the positional encoding, the run's learning rate
    python scripts/show_attention.py --model outputs/multi30k_de_en "Ein Hund." "Zwei Männer spielen Fußball im Park." \
        --masks_output masks.png --positional_encoding_output pe.png --learning_rate_output lr.png

The weights are the model's own (`output_attentions=True`, eager attention) on the translation generate()
produced; layers and heads are numbered from 1, as in the picture. Python: scratch_transformer.attention_maps.
"""

import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

KINDS = ("encoder", "decoder", "cross")


@dataclass
class ShowAttentionArguments:
    model: str = field(metadata={"help": "A trained model: local folder or Hub id."})
    output: str = field(default="attention.png", metadata={
        "help": "The attention picture (of the first sentence); .png, .pdf or .svg."})
    kinds: str = field(default="encoder,decoder,cross", metadata={
        "help": "Which attentions to draw, comma-separated: encoder, decoder, cross."})
    layers: str | None = field(default=None, metadata={"help": "Layers to draw, e.g. 1,3 (default: all)."})
    heads: str | None = field(default=None, metadata={"help": "Heads to draw, e.g. 2 (default: all)."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size (default: the model's generation config)."})
    length_penalty: float | None = field(default=None, metadata={"help": "Beam search length penalty (default: the model's)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Longest translation, in tokens."})
    masks_output: str | None = field(default=None, metadata={
        "help": "Also draw the masks the model applies to the padded batch of all sentences given (with their "
                "translations) here; with one sentence, the short \"Ein Hund.\" joins it so that padding shows."})
    positional_encoding_output: str | None = field(default=None, metadata={
        "help": "Also draw the model's positional-encoding table (paper 3.5) here."})
    learning_rate_output: str | None = field(default=None, metadata={
        "help": "Also draw the learning rate of the run that trained the model (its trainer_state.json) here."})
    run: str | None = field(default=None, metadata={
        "help": "The training run's output folder for --learning_rate_output (default: --model)."})
    dpi: int = field(default=120, metadata={"help": "Resolution of .png pictures."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit id)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code from the Hub."})
    force: bool = field(default=False, metadata={"help": "Replace existing pictures this script did not draw."})


FORMATS = (".png", ".pdf", ".svg")
TOOL = "show_attention"  # the mark in its pictures: it replaces its own without --force
OUTPUT_FLAGS = ("output", "masks_output", "positional_encoding_output", "learning_rate_output")
PADDED_EXAMPLE = "Ein Hund."  # with one sentence given, --masks_output adds this one so the batch is padded


def padded_batch_masks(model, tokenizer, sources, targets) -> dict:
    """The masks the model itself applies (attention_maps.model_masks) to the padded batch sources -> targets."""
    from scratch_transformer.attention_maps import batch_masks, model_masks

    batch = batch_masks(tokenizer, sources, targets)  # the padded ids and their tokens
    masks = model_masks(model, batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"],
                        batch["decoder_attention_mask"])
    return {**masks, "source_tokens": batch["source_tokens"], "target_tokens": batch["target_tokens"]}


def _numbers(parser, flag: str, text: str | None) -> list[int] | None:
    """'1,3' -> [0, 2] (1-based on the command line, 0-based in Python)."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--{flag} {text}: give numbers from 1, comma-separated (e.g. 1,3)")
    if not values or min(values) < 1:
        parser.error(f"--{flag} {text}: give numbers from 1, comma-separated (e.g. 1,3)")
    return [value - 1 for value in values]


def _check_output(parser, flag: str, path: str | None, force: bool = False) -> None:
    if path is None:
        return
    if os.path.splitext(path)[1].lower() not in FORMATS:
        parser.error(f"--{flag} {path}: name a {', '.join(FORMATS)} file")
    if os.path.isdir(path):
        parser.error(f"--{flag} {path}: a folder, not a file")
    from scratch_transformer.paths import output_problem  # a model's files, another's picture (without --force)

    problem = output_problem(path, force=force, tool=TOOL)
    if problem:
        parser.error(f"--{flag} {path}: {problem}")


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(ShowAttentionArguments)
    args, sentences = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    unknown = [s for s in sentences if s.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    sentences = [s.strip() for s in sentences if s.strip()]
    if not sentences:
        parser.error('give a source sentence to translate, e.g. "Zwei Hunde spielen im Schnee."')
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    if not kinds or any(kind not in KINDS for kind in kinds):
        parser.error(f"--kinds {args.kinds}: choose among {', '.join(KINDS)}")
    layers, heads = _numbers(parser, "layers", args.layers), _numbers(parser, "heads", args.heads)
    for name in ("num_beams", "max_new_tokens", "dpi"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for flag in OUTPUT_FLAGS:
        _check_output(parser, flag, getattr(args, flag), args.force)
    from scratch_transformer.paths import same_outputs, save_figure

    clash = same_outputs({f"--{flag}": getattr(args, flag) for flag in OUTPUT_FLAGS})
    if clash:
        parser.error(clash)
    run = args.run or args.model
    if args.learning_rate_output and not os.path.isfile(os.path.join(run, "trainer_state.json")):
        parser.error(f"--learning_rate_output: {run} holds no trainer_state.json (give the run's output folder "
                     "with --run)")

    from scratch_transformer.attention_maps import (
        load_model,
        model_problem,
        plot_learning_rate,
        plot_masks,
        plot_positional_encoding,
        plot_sentence_attention,
        sentence_attention,
    )

    problem = model_problem(args.model)
    if problem:
        parser.error(f"--model {args.model}: {problem}")
    try:
        model, tokenizer = load_model(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError, RuntimeError, ImportError) as error:
        parser.error(f"--model {args.model}: cannot load it: {error}")
    config = model.config
    depth = min(config.encoder_layers if kind == "encoder" else config.decoder_layers for kind in kinds)
    for flag, chosen, count in (("layers", layers, depth),
                                ("heads", heads, config.num_heads)):
        if chosen is not None and max(chosen) >= count:
            parser.error(f"--{flag} {getattr(args, flag)}: the model has {count} (numbered from 1)")
    generate_kwargs = {name: getattr(args, name) for name in ("num_beams", "length_penalty", "max_new_tokens")
                       if getattr(args, name) is not None}

    maps = sentence_attention(model, tokenizer, sentences[0], **generate_kwargs)
    figure = plot_sentence_attention(maps, kinds=kinds, layers=layers, heads=heads)
    save_figure(figure, args.output, TOOL, dpi=args.dpi)
    print(f"{sentences[0]}\n-> {maps.translation}\nwrote {args.output}")
    written = {"output": args.output, "translation": maps.translation}
    if args.masks_output:
        from scratch_transformer.inference import translate

        extra = PADDED_EXAMPLE if sentences[0] != PADDED_EXAMPLE else "Zwei Männer spielen Fußball im Park."
        batch = sentences if len(sentences) > 1 else [extra, sentences[0]]  # padding shows only in a batch
        targets = translate(model, tokenizer, batch, **generate_kwargs)
        save_figure(plot_masks(padded_batch_masks(model, tokenizer, batch, targets)), args.masks_output, TOOL,
                    dpi=args.dpi)
        print(f"wrote {args.masks_output}")
        written["masks_output"] = args.masks_output
    if args.positional_encoding_output:
        save_figure(plot_positional_encoding(config.d_model, min(100, config.max_position_embeddings)),
                    args.positional_encoding_output, TOOL, dpi=args.dpi)
        print(f"wrote {args.positional_encoding_output}")
        written["positional_encoding_output"] = args.positional_encoding_output
    if args.learning_rate_output:
        save_figure(plot_learning_rate(run), args.learning_rate_output, TOOL, dpi=args.dpi)
        print(f"wrote {args.learning_rate_output}")
        written["learning_rate_output"] = args.learning_rate_output
    return written


if __name__ == "__main__":
    from scratch_transformer.paths import run_main

    run_main(main, "show_attention.py", lambda: "each picture written is whole, none half-written")
