"""HybridForCausalLM: ``HybridLM`` behind transformers' ``PreTrainedModel`` and ``GenerationMixin``.

    model = HybridForCausalLM(HybridHFConfig(HybridConfig.preset("hybrid")))
    out = model(input_ids, attention_mask=mask, labels=input_ids)     # out.loss, out.logits
    model.generate(input_ids, attention_mask=mask, max_new_tokens=20, num_beams=2)

The wrapped model is ``model.model`` (a ``HybridLM``), so the weights are ``model.<HybridLM key>``. Decoding
keeps a ``HybridCache`` (our per-layer states, see cache.py): a prompt is prefilled in parallel mode, then
each new token continues the state through ``HybridLM.forward`` at T = 1, which is ``HybridLM.step``: the one
decode route, that of ``HybridLM.generate(mode="recurrent")``.

``attention_mask`` (1 = token, 0 = pad) may pad rows on either side: each row sees only its own tokens, from
position 0, so logits at real positions equal those of the unpadded row (logits at pads are 0). A padded
batch that starts a sequence (no cache yet) runs as one packed forward over the real tokens
(``cu_seqlens``); its rows then continue as one ragged batch, each at its own position, one forward per new
token for the whole batch (``cache.py``). With padded rows, set ``labels`` to -100 at the pads.

``position_ids``: padding-free batches as transformers' ``DataCollatorWithFlattening`` makes them, one row of
several documents whose positions restart at 0, run as one packed forward in which no document sees another
(no cache is returned for them). Otherwise positions follow from each row's state, and ``position_ids`` must
be the plain ``0 … T−1`` of a fresh row or are ignored after the prompt.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from hybrid.computed_buffers import restore_computed_buffers
from hybrid.models import HybridLM, HybridState
from hybrid.models.config import DTYPES

from .compat import GENERATE_CACHE_KWARG, OUTPUT_CACHE_FIELD
from .cache import HybridCache
from .configuration import HybridHFConfig

# Files written beside the weights for trust_remote_code: they import the installed library (pip install 'hybrid-lm[hf]').
REMOTE_CODE_FILES = {
    "configuration_hybrid.py": "from hybrid.models.hf.configuration import HybridHFConfig  # noqa: F401\n",
    "modeling_hybrid.py": "from hybrid.models.hf.modeling import HybridForCausalLM  # noqa: F401\n",
}
AUTO_MAP = {
    "AutoConfig": "configuration_hybrid.HybridHFConfig",
    "AutoModel": "modeling_hybrid.HybridForCausalLM",
    "AutoModelForCausalLM": "modeling_hybrid.HybridForCausalLM",
}


class HybridPreTrainedModel(PreTrainedModel):
    config_class = HybridHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _is_stateful = True  # no assisted decoding: recurrent states cannot be rolled back
    _supports_cache_class = True

    def _init_weights(self, module):
        """Weights come from ``HybridLM``'s own initialisation (or the checkpoint); nothing to do here."""


