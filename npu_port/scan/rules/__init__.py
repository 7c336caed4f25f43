"""The built-in scan rules, one module each; importing this package registers every one of them (a new rule is one
new module here, plus its fixture)."""

import importlib
import pkgutil

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    if not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")
