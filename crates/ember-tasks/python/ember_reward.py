"""Ember's Python reward adapter: runs TRL-style reward functions over Ember's JSON-lines
reward protocol (see `reward.external` in docs/src/recipes.md).

    python3 ember_reward.py path/to/rewards.py:accuracy[=1.0] path/to/rewards.py:fmt=0.2 ...

Each function has TRL's signature, ``f(prompts, completions, **columns) -> list[float | None]``,
and receives what TRL's ``GRPOTrainer`` passes: ``prompts`` and ``completions`` as strings, or, for
a conversational dataset (a ``messages`` prompt), the prompt's message dicts and the completion
as ``[{"role": "assistant", "content": ...}]``; every dataset column under its own name (the
answer column too), plus ``answer`` (the extracted reference) and ``group`` (the prompt's index
in the step); ``completion_ids``; ``trainer_state`` (``global_step``, ``max_steps``, ``epoch``);
``log_metric(name, value)`` (logged as ``reward/<name>``) and ``log_extra`` (accepted, not shown).
A function takes only the arguments it names, or all with ``**kwargs``. ``async def``
functions run on one event loop kept for the run. ``None`` means the function does not apply
to that completion.

The reward of a completion is the weighted sum of the functions that apply to it (TRL's
``nansum``); when none applies it is null, and Ember masks the sample as invalid. Each function's
values come back as a component, which Ember logs as ``reward/<name>`` (the mean of its values).

Request, one line on stdin: ``{"step": 3, "trainer_state": {...}, "items": [{"prompt",
"completion", "answer", "group", "columns": {...}, "messages": [[role, content], ...],
"completion_ids": [...]}, ...]}`` (or ``{"op": "describe"}``, answered ``{"functions": [names]}``, which
Ember sends first to check the functions before any work). Answer, one line on stdout: ``{"rewards": [...], "components":
{"accuracy": [...], ...}, "metrics": {"name": value}}``. An error in a function is printed with its traceback and the first
failing item, and the adapter exits with status 1 (Ember then stops the run, keeping its last
checkpoint).
"""

import asyncio
import hashlib
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback
import types


def fail(message):
    sys.stderr.write(f"ember_reward: {message}\n")
    sys.stderr.flush()
    sys.exit(1)


def load(spec):
    """`path.py:function[=weight]` (or `module:function`) -> (name, function, weight)."""
    target, _, weight = spec.partition("=")
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        fail(f"{spec!r}: expected path/to/module.py:function[=weight]")
    try:
        weight = float(weight) if weight else 1.0
    except ValueError:
        fail(f"{spec!r}: the weight {weight!r} is not a number")
    if not math.isfinite(weight):
        fail(f"{spec!r}: the weight must be finite")
    try:
        if where.endswith(".py") or os.sep in where:
            path = os.path.abspath(where)
            # One module per file: two files with the same name in different folders differ.
            digest = hashlib.sha1(path.encode()).hexdigest()[:12]
            mod_name = "ember_user_" + os.path.splitext(os.path.basename(path))[0] + "_" + digest
            module = sys.modules.get(mod_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(mod_name, path)
                if loader is None:
                    fail(f"{spec!r}: cannot load {path}")
                module = importlib.util.module_from_spec(loader)
                sys.modules[mod_name] = module
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        fail(f"{spec!r}: importing {where} failed (traceback above)")
    fn = getattr(module, name, None)
    if not callable(fn):
        fail(f"{spec!r}: {where} has no function {name!r}")
    return name, fn, weight


# One event loop for the run, so async functions (TRL accepts them) may keep clients bound to it.
LOOP = None


def run_async(awaitable):
    global LOOP
    if LOOP is None:
        LOOP = asyncio.new_event_loop()
    return LOOP.run_until_complete(awaitable)


def call(fn, prompts, completions, columns, constants=None):
    """The function's values for these completions, checked. `columns` are per-item lists;
    `constants` are per-batch arguments (`trainer_state`, `log_metric`, `log_extra`)."""
    kwargs = dict(columns)
    kwargs.update(constants or {})
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_all:
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    out = fn(prompts=prompts, completions=completions, **kwargs)
    if inspect.isawaitable(out):
        out = run_async(out)
    out = list(out)
    if len(out) != len(completions):
        raise ValueError(f"returned {len(out)} values for {len(completions)} completions")
    values = []
    for i, x in enumerate(out):
        if x is None:
            values.append(None)
            continue
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"value {i} is {x!r}, not a number or None") from None
        values.append(x if math.isfinite(x) else None)
    return values


