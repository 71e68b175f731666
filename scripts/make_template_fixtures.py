"""Makes tests/fixtures/llm/chat_templates.json: real chat templates rendered by transformers.

The templates are the ones PyPI `trl` 1.16.0 ships in `trl/chat_templates/` (Qwen3, Qwen2.5,
Llama 3.1, Llama 3.2: the model cards' templates); the test reads them from the test venv that
`scripts/fetch_assets.sh` installs, so no template text is committed. Run from the repository
root with transformers installed (no network, no model):

    python scripts/make_template_fixtures.py --trl PATH/TO/site-packages/trl

Each case is a template file name, the conversation, `add_generation_prompt`, the extra template
variables (`enable_thinking`, `date_string`), the special tokens given, and the text transformers'
`render_jinja_template` (what `apply_chat_template` calls) produces, with the template's SHA-256.
"""

import argparse
import hashlib
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

OUT = os.path.join("tests", "fixtures", "llm", "chat_templates.json")

QWEN = {"eos_token": "<|im_end|>"}
LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

ASK = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
]
# An earlier turn with its reasoning in the content: Qwen3's template drops it from history.
FOLLOW_UP = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]
# The last turn an answer with reasoning (a training example): Qwen3 keeps its reasoning.
ANSWERED = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
]
NO_SYSTEM = [{"role": "user", "content": "Hi"}]

CASES = [
    ("qwen3.jinja", ASK, True, {}, QWEN),
    ("qwen3.jinja", ASK, True, {"enable_thinking": False}, QWEN),
    ("qwen3.jinja", FOLLOW_UP, True, {}, QWEN),
    ("qwen3.jinja", FOLLOW_UP, True, {"enable_thinking": False}, QWEN),
    ("qwen3.jinja", ANSWERED, False, {}, QWEN),
    ("qwen2_5.jinja", NO_SYSTEM, True, {}, QWEN),
    ("qwen2_5.jinja", FOLLOW_UP, False, {}, QWEN),
    ("llama3_2.jinja", ASK, True, {"date_string": "02 Dec 2026"}, LLAMA),
    ("llama3_2.jinja", FOLLOW_UP, True, {"date_string": "02 Dec 2026"}, LLAMA),
    ("llama3_1.jinja", ASK, True, {}, LLAMA),
    ("llama3_1.jinja", NO_SYSTEM, False, {}, LLAMA),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trl", required=True, help="the installed trl package directory")
    args = ap.parse_args()
    cases = []
    for name, messages, gen, kwargs, special in CASES:
        with open(os.path.join(args.trl, "chat_templates", name), encoding="utf-8") as f:
            template = f.read()
        text = render_jinja_template(
            conversations=[messages],
            chat_template=template,
            add_generation_prompt=gen,
            **special,
            **kwargs,
        )
        text = text[0][0] if isinstance(text, tuple) else text
        cases.append(
            {
                "template": name,
                "sha256": hashlib.sha256(template.encode()).hexdigest(),
                "messages": messages,
                "add_generation_prompt": gen,
                "kwargs": kwargs,
                "special": special,
                "text": text,
            }
        )
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"trl": "1.16.0", "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
