"""A translator in the browser (Gradio): type German, get English, and see where the model looked.

Examples:
    pip install ".[demo]"
    python scripts/demo.py --model outputs/multi30k_de_en            # then open http://127.0.0.1:7860
    python scripts/demo.py --model user/scratch-de-en --trust_remote_code --port 8080
    python scripts/demo.py --model outputs/multi30k_de_en --write_space space/   # a folder ready to be a Space

Beam size and length penalty are chosen in the page (the penalty only at beam > 1, where it applies); the
translation comes with the time generate() took, the beam's best candidates with their scores, and an interactive
heatmap (Plotly: tokens and weight on hover) of any of the three attentions (encoder-decoder, encoder self, decoder
self), any layer, one head or the mean over heads. A paragraph is split into sentences, each translated on its own
(the model learnt from single sentences). The weights are the model's own (scratch_transformer.attention_maps).
The app sends nothing anywhere: Gradio's analytics are off and its page uses the browser's own fonts.
On a Hugging Face Space, set the model with the variable SCRATCH_TRANSFORMER_MODEL (docs/attention_and_demo.md).
"""

import os
import shutil
import sys
from dataclasses import dataclass, field

# Before gradio is imported: no usage statistics, no version check, no telemetry from huggingface_hub.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from transformers import HfArgumentParser  # noqa: E402  (torch, the model and gradio load after the checks)

EXAMPLES = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt mit dem Fahrrad über eine Brücke.",
            "Eine Frau mit einem roten Hut liest ein Buch im Park.", "Kinder spielen Fußball auf einer Wiese."]
MEAN_HEADS = "mean over heads"
MAX_BEAMS = 8
NOTHING_TO_VIEW = ("Translate first: the attention shown is that of this session's last translation (an API client "
                   "calls /translate, then /view, with the same Client)")


@dataclass
class DemoArguments:
    model: str | None = field(default=None, metadata={
        "help": "A trained model: local folder or Hub id (default: the variable SCRATCH_TRANSFORMER_MODEL)."})
    host: str | None = field(default=None, metadata={
        "help": "Address to serve on (default: GRADIO_SERVER_NAME or 127.0.0.1; 0.0.0.0 opens it to the network)."})
    port: int | None = field(default=None, metadata={"help": "Port (default: GRADIO_SERVER_PORT or 7860)."})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "Longest translation, in tokens (default: the model's generation config)."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit id)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code from the Hub."})
    write_space: str | None = field(default=None, metadata={
        "help": "Write a folder ready to upload as a Hugging Face Space (app.py, requirements.txt, README.md, the "
                "package) for --model, and exit."})


KINDS = {"encoder-decoder (cross)": "cross", "encoder self-attention": "encoder", "decoder self-attention": "decoder"}
AXES = {"cross": ("English produced (query)", "German (key)"), "encoder": ("German (query)", "German (key)"),
        "decoder": ("English produced (query)", "decoder input so far (key)")}
MAX_CANDIDATES = 4


def split_sentences(text: str) -> list[str]:
    """A paragraph cut into sentences after . ! or ? followed by a space and a capital or a digit: the model was
    trained on single caption-like sentences (Multi30k) and translates each one on its own."""
    import re

    parts = re.split(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ0-9\"„])", text.strip())
    return [part.strip() for part in parts if part.strip()]


