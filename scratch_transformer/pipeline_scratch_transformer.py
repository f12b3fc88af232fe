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
    """Text in, translation out: `pipe("Ein Hund.")` -> `[{"translation_text": "A dog."}]`.

    Call arguments (all optional) are passed to `model.generate`: num_beams, max_new_tokens,
    max_length, length_penalty, do_sample, ...; `batch_size` batches a list of sentences.
    Raises ValueError for input that is not a string or a list of strings.
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
        return super().__call__(inputs, *args, **kwargs)

    def preprocess(self, text, max_source_length=None):
        if not isinstance(text, str):
            raise ValueError(f"TranslationPipeline expects a string or a list of strings, got {type(text).__name__}")
        if not text.strip():
            return {"empty": True}  # an empty sentence translates to an empty string, as in translate()
        return self.tokenizer(text.strip(), return_tensors="pt", truncation=max_source_length is not None,
                              max_length=max_source_length)

    def _forward(self, model_inputs, **generate_kwargs):
        if "input_ids" not in model_inputs:
            return {"output_ids": None}
        with torch.no_grad():
            output_ids = self.model.generate(input_ids=model_inputs["input_ids"],
                                             attention_mask=model_inputs["attention_mask"], **generate_kwargs)
        return {"output_ids": output_ids}

    def postprocess(self, model_outputs):
        if model_outputs["output_ids"] is None:
            return [{"translation_text": ""}]
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]
