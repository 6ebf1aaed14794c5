"""Training data: sources (stdlib / local files / hub), cached tokenisation, splits, batches, bits per byte.

    data = prepare_data(None)                      # the standard library's .py files, byte tokens
    loader = data.train_loader(seq_len=256, batch_size=16, seed=0, rank=0, world_size=1)
    x, y = next(loader)                            # LongTensor (16, 256) each
    for x, y in data.valid_batches(256, 16): ...   # every validation target once
    data.bpb(mean_val_loss), data.unigram_bpb()    # model vs baseline, bits per byte
"""
from .bpb import loss_to_bpb, unigram_bpb
from .loader import BatchLoader, eval_batches, num_blocks
from .prepare import FORMAT_VERSION, PreparedData, default_cache_dir, prepare_data, tokenize_documents
from .sources import (
    DEFAULT_HUB_DOCUMENTS,
    HubOfflineError,
    Source,
    hub_offline_reason,
    looks_like_hub_name,
    resolve_source,
    stdlib_files,
)

__all__ = [
    "prepare_data", "PreparedData", "default_cache_dir", "tokenize_documents", "FORMAT_VERSION",
    "BatchLoader", "eval_batches", "num_blocks",
    "loss_to_bpb", "unigram_bpb",
    "resolve_source", "Source", "stdlib_files", "looks_like_hub_name", "hub_offline_reason", "HubOfflineError",
    "DEFAULT_HUB_DOCUMENTS",
]
