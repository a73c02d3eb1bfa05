"""The documentation pages generated from the code at build time (``docs/gen_pages.py`` writes them through
mkdocs-gen-files; ``tests/test_docs.py`` checks them).

Nothing here is written by hand twice: the config reference comes from the pydantic models, the method pages from
the registry's catalogue (what ``graphfed describe`` prints), the reports from their committed markdown and plots.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SUITES = ROOT / "src" / "graphfed" / "configs" / "suites"
#: the reports that are pages of the site (folder under benchmarks/results -> page title in the navigation)
REPORTS = {"paper": "Reproduction report", "baselines": "Baselines", "aggregation": "Personalised aggregation",
           "robustness": "Robustness", "flha": "FLHA-GHN", "privacy": "Privacy", "pfl_cifar10": "pfl-research CIFAR-10",
           "fedaghn_self_weight": "FedAGHN self weight", "shakespeare": "Shakespeare and LoRA adapters"}
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
CONSTRAINTS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥", "max_length": "length ≤",
               "pattern": "matches"}


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int | None``, ``'fp32' | 'tf32'``, ``list[str]``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(arg) for arg in args)}]"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def constraints(field: Any) -> str:
    found = []
    for meta in field.metadata:
        for attribute, symbol in CONSTRAINTS.items():
            value = getattr(meta, attribute, None)
            if value is not None:
                found.append(f"{symbol} `{value}`")
    return ", ".join(found)


def cell(text: str) -> str:
    """Table-cell text: one line; pipes escaped outside code spans (inside them the table parser keeps them)."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else part.replace("|", "\\|") for part in parts)


def code(text: str) -> str:
    """A table cell's code span."""
    return f"`{' '.join(text.split())}`"


def sections(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel], list[str]]]:
    """(path, model, its scalar field names) for the model and every nested config section, depth first."""
    scalars = [name for name, field in model.model_fields.items() if not _section(field.annotation)]
    yield prefix, model, scalars
    for name, field in model.model_fields.items():
        if _section(field.annotation):
            yield from sections(field.annotation, f"{prefix}{name}.")


def _section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def config_reference(model: type[BaseModel] | None = None) -> str:
    """Every field of the run config: its path, type, default, constraints and meaning."""
    from graphfed.config import RunConfig, shown_default

    model = model or RunConfig
    lines = ["# Config reference", "",
             "Every field of a run config (YAML, or `--set path=value` on the command line), generated from the "
             "pydantic models in `graphfed.config`. Types are strict: a number field takes a number, a boolean a "
             "boolean. Method options are on each [method's page](methods/index.md); model options in "
             "`graphfed list`.", ""]
    for path, section, names in sections(model):
        title = path.rstrip(".") or "top level"
        lines += [f"## `{title}`" if path else "## Top level", ""]
        doc = section.__doc__ if section.__doc__ and section.__doc__ != BaseModel.__doc__ else ""
        if doc and "Usage docs" not in doc:
            lines += [" ".join(doc.split()), ""]
        lines += ["| field | type | default | constraints | meaning |", "|---|---|---|---|---|"]
        for name in names:
            field = section.model_fields[name]
            lines.append(f"| `{path}{name}` | {code(type_name(field.annotation))} | {code(shown_default(field))} | "
                         f"{cell(constraints(field))} | {cell(field.description or '')} |")
        lines.append("")
    return "\n".join(lines)


def suite_methods(suite: Path, known: set[str]) -> set[str]:
    """The registered methods a suite file runs (any string in it that names one)."""
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(key)
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)
        elif isinstance(node, str):
            yield node

    return {text for text in walk(yaml.safe_load(suite.read_text())) if text in known}


def method_reports(methods: set[str]) -> dict[str, list[str]]:
    """Method -> the reports whose suite runs it."""
    found: dict[str, list[str]] = {name: [] for name in methods}
    for report in REPORTS:
        suite = SUITES / f"{report}.yaml"
        if suite.exists():
            for name in sorted(suite_methods(suite, methods)):
                found[name].append(report)
    return found


def method_pages(catalogue: dict[str, Any]) -> dict[str, str]:
    """reference/methods/<name>.md for every method (its summary, algorithm box, options, reports) and an index."""
    methods = catalogue["methods"]
    reports = method_reports(set(methods))
    pages = {}
    index = ["# Methods", "", "Every registered method, as `graphfed describe METHOD` prints it. Pick one with "
             "`method.name`; set its options with `method.options.NAME`.", "",
             "| method | what it does | server weighting |", "|---|---|---|"]
    for name, entry in methods.items():
        index.append(f"| [`{name}`]({name}.md) | {cell(entry['summary'])} | {cell(entry['server_weighting'])} |")
        page = [f"# `{name}`", "", entry["summary"], "", "## Algorithm", "", "```text", entry["doc"].rstrip(), "```",
                "", "## Server weighting", "", f"How the server weighs the clients it combines: "
                f"{entry['server_weighting']}.", "", "## With LoRA adapters", "",
                f"Under `model.options.adapter` (a frozen pretrained base, [how-to](../../how-to/transformers.md)): "
                f"{entry['adapters']}.", "", "## Asynchronous rounds", "",
                f"Under `train.server_mode: fedbuff | fedasync` ([how-to](../../how-to/asynchronous.md)): "
                f"{entry['asynchronous']}.", "", "## Options", ""]
        if entry["options"]:
            page += ["| option | default | meaning |", "|---|---|---|"]
            page += [f"| `{option}` | {code(default)} | {cell(meaning)} |" for option, default, meaning in
                     entry["options"]]
        else:
            page.append("None.")
        page += ["", "## Run it", "", "```bash", f"graphfed run demo --set method.name={name} --out runs/{name}",
                 "```", ""]
        if reports[name]:
            page += ["## Measured in", ""]
            page += [f"- [{REPORTS[report]}](../../reports/{report}/report.md)" for report in reports[name]]
            page.append("")
        pages[f"reference/methods/{name}.md"] = "\n".join(page)
    pages["reference/methods/index.md"] = "\n".join(index) + "\n"
    return pages


def report_files() -> dict[str, bytes]:
    """reports/<name>/...: each report's markdown and the images it shows, as committed; and the benchmarks' README
    (speed, faults, GPU) as reports/benchmarks.md."""
    files: dict[str, bytes] = {"reports/benchmarks.md": (ROOT / "benchmarks" / "README.md").read_bytes()}
    for report in REPORTS:
        folder = RESULTS / report
        for markdown in sorted(folder.glob("*.md")):
            text = markdown.read_text(encoding="utf-8")
            files[f"reports/{report}/{markdown.name}"] = text.encode()
            for target in IMAGE_LINK.findall(text):
                image = (folder / target).resolve()
                if image.is_relative_to(folder.resolve()) and image.is_file():
                    files[f"reports/{report}/{target}"] = image.read_bytes()
    return files
