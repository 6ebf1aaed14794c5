"""``hybrid-generate --prompts FILE``: every prompt of a file through one continuous-batching decoder
(``hybrid.models.decoding.Decoder``), with a progress bar and the tokens/s.

FILE is JSON lines when its name ends in ``.jsonl``: each line a JSON string (the prompt) or an object
``{"prompt": "...", "max_new_tokens": 50, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 3, "stop": true}``
whose keys but ``prompt`` are optional and override the command's flags for that prompt. Any other file holds one
prompt per line, as written (no quoting: a prompt is one line). Lines end at "\\n" only (CRLF too), so a form
feed or U+2028 stays in its prompt; errors name the ``file:LINE``, and every line is checked before decoding. Each
prompt is read as the start of a document (``[eos] + prompt``, as ``--prompt``); request i's seed is ``--seed + i``
unless its line gives one, so every output is that of its prompt decoded alone with that seed.

Output: one JSON line per prompt on stdout, in the file's order, ``{"index", "prompt", "completion",
"new_tokens"}``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hybrid.models.decoding.decoder import Decoder, Request

from ..output.progress import progress_bar
from .inference import prompt_ids

OPTION_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")


def read_prompts(path) -> list[dict]:
    """The file's prompts as ``{"prompt": str, <options given>}`` dicts (see the module docstring)."""
    return [item for _, item in read_numbered_prompts(path)]


def read_numbered_prompts(path) -> list[tuple[str, dict]]:
    """The file's prompts as ``(where, item)`` pairs: ``where`` the ``file:LINE`` it came from (for errors),
    ``item`` a ``{"prompt": str, <options given>}`` dict."""
    path = Path(path)
    lines = file_lines(path.read_bytes().decode("utf-8"))  # not read_text: its universal newlines split at "\r"
    if path.suffix != ".jsonl":
        return [(f"{path}:{number}", {"prompt": line}) for number, line in enumerate(lines, 1)]
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            prompts.append((f"{path}:{number}", _json_prompt(line, f"{path}:{number}")))
    return prompts


def file_lines(text: str) -> list[str]:
    """The lines of ``text``, split at "\\n" only (a prompt may hold a form feed, U+2028 or any other character that
    ``str.splitlines`` also splits at), each without a trailing "\\r" (CRLF files); a last line without a newline
    counts, an empty text has none."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline ending the last line, or an empty text
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _json_prompt(line: str, where: str) -> dict:
    """One JSON line as a ``{"prompt": str, <options>}`` dict; errors name ``where`` (``file:LINE``)."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: expected a JSON string or object, got invalid JSON ({e.msg})") from None
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        raise ValueError(f'{where}: expected a JSON string or an object with a "prompt" string, got {line[:60]}')
    unknown = sorted(set(item) - {"prompt", *OPTION_KEYS})
    if unknown:
        raise ValueError(f"{where}: expected keys among prompt, {', '.join(OPTION_KEYS)}, got {unknown}")
    return item


def requests_for(run, items: list[dict], *, max_new_tokens: int, temperature: float, top_k, top_p, seed: int,
                 stop_at_eos: bool, wheres: list[str] | None = None) -> list[Request]:
    """One ``Request`` per prompt: its ids after the tokenizer's document start and its options (the line's, else
    the flags').
    ``wheres``: each item's ``file:LINE``, which errors name (default ``prompts[i]``)."""
    tok = run.tokenizer
    requests = []
    for i, item in enumerate(items):
        stop = item.get("stop", stop_at_eos)
        if not isinstance(stop, bool):
            where = f"prompts[{i}]." if wheres is None else f"{wheres[i]}: "
            raise ValueError(f"{where}stop: expected true or false, got {stop!r}")
        requests.append(Request(
            prompt=prompt_ids(tok, item["prompt"], f"prompts[{i}].prompt" if wheres is None
                              else f"{wheres[i]}: prompt"),
            max_new_tokens=item.get("max_new_tokens", max_new_tokens),
            temperature=item.get("temperature", temperature), top_k=item.get("top_k", top_k),
            top_p=item.get("top_p", top_p), seed=item.get("seed", seed + i),
            stop_token=tok.eos_id if stop else None,
        ))
    return requests


def generate_file(run, path, *, max_batch: int = 8, prefill: str = "parallel", chunk_size=None, out=None,
                  compile: bool | str = False, **options) -> dict:
    """Decode every prompt of ``path`` with ``run``'s model, ``max_batch`` in flight; write one JSON line per
    prompt to ``out`` (stdout), in order. ``compile``: the decode steps under torch.compile, or "cuda-graph"
    (``Decoder``'s). ``options``: ``requests_for``'s. Returns the totals (prompts, new tokens, seconds)."""
    out = sys.stdout if out is None else out
    numbered = read_numbered_prompts(path)
    wheres, items = [where for where, _ in numbered], [item for _, item in numbered]
    requests = requests_for(run, items, wheres=wheres, **options)
    model = run.model
    decoder = Decoder(model, max_batch, prefill=prefill, chunk_size=chunk_size,
                      vocab_limit=min(run.tokenizer.vocab_size, model.config.vocab_size), compile=compile)
    for i, (request, where) in enumerate(zip(requests, wheres)):  # every line's options, before any decoding
        decoder.check(request, i, where=where)
    bar = progress_bar(total=len(requests), desc="generate", unit="prompt")
    start, new_tokens, ready, next_index = time.perf_counter(), 0, {}, 0
    for done in decoder.run(requests):
        new_tokens += done.tokens.numel()
        ready[done.index] = done
        while next_index in ready:  # in the file's order, as soon as the next one is done
            _write(out, ready.pop(next_index), items, run.tokenizer)
            next_index += 1
        bar.update(1)
        bar.set_postfix_str(f"{new_tokens / max(time.perf_counter() - start, 1e-9):,.0f} tok/s")
    bar.close()
    seconds = time.perf_counter() - start
    print(f"generate: {len(requests)} prompts, {new_tokens} new tokens in {seconds:.1f} s "
          f"({new_tokens / max(seconds, 1e-9):,.0f} tokens/s, up to {max_batch} at once)", file=sys.stderr)
    return {"prompts": len(requests), "new_tokens": new_tokens, "seconds": seconds}


def _write(out, done, items, tokenizer) -> None:
    record = {"index": done.index, "prompt": items[done.index]["prompt"],
              "completion": tokenizer.decode(done.tokens.tolist()), "new_tokens": done.tokens.numel()}
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()
