"""A language model's run: its config (``config``), its trainer on the one loop (``trainer``, ``stage``), its
validation (``evaluate``) and the trained run read back to generate from (``inference``)."""
