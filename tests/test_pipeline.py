"""TranslationPipeline: HF's translation return shapes, and empty sentences inside batches (tiny model, seconds)."""

import pytest

SENTENCES = ["Ein Hund läuft.", "Zwei Männer spielen Fußball auf einer Wiese.", "Eine Frau sitzt."]


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    import scratch_transformer  # noqa: F401  (registers "scratch-translation")
    from transformers import pipeline

    return pipeline("scratch-translation", model=str(tiny_model_dir))


@pytest.fixture(scope="module")
def expected(pipe):
    """Greedy translations of SENTENCES, one generate() call per sentence (translate() of the package)."""
    from scratch_transformer.inference import translate

    return [translate(pipe.model, pipe.tokenizer, [s], num_beams=1)[0] for s in SENTENCES]


def test_a_string_gives_a_list_of_one_dict(pipe, expected):
    assert pipe(SENTENCES[0], num_beams=1) == [{"translation_text": expected[0]}]
    assert expected[0]  # the tiny model does produce text, so "" below means "empty input"


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_list_gives_one_dict_per_sentence(pipe, expected, batch_size):
    """As transformers' translation / text2text pipelines: n strings in, n dicts out (not n lists)."""
    assert pipe(SENTENCES, num_beams=1, batch_size=batch_size) == [{"translation_text": t} for t in expected]


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_empty_sentences_in_a_list_translate_to_empty_strings(pipe, expected, batch_size):
    inputs = [SENTENCES[0], "", SENTENCES[1], "   ", SENTENCES[2]]
    assert pipe(inputs, num_beams=1, batch_size=batch_size) == [
        {"translation_text": expected[0]}, {"translation_text": ""}, {"translation_text": expected[1]},
        {"translation_text": ""}, {"translation_text": expected[2]},
    ]
    assert pipe(["", ""], batch_size=2) == [{"translation_text": ""}, {"translation_text": ""}]


def test_num_return_sequences_gives_a_list_per_sentence_batched_or_not(pipe):
    inputs = [SENTENCES[0], "", SENTENCES[1]]
    one_by_one = pipe(inputs, num_beams=2, num_return_sequences=2, batch_size=1)
    assert [len(item) for item in one_by_one] == [2, 2, 2]
    assert one_by_one[1] == [{"translation_text": ""}, {"translation_text": ""}]
    assert pipe(inputs, num_beams=2, num_return_sequences=2, batch_size=3) == one_by_one


def test_non_string_input_is_rejected(pipe):
    with pytest.raises(ValueError, match="expects a string or a list of strings, got int"):
        pipe([SENTENCES[0], 3])
