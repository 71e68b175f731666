"""Makes the model-family fixtures in tests/fixtures/llm/ with the reference library.

Run from the repository root with PyTorch, transformers, safetensors, numpy and gguf installed
(CPU is enough; never part of CI; no network: every model is made from a config):

    python scripts/make_family_fixtures.py

For each family below it writes a random tiny checkpoint with `save_pretrained` (config.json,
model.safetensors, generation_config.json) and logits.json: inputs with left and right padding
whose positions reach past the original context of the scaled-RoPE variants, the logits at every
position, and the greedy continuation of two prompts from `generate`. The Qwen3 and Llama 3
checkpoints are also written as GGUF files (f32 tensors, llama.cpp's names; Llama's Q/K rows
permuted as llama.cpp's converter does, and Llama 3's RoPE scaling as its `rope_freqs` tensor).

- tiny_qwen3: Qwen3 dense (q/k RMS norms per head, explicit head_dim, no biases);
- tiny_llama3: Llama with `rope_scaling = {rope_type: llama3}` (all three frequency bands used);
- tiny_yarn: Qwen2 with YaRN scaling (the attention factor and the ramp);
- tiny_linear: Mistral (model_type `mistral`, no sliding window) with linear RoPE scaling.
"""

import json
import math
import os

import numpy as np
import torch
import transformers

OUT = os.path.join("tests", "fixtures", "llm")
COMMON = dict(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 16}


def make(kind):
    torch.manual_seed({"qwen3": 10, "llama3": 11, "yarn": 12, "linear": 13}[kind])
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, rope_theta=1000000.0, **COMMON)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif kind == "llama3":
        # θ = 100 with head_dim 8: wavelengths 6.3, 19.9, 62.8, 199 against an original context
        # of 16 (bands: kept below 16/2 = 8, divided above 16/0.5 = 32, smoothed between).
        cfg = transformers.LlamaConfig(rope_theta=100.0, rope_scaling=LLAMA3, **COMMON)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "yarn":
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
        cfg = transformers.Qwen2Config(rope_theta=10000.0, rope_scaling=yarn,
                                       use_sliding_window=False, **COMMON)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        lin = {"rope_type": "linear", "factor": 2.0}
        cfg = transformers.MistralConfig(rope_theta=10000.0, rope_scaling=lin, sliding_window=None,
                                         **COMMON)
        model = transformers.MistralForCausalLM(cfg)
    model.eval()
    # Random init leaves the norms at 1 and biases at 0; perturb them so they are tested too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
            # Sharper attention than the 0.02-std init gives, so positions (and the RoPE
            # scaling) move the logits well beyond the tests' tolerance.
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10.0)
    d = os.path.join(OUT, f"tiny_{kind}")
    model.save_pretrained(d, safe_serialization=True)
    t = 40
    tokens = [[0] * 4 + [(7 * i + 3) % 80 for i in range(t - 4)],
              [(11 * i + 5) % 80 for i in range(t)],
              [(13 * i + 1) % 80 for i in range(t - 6)] + [0] * 6]
    mask = [[0] * 4 + [1] * (t - 4), [1] * t, [1] * (t - 6) + [0] * 6]
    ids = torch.tensor(tokens)
    am = torch.tensor(mask)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits
    prompts = [[5, 17, 33, 61, 9, 12, 40, 3, 22, 71, 8, 19, 30, 44, 57, 66, 6, 13],
               [3, 9, 27]]
    greedy = []
    for p in prompts:
        with torch.no_grad():
            g = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        greedy.append(g[0, len(p):].tolist())
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"tokens": tokens, "mask": mask, "position_ids": pos.tolist(),
                   "logits": np.round(logits.double().numpy(), 5).tolist(), "prompts": prompts, "greedy": greedy}, f)
    return model, cfg


def llama3_factors(cfg, head_dim):
    """llama.cpp's per-frequency divisors of the Llama 3 scaling (its `rope_freqs` tensor)."""
    r = LLAMA3
    lo_wl = r["original_max_position_embeddings"] / r["low_freq_factor"]
    hi_wl = r["original_max_position_embeddings"] / r["high_freq_factor"]
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (theta(cfg) ** (i / head_dim))
        wl = 2 * math.pi / freq
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(r["factor"])
        else:
            s = (r["original_max_position_embeddings"] / wl - r["low_freq_factor"]) / (
                r["high_freq_factor"] - r["low_freq_factor"])
            out.append(1.0 / ((1 - s) / r["factor"] + s))
    return np.array(out, dtype=np.float32)


def theta(cfg):
    """RoPE θ of a config (transformers 5 keeps it in `rope_parameters`)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    return params.get("rope_theta") or getattr(cfg, "rope_theta")


def permute(w, n_head):
    """llama.cpp's converter's Q/K row order for its interleaved RoPE."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def write_gguf(model, cfg, arch, path, rope_freqs=None):
    import gguf
    w = gguf.GGUFWriter(path, arch)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(theta(cfg))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, p in model.state_dict().items():
        a = p.detach().numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            g = f"blk.{layer}.{names[module]}.{kind}"
            if arch == "llama" and module == "self_attn.q_proj":
                a = permute(a, cfg.num_attention_heads)
            if arch == "llama" and module == "self_attn.k_proj":
                a = permute(a, cfg.num_key_value_heads)
        w.add_tensor(g, a)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    qwen3, qcfg = make("qwen3")
    write_gguf(qwen3, qcfg, "qwen3", os.path.join(OUT, "tiny_qwen3.gguf"))
    llama3, lcfg = make("llama3")
    hd = lcfg.hidden_size // lcfg.num_attention_heads
    write_gguf(llama3, lcfg, "llama", os.path.join(OUT, "tiny_llama3.gguf"),
               rope_freqs=llama3_factors(lcfg, hd))
    make("yarn")
    make("linear")
    print("fixtures written to", OUT, "with torch", torch.__version__, "transformers",
          transformers.__version__, "numpy", np.__version__)
