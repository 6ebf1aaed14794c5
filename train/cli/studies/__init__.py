"""The command lines of the studies behind docs/research (``python -m hybrid.train.cli.studies.NAME``): each reads run
directories and prints a markdown table; the study's code is the module it names."""
