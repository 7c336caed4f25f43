"""The ``npu-port`` command line: argparse wiring in ``main``, one module per subcommand; the library never imports it."""
