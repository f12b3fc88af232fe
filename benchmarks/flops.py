"""Analytic FLOPs of the three figures (matmuls only; 2 FLOPs per multiply-add; backward = 2 x forward)."""


def analytic_flops(sizes: dict) -> dict:
    d, f, v = sizes["d_model"], sizes["d_ff"], sizes["vocab_size"]
    le, ld = sizes["encoder_layers"], sizes["decoder_layers"]
    b, s, t = sizes["batch_size"], sizes["src_len"], sizes["tgt_len"]

    def encoder(rows):
        # per token: Q,K,V,O projections 8d^2, FFN 4df, scores + weighted sum 4sd
        return le * rows * s * (8 * d * d + 4 * d * f + 4 * s * d)

    def decoder_token(ctx):
        # self-attn projections 8d^2 + scores 4*ctx*d; cross Q,O 4d^2 + scores 4sd; FFN 4df
        return ld * (8 * d * d + 4 * ctx * d + 4 * d * d + 4 * s * d + 4 * d * f)

    cross_kv = ld * s * 4 * d * d  # per row: encoder output through cross K, V
    head = 2 * d * v

    train_fwd = encoder(b) + b * (t * decoder_token(t) + cross_kv + t * head)
    train = 3 * train_fwd

    def cached_decode(rows, m):
        steps = sum(decoder_token(i) + head for i in range(1, m + 1))
        return encoder(b) + rows * (cross_kv + steps)

    def naive_decode(rows, m):  # whole prefix of i tokens at step i, cross K/V recomputed, head on last only
        steps = sum(i * decoder_token(i) + cross_kv + head for i in range(1, m + 1))
        return encoder(b) + rows * steps

    return {
        "method": "analytic matmul FLOPs (2 per multiply-add): projections, attention scores and weighted sums "
                  "(full causal square in training), FFN, output projection; backward = 2 x forward; "
                  "decoding counted as cached incremental decoding",
        "train_per_step": train,
        "train_per_token": train / (b * (s + t)),
        "greedy_per_call": cached_decode(b, t),
        "beam4_per_call": cached_decode(4 * b, t),
        "naive_greedy_executed_per_call": naive_decode(b, t),
        "six_times_params_per_token_note": "for comparison, 6 x trainable params per (src+tgt) token",
    }
