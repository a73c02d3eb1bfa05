"""What ``graphfed list`` and ``graphfed describe`` print, read without importing torch.

Listing methods means importing every method module, and with them torch (about 2 s on a 2-core machine) — far
too slow for a command a user types to look something up. ``catalogue.json`` beside this file holds the same
text, generated from the registries by ``python -m graphfed.catalogue``; a test rebuilds it and fails when the
committed file differs, so it cannot go stale.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).with_name("catalogue.json")


def build() -> dict[str, Any]:
    """The catalogue from the live registries (imports torch)."""
    from graphfed.config import shown_default
    from graphfed.data import DATASETS
    from graphfed.methods import METHODS
    from graphfed.models import MODELS

    methods = {}
    for name, cls in sorted(METHODS.items()):
        options = [[option, shown_default(field), field.description or ""]
                   for option, field in cls.Options.model_fields.items()]
        methods[name] = {"summary": cls.summary, "doc": inspect.getdoc(inspect.getmodule(cls)) or "",
                         "server_weighting": cls.server_weighting, "adapters": cls.adapters,
                         "asynchronous": asynchronous_text(cls),
                         "options": options}
    return {"methods": methods,
            "datasets": {name: f"{info.task}: {info.description}" for name, info in sorted(DATASETS.items())},
            "models": {name: text for name, (_, text) in sorted(MODELS.items())}}


def asynchronous_text(cls: Any) -> str:
    """What a method does with updates that arrive as clients finish (``train.server_mode``), one sentence."""
    if cls.asynchronous_refusal is not None:
        return f"synchronous rounds only: {cls.asynchronous_refusal}"
    global_model = getattr(cls, "sends_global_model", False)
    return (("fedbuff and fedasync" if global_model else "fedbuff (fedasync mixes one global model, which it does not "
             "have)") + ": " + cls.asynchronous)


def render(catalogue: dict[str, Any]) -> str:
    return json.dumps(catalogue, indent=1, ensure_ascii=False) + "\n"


def load() -> dict[str, Any]:
    """The committed catalogue (no torch)."""
    return json.loads(CATALOGUE.read_text(encoding="utf-8"))


def main() -> None:
    CATALOGUE.write_text(render(build()), encoding="utf-8")
    print(f"wrote {CATALOGUE}")


if __name__ == "__main__":
    main()