class HybridForCausalLM(HybridPreTrainedModel, GenerationMixin):
    def __init__(self, config: HybridHFConfig):
        super().__init__(config)
        hybrid = config.to_hybrid_config()
        dtype = _dtype_name(config.dtype, hybrid.dtype)  # what from_pretrained / from_config were asked for
        if dtype != hybrid.dtype:
            hybrid = hybrid.replace(dtype=dtype)
            config.hybrid = hybrid.to_dict()
        # transformers sets the asked dtype as torch's default while it builds a model; ours is built in float32
        # and cast (its rotary tables and decay constants computed in float32, as a HybridLM of that dtype is).
        # from_pretrained builds it on the meta device, nothing allocated: the buffers computed from the config
        # (not in the checkpoint) keep their values on the host, and from_pretrained writes them back.
        with _default_dtype(torch.float32):
            self.model = HybridLM(hybrid)
        self._tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"} if config.tie_word_embeddings else {}
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save_pretrained, plus two one-line modules and ``auto_map`` in config.json, so that
        ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works without importing us first."""
        self.config.auto_map = dict(AUTO_MAP)
        dtype = _dtype_name(self.dtype, self.config.hybrid["dtype"])  # a model cast since it was built: its dtype
        self.config.hybrid = {**self.config.hybrid, "dtype": dtype}
        super().save_pretrained(save_directory, *args, **kwargs)
        for filename, text in REMOTE_CODE_FILES.items():
            (Path(save_directory) / filename).write_text(text)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained; a checkpoint missing any of our weights is refused (transformers would
        leave them uninitialised), and the non-persistent buffers are put back. ``dtype`` (or ``torch_dtype``)
        is honoured; without it the model loads in the dtype it was saved in."""
        want_info = kwargs.pop("output_loading_info", False)
        if kwargs.get("dtype") is None and kwargs.get("torch_dtype") is None:
            kwargs["dtype"] = "auto"  # the dtype it was saved in (config.json), not torch's default
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(set(info.get("missing_keys", ())) - set(model._tied_weights_keys))
        if missing:
            raise ValueError(f"checkpoint: expected every weight of the model, got none for {missing[:5]}")
        restore_computed_buffers(model)  # transformers allocates them uninitialised while loading a meta model
        return (model, info) if want_info else model

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not hand us a DynamicCache: forward builds a HybridCache

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def resize_token_embeddings(self, *args, **kwargs):
        """transformers' resize, with the vocabulary size written into both configs (the wrapped model's checks
        ids against its own, and a save must load again)."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        vocab = embeddings.num_embeddings
        self.model.config = self.model.config.replace(vocab_size=vocab)
        self.config.hybrid = {**self.config.hybrid, "vocab_size": vocab}
        return embeddings

    # ------------------------------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ):
        """input_ids ``(B, T)``, attention_mask ``(B, past + T)`` or None → logits ``(B, T, vocab)``; ``loss``
        (mean next-token cross-entropy over labels != -100, or its sum over ``num_items_in_batch`` when the Trainer
        passes that) when ``labels`` ``(B, T)`` are given. The cache comes
        as ``past_key_values`` or, the name of transformers ≥ 5.2x, ``cache``."""
        past_key_values = _one_cache(past_key_values, cache)
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds: expected None (HybridForCausalLM takes input_ids), got a tensor")
        if input_ids is None:
            raise ValueError("input_ids: expected a (B, T) tensor of token ids, got None")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = self._cache_for(past_key_values, use_cache)
        past = cache.columns if cache is not None else 0
        B, T = input_ids.shape
        mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] not in (T, past + T):
                raise ValueError(
                    f"attention_mask: expected shape ({B}, {past + T}) (past + new tokens), "
                    f"got {tuple(attention_mask.shape)}"
                )
            mask = attention_mask[:, -T:].bool()
            if bool(mask.all()):
                mask = None

        cu_seqlens = _documents_from_positions(position_ids, input_ids.shape) if past == 0 else None
        if cu_seqlens is not None:
            if mask is not None:
                raise ValueError("attention_mask: expected None or all ones with padding-free position_ids, got padding")
            logits, _ = self.model(input_ids, cu_seqlens=cu_seqlens, output_final_state=False)
            cache = None
        elif cache is None and mask is None:
            logits, _ = self.model(input_ids, output_final_state=False)
        elif mask is not None and (cache is None or cache.state is None):
            logits = self._forward_packed_rows(input_ids, mask, cache)
            if cache is not None:
                cache.columns = past + T
        else:
            logits = self._forward_cached(input_ids, mask, cache if cache is not None else HybridCache())
            if cache is not None:
                cache.columns = past + T

        loss = None
        if labels is not None:
            loss = _next_token_loss(logits, labels, kwargs.get("num_items_in_batch"))
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: cache})

    def _cache_for(self, past_key_values, use_cache: bool) -> HybridCache | None:
        if isinstance(past_key_values, HybridCache):
            return past_key_values
        if past_key_values is not None and not isinstance(past_key_values, Cache):
            raise ValueError(f"past_key_values: expected a HybridCache or None, got {type(past_key_values).__name__}")
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            raise ValueError(f"past_key_values: expected a HybridCache, got a filled {type(past_key_values).__name__}")
        return HybridCache() if use_cache else None

    def _forward_packed_rows(self, input_ids: torch.Tensor, mask: torch.Tensor, cache: HybridCache | None) -> torch.Tensor:
        """A padded batch from its start as one packed forward over the real tokens of every row; returns logits
        ``(B, T, V)`` (0 at pads) and, with a cache, leaves the rows' states in it as one (ragged) batch."""
        B, T = input_ids.shape
        counts = mask.sum(dim=1)  # (B,) real tokens per row
        real = (counts > 0).nonzero().flatten()  # rows holding at least one token
        logits = self.model.lm_head.weight.new_zeros(B, T, self.config.vocab_size)
        states = [None] * B
        if real.numel():
            cu_seqlens = F.pad(torch.cumsum(counts[real], dim=0), (1, 0))  # (N+1,)
            packed = input_ids[mask].unsqueeze(0)  # (1, total): the real tokens, row after row
            packed_logits, packed_states = self.model(packed, cu_seqlens=cu_seqlens,
                                                      output_final_state=cache is not None)
            logits[mask] = packed_logits[0]
            if cache is not None:
                for row, state in zip(real.tolist(), packed_states):
                    states[row] = state
        if cache is not None:
            cache.state = HybridState.cat([self.model.init_state(1) if s is None else s for s in states])
        return logits

    def _forward_cached(self, input_ids: torch.Tensor, mask: torch.Tensor | None, cache: HybridCache) -> torch.Tensor:
        """Continue ``cache.state`` (None: fresh rows) with the new columns; returns logits ``(B, T, V)`` (0 at
        pads). Without pads in them, one forward for the whole batch (a decode step at T = 1). New pads (rare in
        generation) split the rows by mask pattern: each group runs on its real tokens and its rows' states are
        written back (``HybridState.select`` / ``put``)."""
        if cache.state is not None and cache.state.batch_size != input_ids.shape[0]:
            raise ValueError(f"past_key_values: expected a cache of {input_ids.shape[0]} rows (input_ids'), got one of "
                             f"{cache.state.batch_size}")
        if mask is None:
            logits, cache.state = self.model(input_ids, state=cache.state)
            return logits
        B, T = input_ids.shape
        logits = self.model.lm_head.weight.new_zeros(B, T, self.config.vocab_size)
        patterns, inverse = torch.unique(mask, dim=0, return_inverse=True)  # (G, T), (B,)
        for g in range(patterns.shape[0]):
            rows = (inverse == g).nonzero().flatten()  # (n_g,)
            positions = patterns[g].nonzero().flatten()
            if positions.numel() == 0:
                continue
            state = cache.state if patterns.shape[0] == 1 else cache.state.select(rows)
            group_logits, state = self.model(input_ids[rows][:, positions], state=state)  # T_g = 1: a decode step
            logits[rows[:, None], positions[None, :]] = group_logits
            cache.state = state if patterns.shape[0] == 1 else cache.state.put(rows, state)
        return logits

    # ------------------------------------------------------------------------------------------ generate

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=True,
                                      cache=None, **kwargs):
        """The columns the cache has not consumed yet (all of them on the first call). generate names the cache
        ``past_key_values`` or ``cache`` by release (``GENERATE_CACHE_KWARG``); it is handed back under that name."""
        cache = _one_cache(past_key_values, cache)
        if isinstance(cache, HybridCache) and cache.columns > 0:
            if input_ids.shape[1] <= cache.columns:
                raise ValueError(f"input_ids: expected the whole sequence so far, longer than the {cache.columns} "
                                 f"columns past_key_values holds (generate feeds the columns after them), got "
                                 f"{input_ids.shape[1]} columns")
            input_ids = input_ids[:, cache.columns:]
        return {"input_ids": input_ids.contiguous(), "attention_mask": attention_mask,
                GENERATE_CACHE_KWARG: cache, "use_cache": use_cache}


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """The next-token cross-entropy of ``logits`` ``(B, T, V)`` against ``labels`` ``(B, T)`` (-100: none): the mean
    over the labelled tokens, or their sum over ``num_items_in_batch``, the labelled tokens of a whole
    gradient-accumulation step, which transformers' Trainer passes instead of dividing the loss by the
    accumulation steps (as its own models take it)."""
    logits, labels = logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, labels, ignore_index=-100)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(logits.device)
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / num_items_in_batch


