"""One module per op family; importing the package imports every module in it, and their
``@lowers`` decorators register the lowerings. A new family is a new file here."""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
