"""``python -m npu_port`` is the ``npu-port`` command."""

import sys

from .cli.main import main

sys.exit(main())
