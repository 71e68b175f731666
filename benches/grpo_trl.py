"""TRL's side of the GRPO step benchmark (`benches/grpo_step.sh`): one `GRPOTrainer` run with the
settings of Ember's `recipes/smollm2-gsm8k-grpo.toml` as that script overrides them (SmolLM2-135M
-Instruct in f32, LoRA r16/alpha32 on the seven projections, P GSM8K prompts x G samples, N new
tokens, one optimizer step per generation, no KL, no reference model), on the CPU.

Prints one JSON object: seconds of each step (wall), of its generation and of the rest (the
update), and the process's peak resident memory; then the last step as one line.

Needs (PyPI, in a venv of its own): torch, transformers, trl, peft, datasets.
"""

import argparse
import json
import re
import resource
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

TEMPLATE = '{question}\nSolve it step by step, then end with "The answer is N."'
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def gsm8k(path, n):
    rows = []
    with open(path) as f:
        for line in f:
            ex = json.loads(line)
            answer = ex["answer"].split("####")[-1].strip().replace(",", "")
            prompt = [{"role": "user", "content": TEMPLATE.format(question=ex["question"])}]
            rows.append({"prompt": prompt, "solution": answer})
            if len(rows) == n:
                break
    return Dataset.from_list(rows)


def accuracy(completions, solution, **kwargs):
    """1 for "The answer is N." with the right N, 0.1 for the form alone (Ember's recipe)."""
    out = []
    for c, s in zip(completions, solution):
        m = re.search(r"The answer is\s*\$?(-?[\d,\.]+)", c[0]["content"])
        if m is None:
            out.append(0.0)
        else:
            out.append(1.0 if m.group(1).rstrip(".").replace(",", "") == s else 0.1)
    return out


class Clock(TrainerCallback):
    def __init__(self):
        self.steps, self.t0 = [], None

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.steps.append(time.perf_counter() - self.t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a Hugging Face directory (ember export)")
    ap.add_argument("--data", required=True, help="GSM8K train.jsonl")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--gradient-checkpointing", choices=["default", "on", "off"], default="default")
    ap.add_argument("--out", default="/tmp/ember-trl-grpo")
    a = ap.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    extra = {}
    if a.gradient_checkpointing != "default":
        extra["gradient_checkpointing"] = a.gradient_checkpointing == "on"
    cfg = GRPOConfig(
        output_dir=a.out,
        per_device_train_batch_size=a.prompts * a.samples,
        num_generations=a.samples,
        max_completion_length=a.max_new,
        learning_rate=1e-4,
        beta=0.0,
        temperature=1.0,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        **extra,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=accuracy,
        args=cfg,
        train_dataset=gsm8k(a.data, a.prompts * a.steps),
        processing_class=tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, task_type="CAUSAL_LM"),
        callbacks=[clock],
    )
    gen = []
    inner = trainer._generate_and_score_completions

    def timed(*args, **kw):
        t = time.perf_counter()
        out = inner(*args, **kw)
        gen.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    r = {
        "step_s": clock.steps,
        "gen_s": gen,
        "update_s": [s - g for s, g in zip(clock.steps, gen)],
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(r))
    # The last step and the mean after the first, in the line format of benches/grpo_step.sh.
    step, name = r["step_s"][-1], f"trl gc={r['gradient_checkpointing']}"
    warm = r["step_s"][1:] or [step]
    print(
        f"{name:<28} step {step:7.1f} s  mean after step 1 {sum(warm) / len(warm):7.1f} s  "
        f"gen {r['gen_s'][-1]:6.1f} s  "
        f"update {r['update_s'][-1]:6.1f} s  peak {r['peak_rss_mib']:6.0f} MiB"
    )


if __name__ == "__main__":
    main()