def attention_figure(maps, kind: str, layer: str, head: str):
    """A Plotly heatmap of one attention (kind: "cross", "encoder" or "decoder") at one layer (1-based), one head
    or the mean over heads: rows are queries, columns keys, each cell's tokens and weight shown on hover."""
    import plotly.graph_objects as go

    weights = getattr(maps, kind)  # (L, h, queries, keys)
    layer_index = min(int(layer), weights.shape[0]) - 1
    matrix = weights[layer_index].mean(0) if head == MEAN_HEADS else weights[layer_index, int(head) - 1]
    import html

    rows = maps.source_tokens if kind == "encoder" else maps.output_tokens
    columns = maps.input_tokens if kind == "decoder" else maps.source_tokens
    rows, columns = [html.escape(t) for t in rows], [html.escape(t) for t in columns]  # Plotly reads "</s>" as HTML
    which = f"mean over {weights.shape[1]} heads" if head == MEAN_HEADS else f"head {head}"
    name = {"cross": "Encoder-decoder attention", "encoder": "Encoder self-attention",
            "decoder": "Decoder self-attention"}[kind]
    hover = [[[rows[i], columns[j]] for j in range(len(columns))] for i in range(len(rows))]
    figure = go.Figure(go.Heatmap(
        z=matrix.tolist(), x=list(range(len(columns))), y=list(range(len(rows))), customdata=hover,
        colorscale="Viridis", zmin=0.0, zmax=1.0, colorbar={"title": {"text": "weight"}},
        hovertemplate="%{customdata[0]} → %{customdata[1]}<br>weight %{z:.3f}<extra></extra>"))
    tick_size = 12 if max(len(rows), len(columns)) <= 24 else 9
    figure.update_xaxes(tickvals=list(range(len(columns))), ticktext=columns, tickangle=-60, title=AXES[kind][1],
                        tickfont={"size": tick_size})
    figure.update_yaxes(tickvals=list(range(len(rows))), ticktext=rows, autorange="reversed", title=AXES[kind][0],
                        tickfont={"size": tick_size})
    figure.update_layout(title={"text": f"{name}, layer {layer_index + 1}, {which}", "font": {"size": 15}},
                         height=min(max(360, 20 * len(rows) + 220), 900), margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return figure


def translation_candidates(model, tokenizer, sentence: str, generate_kwargs: dict, limit: int = MAX_CANDIDATES):
    """The beam's best translations (up to `limit`, one at beam 1) with the model's log-probability of each
    (a teacher-forced forward: sum over its tokens, `</s>` included) and beam search's own score (the sum divided
    by length ** length_penalty, what it ranks by): rows [rank, translation, log-probability, per token, beam score]."""
    import torch

    num_beams = int(generate_kwargs.get("num_beams", 1))
    count = min(num_beams, limit)
    source = tokenizer([sentence], return_tensors="pt", truncation=True,
                       max_length=getattr(model.config, "max_position_embeddings", 256))
    with torch.no_grad():
        output = model.generate(**source, **generate_kwargs, num_return_sequences=count, return_dict_in_generate=True,
                                output_scores=True)
    sequences = output.sequences.cpu()  # (count, 1 + n)
    labels = sequences[:, 1:].clone()
    ended = (labels == model.config.eos_token_id).long().cumsum(-1)
    labels[(ended - (labels == model.config.eos_token_id).long()) > 0] = -100  # after the first </s>: padding
    with torch.no_grad():
        logits = model(input_ids=source["input_ids"].expand(count, -1),
                       attention_mask=source["attention_mask"].expand(count, -1),
                       decoder_input_ids=sequences[:, :-1]).logits.float().cpu()  # (count, n, v)
    log_probabilities = logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0] * (labels != -100)
    totals, lengths = log_probabilities.sum(-1), (labels != -100).sum(-1)
    beam_scores = getattr(output, "sequences_scores", None)
    rows = []
    for rank in range(count):
        rows.append([rank + 1, tokenizer.decode(sequences[rank], skip_special_tokens=True).strip(),
                     round(float(totals[rank]), 3), round(float(totals[rank] / lengths[rank]), 3),
                     round(float(beam_scores[rank]), 3) if beam_scores is not None else None])
    return rows


