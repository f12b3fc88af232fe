"""Side-by-side CPU speed benchmark: our Transformer vs transformers' Marian vs a naive baseline.

Run from the repository root: `python -m benchmarks --size small --repeats 3` (`--help` for the
flags; `python scripts/benchmark.py ...` is kept as a shim that runs the same command).
A trained model through each inference engine (torch, torch int8, CTranslate2): `python -m
benchmarks.inference_engines --model outputs/multi30k_de_en`; quality side by side with Marian:
`python -m benchmarks.quality`.

Contenders, all at identical sizes, from the same seed, fp32 on CPU (benchmarks/contenders.py):
    ours-eager   ScratchTransformerForConditionalGeneration, config._attn_implementation = "eager"
    ours-sdpa    the same with "sdpa" (F.scaled_dot_product_attention)
    marian       MarianMTModel from a MarianConfig matching ours (post-LN, ReLU, sinusoidal positions,
                 scaled, shared + tied embeddings, same dropouts and special ids), attn "sdpa"
    naive        benchmarks/naive_transformer.py (tutorial-style; greedy decoding without a cache)
    marian-eager (optional, not in the default set) Marian with attn "eager", as the main job runs it (its config
                 sets eager for both models): ratio train_main_job_ours_eager_over_marian_eager
Ours is built with share_encoder_decoder_embeddings=True so that its trainable parameters equal
Marian's (Marian's sinusoid tables are frozen parameters and are not counted).

Figures, each timed in a fresh child process (forkserver, libraries preloaded; --same-process to
time them here), contenders in alternation (A B C A B C ...) after warm-up, median [min-max] over
repeats (benchmarks/measure.py). Fresh processes because leftovers change the next figure: after a
training figure in the same process, beam-4 ours/Marian went from 1.20 to 1.01 (glibc's heap state,
see docs/results.md).
    train    forward + backward + AdamW step in train mode with labels; (source + target) tokens/s
    train_main_job  the main job's step as it runs (ours and Marian): forward in the precision the main
             job picks on this machine (scratch_transformer.training.choose_precision: bf16 autocast
             on a CPU with native bf16, fp32 elsewhere), label smoothing 0.1 as the main job's
             Trainer computes it (ours: the model's fused loss; Marian: float32 logits through HF's
             LabelSmoother), backward and AdamW step; the report's header gives the CPU model and
             whether it computes bf16 natively
    greedy   new tokens/s of model.generate(do_sample=False, num_beams=1, min_new_tokens=M,
             max_new_tokens=M, attention_mask=...); for naive, naive_greedy_decode (M steps, no cache)
    beam4    model.generate(num_beams=4, same M); new tokens/s counted as batch * M
    split    for generate() calls (greedy, beam4; ours and Marian): the seconds spent inside the model's
             forward calls (forward hooks on the encoder and the whole model) and the rest, which is
             generate()'s own work: the same transformers code for both models except the model's own
             cache reordering in beam search, so it shows how far the model alone can move the ratios
    memory   in a fresh child process per contender and figure (multiprocessing "forkserver", which has
             imported the libraries once): VmHWM - VmRSS from /proc/self/status, i.e. the peak resident
             set size reached while running the figure twice, minus the RSS just before (model and
             inputs built, optimizer object created); the peak is reset first by writing 5 to
             /proc/self/clear_refs. For training it therefore includes gradients and AdamW moments
             as well as activations; for decoding the KV cache, logits and activations. One-time costs
             (library pages touched for the first time, allocator caches) are included too, so read it
             as a comparison between contenders, not as exact tensor bytes.
    matmul   the machine's fp32 torch.mm throughput in this run (1024^3 square, and a model-shaped
             (batch*src_len x d_model) @ (d_model x d_ff)), measured at the start and at the end; the
             reference is the median of the square measurements.

FLOPs are counted analytically (benchmarks/flops.py; matmuls only: projections, attention scores and
weighted sums as computed, i.e. the full causal square in training, the output projection; 2 FLOPs
per multiply-add; backward = 2 x forward). Decoding FLOPs are those of cached incremental decoding
(the useful work); the naive loop's executed FLOPs (whole prefix every step) are reported beside.

Modules: contenders.py (one class per kind of contender, built by name in one place), measure.py
(timing, memory, matmul throughput, child processes), flops.py, report.py (the JSON entries, ratios
and the printed tables), cli.py (flags and the run), naive_transformer.py (the baseline),
micro_kernels.py (per-kernel figures, a separate script).
"""
