"""Batched translation with model.generate (used by scripts/translate.py)."""

import warnings
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from .pipeline_scratch_transformer import (
    DEFAULT_MAX_SOURCE_LENGTH,
    clean_source,
    source_limit,
    truncation_message,
    unknown_characters,
    unknown_message,
)


@torch.no_grad()
def translate(model, tokenizer, sentences: Sequence[str], batch_size: int = 32, num_beams: int | None = None,
              max_new_tokens: int | None = None, max_source_length: int = DEFAULT_MAX_SOURCE_LENGTH,
              progress: bool = False, done: dict | None = None,
              **generate_kwargs) -> list[str]:
    """Translate sentences in batches of similar length; the output keeps the input order.

    Args:
        sentences: source sentences (an empty string translates to an empty string; a newline or tab inside one
            is a space, as in the pipeline).
        batch_size: sentences per generate() call.
        num_beams / max_new_tokens: override the model's generation_config when given.
        max_source_length: longer sources are truncated to this many tokens (end-of-sentence token included;
            at most the model's max_position_embeddings),
            with a warning that says how many were cut; split long texts into sentences, one per item.
        progress: show a tqdm progress bar (sentences).
        done: a dict filled as batches finish, {index in sentences: translation}: what an interrupted call had
            finished (translate.py keeps it across Ctrl-C).
    Returns:
        one detokenised translation per input sentence.
    Raises:
        ValueError: batch_size, num_beams, max_new_tokens or max_source_length < 1, a single string instead of a list, a non-string
            item, or num_return_sequences other than 1.
    Warns:
        UserWarning: when sources were truncated to max_source_length, with their count; when sources hold
            characters the tokenizer never saw (read as <unk>), with their count and the characters. The same
            rule and messages as the pipeline's (pipeline_scratch_transformer).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(max_source_length, bool) or not isinstance(max_source_length, int) or max_source_length < 1:
        raise ValueError(f"max_source_length must be a positive integer, got {max_source_length!r}")
    if isinstance(sentences, str):
        raise ValueError("sentences must be a list of strings, got one string (wrap it: [sentence])")
    if num_beams is not None and num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        raise ValueError("translate() returns one translation per sentence; for n-best lists call "
                         "model.generate(..., num_return_sequences=k) directly")
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise ValueError(f"sentence {index} is a {type(sentence).__name__}, not a string")
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    if max_new_tokens is not None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        generate_kwargs["max_new_tokens"] = max_new_tokens
    # a source can be no longer than the model's positional encoding (paper 3.5) reaches
    max_source_length = source_limit(model, max_source_length)
    model.eval()
    sources = [clean_source(sentence) for sentence in sentences]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results = [""] * len(sentences)
    truncated, unknown_sentences, unknown = 0, 0, {}
    bar = tqdm(total=len(sentences), unit="sent", disable=not progress)
    for start in range(0, len(order), batch_size):
        indices = [i for i in order[start : start + batch_size] if sources[i]]
        if indices:
            texts = [sources[i] for i in indices]
            lengths = [len(ids) for ids in tokenizer(texts, verbose=False)["input_ids"]]
            truncated += sum(length > max_source_length for length in lengths)
            for characters in unknown_characters(tokenizer, texts):
                unknown_sentences += bool(characters)
                unknown.update(dict.fromkeys(characters))
            batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                              max_length=max_source_length).to(model.device)
            output = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    **generate_kwargs)
            for i, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True)):
                results[i] = text.strip()
        if done is not None:
            done.update((i, results[i]) for i in order[start : start + batch_size])
        bar.update(len(order[start : start + batch_size]))
    bar.close()
    if truncated:
        warnings.warn(truncation_message(truncated, len(sentences), max_source_length), UserWarning, stacklevel=2)
    if unknown_sentences:
        warnings.warn(unknown_message(unknown_sentences, len(sentences), list(unknown)), UserWarning, stacklevel=2)
    return results
