"""Every command line: its parser and what it runs (``lm``: hybrid-train and hybrid-generate; ``distill``;
``synthetic``; ``hf``: hybrid-export / -import / -eval; ``rope_analyze``; ``bench``; ``studies``: the tables of the
studies behind docs/research), the parts they share (``parts``: the parser, value types, one-line errors; ``flags``:
flags generated from the run configs' options) and config files (``config_file``). Nothing below imports it: the
commands are the top of the house (``python -m hybrid.train.cli.distill`` runs ``hybrid-distill``, and so on)."""
