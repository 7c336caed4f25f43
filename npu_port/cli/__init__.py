"""The ``npu-port`` command line: argparse wiring in ``main``, one module per subcommand.

The library never imports this package.
"""
