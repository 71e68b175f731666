"""Makes the LLM fidelity fixtures in tests/fixtures/llm/ with the reference library.

Run from the repository root with PyTorch, transformers, safetensors and gguf installed (CPU is
enough; never part of CI):

    python scripts/make_llm_fixtures.py --smollm2 PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf

It writes:
- tiny_llama/, tiny_qwen2/: random tiny models saved with save_pretrained (config.json,
  model.safetensors, generation_config.json), plus logits.json: inputs with left and right
  padding, the position ids used, and the logits at every position;
- smollm2.json: for a few prompts, the token ids the reference tokenizer produces, the
  next-token logits (top 64 ids and values, log-sum-exp), the rendered chat template and the
  greedy continuation of a chat prompt, from transformers' GGUF loader;
- tiny_llama_peft/: a PEFT LoRA adapter (random non-zero factors) on tiny_llama saved by
  `peft`, plus logits.json with the adapter applied (same inputs as tiny_llama/logits.json);
- gguf_blocks.json: dequantized values of a few rows of SmolLM2's Q8_0 and Q4_1 tensors, from
  the gguf package's reference dequantizer.
"""

import argparse
import json
import os

import numpy as np
import torch
import transformers

OUT = os.path.join("tests", "fixtures", "llm")


def tiny(kind):
    torch.manual_seed(0 if kind == "llama" else 1)
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if kind == "llama":
        cfg = transformers.LlamaConfig(rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(rope_theta=1000000.0, use_sliding_window=False, **common)
        cfg.tie_word_embeddings = True
        model = transformers.Qwen2ForCausalLM(cfg)
    model.eval()
    # Random init leaves the norms at 1 and biases at 0; perturb them so they are tested too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(OUT, f"tiny_{kind}")
    model.save_pretrained(d, safe_serialization=True)
    tokens = [[0, 0, 5, 17, 33, 61, 90], [3, 9, 27, 81, 44, 12, 7], [8, 16, 24, 32, 40, 0, 0]]
    mask = [[0, 0, 1, 1, 1, 1, 1], [1] * 7, [1, 1, 1, 1, 1, 0, 0]]
    ids = torch.tensor(tokens)
    am = torch.tensor(mask)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"tokens": tokens, "mask": mask, "position_ids": pos.tolist(),
                   "logits": logits.tolist()}, f)


def peft_adapter():
    import peft
    d = os.path.join(OUT, "tiny_llama")
    model = transformers.LlamaForCausalLM.from_pretrained(d)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                          lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    pm.eval()
    out = os.path.join(OUT, "tiny_llama_peft")
    pm.save_pretrained(out)
    with open(os.path.join(d, "logits.json")) as f:
        inputs = json.load(f)
    ids = torch.tensor(inputs["tokens"])
    am = torch.tensor(inputs["mask"])
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = pm(input_ids=ids, attention_mask=am, position_ids=pos).logits
    with open(os.path.join(out, "logits.json"), "w") as f:
        json.dump({"tokens": inputs["tokens"], "mask": inputs["mask"], "logits": logits.tolist()}, f)


def check_ember_peft(path):
    """Loads an adapter Ember saved (tests write one with EMBER_KEEP_PEFT) into peft."""
    import peft
    base = transformers.LlamaForCausalLM.from_pretrained(os.path.join(OUT, "tiny_llama"))
    pm = peft.PeftModel.from_pretrained(base, path)
    ids = torch.tensor([[5, 17, 33, 61]])
    with torch.no_grad():
        print("peft loaded Ember's adapter; logits[0, -1, :4] =", pm(ids).logits[0, -1, :4].tolist())


def smollm2(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    prompts = ["The capital of France is", "1 + 1 = 2, 12 + 34 =", "def fibonacci(n):"]
    out = {"prompts": []}
    for p in prompts:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 64)
        out["prompts"].append({"text": p, "ids": ids, "top_ids": top.indices.tolist(),
                               "top_logits": top.values.tolist(),
                               "logsumexp": torch.logsumexp(logits, 0).item()})
    messages = [{"role": "user", "content": "What is 7 times 8?"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    out["chat"] = {"messages": messages, "rendered": rendered, "ids": ids,
                   "greedy": gen[0, len(ids):].tolist(),
                   "greedy_text": tok.decode(gen[0, len(ids):], skip_special_tokens=True)}
    with open(os.path.join(OUT, "smollm2.json"), "w") as f:
        json.dump(out, f)


def gguf_blocks(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(path)
    out = {}
    for t in r.tensors:
        if t.name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.3.ffn_down.weight"):
            full = dequantize(t.data, t.tensor_type)
            rows = [0, 1, full.shape[0] - 1]
            out[t.name] = {"type": t.tensor_type.name, "shape": list(full.shape),
                           "rows": {str(i): full[i, :64].astype(float).tolist() for i in rows}}
    with open(os.path.join(OUT, "gguf_blocks.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", required=True, help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--check-ember-peft", help="only load this Ember-saved adapter with peft")
    args = ap.parse_args()
    if args.check_ember_peft:
        check_ember_peft(args.check_ember_peft)
        raise SystemExit(0)
    os.makedirs(OUT, exist_ok=True)
    tiny("llama")
    tiny("qwen2")
    peft_adapter()
    gguf_blocks(args.smollm2)
    smollm2(args.smollm2)
    print("fixtures written to", OUT, "with torch", torch.__version__, "transformers",
          transformers.__version__, "numpy", np.__version__)
