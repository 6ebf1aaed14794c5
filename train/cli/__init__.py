"""Every command line: its parser and what it runs (``lm``: hybrid-train and hybrid-generate; ``distill``,
``synthetic``, ``hf``: hybrid-export / -import / -eval, ``rope_analyze``, ``bench``), the parts they share
(``parts``: the parser, value types, one-line errors; ``flags``: flags generated from the run configs' options)
and config files (``config_file``)."""
