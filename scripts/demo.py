"""A translator in the browser (Gradio): type German, get English, and see where the model looked.

Examples:
    pip install ".[demo]"
    python scripts/demo.py --model outputs/multi30k_de_en            # then open http://127.0.0.1:7860
    python scripts/demo.py --model user/scratch-de-en --trust_remote_code --port 8080
    python scripts/demo.py --model outputs/multi30k_de_en --write_space space/   # a folder ready to be a Space

Beam size and length penalty are chosen in the page; the translation comes with the time generate() took and the
encoder-decoder (cross) attention of the translation as a heatmap, layer and head selectable (rows: the English
tokens produced, columns: the German tokens). The weights are the model's own (scratch_transformer.attention_maps).
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
ALL_HEADS = "all heads"
MAX_BEAMS = 8


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


def _cross_attention_figure(maps, layer: str, head: str):
    """The cross-attention of one layer (1-based, as the page shows it), one head or all of them."""
    from scratch_transformer.attention_maps import plot_heads

    layer_index = int(layer) - 1
    heads = None if head == ALL_HEADS else [int(head) - 1]
    figure = plot_heads(maps.cross, maps.output_tokens, maps.source_tokens, layers=[layer_index], heads=heads,
                        title=f"Encoder-decoder attention, layer {layer} (rows: English produced, columns: German)")
    return figure


def build_demo(model, tokenizer, title: str = "scratch_transformer: German → English",
               max_new_tokens: int | None = None):
    """The Gradio Blocks app for a loaded model and tokenizer (see the module docstring)."""
    import gradio as gr

    from scratch_transformer.attention_maps import sentence_attention

    config, generation = model.config, model.generation_config
    layers = [str(i) for i in range(1, config.decoder_layers + 1)]
    heads = [ALL_HEADS] + [str(i) for i in range(1, config.num_heads + 1)]
    default_beams = min(max(int(generation.num_beams or 1), 1), MAX_BEAMS)
    default_penalty = float(generation.length_penalty if generation.length_penalty is not None else 1.0)

    def translate(sentence, num_beams, length_penalty, layer, head):
        if not sentence or not sentence.strip():
            raise gr.Error("Type a German sentence first.")
        kwargs = {"num_beams": int(num_beams), "length_penalty": float(length_penalty)}
        if max_new_tokens is not None:
            kwargs["max_new_tokens"] = max_new_tokens
        if kwargs["num_beams"] == 1:  # settings that apply to beam search only would be refused by generate()
            kwargs["early_stopping"] = False
        try:
            maps = sentence_attention(model, tokenizer, sentence, **kwargs)
        except ValueError as error:  # e.g. settings generate() refuses: shown in the page, not a traceback
            raise gr.Error(str(error)) from None
        timing = (f"{maps.generate_seconds * 1000:.0f} ms to translate ({len(maps.source_tokens)} source tokens, "
                  f"{len(maps.output_tokens)} produced, beam {kwargs['num_beams']})")
        return maps.translation, timing, _cross_attention_figure(maps, layer, head), maps

    def redraw(maps, layer, head):
        return None if maps is None else _cross_attention_figure(maps, layer, head)

    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        gr.Markdown(f"# {title}\nThe Transformer of *Attention Is All You Need*, written by hand. Type German, get "
                    "English, and see the encoder-decoder attention: for each English token produced (row), how "
                    "much each head looked at each German token (column).")
        with gr.Row():
            with gr.Column():
                source = gr.Textbox(label="German", value=EXAMPLES[0], lines=2, elem_id="source")
                with gr.Row():
                    num_beams = gr.Slider(1, MAX_BEAMS, value=default_beams, step=1, label="beam size")
                    length_penalty = gr.Slider(0.0, 2.0, value=default_penalty, step=0.1, label="length penalty")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
                gr.Examples(EXAMPLES, inputs=source)
            with gr.Column():
                target = gr.Textbox(label="English", interactive=False, elem_id="target")
                timing = gr.Textbox(label="time", interactive=False, elem_id="timing")
        with gr.Row():
            layer = gr.Dropdown(layers, value=layers[-1], label="layer", elem_id="layer")
            head = gr.Dropdown(heads, value=ALL_HEADS, label="head", elem_id="head")
        heatmap = gr.Plot(label="cross-attention", format="png", elem_id="heatmap")
        state = gr.State(None)
        inputs = [source, num_beams, length_penalty, layer, head]
        outputs = [target, timing, heatmap, state]
        button.click(translate, inputs, outputs)
        source.submit(translate, inputs, outputs)
        layer.change(redraw, [state, layer, head], heatmap)
        head.change(redraw, [state, layer, head], heatmap)
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
                     + "\ngradio\n")
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
    except ImportError:
        parser.error('the demo needs gradio: pip install ".[demo]"')
    try:
        model, tokenizer = load_model(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError, RuntimeError, ImportError) as error:
        parser.error(f"--model {args.model}: cannot load it: {error}")
    demo = build_demo(model, tokenizer, max_new_tokens=args.max_new_tokens)
    launch(demo, host, port)
    return demo


if __name__ == "__main__":
    main()
