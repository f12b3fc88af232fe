"""Attention maps: the numbers behind the pictures (rows are distributions, the decoder cannot see the future,
padding gets no weight, the weights are generate()'s own), the pictures hold those numbers, and the command."""

import json
import math

import pytest
import torch
from conftest import TINY_SENTENCES, load_script

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.attention_maps import (
    attention_weights,
    batch_masks,
    learning_rates,
    load_model,
    model_masks,
    plot_attention_matrix,
    plot_heads,
    plot_masks,
    plot_positional_encoding,
    plot_sentence_attention,
    positional_wavelength,
    sentence_attention,
)
from scratch_transformer.tokenization import train_tokenizer

show_attention = load_script("show_attention")


@pytest.fixture(scope="module")
def tiny():
    """A tiny untrained model of 2 + 3 layers and 4 heads (sdpa by default, as from_pretrained gives) and its tokenizer."""
    tokenizer = train_tokenizer(TINY_SENTENCES * 3, vocab_size=300, min_frequency=1, model_max_length=64)
    config = ScratchTransformerConfig(vocab_size=len(tokenizer), d_model=32, num_heads=4, encoder_layers=2,
                                      decoder_layers=3, d_ff=64, dropout=0.0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(config).eval()
    model.set_attn_implementation("sdpa")
    model.generation_config.max_length = 10
    return model, tokenizer


def test_sentence_attention_shapes_rows_and_causal_triangle(tiny):
    model, tokenizer = tiny
    maps = sentence_attention(model, tokenizer, "Ein Hund läuft über die Wiese.")
    s, t = len(maps.source_tokens), len(maps.output_tokens)
    assert maps.source_tokens[-1] == "</s>" and maps.input_tokens[0] == "<s>"
    assert maps.input_tokens[1:] == maps.output_tokens[:-1]  # the decoder reads what it produced, one step behind
    assert maps.encoder.shape == (2, 4, s, s)
    assert maps.decoder.shape == (3, 4, t, t)
    assert maps.cross.shape == (3, 4, t, s)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
        assert (weights >= 0).all()
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    assert (maps.decoder[..., future] == 0).all()  # query i sees keys 0 .. i only (paper 3.2.3)
    assert (maps.decoder[..., ~future] > 0).all()
    assert model.config._attn_implementation == "sdpa"  # switched to eager for the call, and back


def test_weights_are_those_of_the_translation_generate_produced(tiny):
    """Greedy: the teacher-forced pass predicts exactly the generated tokens, and its cross-attention rows are
    the ones generate() itself returns, step by step."""
    model, tokenizer = tiny
    sentence = "Zwei Männer spielen Fußball."
    maps = sentence_attention(model, tokenizer, sentence, num_beams=1)
    source = tokenizer([sentence], return_tensors="pt")
    model.set_attn_implementation("eager")
    try:
        generated = model.generate(**source, num_beams=1, output_attentions=True, return_dict_in_generate=True)
    finally:
        model.set_attn_implementation("sdpa")
    ids = generated.sequences[0]
    assert tokenizer.convert_ids_to_tokens(ids[1:].tolist()) == maps.output_tokens
    assert maps.translation == tokenizer.decode(ids, skip_special_tokens=True).strip()
    weights = attention_weights(model, source["input_ids"], ids[None, :-1], source["attention_mask"])
    assert weights["logits"][0].argmax(-1).tolist() == ids[1:].tolist()
    for step, layers in enumerate(generated.cross_attentions):  # steps x layers x (1, h, 1, s)
        for layer, step_weights in enumerate(layers):
            assert torch.allclose(maps.cross[layer, :, step], step_weights[0, :, -1], atol=1e-5)


def test_padded_keys_get_zero_weight_and_padding_changes_nothing(tiny):
    model, tokenizer = tiny
    sources = ["Ein Hund.", "Zwei Männer spielen Fußball auf der Wiese."]
    targets = ["Two men are playing football.", "A dog."]  # padding on both sides, in different rows
    masks = batch_masks(tokenizer, sources, targets)
    assert not masks["attention_mask"].all() and not masks["decoder_attention_mask"].all()
    weights = attention_weights(model, masks["input_ids"], masks["decoder_input_ids"], masks["attention_mask"],
                                masks["decoder_attention_mask"])
    for kind in ("encoder", "decoder", "cross"):
        allowed = masks[kind][:, None, None]  # (b, q, k) -> (b, 1, 1, q, k), over layers and heads
        assert (weights[kind].masked_select(~allowed) == 0).all(), kind
        assert torch.allclose(weights[kind].sum(-1), torch.ones(weights[kind].shape[:-1]), atol=1e-5)
    # the short sentence alone, unpadded: the same weights on its real tokens
    s = int(masks["attention_mask"][0].sum())
    t = int(masks["decoder_attention_mask"][1].sum())
    alone = attention_weights(model, masks["input_ids"][:1, :s], masks["decoder_input_ids"][:1])
    assert torch.allclose(alone["encoder"][0], weights["encoder"][0, ..., :s, :s], atol=1e-5)
    assert torch.allclose(alone["cross"][0], weights["cross"][0, ..., :s], atol=1e-5)
    alone = attention_weights(model, masks["input_ids"][1:], masks["decoder_input_ids"][1:, :t])
    assert torch.allclose(alone["decoder"][0], weights["decoder"][1, ..., :t, :t], atol=1e-5)


def test_batch_masks_are_the_paper_masks(tiny):
    _, tokenizer = tiny
    masks = batch_masks(tokenizer, ["Ein Hund.", "Zwei Männer spielen Fußball."], ["A dog.", "Two men play."])
    source_real = masks["attention_mask"].bool()
    assert masks["decoder_input_ids"][:, 0].eq(tokenizer.bos_token_id).all()
    for i in range(2):
        assert (masks["encoder"][i] == source_real[i][None, :]).all()
        assert (masks["cross"][i] == source_real[i][None, :]).all()
        t = masks["decoder"].shape[-1]
        for q in range(t):
            for k in range(t):
                assert bool(masks["decoder"][i, q, k]) == (k <= q and bool(masks["decoder_attention_mask"][i, k]))
    with pytest.raises(ValueError, match="as many targets as sources"):
        batch_masks(tokenizer, ["Ein Hund."], [])


def test_pictures_hold_the_numbers(tiny):
    model, tokenizer = tiny
    maps = sentence_attention(model, tokenizer, "Eine Frau sitzt auf einer Bank.")
    figure = plot_sentence_attention(maps)
    images = [ax.images[0].get_array() for subfigure in figure.subfigs for ax in subfigure.axes if ax.images]
    expected = [weights[layer, head] for weights in (maps.encoder, maps.decoder, maps.cross)
                for layer in range(weights.shape[0]) for head in range(weights.shape[1])]
    assert len(images) == len(expected) == 2 * 4 + 3 * 4 + 3 * 4
    for image, weights in zip(images, expected):
        assert torch.allclose(torch.as_tensor(image.data), weights)
    cross_only = plot_sentence_attention(maps, kinds=["cross"], layers=[2], heads=[1, 3])
    images = [ax.images[0].get_array() for subfigure in cross_only.subfigs for ax in subfigure.axes if ax.images]
    assert [torch.allclose(torch.as_tensor(i.data), maps.cross[2, h]) for i, h in zip(images, (1, 3))] == [True, True]
    tick_labels = [label.get_text() for label in cross_only.subfigs[0].axes[0].get_yticklabels()]
    assert tick_labels == maps.output_tokens
    with pytest.raises(ValueError, match="heads \\[4\\] out of range"):
        plot_heads(maps.cross, maps.output_tokens, maps.source_tokens, heads=[4])
    with pytest.raises(ValueError, match="kinds must be"):
        plot_sentence_attention(maps, kinds=["self"])

    masks = batch_masks(tokenizer, ["Ein Hund.", "Zwei Männer spielen Fußball."], ["A dog.", "Two men play."])
    images = [ax.images[0].get_array() for ax in plot_masks(masks).axes if ax.images]
    for index, image in enumerate(images):
        row, kind = divmod(index, 3)
        assert (torch.as_tensor(image.data) == masks[("encoder", "decoder", "cross")[kind]][row]).all()


def test_positional_encoding_picture_is_the_sinusoid_table():
    figure = plot_positional_encoding(d_model=16, num_positions=30)
    table = torch.as_tensor(figure.axes[0].images[0].get_array().data)
    assert table.shape == (30, 16)
    for pos, i in ((0, 0), (7, 2), (29, 5)):
        angle = pos / 10000 ** (2 * i / 16)
        assert math.isclose(table[pos, 2 * i], math.sin(angle), abs_tol=1e-5)
        assert math.isclose(table[pos, 2 * i + 1], math.cos(angle), abs_tol=1e-5)
    with pytest.raises(ValueError, match="outside"):
        plot_positional_encoding(d_model=4, dimensions=[4])


def test_learning_rates_from_a_run_folder(tmp_path):
    history = [{"step": 5, "learning_rate": 1e-4, "loss": 9.0}, {"step": 10, "learning_rate": 2e-4},
               {"step": 10, "eval_bleu": 1.0}, {"step": 15, "learning_rate": 1.5e-4}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert learning_rates(str(tmp_path)) == ([5, 10, 15], [1e-4, 2e-4, 1.5e-4])
    assert learning_rates(history) == learning_rates(str(tmp_path / "trainer_state.json"))
    with pytest.raises(ValueError, match="no trainer_state.json"):
        learning_rates(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no learning rate"):
        learning_rates([{"step": 1, "loss": 2.0}])


def test_sentence_attention_refuses_bad_input(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="non-empty string"):
        sentence_attention(model, tokenizer, "  ")
    with pytest.raises(ValueError, match="num_return_sequences"):
        sentence_attention(model, tokenizer, "Ein Hund.", num_beams=2, num_return_sequences=2)


def test_show_attention_command(tiny_model_dir, tmp_path, capsys):
    outputs = {name: tmp_path / f"{name}.png" for name in ("attention", "masks", "pe")}
    written = show_attention.main(["--model", str(tiny_model_dir), "Ein Hund läuft über die Wiese.", "Ein Hund.",
                                   "--output", str(outputs["attention"]), "--masks_output", str(outputs["masks"]),
                                   "--positional_encoding_output", str(outputs["pe"]), "--num_beams", "2", "--dpi", "40"])
    model, tokenizer = load_model(str(tiny_model_dir))
    expected = sentence_attention(model, tokenizer, "Ein Hund läuft über die Wiese.", num_beams=2).translation
    assert written["translation"] == expected
    assert f"-> {expected}" in capsys.readouterr().out
    for path in outputs.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    ([], "give a source sentence"),
    (["Ein Hund.", "--kinds", "self"], "--kinds self: choose among"),
    (["Ein Hund.", "--layers", "0"], "--layers 0: give numbers from 1"),
    (["Ein Hund.", "--heads", "3"], "--heads 3: the model has 2"),
    (["Ein Hund.", "--output", "attention.jpg"], "name a .png, .pdf, .svg file"),
    (["Ein Hund.", "--output", "no/such/folder/a.png"], "its folder does not exist"),
    (["Ein Hund.", "--learning_rate_output", "lr.png"], "holds no trainer_state.json"),
])
def test_show_attention_refuses_bad_arguments(tiny_model_dir, argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        show_attention.main(["--model", str(tiny_model_dir), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_show_attention_refuses_a_folder_without_a_model(tmp_path, capsys):
    with pytest.raises(SystemExit):
        show_attention.main(["--model", str(tmp_path), "Ein Hund."])
    assert "holds no trained model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        show_attention.main(["--model", str(tmp_path / "missing"), "Ein Hund."])
    assert "no such folder" in capsys.readouterr().err


def test_model_masks_are_what_the_model_applies(tiny):
    """The masks read from inside the model (hooks on its attention layers) are the paper's: source padding for
    the encoder and the cross-attention, causal and target padding for the decoder; and padded keys get no weight."""
    model, tokenizer = tiny
    batch = batch_masks(tokenizer, ["Ein Hund.", "Zwei Männer spielen Fußball."], ["A dog.", "Two men play."])
    masks = model_masks(model, batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"],
                        batch["decoder_attention_mask"])
    source, target = batch["attention_mask"].bool(), batch["decoder_attention_mask"].bool()
    t = target.size(1)
    assert not source[0].all()  # the first sentence is padded
    assert (masks["encoder"] == source[:, None, :]).all() and (masks["cross"] == source[:, None, :]).all()
    assert (masks["decoder"] == (torch.ones(t, t, dtype=torch.bool).tril() & target[:, None, :])).all()
    assert masks["raw"]["decoder"].dtype == torch.bool  # sdpa's form: True = may attend
    model.set_attn_implementation("eager")
    try:
        eager = model_masks(model, batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"],
                            batch["decoder_attention_mask"])
    finally:
        model.set_attn_implementation("sdpa")
    assert set(eager["raw"]["decoder"].unique().tolist()) == {0.0, torch.finfo(torch.float32).min}  # additive
    assert all((eager[kind] == masks[kind]).all() for kind in ("encoder", "decoder", "cross"))
    assert model.config._attn_implementation == "sdpa" and not model.get_encoder().layers[0].self_attn._forward_pre_hooks
    weights = attention_weights(model, batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"],
                                batch["decoder_attention_mask"])
    assert (weights["cross"][0][..., ~source[0]] == 0).all()


def test_attention_matrix_picture_and_titles_that_fit(tiny):
    model, tokenizer = tiny
    maps = sentence_attention(model, tokenizer, "Zwei Männer spielen Fußball.")
    mean = maps.cross[-1].mean(0)
    figure = plot_attention_matrix(mean, maps.output_tokens, maps.source_tokens, title="mean over heads")
    assert torch.allclose(torch.as_tensor(figure.axes[0].images[0].get_array().data), mean)
    assert len(figure.axes[0].texts) == mean.numel()  # the values written in the cells
    with pytest.raises(ValueError, match="labels"):
        plot_attention_matrix(mean, maps.output_tokens[:-1], maps.source_tokens)
    # one head: the figure is narrow, so its long title is wrapped into lines that fit instead of clipped
    one_head = plot_sentence_attention(maps, kinds=["cross"], heads=[1])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(one_head)
    canvas.draw()
    renderer = canvas.get_renderer()
    width = one_head.bbox.width
    for text in [one_head._suptitle, *[sub._suptitle for sub in one_head.subfigs]]:
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width, text.get_text()
        assert "\n" in text.get_text() or box.width < width


def test_positional_encoding_picture_draws_dimensions_far_apart():
    figure = plot_positional_encoding(d_model=128, num_positions=100)
    labels = [line.get_label() for line in figure.axes[1].get_lines()]
    assert labels == ["dim 0: wavelength 6", "dim 16: wavelength 20", "dim 32: wavelength 63", "dim 64: wavelength 628"]
    assert math.isclose(positional_wavelength(33, 128), positional_wavelength(32, 128))  # a (sin, cos) pair shares one
    # the longest wavelength is the last pair's, 2π·10000^(126/128) = 2π·8660: just under 2π·10000, as the title says
    assert "to 2π·8660 (dims 126, 127), just under 2π·10000" in figure.axes[1].get_title()
    assert math.isclose(positional_wavelength(127, 128), 2 * math.pi * 10000 ** (126 / 128))
