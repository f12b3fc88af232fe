"""The Gradio demo (scripts/demo.py): in a real browser (headless Chromium driven by Playwright, marked `browser`,
run explicitly by .ci/run) and, without one, its arguments and the folder it writes for a Space.

The browser test skips when gradio, playwright or Debian's chromium is missing, unless
SCRATCH_TRANSFORMER_REQUIRE_BROWSER=1 (set by .ci/run), where a missing piece fails it."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO_ROOT, load_script
from helpers import GUARD_SOURCE, subprocess_env

demo = load_script("demo")

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PARAGRAPH = ["Zwei Männer spielen Fußball.", "Ein Hund läuft über die Wiese."]  # split, translated one by one
TITLE = "#heatmap .gtitle"

# The demo in a process whose every connection off this machine is refused and written down (one JSON line each).
SERVER = GUARD_SOURCE + '''
import json, runpy, sys


class Logged(list):
    def append(self, item):
        with open(sys.argv[1], "a", encoding="utf-8") as handle:
            handle.write(json.dumps(item) + "\\n")
        super().append(item)


OUTSIDE = Logged()
install_guard()
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _require(what: str, available: bool):
    if not available:
        if os.environ.get("SCRATCH_TRANSFORMER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{what} is missing, and SCRATCH_TRANSFORMER_REQUIRE_BROWSER=1 asks for the browser test")
        pytest.skip(f"{what} is missing")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, process, log_path, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the demo exited:\n" + log_path.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the demo did not answer at {url} within {timeout:g} s:\n" + log_path.read_text()[-3000:])


@pytest.mark.browser
def test_translate_in_the_browser(tiny_model_dir, tmp_path):
    """Start the demo on 127.0.0.1, type a two-sentence paragraph in Chromium, press Translate: the English is the
    model's own translation of each sentence, the time and the candidates are shown; the heatmap shows tokens and
    weight on hover, follows the head, the attention kind (all three) and the sentence chosen; the length penalty
    is live only at beam > 1; nothing leaves the machine."""
    try:
        import gradio  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        _require('gradio and plotly (pip install ".[demo]")', False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _require('playwright (pip install ".[browser]")', False)
    _require(f"chromium ({CHROMIUM}; apt-get install chromium)", os.path.isfile(CHROMIUM))

    from scratch_transformer.attention_maps import load_model, sentence_attention

    model, tokenizer = load_model(str(tiny_model_dir))
    maps = [sentence_attention(model, tokenizer, sentence, num_beams=1) for sentence in PARAGRAPH]
    expected = " ".join(m.translation for m in maps)

    port, outside, log_path = _free_port(), tmp_path / "outside.jsonl", tmp_path / "demo.log"
    script = tmp_path / "serve.py"
    script.write_text(SERVER)
    env = subprocess_env(GRADIO_ANALYTICS_ENABLED="False")
    env.pop("GRADIO_SERVER_NAME", None)
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen([sys.executable, str(script), str(outside), str(REPO_ROOT / "scripts" / "demo.py"),
                                    "--model", str(tiny_model_dir), "--port", str(port)],
                                   cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    seen = {}
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_for(url, process, log_path)
        requests = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1600})
                page.on("request", lambda request: requests.append(request.url))
                page.goto(url, wait_until="domcontentloaded")
                penalty = page.locator("#length_penalty input[type=range]")
                penalty.wait_for(timeout=60_000)
                seen["penalty at beam 1"] = penalty.is_disabled()
                page.locator("#source textarea").fill(" ".join(PARAGRAPH))
                page.locator("#translate").click()
                page.wait_for_function("document.querySelector('#target textarea')?.value.length > 0",
                                       timeout=120_000)
                seen["english"] = page.locator("#target textarea").input_value()
                seen["timing"] = page.locator("#timing textarea").input_value()
                page.locator(TITLE).wait_for(timeout=60_000)
                seen["candidates"] = page.locator("#candidates").inner_text()

                def title_becomes(old):
                    page.wait_for_function("(old) => { const t = document.querySelector('#heatmap .gtitle'); "
                                           "return t && t.textContent !== old; }", arg=old, timeout=60_000)
                    return page.locator(TITLE).text_content()

                def rows():
                    return page.locator("#heatmap .ytick text").all_text_contents()

                seen["title"], seen["rows"] = page.locator(TITLE).text_content(), rows()
                box = page.locator("#heatmap .nsewdrag").first.bounding_box()  # hover the middle of the map
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.locator("#heatmap .hovertext").first.wait_for(timeout=30_000)
                seen["hover"] = page.locator("#heatmap .hovertext").first.text_content()

                page.locator("#head input").click()  # one head instead of the mean: redrawn from the kept weights
                page.get_by_role("option", name="2", exact=True).click()
                seen["head title"] = title_becomes(seen["title"])
                page.locator("#kind").get_by_text("encoder self-attention").click()
                seen["encoder title"] = title_becomes(seen["head title"])
                seen["encoder rows"] = rows()
                page.locator("#kind").get_by_text("decoder self-attention").click()
                seen["decoder title"] = title_becomes(seen["encoder title"])
                page.locator("#sentence input").click()  # the second sentence's map
                page.get_by_role("option", name=f"2: {PARAGRAPH[1]}").click()
                page.wait_for_function("(old) => JSON.stringify([...document.querySelectorAll('#heatmap .ytick text')]"
                                       ".map(t => t.textContent)) !== old", arg=json.dumps(rows()), timeout=60_000)
                seen["second sentence rows"] = rows()
                page.locator("#num_beams input[type=number]").fill("2")
                page.locator("#num_beams input[type=number]").press("Enter")
                page.wait_for_function("!document.querySelector('#length_penalty input[type=range]').disabled",
                                       timeout=30_000)
                seen["english after"] = page.locator("#target textarea").input_value()
            finally:
                browser.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    assert seen["english"] == expected
    assert "ms to translate (2 sentences" in seen["timing"] and "beam 1" in seen["timing"]
    assert maps[0].translation in seen["candidates"]  # the first sentence's candidates, with their scores
    assert seen["title"] == "Encoder-decoder attention, layer 1, mean over 2 heads"
    assert seen["rows"] == maps[0].output_tokens  # rows: the English tokens produced
    assert " → " in seen["hover"] and "weight 0." in seen["hover"]  # hover: query token → key token, weight
    assert seen["head title"] == "Encoder-decoder attention, layer 1, head 2"
    assert seen["encoder title"] == "Encoder self-attention, layer 1, head 2" and seen["encoder rows"] == maps[0].source_tokens
    assert seen["decoder title"] == "Decoder self-attention, layer 1, head 2"
    assert seen["second sentence rows"] == maps[1].output_tokens
    assert seen["penalty at beam 1"] is True  # the length penalty does nothing at beam 1: disabled until beam 2
    assert seen["english after"] == seen["english"]  # redrawn, not translated again
    assert {request.split("/")[2] for request in requests} == {f"127.0.0.1:{port}"}  # the page fetched nothing else
    attempts = [json.loads(line) for line in outside.read_text().splitlines()] if outside.exists() else []
    assert attempts == [], f"the demo tried to reach other machines: {attempts}"


def test_write_space(tiny_model_dir, tmp_path, capsys):
    space = tmp_path / "space"
    assert demo.main(["--model", "someone/scratch-de-en", "--write_space", str(space)]) is None
    assert "hf upload USER/SPACE_NAME" in capsys.readouterr().out
    assert sorted(path.name for path in space.iterdir()) == ["README.md", "app.py", "requirements.txt",
                                                               "scratch_transformer"]
    readme = (space / "README.md").read_text()
    assert "sdk: gradio" in readme and "app_file: app.py" in readme
    app = (space / "app.py").read_text()
    assert "os.environ.setdefault(\"SCRATCH_TRANSFORMER_MODEL\", 'someone/scratch-de-en')" in app
    requirements = (space / "requirements.txt").read_text().splitlines()
    assert "gradio" in requirements and "plotly" in requirements and any(line.startswith("transformers") for line in requirements)
    assert [line for line in requirements if line.startswith("torch")] == ["torch"]  # the CPU build's index is given
    assert (space / "scratch_transformer" / "attention_maps.py").is_file()
    assert not list(space.rglob("__pycache__"))
    compile(app, "app.py", "exec")  # the Space's entry point is valid Python (starting it loads torch: too slow here)
    with pytest.raises(SystemExit):
        demo.main(["--model", "someone/scratch-de-en", "--write_space", str(space)])
    assert "is not empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([], "give --model"),
    (["--model", "{folder}", "--port", "0"], "--port must be in 1 .. 65535"),
    (["--model", "{folder}", "--max_new_tokens", "0"], "--max_new_tokens must be >= 1"),
    (["--model", "{tmp}"], "holds no trained model"),
])
def test_demo_refuses_bad_arguments(tiny_model_dir, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.delenv("SCRATCH_TRANSFORMER_MODEL", raising=False)
    argv = [arg.format(folder=tiny_model_dir, tmp=tmp_path) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err



def test_api_view_says_translate_first_then_follows_the_translation(tiny_model_dir):
    """Issue 54: a fresh gradio_client calling /view got "... not in the list of choices: []" (the sentence
    selector's choices belong to a session). Now it is told to translate first; after /translate, /view in the same
    session draws the chosen attention of that translation."""
    pytest.importorskip("plotly", reason='the demo needs plotly (pip install ".[demo]")')
    pytest.importorskip("gradio", reason='the demo needs gradio (pip install ".[demo]")')
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from scratch_transformer.attention_maps import load_model

    model, tokenizer = load_model(str(tiny_model_dir))
    app, port = demo.build_demo(model, tokenizer), _free_port()
    demo.launch(app, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        sentence = "1: " + PARAGRAPH[0]
        with pytest.raises(AppError, match="Translate first"):
            client.predict(sentence, "encoder self-attention", "1", demo.MEAN_HEADS, api_name="/view")
        english = client.predict(PARAGRAPH[0], 1, 1.0, "encoder-decoder (cross)", "1", demo.MEAN_HEADS,
                                 api_name="/translate")[0]
        figure, _ = client.predict(sentence, "encoder self-attention", "1", "2", api_name="/view")
    finally:
        app.close()
    assert english and '"Encoder self-attention, layer 1, head 2"' in figure["plot"]


def test_split_sentences():
    assert demo.split_sentences("Ein Hund läuft. Zwei Männer spielen Fußball! Eine Frau liest?  Ein Kind.") == [
        "Ein Hund läuft.", "Zwei Männer spielen Fußball!", "Eine Frau liest?", "Ein Kind."]
    assert demo.split_sentences("Der Turm ist 3.5 m hoch. dann") == ["Der Turm ist 3.5 m hoch. dann"]


def test_attention_figure_and_candidates(tiny_model_dir):
    """The heatmap the page shows holds the model's weights (one head, or the mean over heads) for each of the three
    kinds, with the tokens as labels; the candidates are the beam's, best first, with the model's log-probability."""
    pytest.importorskip("plotly", reason='the demo needs plotly (pip install ".[demo]")')
    import torch

    from scratch_transformer.attention_maps import load_model, sentence_attention

    model, tokenizer = load_model(str(tiny_model_dir))
    maps = sentence_attention(model, tokenizer, "Zwei Männer spielen Fußball.", num_beams=1)
    for label, kind in demo.KINDS.items():
        weights = getattr(maps, kind)
        mean = demo.attention_figure(maps, kind, "1", demo.MEAN_HEADS)
        assert torch.allclose(torch.tensor(mean.data[0].z), weights[0].mean(0), atol=1e-6)
        head = demo.attention_figure(maps, kind, "1", "2")
        assert torch.allclose(torch.tensor(head.data[0].z), weights[0, 1], atol=1e-6)
        assert "weight %{z:.3f}" in head.data[0].hovertemplate
    cross = demo.attention_figure(maps, "cross", "1", "1")
    assert list(cross.layout.yaxis.ticktext) == [t.replace("<", "&lt;").replace(">", "&gt;") for t in maps.output_tokens]
    assert cross.layout.title.text == "Encoder-decoder attention, layer 1, head 1"
    rows = demo.translation_candidates(model, tokenizer, "Zwei Männer spielen Fußball.", {"num_beams": 3,
                                                                                          "length_penalty": 1.0})
    assert [row[0] for row in rows] == [1, 2, 3]
    assert [row[4] for row in rows] == sorted((row[4] for row in rows), reverse=True)  # ranked by beam score
    assert all(row[2] <= 0 and row[3] <= 0 for row in rows)  # log-probabilities, summed and per token
    greedy = demo.translation_candidates(model, tokenizer, "Zwei Männer spielen Fußball.", {"num_beams": 1,
                                                                                            "early_stopping": False})
    assert len(greedy) == 1 and greedy[0][1] == maps.translation and greedy[0][4] is None