def build_demo(model, tokenizer, title: str = "scratch_transformer: German → English",
               max_new_tokens: int | None = None):
    """The Gradio Blocks app for a loaded model and tokenizer (see the module docstring)."""
    import gradio as gr

    from scratch_transformer.attention_maps import sentence_attention

    config, generation = model.config, model.generation_config
    layers = [str(i) for i in range(1, max(config.encoder_layers, config.decoder_layers) + 1)]
    heads = [MEAN_HEADS] + [str(i) for i in range(1, config.num_heads + 1)]
    default_beams = min(max(int(generation.num_beams or 1), 1), MAX_BEAMS)
    default_penalty = float(generation.length_penalty if generation.length_penalty is not None else 1.0)
    kinds = list(KINDS)

    def sentence_choices(results):
        return [f"{i + 1}: {result['sentence']}" for i, result in enumerate(results)]

    def view(results, choice, kind, layer, head):
        """The heatmap and the candidates of the chosen sentence of this session's last translation."""
        if not results:  # e.g. a fresh API client (gradio_client) calling /view before /translate
            refusal = gr.Error(NOTHING_TO_VIEW)
            refusal.print_exception = False  # a message for the page or client, no traceback in the server's log
            raise refusal
        choices = sentence_choices(results)
        result = results[choices.index(choice) if choice in choices else 0]
        return attention_figure(result["maps"], KINDS[kind], layer, head), result["candidates"]

    def translate(text, num_beams, length_penalty, kind, layer, head):
        if not text or not text.strip():
            raise gr.Error("Type a German sentence first.")
        kwargs = {"num_beams": int(num_beams)}
        if max_new_tokens is not None:
            kwargs["max_new_tokens"] = max_new_tokens
        if kwargs["num_beams"] == 1:  # settings that apply to beam search only would be refused by generate()
            kwargs["early_stopping"] = False
        else:
            kwargs["length_penalty"] = float(length_penalty)
        results, seconds = [], 0.0
        try:
            for sentence in split_sentences(text):
                maps = sentence_attention(model, tokenizer, sentence, **dict(kwargs))
                seconds += maps.generate_seconds
                results.append({"sentence": sentence, "maps": maps,
                                 "candidates": translation_candidates(model, tokenizer, sentence, dict(kwargs))})
        except ValueError as error:  # e.g. settings generate() refuses: shown in the page, not a traceback
            raise gr.Error(str(error)) from None
        english = " ".join(result["maps"].translation for result in results)
        sources = sum(len(result["maps"].source_tokens) for result in results)
        produced = sum(len(result["maps"].output_tokens) for result in results)
        plural = "s" if len(results) > 1 else ""
        timing = (f"{seconds * 1000:.0f} ms to translate ({len(results)} sentence{plural}, {sources} source tokens, "
                  f"{produced} produced, beam {kwargs['num_beams']})")
        choices = sentence_choices(results)
        figure, candidates = view(results, choices[0], kind, layer, head)
        return (english, timing, figure, candidates,
                gr.update(choices=choices, value=choices[0], visible=len(choices) > 1), results)

    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        gr.Markdown(f"# {title}\nThe Transformer of *Attention Is All You Need*, written by hand. Type German, get "
                    "English, and see where the model looked: the encoder-decoder attention (for each English token "
                    "produced, a row, the weight each German token got), the encoder's self-attention and the "
                    "decoder's. Hover a cell for its tokens and weight. The model learnt from single caption-like "
                    "sentences: a paragraph is split into sentences, each translated on its own.")
        with gr.Row():
            with gr.Column():
                source = gr.Textbox(label="German", value=EXAMPLES[0], lines=2, elem_id="source")
                with gr.Row():
                    num_beams = gr.Slider(1, MAX_BEAMS, value=default_beams, step=1, label="beam size",
                                          elem_id="num_beams")
                    length_penalty = gr.Slider(0.0, 2.0, value=default_penalty, step=0.1,
                                               label="length penalty (beam search only)",
                                               interactive=default_beams > 1, elem_id="length_penalty")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
                gr.Examples(EXAMPLES, inputs=source)
            with gr.Column():
                target = gr.Textbox(label="English", interactive=False, elem_id="target")
                timing = gr.Textbox(label="time", interactive=False, elem_id="timing")
        candidates = gr.Dataframe(
            headers=["rank", "translation", "log-probability", "per token", "beam score"],
            label="the beam's best translations (log-probability: the model's, summed over the tokens; beam score: "
                  "that sum / length ** length penalty, what beam search ranks by)",
            interactive=False, wrap=True, column_widths=["6%", "58%", "13%", "10%", "13%"], elem_id="candidates")
        with gr.Row():
            sentence = gr.Dropdown([], label="sentence", visible=False, elem_id="sentence",
                                   allow_custom_value=True)  # its choices are a session's: any value reaches view()
            kind = gr.Radio(kinds, value=kinds[0], label="attention", elem_id="kind")
            layer = gr.Dropdown(layers, value=layers[-1], label="layer", elem_id="layer")
            head = gr.Dropdown(heads, value=MEAN_HEADS, label="head", elem_id="head")
        heatmap = gr.Plot(label="attention", elem_id="heatmap")
        state = gr.State([])
        inputs = [source, num_beams, length_penalty, kind, layer, head]
        outputs = [target, timing, heatmap, candidates, sentence, state]
        button.click(translate, inputs, outputs)
        source.submit(translate, inputs, outputs)
        num_beams.change(lambda beams: gr.update(interactive=int(beams) > 1), num_beams, length_penalty)
        for control in (sentence, kind, layer, head):
            control.change(view, [state, sentence, kind, layer, head], [heatmap, candidates])
    return demo


