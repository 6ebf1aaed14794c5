"""Continuous batching: decode a stream of requests with up to ``max_batch`` in flight, one forward per token for
the whole batch (vLLM / SGLang's scheduling, on the state slots of ``HybridState``).

    decoder = Decoder(model, max_batch=8)
    for done in decoder.run(requests):          # Completions in the order they finish
        print(done.index, done.tokens)
    outputs = generate_many(model, requests, max_batch=8)      # the new tokens of each request, in order

Each row of the batch state is a slot holding one request. Every iteration: requests enter the free slots
(their prompts prefilled as one packed forward, their states written into the slots: ``HybridState.put``), every
live row draws its next token with its own sampling options and random generator, finished rows free their
slots, and one decode step advances the whole batch, each row at its own position. A free slot that no request
takes rides along until half the slots are free; the batch then shrinks to its live rows (``select``).
With ``compile``, that step runs under ``torch.compile(model, dynamic=True)`` (``compiled_step.decode_step``): the
batch growing and shrinking is a symbolic size, so the graphs are reused; the prefills stay eager. With
``compile="cuda-graph"`` it is replayed from a CUDA graph (``graphed_step.py``), one per batch size, the batch
state copied into it after requests join or leave; the batch then shrinks to a power of two (free rows riding
along), so that a drain records at most log2(max_batch) graphs and a later one records none.

Each request's tokens are those of decoding it alone with its seed (``generate`` on that prompt with
``torch.Generator().manual_seed(seed)``): the same draws from the same distributions, the logits equal to
float rounding (``tests/models/decoding``).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hybrid.checks import check_int
from hybrid.kernels.varlen import on_device

from ..sampling import check_sampling, draw_rows, sample_next, sampling_probs
from ..state import HybridState
from .compiled_step import decode_step
from .graph_state import bound_global_spans
from .prompts import PREFILL_MODES, check_prompts, prefill, token_ids


@dataclass(frozen=True)
class Request:
    """One generation request: its prompt (token ids), how many tokens at most, its sampling options, its seed and
    its stop token (it ends the output when produced, and is kept in it). ``seed`` None: the decoder's
    ``seed`` plus the request's index in the stream."""

    prompt: Sequence[int] | Tensor
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token: int | None = None


@dataclass
class Completion:
    """A finished request: its index in the stream, the new tokens (1-D int64), and when its prefill started and
    its last token was chosen (``time.perf_counter()`` seconds)."""

    index: int
    request: Request
    tokens: Tensor
    started: float
    finished: float


@dataclass
class _Slot:
    index: int
    request: Request
    generator: torch.Generator
    started: float
    tokens: list[int] = field(default_factory=list)


