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


def test_an_over_long_sentence_is_truncated_with_translate_scripts_warning(pipe):
    """One rule for the pipeline and translate.py: a source longer than max_source_length (at most the model's
    positions) is truncated with a warning (the pipeline once refused it: 'positions exceed ...')."""
    from scratch_transformer.inference import translate

    long = " ".join(["Ein Hund läuft über die Wiese."] * 20)
    limit = pipe.model.config.max_position_embeddings
    assert len(pipe.tokenizer(long)["input_ids"]) > limit
    message = (rf"^1 of 1 sentences are longer than max_source_length={limit} tokens and were truncated: their "
               rf"translations cover only the first {limit} tokens")
    with pytest.warns(UserWarning, match=message):
        piped = pipe(long, num_beams=1)
    with pytest.warns(UserWarning, match=message):
        assert piped == [{"translation_text": translate(pipe.model, pipe.tokenizer, [long], num_beams=1)[0]}]
    with pytest.warns(UserWarning, match=r"^1 of 1 sentences are longer than max_source_length=5 tokens"):
        assert pipe(SENTENCES[1], num_beams=1, max_source_length=5) == [{"translation_text": translate(
            pipe.model, pipe.tokenizer, [SENTENCES[1]], num_beams=1, max_source_length=5)[0]}]


def test_a_newline_is_a_space_and_unseen_characters_are_named(pipe, expected):
    from scratch_transformer.inference import translate

    assert pipe(SENTENCES[1].replace(" ", "\n", 2), num_beams=1) == [{"translation_text": expected[1]}]
    assert translate(pipe.model, pipe.tokenizer, [SENTENCES[1].replace(" ", "\n", 2)], num_beams=1) == [expected[1]]
    with pytest.warns(UserWarning, match=r"^1 of 1 sentences hold characters the tokenizer has never seen "
                                         r"\('😀'\): they are read as <unk>"):
        pipe("Ein Hund 😀 läuft.", num_beams=1)
    with pytest.warns(UserWarning, match=r"^1 of 2 sentences hold characters the tokenizer has never seen "
                                         r"\('😀', '☃'\)"):
        translate(pipe.model, pipe.tokenizer, ["Ein Hund 😀 läuft ☃.", "Ein Hund."], num_beams=1)
