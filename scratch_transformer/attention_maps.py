"""Pictures of what the Transformer attends to, and of the pieces around attention (matplotlib).

The weights are the model's own: `forward(..., output_attentions=True)` on the eager attention (paper eq. 1
written out), run once over the source and the translation that `generate()` produced (teacher forcing: the
decoder sees exactly the tokens it generated, so each row is the step that produced its token).

    from scratch_transformer.attention_maps import load_model, sentence_attention, plot_sentence_attention

    model, tokenizer = load_model("outputs/multi30k_de_en")          # folder or Hub id; eager attention
    maps = sentence_attention(model, tokenizer, "Zwei Hunde spielen im Schnee.")
    maps.translation, maps.cross.shape                                # 'Two dogs play in the snow.', (L, h, t, s)
    plot_sentence_attention(maps).savefig("attention.png")

Also: the masks of a padded batch (`batch_masks`, `plot_masks`), the positional-encoding table
(`plot_positional_encoding`) and a run's learning-rate schedule (`learning_rates`, `plot_learning_rate`).
Every `plot_*` returns a `matplotlib.figure.Figure` made without pyplot (no global state, safe in a web server's
threads): save it with `figure.savefig(path)`. Command line: scripts/show_attention.py.

Notation: L layers, h heads, s source tokens, t target tokens, b batch.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure

__all__ = [
    "SentenceAttention",
    "load_model",
    "model_problem",
    "attention_weights",
    "sentence_attention",
    "plot_heads",
    "plot_sentence_attention",
    "plot_attention_matrix",
    "batch_masks",
    "model_masks",
    "plot_masks",
    "plot_positional_encoding",
    "learning_rates",
    "plot_learning_rate",
]

KINDS = ("encoder", "decoder", "cross")
TITLES = {
    "encoder": "Encoder self-attention (query: source token, key: source token)",
    "decoder": "Decoder self-attention (query: token being produced, key: decoder input so far)",
    "cross": "Encoder-decoder attention (query: token being produced, key: source token)",
}


@dataclass
class SentenceAttention:
    """Every layer's and head's attention weights for one source sentence and its translation.

    Attributes:
        source_tokens: the source as the tokenizer splits it, `</s>` included (s tokens; "▁" starts a word).
        input_tokens: the decoder's inputs, `<s>` then the translation's tokens (t tokens): the keys of the
            decoder's self-attention.
        output_tokens: the tokens the decoder produced at each of those positions (t tokens, ending in `</s>`
            unless generation stopped at its maximum length): the queries of the decoder's two attentions.
        translation: the decoded translation.
        encoder: (L, h, s, s) encoder self-attention; row i = what source token i attends to.
        decoder: (L, h, t, t) decoder self-attention; zero above the diagonal (paper 3.2.3).
        cross: (L, h, t, s) encoder-decoder attention; row i = where in the source the model looked to produce
            output token i.
        generate_seconds: wall time of the generate() call that translated the sentence.
    Each row of each matrix sums to 1 (a softmax over the keys), float32 on the CPU.
    """

    source_tokens: list[str]
    input_tokens: list[str]
    output_tokens: list[str]
    translation: str
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor
    generate_seconds: float = 0.0


def load_model(model_name_or_path: str, revision: str | None = None, trust_remote_code: bool = False,
               **from_pretrained_kwargs):
    """A trained model (local folder or Hub id) and its tokenizer, in eval mode with eager attention.

    Raises:
        OSError / ValueError: from `from_pretrained` when the folder or Hub id holds no model or tokenizer.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401  (registers the model with the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, revision=revision, **from_pretrained_kwargs)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, revision=revision,
                                                  trust_remote_code=trust_remote_code, attn_implementation="eager",
                                                  **from_pretrained_kwargs)
    return model.eval(), tokenizer