def local_theme():
    """Gradio's default look with the browser's own fonts: the page fetches no web fonts."""
    import gradio as gr

    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def launch(demo, host: str = "127.0.0.1", port: int = 7860, **kwargs):
    """Serve `demo` (no share link, no server-side rendering, no MCP server); blocks unless
    prevent_thread_lock=True is passed."""
    return demo.launch(server_name=host, server_port=port, share=False, ssr_mode=False, mcp_server=False,
                       theme=local_theme(), footer_links=[], run_history=False, **kwargs)


SPACE_README = """---
title: scratch_transformer German to English
emoji: 🔤
colorFrom: blue
colorTo: green
sdk: gradio
app_file: app.py
pinned: false
---

A Transformer written by hand (scratch_transformer), translating German to English, with its encoder-decoder
attention drawn for each translation. Model: {model}.
"""


def write_space(folder: str, model: str) -> None:
    """A folder ready to upload as a Gradio Space: app.py (this script), requirements.txt (the package's
    dependencies, the CPU build of torch), README.md (the Space's settings, the model id in SCRATCH_TRANSFORMER_MODEL's
    place), and a copy of the scratch_transformer package. Raises FileExistsError when the folder is not empty."""
    import importlib.metadata

    import scratch_transformer

    if os.path.isdir(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} is not empty")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.abspath(__file__), encoding="utf-8") as handle:
        app = handle.read().replace('os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")\n',
                                    'os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")\n'
                                    f'os.environ.setdefault("SCRATCH_TRANSFORMER_MODEL", {model!r})\n', 1)
    with open(os.path.join(folder, "app.py"), "w", encoding="utf-8") as handle:
        handle.write(app)
    requirements = [r for r in importlib.metadata.requires("scratch_transformer") or [] if "extra ==" not in r]
    requirements = [r for r in requirements if not r.startswith("torch")]
    with open(os.path.join(folder, "requirements.txt"), "w", encoding="utf-8") as handle:
        handle.write("--extra-index-url https://download.pytorch.org/whl/cpu\ntorch\n" + "\n".join(requirements)
                     + "\ngradio\nplotly\n")
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as handle:
        handle.write(SPACE_README.format(model=model))
    package = os.path.dirname(os.path.abspath(scratch_transformer.__file__))
    shutil.copytree(package, os.path.join(folder, "scratch_transformer"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(DemoArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    args.model = args.model or os.environ.get("SCRATCH_TRANSFORMER_MODEL")
    if not args.model:
        parser.error("give --model (a trained model's folder or Hub id) or set SCRATCH_TRANSFORMER_MODEL")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        parser.error(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    host = args.host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    try:
        port = args.port if args.port is not None else int(os.environ.get("GRADIO_SERVER_PORT", 7860))
    except ValueError:
        parser.error(f"GRADIO_SERVER_PORT={os.environ['GRADIO_SERVER_PORT']!r} is not a port number")
    if not 0 < port < 65536:
        parser.error(f"--port must be in 1 .. 65535, got {port}")

    from scratch_transformer.attention_maps import load_model, model_problem

    problem = model_problem(args.model)
    if problem:
        parser.error(f"--model {args.model}: {problem}")
    if args.write_space:
        from scratch_transformer.paths import space_model_problem

        if space_model_problem(args.model):  # the Space loads the model by its Hub id
            parser.error(f"--write_space {args.write_space}: {space_model_problem(args.model)}")
        try:
            write_space(args.write_space, args.model)
        except (FileExistsError, OSError) as error:
            parser.error(f"--write_space {args.write_space}: {error}")
        print(f"wrote {args.write_space}: upload it with\n  hf upload USER/SPACE_NAME {args.write_space} "
              "--repo-type space")
        return None
    try:
        import gradio  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as error:
        parser.error(f'the demo needs gradio and plotly ({error.name} is missing): pip install ".[demo]"')
    try:
        model, tokenizer = load_model(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError, RuntimeError, ImportError) as error:
        parser.error(f"--model {args.model}: cannot load it: {error}")
    demo = build_demo(model, tokenizer, max_new_tokens=args.max_new_tokens)
    launch(demo, host, port)
    return demo


if __name__ == "__main__":
    main()
