"""Decoding many sequences at once: prompts of any lengths as one batch (``prompts``), continuous batching over a
stream of requests (``decoder``), speculative decoding with an exact rollback (``speculative``)."""
