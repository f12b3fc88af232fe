"""A translation pipeline (transformers 5 removed its own "translation" task).

Shipped beside the weights (config `custom_pipelines`), so that
`pipeline(model="user/name", trust_remote_code=True)` translates without this package installed;
in-process: `TranslationPipeline(model=model, tokenizer=tokenizer)` or
`pipeline("scratch-translation", model=...)` after `import scratch_transformer`.
Flat file, imports only transformers and torch (it travels with checkpoints).
"""

import warnings

import torch
from transformers import Pipeline

# Sources longer than this many tokens (end-of-sentence token included) are truncated, with a warning; never more
# than the model's max_position_embeddings. The one rule of the pipeline and of inference.translate/translate.py.
DEFAULT_MAX_SOURCE_LENGTH = 256


def source_limit(model, max_source_length: int | None = None) -> int:
    """The longest source, in tokens: max_source_length (default DEFAULT_MAX_SOURCE_LENGTH), at most the
    model's max_position_embeddings (paper 3.5: the positional encoding reaches no further)."""
    limit = DEFAULT_MAX_SOURCE_LENGTH if max_source_length is None else max_source_length
    return min(limit, getattr(model.config, "max_position_embeddings", None) or limit)


def truncation_message(truncated: int, total: int, limit: int) -> str:
    """The warning for sources cut to `limit` tokens (the same from the pipeline and from translate.py)."""
    return (f"{truncated} of {total} sentences are longer than max_source_length={limit} tokens and were "
            f"truncated: their translations cover only the first {limit} tokens (split long texts into "
            "sentences, one per line, or raise max_source_length)")


def clean_source(text: str) -> str:
    """A source sentence as the model reads it: a newline, tab or run of spaces inside it is one space (a
    sentence is one line of text), no space at either end, and no format character (Unicode Cf, e.g. a zero-width
    space: as the tokenizer's normaliser drops them since bpe-v3, for tokenizers saved before, which read <unk>)."""
    import unicodedata

    return " ".join("".join(c for c in text if unicodedata.category(c) != "Cf").split())


def unknown_characters(tokenizer, texts) -> list[list[str]]:
    """For each of `texts`, the characters that the tokenizer reads as its unknown token (never seen in
    training), in order of appearance, each once; empty lists for a tokenizer without an unknown token or
    offsets (a slow tokenizer)."""
    texts = list(texts)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not getattr(tokenizer, "is_fast", False) or not texts:
        return [[] for _ in texts]
    encoded = tokenizer(texts, return_offsets_mapping=True, add_special_tokens=False, verbose=False)
    found = []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        found.append(list(dict.fromkeys(text[start:end] for token, (start, end) in zip(ids, offsets)
                                        if token == unk and end > start)))
    return found


def unknown_message(sentences: int, total: int, characters: list[str]) -> str:
    """The warning for sources holding characters the tokenizer never saw."""
    shown = ", ".join(repr(c) for c in characters[:8]) + (" ..." if len(characters) > 8 else "")
    return (f"{sentences} of {total} sentences hold characters the tokenizer has never seen ({shown}): they are "
            "read as <unk> and are missing from the translations")


class TranslationPipeline(Pipeline):
    """Text in, translation out, with the return shapes of transformers' (v4) translation pipeline.

    `pipe("Ein Hund.")` -> `[{"translation_text": "A dog."}]`; a list of n strings -> a list of n dicts,
    `pipe(["Ein Hund.", "Eine Katze."])` -> `[{"translation_text": "A dog."}, {"translation_text": "A cat."}]`;
    with num_return_sequences=k > 1 each sentence gives a list of k dicts instead. An empty (or blank) sentence
    translates to "", in a batch too. A generator or Dataset streams one list of dicts per sentence.

    Call arguments (all optional) are passed to `model.generate`: num_beams, max_new_tokens,
    max_length, length_penalty, do_sample, ...; `batch_size` batches a list of sentences;
    `max_source_length` (default DEFAULT_MAX_SOURCE_LENGTH, at most the model's positions) truncates each
    source to that many tokens, with a warning, as translate.py does. A newline inside a sentence is a space;
    characters the tokenizer never saw are read as <unk>, with a warning naming them.
    Raises ValueError for input that is not a string or a list of strings, and generate()'s ValueErrors.
    Warns: UserWarning for a truncated source and for unknown characters.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, max_source_length=None, **generate_kwargs):
        preprocess_params = {}
        if max_source_length is not None:
            preprocess_params["max_source_length"] = max_source_length
        return preprocess_params, generate_kwargs, {}

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple)) and len(inputs) == 0:
            return []
        result = super().__call__(inputs, *args, **kwargs)
        if isinstance(inputs, (list, tuple)) and all(len(item) == 1 for item in result):
            return [item[0] for item in result]  # one dict per sentence, as HF's Text2Text/translation pipelines
        return result

    def preprocess(self, text, max_source_length=None):
        if not isinstance(text, str):
            raise ValueError(f"TranslationPipeline expects a string or a list of strings, got {type(text).__name__}")
        if isinstance(max_source_length, bool) or not isinstance(max_source_length, (int, type(None))) or \
                (max_source_length is not None and max_source_length < 1):
            raise ValueError(f"max_source_length must be a positive integer, got {max_source_length!r}")
        text = clean_source(text)
        limit = source_limit(self.model, max_source_length)
        model_inputs = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=limit)
        if text:
            length = len(self.tokenizer(text, verbose=False)["input_ids"])
            if length > limit:
                warnings.warn(truncation_message(1, 1, limit), UserWarning, stacklevel=2)
            unknown = unknown_characters(self.tokenizer, [text])[0]
            if unknown:
                warnings.warn(unknown_message(1, 1, unknown), UserWarning, stacklevel=2)
        # An empty sentence travels with the same keys as the others (so it batches) and comes out as "".
        model_inputs["empty"] = torch.tensor([not text])  # (1,); batched: (b,)
        return model_inputs

    def _forward(self, model_inputs, **generate_kwargs):
        empty = model_inputs.pop("empty")  # (b,)
        if bool(empty.all()):
            count = generate_kwargs.get("num_return_sequences") or self.model.generation_config.num_return_sequences
            output_ids = torch.zeros((len(empty), count or 1, 0), dtype=torch.long)
        else:
            with torch.no_grad():
                output_ids = self.model.generate(input_ids=model_inputs["input_ids"],
                                                 attention_mask=model_inputs["attention_mask"], **generate_kwargs)
            output_ids = output_ids.reshape(len(empty), -1, output_ids.shape[-1])  # (b * k, t) -> (b, k, t)
        return {"output_ids": output_ids, "empty": empty}

    def postprocess(self, model_outputs):
        output_ids = model_outputs["output_ids"][0]  # (1, k, t) -> (k, t)
        if bool(model_outputs["empty"][0]):
            return [{"translation_text": ""} for _ in range(len(output_ids))]
        texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]