def model_problem(name: str) -> str | None:
    """Why `name` cannot be loaded as a model, found without loading it: a local folder that holds no trained model,
    a file, or a local-looking path that does not exist. None for a model folder or a Hub id."""
    from .paths import looks_like_local_path, missing_model_message, model_folder_problem

    folder = os.path.expanduser(name)
    if os.path.isdir(folder):
        return model_folder_problem(folder)
    if os.path.exists(folder):
        return "a file, not a model folder (give a trained model's folder or a Hub id)"
    if looks_like_local_path(name):
        return missing_model_message(name)  # "no such folder (train it first: ...; or give a Hub id)"
    return None


def _check_model(model) -> None:
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"need an encoder-decoder model (from_pretrained of a trained folder), got {type(model).__name__}")


@torch.no_grad()
def attention_weights(model, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                      attention_mask: torch.Tensor | None = None,
                      decoder_attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One teacher-forced forward with `output_attentions=True` on the eager attention, weights stacked by layer.

    Args:
        input_ids: source ids (b, s); attention_mask: (b, s), 1 = token, 0 = padding.
        decoder_input_ids: target prefix (b, t), starting with the decoder start token;
            decoder_attention_mask: (b, t), optional.
    Returns:
        {"encoder": (b, L, h, s, s), "decoder": (b, L, h, t, t), "cross": (b, L, h, t, s)}, float32 on the CPU,
        plus "logits": (b, t, v).
    Raises:
        ValueError: not an encoder-decoder model, ids or masks of the wrong shape (the model's own checks).

    The model is switched to eager attention for the call when it uses another (sdpa, say), and back after.
    """
    _check_model(model)
    previous = getattr(model.config, "_attn_implementation", None) or "eager"
    if previous != "eager":
        model.set_attn_implementation("eager")
    was_training = model.training
    model.eval()
    try:
        device = model.device
        output = model(input_ids=input_ids.to(device), decoder_input_ids=decoder_input_ids.to(device),
                       attention_mask=None if attention_mask is None else attention_mask.to(device),
                       decoder_attention_mask=None if decoder_attention_mask is None else decoder_attention_mask.to(device),
                       output_attentions=True, use_cache=False)
    finally:
        model.train(was_training)
        if previous != "eager":
            model.set_attn_implementation(previous)
    stacks = {"encoder": output.encoder_attentions, "decoder": output.decoder_attentions, "cross": output.cross_attentions}
    weights = {}
    for kind, layers in stacks.items():
        if not layers or any(layer is None for layer in layers):
            raise ValueError(f"the model returned no {kind} attention weights with output_attentions=True")
        weights[kind] = torch.stack([layer.float().cpu() for layer in layers], dim=1)  # L x (b, h, q, k) -> (b, L, h, q, k)
    weights["logits"] = output.logits.float().cpu()
    return weights


def _readable(tokens: list[str]) -> list[str]:
    return [token.replace("\n", "\\n") for token in tokens]


def sentence_attention(model, tokenizer, sentence: str, max_source_length: int = 256,
                       **generate_kwargs) -> SentenceAttention:
    """Translate `sentence` with `model.generate(**generate_kwargs)` and read every attention weight of it.

    Args:
        sentence: one source sentence (non-empty).
        max_source_length: longer sources are truncated to this many tokens (`</s>` included).
        generate_kwargs: passed to generate() (num_beams, length_penalty, max_new_tokens, ...); the model's
            generation config otherwise. Both lengths are capped at what the model's positional encoding covers.
    Returns:
        SentenceAttention with the translation and the (L, h, queries, keys) weights of the three attentions.
    Raises:
        ValueError: an empty or non-string sentence, num_return_sequences other than 1, not an encoder-decoder.
    """
    _check_model(model)
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"sentence must be a non-empty string, got {sentence!r}")
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        raise ValueError("sentence_attention draws one translation: num_return_sequences must be 1")
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None:  # the positional encoding (paper 3.5) reaches no further, on either side
        max_source_length = min(max_source_length, positions)
        if generate_kwargs.get("max_new_tokens") is not None:
            generate_kwargs["max_new_tokens"] = min(generate_kwargs["max_new_tokens"], positions - 1)
    source = tokenizer([sentence.strip()], return_tensors="pt", truncation=True, max_length=max_source_length)
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        generated = model.generate(input_ids=source["input_ids"].to(model.device),
                                   attention_mask=source["attention_mask"].to(model.device), **generate_kwargs)
    generate_seconds = time.perf_counter() - start
    sequence = generated[0].cpu()  # (1 + n,): decoder start, then the generated tokens
    eos = model.config.eos_token_id
    ends = (sequence[1:] == eos).nonzero()
    if len(ends):
        sequence = sequence[: int(ends[0]) + 2]  # through the first </s>; what follows is padding
    weights = attention_weights(model, source["input_ids"], sequence[None, :-1], source["attention_mask"])
    to_tokens = tokenizer.convert_ids_to_tokens
    return SentenceAttention(
        source_tokens=_readable(to_tokens(source["input_ids"][0].tolist())),
        input_tokens=_readable(to_tokens(sequence[:-1].tolist())),
        output_tokens=_readable(to_tokens(sequence[1:].tolist())),
        translation=tokenizer.decode(sequence, skip_special_tokens=True).strip(),
        encoder=weights["encoder"][0], decoder=weights["decoder"][0], cross=weights["cross"][0],
        generate_seconds=generate_seconds,
    )


# ---------------------------------------------------------------- drawing


def _cell_inches(tokens: int) -> float:
    return min(max(1.6, 0.16 * tokens + 0.6), 4.5)


def _wrapped(title: str, width_inches: float, fontsize: float = 10) -> str:
    """`title` broken into lines that fit `width_inches` at `fontsize` points (about 0.55 em a character), so
    a narrow figure (one head) shows its whole title instead of clipping it."""
    characters = max(12, int(width_inches * 72 / (0.55 * fontsize)) - 2)
    return "\n".join(textwrap.fill(line, characters) for line in title.split("\n"))


def plot_heads(weights: torch.Tensor, row_labels: Sequence[str], column_labels: Sequence[str], figure=None,
               title: str | None = None, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
               cmap: str = "viridis"):
    """A grid of heatmaps, one row per layer and one column per head, on a shared 0..1 colour scale.

    Args:
        weights: (L, h, queries, keys) attention weights.
        row_labels / column_labels: the query and key tokens (queries and keys long).
        figure: a Figure or SubFigure to draw into (a new Figure when None).
        layers / heads: which to draw (0-based; default all).
    Returns:
        the figure drawn into.
    Raises:
        ValueError: weights not 4-D, labels that do not match its last two sizes, a layer or head out of range.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (layers, heads, queries, keys), got shape {tuple(weights.shape)}")
    num_layers, num_heads, queries, keys = weights.shape
    if len(row_labels) != queries or len(column_labels) != keys:
        raise ValueError(f"{len(row_labels)} row and {len(column_labels)} column labels for {queries} x {keys} weights")
    layers = list(range(num_layers)) if layers is None else list(layers)
    heads = list(range(num_heads)) if heads is None else list(heads)
    for name, chosen, count in (("layer", layers, num_layers), ("head", heads, num_heads)):
        bad = [i for i in chosen if not 0 <= i < count]
        if bad or not chosen:
            raise ValueError(f"{name}s {bad or chosen} out of range: the model has {count} (0 .. {count - 1})")
    if figure is None:
        figure = Figure(figsize=(len(heads) * _cell_inches(keys) + 1.2, len(layers) * _cell_inches(queries) + 0.8),
                        layout="constrained")
    axes = figure.subplots(len(layers), len(heads), squeeze=False)
    fontsize = 7 if max(queries, keys) <= 20 else 6
    image = None
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            image = ax.imshow(weights[layer, head].numpy(), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                              interpolation="nearest")
            ax.set_xticks(range(keys))
            ax.set_yticks(range(queries))
            ax.set_xticklabels(column_labels if r == len(layers) - 1 else [], rotation=90, fontsize=fontsize)
            ax.set_yticklabels(row_labels if c == 0 else [], fontsize=fontsize)
            ax.tick_params(length=0)
            if r == 0:
                ax.set_title(f"head {head + 1}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        width = figure.get_figwidth() if isinstance(figure, Figure) else figure.bbox.width / figure.dpi
        figure.suptitle(_wrapped(title, width), fontsize=10)
    return figure


def plot_attention_matrix(weights: torch.Tensor, row_labels: Sequence[str], column_labels: Sequence[str],
                          title: str | None = None, annotate: bool | None = None, cmap: str = "viridis") -> Figure:
    """One attention matrix (queries x keys), e.g. a layer's weights averaged over its heads, with its values
    written in the cells when it is small enough to read them (`annotate` None: up to 16 x 16).

    Args:
        weights: (queries, keys) weights in [0, 1].
        row_labels / column_labels: the query and key tokens.
    Raises:
        ValueError: weights not 2-D, or labels that do not match its sizes.
    """
    if weights.dim() != 2:
        raise ValueError(f"weights must be (queries, keys), got shape {tuple(weights.shape)}")
    queries, keys = weights.shape
    if len(row_labels) != queries or len(column_labels) != keys:
        raise ValueError(f"{len(row_labels)} row and {len(column_labels)} column labels for {queries} x {keys} weights")
    annotate = max(queries, keys) <= 16 if annotate is None else annotate
    size = 0.42 if annotate else 0.22
    width = max(4.5, keys * size + 2.2)
    figure = Figure(figsize=(width, max(3.0, queries * size + 1.6)), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(weights.float().numpy(), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(keys), column_labels, rotation=90, fontsize=8)
    ax.set_yticks(range(queries), row_labels, fontsize=8)
    ax.tick_params(length=0)
    if annotate:
        for i in range(queries):
            for j in range(keys):
                value = float(weights[i, j])
                ax.text(j, i, f"{value:.2f}"[1:] if value < 1 else "1", ha="center", va="center", fontsize=6,
                        color="black" if value > 0.6 else "white")
    figure.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    if title:
        ax.set_title(_wrapped(title, width - 1.2, 9), fontsize=9)
    return figure


def plot_sentence_attention(maps: SentenceAttention, kinds: Sequence[str] = KINDS,
                            layers: Sequence[int] | None = None, heads: Sequence[int] | None = None) -> Figure:
    """One figure with a grid (layers x heads) for each of `kinds` ("encoder", "decoder", "cross").

    Raises:
        ValueError: an unknown kind, or a layer or head out of range.
    """
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds must be some of {KINDS}, got {list(kinds)}")
    labels = {"encoder": (maps.source_tokens, maps.source_tokens),
              "decoder": (maps.output_tokens, maps.input_tokens),
              "cross": (maps.output_tokens, maps.source_tokens)}
    tensors = {kind: getattr(maps, kind) for kind in kinds}
    num_layers = {kind: len(layers) if layers is not None else tensors[kind].shape[0] for kind in kinds}
    num_heads = len(heads) if heads is not None else maps.encoder.shape[1]
    widths = [num_heads * _cell_inches(len(labels[kind][1])) + 1.6 for kind in kinds]
    heights = [num_layers[kind] * _cell_inches(len(labels[kind][0])) + 1.2 for kind in kinds]
    width = max(max(widths), 4.5)
    figure = Figure(figsize=(width, sum(heights) + 0.6), layout="constrained")
    figure.suptitle(_wrapped(f"{' '.join(maps.source_tokens)}\n→ {maps.translation}", width), fontsize=10)
    subfigures = figure.subfigures(len(kinds), 1, height_ratios=heights, squeeze=False)[:, 0]
    for subfigure, kind in zip(subfigures, kinds):
        rows, columns = labels[kind]
        plot_heads(tensors[kind], rows, columns, figure=subfigure, title=TITLES[kind], layers=layers, heads=heads)
    return figure


# ---------------------------------------------------------------- masks, positional encoding, learning rate


def batch_masks(tokenizer, sources: Sequence[str], targets: Sequence[str]) -> dict:
    """The masks of a padded batch as the model applies them (paper 3.2.3); True = may attend.

    Args:
        sources / targets: as many target sentences as source sentences (b each).
    Returns:
        {"input_ids" (b, s), "attention_mask" (b, s), "decoder_input_ids" (b, t): `<s>` then the target's
        tokens, "decoder_attention_mask" (b, t), "encoder" (b, s, s) source padding, "decoder" (b, t, t)
        causal and target padding, "cross" (b, t, s) source padding, "source_tokens" / "target_tokens":
        b lists of tokens, padding included}.
    Raises:
        ValueError: empty lists or lists of different lengths.
    """
    if not sources or len(sources) != len(targets):
        raise ValueError(f"need as many targets as sources (at least one), got {len(sources)} and {len(targets)}")
    source = tokenizer(list(sources), return_tensors="pt", padding=True)
    labels = tokenizer(text_target=list(targets), return_tensors="pt", padding=True)
    start = torch.full((len(targets), 1), tokenizer.bos_token_id, dtype=labels["input_ids"].dtype)
    decoder_input_ids = torch.cat([start, labels["input_ids"][:, :-1]], dim=1)  # labels shifted right: (b, t)
    decoder_attention_mask = torch.cat([torch.ones_like(start), labels["attention_mask"][:, :-1]], dim=1)
    source_keys = source["attention_mask"].bool()  # (b, s)
    target_keys = decoder_attention_mask.bool()  # (b, t)
    t, s = decoder_input_ids.size(1), source_keys.size(1)
    causal = torch.ones(t, t, dtype=torch.bool).tril()  # query i sees keys 0 .. i
    return {
        "input_ids": source["input_ids"], "attention_mask": source["attention_mask"],
        "decoder_input_ids": decoder_input_ids, "decoder_attention_mask": decoder_attention_mask,
        "encoder": source_keys[:, None, :].expand(-1, s, -1),  # (b, s) -> (b, s, s)
        "decoder": causal[None] & target_keys[:, None, :],  # (b, t, t)
        "cross": source_keys[:, None, :].expand(-1, t, -1),  # (b, s) -> (b, t, s)
        "source_tokens": [_readable(tokenizer.convert_ids_to_tokens(row.tolist())) for row in source["input_ids"]],
        "target_tokens": [_readable(tokenizer.convert_ids_to_tokens(row.tolist())) for row in decoder_input_ids],
    }


@torch.no_grad()
def model_masks(model, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The masks the model itself builds and hands to its attention layers (paper 3.2.3), read in one forward.

    Forward pre-hooks on the first encoder layer's self-attention and the first decoder layer's two attentions
    record the `attention_mask` each receives (every layer of a stack gets the same one: the stacks build their
    masks once, with transformers' masking_utils), so what you see is what the model applies, not a copy.

    Args:
        input_ids (b, s), decoder_input_ids (b, t); attention_mask (b, s) and decoder_attention_mask (b, t):
            1 = token, 0 = padding.
    Returns:
        {"encoder" (b, s, s), "decoder" (b, t, t), "cross" (b, t, s)}: True = may attend (False where the model's
        additive mask is the dtype's minimum); "raw": the three masks as the layers received them (additive
        float (b, 1, q, k) under eager attention; None where the model needs no mask, e.g. no padding).
    Raises:
        ValueError: not an encoder-decoder model, or ids or masks of the wrong shape (the model's own checks).
    """
    _check_model(model)
    b, s = input_ids.shape
    t = decoder_input_ids.size(1)
    layers = {"encoder": model.get_encoder().layers[0].self_attn,
              "decoder": model.get_decoder().layers[0].self_attn,
              "cross": model.get_decoder().layers[0].encoder_attn}
    raw, handles = {}, []
    for kind, module in layers.items():
        def record(module, args, kwargs, kind=kind):
            raw[kind] = kwargs.get("attention_mask")
        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        device = model.device
        model(input_ids=input_ids.to(device), decoder_input_ids=decoder_input_ids.to(device),
              attention_mask=None if attention_mask is None else attention_mask.to(device),
              decoder_attention_mask=None if decoder_attention_mask is None else decoder_attention_mask.to(device),
              use_cache=False)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    sizes = {"encoder": (s, s), "decoder": (t, t), "cross": (t, s)}
    allowed = {}
    for kind, mask in raw.items():
        q, k = sizes[kind]
        if mask is None:  # no mask needed: all keys allowed (and the decoder's is_causal applies the triangle)
            allowed[kind] = torch.ones(q, k, dtype=torch.bool).tril() if kind == "decoder" else torch.ones(q, k, dtype=torch.bool)
            allowed[kind] = allowed[kind].expand(b, q, k)
        elif mask.dtype == torch.bool:
            allowed[kind] = mask[:, 0].cpu().expand(b, q, k)
        else:  # additive: 0 where allowed, the dtype's minimum where masked
            allowed[kind] = (mask[:, 0] > torch.finfo(mask.dtype).min / 2).cpu().expand(b, q, k)
    return {**allowed, "raw": raw}


def plot_masks(masks: dict) -> Figure:
    """Each sentence of a batch in a row: its encoder, decoder and cross-attention masks (yellow = may attend,
    dark = masked). `masks`: `batch_masks(...)`, or `model_masks(...)` with "source_tokens" and "target_tokens"
    added (b lists of tokens, padding included)."""
    b = len(masks["source_tokens"])
    s, t = masks["encoder"].shape[-1], masks["decoder"].shape[-1]
    figure = Figure(figsize=(3 * _cell_inches(max(s, t)) + 1, b * _cell_inches(max(s, t)) + 1), layout="constrained")
    axes = figure.subplots(b, 3, squeeze=False)
    for i in range(b):
        src, tgt = masks["source_tokens"][i], masks["target_tokens"][i]
        for j, (kind, rows, columns) in enumerate((("encoder", src, src), ("decoder", tgt, tgt), ("cross", tgt, src))):
            ax = axes[i][j]
            ax.imshow(masks[kind][i].numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=6)
            ax.set_yticks(range(len(rows)), rows, fontsize=6)
            ax.tick_params(length=0)
            if i == 0:
                ax.set_title({"encoder": "encoder self-attention\n(source padding)",
                              "decoder": "decoder self-attention\n(causal + target padding)",
                              "cross": "encoder-decoder attention\n(source padding)"}[kind], fontsize=9)
    figure.suptitle("Masks of a padded batch (yellow: may attend; rows: queries, columns: keys)", fontsize=10)
    return figure


def positional_wavelength(dimension: int, d_model: int) -> float:
    """Wavelength, in positions, of dimension `dimension` of the sinusoid table (paper 3.5): 2π·10000^(2i/d_model)
    for dimensions 2i (sine) and 2i+1 (cosine): a pair shares one wavelength; they grow geometrically from 2π."""
    return 2 * math.pi * 10000 ** (2 * (dimension // 2) / d_model)


def plot_positional_encoding(d_model: int = 512, num_positions: int = 100, dimensions: Sequence[int] | None = None):
    """The sinusoid table of paper 3.5 as a heatmap (positions x dimensions), and a few of its columns far apart
    as curves, each labelled with its wavelength.

    Args:
        dimensions: the columns drawn as curves (default: 0 and d/8, d/4, d/2 rounded to even, four sines whose
            wavelengths are 2π, 2π·10000^(1/8), 2π·10000^(1/4), 2π·100).
    Raises:
        ValueError: d_model or num_positions < 1, or a dimension outside [0, d_model).
    """
    from .modeling_scratch_transformer import sinusoidal_position_encoding

    if d_model < 1 or num_positions < 1:
        raise ValueError(f"d_model and num_positions must be >= 1, got {d_model} and {num_positions}")
    if dimensions is None:
        dimensions = sorted({2 * ((d_model * share) // 16) for share in (0, 1, 2, 4)})  # 0, d/8, d/4, d/2, even
    bad = [d for d in dimensions if not 0 <= d < d_model]
    if bad:
        raise ValueError(f"dimensions {bad} outside [0, d_model={d_model})")
    table = sinusoidal_position_encoding(num_positions, d_model)  # (n, d)
    figure = Figure(figsize=(12, 4.2), layout="constrained")
    heat, curves = figure.subplots(1, 2, width_ratios=[1.1, 1])
    image = heat.imshow(table.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    heat.set_xlabel("dimension (even: sin, odd: cos)")
    heat.set_ylabel("position")
    heat.set_title(f"PE(pos, 2i) = sin(pos / 10000^(2i/{d_model})), PE(pos, 2i+1) = cos(same angle)\n"
                   "left columns change fast, right columns hardly at all", fontsize=9)
    figure.colorbar(image, ax=heat)
    for d in dimensions:
        curves.plot(table[:, d].numpy(), label=f"dim {d}: wavelength {positional_wavelength(d, d_model):.0f}")
    curves.set_xlabel("position")
    curves.set_ylim(-1.1, 1.6)
    last = 2 * ((d_model - 1) // 2)  # the last (sin, cos) pair's first dimension
    last_dims = f"dims {last}, {last + 1}" if last + 1 < d_model else f"dim {last}"
    curves.set_title("columns far apart: the wavelength grows geometrically with the dimension,\n"
                     f"from 2π (dims 0, 1) to 2π·{10000 ** (last / d_model):.0f} ({last_dims}), just under "
                     "2π·10000;\ndims 2i and 2i+1 (sin, cos) share one wavelength", fontsize=9)
    curves.legend(fontsize=8, loc="upper right", ncols=2)
    return figure


def learning_rates(run: str | list[dict]) -> tuple[list[int], list[float]]:
    """(steps, learning rates) logged during a training run.

    Args:
        run: a run's output folder or checkpoint (holding trainer_state.json), the path of a trainer_state.json,
            or a Trainer's `state.log_history` list.
    Raises:
        ValueError: no trainer_state.json there, or no learning rate in its log.
    """
    if isinstance(run, (str, os.PathLike)):
        path = os.path.join(run, "trainer_state.json") if os.path.isdir(run) else run
        if not os.path.isfile(path):
            raise ValueError(f"{run}: no trainer_state.json (give a training run's output folder or a checkpoint)")
        with open(path, encoding="utf-8") as handle:
            run = json.load(handle).get("log_history", [])
    points = [(entry["step"], entry["learning_rate"]) for entry in run if "learning_rate" in entry and "step" in entry]
    if not points:
        raise ValueError("no learning rate in the run's log (log_history has no 'learning_rate' entry)")
    steps, rates = zip(*points)
    return list(steps), list(rates)


def plot_learning_rate(run: str | list[dict]) -> Figure:
    """The learning rate by step, as the run logged it (see `learning_rates` for `run`)."""
    steps, rates = learning_rates(run)
    figure = Figure(figsize=(7, 3.5), layout="constrained")
    ax = figure.subplots()
    ax.plot(steps, rates, marker="." if len(steps) < 60 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("Learning-rate schedule (as logged)")
    ax.grid(alpha=0.3)
    return figure
