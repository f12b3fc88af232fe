"""A translation pipeline (transformers 5 removed its own "translation" task).

Shipped beside the weights (config `custom_pipelines`), so that
`pipeline(model="user/name", trust_remote_code=True)` translates without this package installed;
in-process: `TranslationPipeline(model=model, tokenizer=tokenizer)` or
`pipeline("scratch-translation", model=...)` after `import scratch_transformer`.
Flat file, imports only transformers and torch (it travels with checkpoints).
"""

import torch
from transformers import Pipeline


class TranslationPipeline(Pipeline):
    """Text in, translation out, with the return shapes of transformers' (v4) translation pipeline.

    `pipe("Ein Hund.")` -> `[{"translation_text": "A dog."}]`; a list of n strings -> a list of n dicts,
    `pipe(["Ein Hund.", "Eine Katze."])` -> `[{"translation_text": "A dog."}, {"translation_text": "A cat."}]`;
    with num_return_sequences=k > 1 each sentence gives a list of k dicts instead. An empty (or blank) sentence
    translates to "", in a batch too. A generator or Dataset streams one list of dicts per sentence.

    Call arguments (all optional) are passed to `model.generate`: num_beams, max_new_tokens,
    max_length, length_penalty, do_sample, ...; `batch_size` batches a list of sentences;
    `max_source_length` truncates each source to that many tokens.
    Raises ValueError for input that is not a string or a list of strings, and generate()'s ValueErrors.
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
        model_inputs = self.tokenizer(text.strip(), return_tensors="pt", truncation=max_source_length is not None,
                                      max_length=max_source_length)
        # An empty sentence travels with the same keys as the others (so it batches) and comes out as "".
        model_inputs["empty"] = torch.tensor([not text.strip()])  # (1,); batched: (b,)
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
