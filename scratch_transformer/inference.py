"""Batched translation with model.generate (used by scripts/translate.py)."""

import warnings
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm


@torch.no_grad()
def translate(model, tokenizer, sentences: Sequence[str], batch_size: int = 32, num_beams: int | None = None,
              max_new_tokens: int | None = None, max_source_length: int = 256, progress: bool = False,
              **generate_kwargs) -> list[str]:
    """Translate sentences in batches of similar length; the output keeps the input order.

    Args:
        sentences: source sentences (an empty string translates to an empty string).
        batch_size: sentences per generate() call.
        num_beams / max_new_tokens: override the model's generation_config when given.
        max_source_length: longer sources are truncated to this many tokens (end-of-sentence token included;
            at most the model's max_position_embeddings),
            with a warning that says how many were cut; split long texts into sentences, one per item.
        progress: show a tqdm progress bar (sentences).
    Returns:
        one detokenised translation per input sentence.
    Raises:
        ValueError: batch_size, num_beams, max_new_tokens or max_source_length < 1, a single string instead of a list, a non-string
            item, or num_return_sequences other than 1.
    Warns:
        UserWarning: when sources were truncated to max_source_length, with their count.
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
    max_source_length = min(max_source_length, getattr(model.config, "max_position_embeddings", max_source_length))
    model.eval()
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results = [""] * len(sentences)
    truncated = 0
    bar = tqdm(total=len(sentences), unit="sent", disable=not progress)
    for start in range(0, len(order), batch_size):
        indices = [i for i in order[start : start + batch_size] if sentences[i].strip()]
        if indices:
            texts = [sentences[i].strip() for i in indices]
            lengths = [len(ids) for ids in tokenizer(texts, verbose=False)["input_ids"]]
            truncated += sum(length > max_source_length for length in lengths)
            batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                              max_length=max_source_length).to(model.device)
            output = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    **generate_kwargs)
            for i, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True)):
                results[i] = text.strip()
        bar.update(len(order[start : start + batch_size]))
    bar.close()
    if truncated:
        warnings.warn(
            f"{truncated} of {len(sentences)} sentences are longer than max_source_length={max_source_length} tokens "
            f"and were truncated: their translations cover only the first {max_source_length} tokens (split long "
            "texts into sentences, one per line, or raise max_source_length)", UserWarning, stacklevel=2)
    return results