def first_failing(fn, prompts, completions, columns, constants):
    """The index of the first item on which `fn` fails alone, if any."""
    for i in range(len(completions)):
        one = {k: v[i : i + 1] for k, v in columns.items()}
        try:
            call(fn, prompts[i : i + 1], completions[i : i + 1], one, constants)
        except Exception:
            return i
    return None


def shaped(item):
    """(prompt, completion) as TRL passes them: for a conversation, the prompt's messages and
    the completion as one assistant message; otherwise the two strings."""
    turns = item.get("messages")
    if not turns:
        return item["prompt"], item["completion"]
    prompt = [{"role": role, "content": content} for role, content in turns]
    return prompt, [{"role": "assistant", "content": item["completion"]}]


def score(functions, request):
    items = request["items"]
    pairs = [shaped(it) for it in items]
    prompts = [p for p, _ in pairs]
    completions = [c for _, c in pairs]
    columns = {"answer": [it.get("answer") for it in items],
               "group": [it.get("group") for it in items],
               "completion_ids": [it.get("completion_ids") for it in items]}
    extra = sorted({k for it in items for k in (it.get("columns") or {})})
    for k in extra:
        columns.setdefault(k, [(it.get("columns") or {}).get(k) for it in items])
    state = request.get("trainer_state") or {}
    logged = {}
    constants = {
        "trainer_state": types.SimpleNamespace(
            global_step=state.get("global_step", request.get("step", 1) - 1),
            max_steps=state.get("max_steps", 0), epoch=state.get("epoch", 0.0)),
        # TRL's logging hooks: scalars come back as metrics (the batch's mean per name);
        # extra table columns are accepted and not shown.
        "log_metric": lambda name, value: logged.setdefault(str(name), []).append(float(value)),
        "log_extra": lambda column, values: None,
    }
    total = [None] * len(items)
    components = {}
    for name, fn, weight in functions:
        try:
            values = call(fn, prompts, completions, columns, constants)
        except Exception:
            traceback.print_exc()
            i = first_failing(fn, prompts, completions, columns, constants)
            where = ""
            if i is not None:
                where = (f" on item {i} of step {request.get('step')}: prompt "
                         f"{str(prompts[i])[:200]!r}, completion {str(completions[i])[:200]!r}")
            fail(f"reward function {name!r} raised{where} (traceback above)")
        except BaseException:
            traceback.print_exc()
            fail(f"reward function {name!r} stopped the adapter (traceback above)")
        components[name] = values
        for i, v in enumerate(values):
            if v is not None:
                total[i] = (total[i] or 0.0) + weight * v
    # A sum that overflows is an invalid sample, not a crash of the adapter.
    total = [t if t is not None and math.isfinite(t) else None for t in total]
    metrics = {k: sum(v) / len(v) for k, v in logged.items()
               if v and math.isfinite(sum(v) / len(v))}
    return {"rewards": total, "components": components, "metrics": metrics}


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 0 if len(argv) >= 2 else 2
    # The protocol owns stdout: whatever the user's code prints (Python's print, a subprocess, a
    # C extension) goes to stderr instead; answers go to a private copy of the original stdout.
    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    functions = [load(spec) for spec in argv[1:]]
    names = [n for n, _, _ in functions]
    if len(set(names)) != len(names):
        fail(f"two functions share a name: {names}")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"the request is not JSON: {e}")
        if request.get("op") == "describe":
            answer = {"functions": names}
        else:
            answer = score(functions, request)
        answers.write(json.dumps(answer, allow_nan=False) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
