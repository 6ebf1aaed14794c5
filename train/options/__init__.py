"""Every run option declared once (``fields``): the sections the run kinds share (``sections``: model, data,
optimizer, loop, logging, execution), the checks of their values (``checks``), and the record every run config is
(``record``: from a dict, to a dict, replaced). The command lines generate their flags from the same declarations
(``hybrid.train.cli.flags``)."""
