"""What a command shows and writes: the console and its progress bars, ``metrics.jsonl``, the experiment trackers
(TensorBoard, Weights & Biases), a run's records on their way to both (``records``), output directories that
are written whole and never over a user's files (``outdir``), never inside what a command reads (``paths``), and by
one writer at a time (``run_lock``)."""
