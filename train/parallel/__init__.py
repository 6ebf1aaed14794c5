"""Where a run executes: the device (``device``), the torchrun job with DDP or FSDP2 wrapping and full state dicts
(``distributed``), the data × context mesh of its ranks (``mesh``), and training batches laid out over the ranks
so a run resumes on any number of them (``sharding``)."""
