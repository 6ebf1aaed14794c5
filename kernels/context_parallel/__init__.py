"""context_parallel: one long sequence split across ranks, every op with the numbers of one rank.

Every rank holds a contiguous shard of the sequence (`SequenceShard`, from `shard_sequence`). The linear
recurrences exchange one carry per shard (`carry.py`: the complex scan's complex state per channel,
retention's and the G mixer's matrix per head, a cumulative phase), the mixers that look back a fixed distance
exchange a halo (`halo.py`: the conv's W − 1 inputs, a window's w − 1 keys and values; global attention: every
earlier shard), and the loss is the global token mean (`loss.py`). Each op takes the arguments of its one-rank op plus
``shard=``::

    complex_scan_cp(x, log_decay, theta, initial_state=None, *, shard, output_final_state=False, ...)
    retention_cp(q, k, v, log_gamma, initial_state=None, *, shard, output_final_state=False, tile_size=64)
    vo_gla_cp(q, k, v, log_decay, theta, initial_state=None, *, shard, output_final_state=False, tile_size=64, ...)
    causal_conv1d_cp(x, weight, bias=None, initial_state=None, *, shard, output_final_state=False, backend=None)
    window_attention_cp(q, k, v, window, *, shard, scale=None, backend=None)

All collectives are differentiable (`comm.py`: all-gather / all-reduce for the carries; `halo.py`: point to point
for the halos) and run on gloo as on NCCL; `count_traffic()` counts their bytes.
Arguments about the whole sequence (``initial_state``, the packed offsets) are the same on every rank. No
nn.Modules: the mixers and the model wire these in (``shard=`` of their ``forward``).
"""
from .attention import window_attention_cp
from .carry import carry_in, running_sum_in
from .comm import Traffic, count_traffic, gather_shards, keep_in_graph
from .conv import causal_conv1d_cp
from .gla import vo_gla_cp
from .halo import gather_halo
from .loss import global_token_mean
from .retention import retention_cp
from .scan import complex_scan_cp
from .shard import SequenceShard, shard_sequence

__all__ = ["SequenceShard", "Traffic", "carry_in", "causal_conv1d_cp", "complex_scan_cp", "count_traffic",
           "gather_halo", "gather_shards", "global_token_mean", "keep_in_graph", "retention_cp", "running_sum_in",
           "shard_sequence", "vo_gla_cp", "window_attention_cp"]