def _documents_from_positions(position_ids: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """``cu_seqlens`` of a padding-free row (positions restarting at 0 at each document), or None when the
    positions are the plain ``0 … T−1`` of every row (or not given)."""
    if position_ids is None:
        return None
    B, T = shape
    if not isinstance(position_ids, torch.Tensor) or position_ids.shape[-1] != T or position_ids.numel() != B * T:
        got = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids: expected shape ({B}, {T}), got {got}")
    pos = position_ids.reshape(B, T).to(torch.long)
    plain = torch.arange(T, device=pos.device)
    if bool((pos == plain).all()):
        return None
    if B != 1:
        raise ValueError(f"position_ids: expected 0 … T−1 in every row, or one padding-free row (batch 1) whose "
                         f"positions restart at 0 at each document, got batch {B} with other positions")
    row = pos[0]
    steps_on = row[1:] == row[:-1] + 1
    if int(row[0]) != 0 or not bool((steps_on | (row[1:] == 0)).all()):
        raise ValueError("position_ids: expected positions that start at 0 and count up by 1 within each "
                         "document, restarting at 0 at the next (DataCollatorWithFlattening's layout), got "
                         f"{row[:12].tolist()}{' …' if T > 12 else ''}")
    starts = (row == 0).nonzero().flatten()
    return torch.cat([starts, starts.new_tensor([T])])


def _dtype_name(dtype, default: str) -> str:
    """The ``HybridConfig.dtype`` name of a torch dtype or its name (None: ``default``)."""
    if dtype is None:
        return default
    for name, value in DTYPES.items():
        if dtype in (name, value):
            return name
    raise ValueError(f"dtype: expected one of {list(DTYPES)} (or None), got {dtype}")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """torch's default dtype set to ``dtype`` inside the block, put back after."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _one_cache(past_key_values: Cache | None, cache: Cache | None) -> Cache | None:
    """The cache under either of its names; both at once is an error."""
    if past_key_values is not None and cache is not None:
        raise ValueError("cache: expected the cache as past_key_values or as cache, got both")
    return cache if cache is not None else past_key_values