class Decoder:
    """Decodes requests with up to ``max_batch`` in flight (see the module docstring). ``prefill`` / ``chunk_size``:
    how prompts are read ("parallel" or "chunked"); ``vocab_limit``: ids from it up are never produced; ``seed``:
    the seed of requests that give none (plus their index); ``compile``: True or a dict of ``torch.compile``
    options runs the decode steps compiled, "cuda-graph" replays them from CUDA graphs, one per batch size
    ("compiled-cuda-graph": graphs of the compiled step; ``decode_step``). With graphs the batch shrinks to a
    power of two, free rows riding along, so that a few batch sizes, each recorded once, serve every drain."""

    def __init__(self, model, max_batch: int = 8, *, prefill: str = "parallel", chunk_size: int | None = None,
                 vocab_limit: int | None = None, seed: int = 0, compile=False):
        self.model = model
        self.step = decode_step(model, compile)
        self.graphed = isinstance(compile, str)  # a graph per batch size: shrink to powers of two
        self.max_batch = check_int("max_batch", max_batch, low=1)
        if prefill not in PREFILL_MODES:
            raise ValueError(f"prefill: expected 'parallel' or 'chunked', got {prefill!r}")
        self.prefill, self.chunk_size = prefill, check_int("chunk_size", chunk_size, low=1, allow_none=True)
        V = model.config.vocab_size
        self.vocab_limit = check_int("vocab_limit", vocab_limit, low=1, high=V, allow_none=True)
        self.seed = check_int("seed", seed)
        self.device = model.embed.weight.device

    def check(self, request: Request, index: int, where: str | None = None) -> Tensor:
        """The request's prompt on the model's device, every option checked. Errors name the request's field,
        after ``requests[index].`` or after ``where`` (e.g. ``"prompts.jsonl:3"``, the line it came from)."""
        if not isinstance(request, Request):
            raise ValueError(f"{where or f'requests[{index}]'}: expected a Request, got {type(request).__name__}")
        try:
            check_int("max_new_tokens", request.max_new_tokens, low=0)
            check_sampling(request.temperature, request.top_k, request.top_p)
            high = (self.vocab_limit or self.model.config.vocab_size) - 1
            check_int("stop_token", request.stop_token, low=0, high=high, allow_none=True)
            check_int("seed", request.seed, allow_none=True)
            prompt = token_ids(request.prompt, "prompt")
            return check_prompts(self.model, [prompt], name=lambda _: "prompt")[0]
        except (ValueError, TypeError, RuntimeError) as e:
            raise ValueError(f"requests[{index}].{e}" if where is None else f"{where}: {e}") from None

    @torch.no_grad()
    def run(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Decode ``requests`` (any iterable, read as slots free up); yields each ``Completion`` as it finishes."""
        queue = _Queue(requests)
        slots: list[_Slot | None] = []
        state, logits = None, None  # the batch state (a row per slot) and each row's next-token logits (B, V)
        lengths: list[int] = []  # each row's tokens in its state, counted on the host: the global caches' bound
        while True:
            free = [row for row, slot in enumerate(slots) if slot is None]
            free += list(range(len(slots), self.max_batch))  # rows the batch has not grown to yet
            taken = []
            for index, request in queue.take(len(free)):
                prompt = self.check(request, index)
                if request.max_new_tokens == 0:
                    now = time.perf_counter()
                    yield Completion(index, request, torch.zeros(0, dtype=torch.long), now, now)
                else:
                    taken.append((index, request, prompt))
            if taken:
                state, logits = self._admit(taken, free, slots, lengths, state, logits)
            live = [row for row, slot in enumerate(slots) if slot is not None]
            if not live:
                if queue.exhausted:
                    return
                continue
            token = self._draw(logits, slots)
            chosen = token.tolist()  # the step's one read back: every row's token, to see which requests end
            for row in live:
                slot = slots[row]
                slot.tokens.append(chosen[row])
                request = slot.request
                if len(slot.tokens) == request.max_new_tokens or slot.tokens[-1] == request.stop_token:
                    slots[row] = None
                    yield Completion(slot.index, request, torch.tensor(slot.tokens, dtype=torch.long), slot.started,
                                     time.perf_counter())
            live = [row for row, slot in enumerate(slots) if slot is not None]
            if not live:
                continue
            if 2 * len(live) <= len(slots) and queue.exhausted:  # nothing left to take the free slots: shrink
                rows = self._rows_to_keep(live, slots)
                keep = on_device(rows, self.device)
                state, logits, token = state.select(keep), logits[keep], token[keep]
                slots, lengths = [slots[row] for row in rows], [lengths[row] for row in rows]
            bound_global_spans(state, max(lengths))  # a finished long request's length is no row's any more
            step_logits, state = self.step(token[:, None], state=state)  # (B, 1, V): one step for every row
            logits = step_logits[:, 0]
            lengths = [n + 1 for n in lengths]

    def _rows_to_keep(self, live: list[int], slots: list) -> list[int]:
        """The rows a shrinking batch keeps: its live ones; with graphs, free ones too up to the next power of two
        (vLLM's padding to captured sizes): the batch then takes only the sizes 1, 2, 4 … below ``max_batch``,
        where each would otherwise record a graph for every count of live rows it met."""
        if not self.graphed:
            return live
        size = 1 << (len(live) - 1).bit_length()  # < 2·len(live) <= len(slots): still a shrink
        free = [row for row, slot in enumerate(slots) if slot is None]
        return sorted(live + free[:size - len(live)])

    def _admit(self, taken, free: list[int], slots: list, lengths: list[int], state, logits):
        """Prefill the taken requests as one packed forward and write their states into free rows (the lowest
        first; past the batch's end, the batch grows); ``slots`` and ``lengths`` are updated in place."""
        started = time.perf_counter()
        new_logits, new_state = prefill(self.model, [prompt for _, _, prompt in taken], self.prefill,
                                        self.chunk_size)
        rows = free[:len(taken)]
        for row, (index, request, prompt) in zip(rows, taken):
            seed = self.seed + index if request.seed is None else request.seed
            slot = _Slot(index, request, torch.Generator(device=self.device).manual_seed(seed), started)
            if row < len(slots):
                slots[row], lengths[row] = slot, len(prompt)
            else:
                slots.append(slot)
                lengths.append(len(prompt))
        if state is None:
            return new_state, new_logits
        n_put = sum(row < state.batch_size for row in rows)  # rows inside the batch: slots to overwrite
        if n_put:
            source = new_state if n_put == len(rows) else new_state.select(torch.arange(n_put, device=self.device))
            put_rows = on_device(rows[:n_put], self.device)
            state = state.put(put_rows, source)
            logits = logits.index_copy(0, put_rows, new_logits[:n_put])
        if n_put < len(rows):  # the batch grows (the stream yielded fewer requests than slots before)
            extra = torch.arange(n_put, len(rows), device=self.device)
            state = HybridState.cat([state, new_state.select(extra)])
            logits = torch.cat([logits, new_logits[n_put:]])
        return state, logits

    def _draw(self, logits: Tensor, slots: list) -> Tensor:
        """Each live row's next token, drawn with its own options and generator. The rows that share their options
        draw together: greedy ones by one argmax, sampled ones from one batched distribution and one race, each
        row's exponentials from its own generator (``draw_rows``; a row alone would launch a dozen kernels)."""
        token = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        groups: dict[tuple, list[int]] = {}  # (temperature, top_k, top_p) → rows; greedy ignores top-k and top-p
        for row, slot in enumerate(slots):
            if slot is not None:
                r = slot.request
                groups.setdefault((0, None, None) if r.temperature == 0 else (r.temperature, r.top_k, r.top_p),
                                  []).append(row)
        for (temperature, top_k, top_p), rows in groups.items():
            # (a row alone: a slice, no index to copy to the device)
            index = slice(rows[0], rows[0] + 1) if len(rows) == 1 else on_device(rows, logits.device)
            if temperature == 0:
                token[index] = sample_next(logits[index], temperature=0, vocab_limit=self.vocab_limit)
            else:
                probs = sampling_probs(logits[index], temperature, top_k, top_p, self.vocab_limit)  # (n, V)
                token[index] = draw_rows(probs, [slots[row].generator for row in rows])
        return token


class _Queue:
    """The request stream, read on demand; ``exhausted`` looks one request ahead."""

    def __init__(self, requests: Iterable[Request]):
        self._stream = iter(enumerate(requests))
        self._ahead: list = []

    def take(self, n: int) -> list:
        out = self._ahead[:n]
        self._ahead = self._ahead[n:]
        return out + list(itertools.islice(self._stream, n - len(out)))

    @property
    def exhausted(self) -> bool:
        if not self._ahead:
            self._ahead = list(itertools.islice(self._stream, 1))
        return not self._ahead


def generate_many(model, requests: Iterable[Request], max_batch: int = 8, **options) -> list[Tensor]:
    """The new tokens of every request (1-D each, in request order), decoded with up to ``max_batch`` in flight
    (``Decoder``; ``options``: its ``prefill``, ``chunk_size``, ``vocab_limit``, ``seed``, ``compile``)."""
    done = {c.index: c.tokens for c in Decoder(model, max_batch, **options).run(requests)}
    return [done[i] for i in range(len(done))]
