"""The suite file of ``graphfed bench``: a grid of methods x datasets x seeds, the papers' numbers and claims.

A suite file names the grid and, where a paper reports a cell, the paper's number beside it::

    name: smoke
    seeds: 2                      # seeds per cell: seed, seed+1, ... from the config's seed
    base:                         # RunConfig fields shared by every cell
      torch_threads: 1
      train: {rounds: 20, local_steps: 10}
    datasets:
      fl60:                       # a key of your choice: one table in the report
        title: FL-60
        config: {dataset: {name: fl60, novel_fraction: 0.2}}   # merged over base
        methods: [panacea, panacea-big, fedavg]
        method_options: {panacea: {server_steps: 2}}
        variants: {panacea-big: {method: panacea, options: {hypernet_hidden: 200}}}  # a row of its own
        paper:
          - label: Panacea T2
            source: "Panacea Table II (accuracy %, mean ± std over clients)"
            numbers: {panacea: {test: "100.0 ± 0.0", novel: "100.0 ± 0.0"}}

A relative ``dataset.data_dir`` in a suite is relative to the suite file; a dataset whose config names none
reads ``--data-dir``, then ``$GRAPHFED_DATA``, then ``../shared/data``.

Every cell is a validated :class:`RunConfig`; :func:`suite_cells` checks them all before anything runs.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graphfed.config import ConfigError, RunConfig, read_yaml_mapping, validate_config, without_adapter


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class PaperCell(_Strict):
    test: str | None = None
    novel: str | None = None


class PaperReference(_Strict):
    """Numbers one paper reports for one dataset setting (as printed, with the paper's own ± and unit)."""

    label: str = Field(description="short column header, e.g. 'FedAGHN T2'")
    source: str = Field(description="table caption and setting")
    unit: str = ""
    notes: str = ""
    numbers: dict[str, PaperCell] = Field(default_factory=dict)


class PaperBudget(_Strict):
    """What one run of a paper's setting trains: its rounds, clients per round, and each client's work a round,
    either local steps of a batch or local epochs over the client's rows. The report compares training rows
    processed over a run, the section's against the paper's."""

    paper: str = Field(description="whose budget, e.g. 'FedAGHN'")
    rounds: int = Field(ge=1)
    clients_per_round: int | None = Field(default=None, ge=1, description="default: the section's own (the paper "
                                          "does not say, or trains every client)")
    local_steps: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    local_epochs: float | None = Field(default=None, gt=0)
    rows_per_client: float | None = Field(default=None, gt=0, description="a client's training rows in the "
                                          "paper's split (to count its epochs in rows)")

    @model_validator(mode="after")
    def _one_kind_of_local_work(self) -> PaperBudget:
        steps = self.local_steps is not None and self.batch_size is not None
        epochs = self.local_epochs is not None and self.rows_per_client is not None
        if steps == epochs:
            raise ValueError("a paper budget gives local_steps and batch_size, or local_epochs and rows_per_client")
        return self

    def rows_per_round(self) -> float:
        """Training rows one client processes in a round."""
        if self.local_steps is not None and self.batch_size is not None:
            return float(self.local_steps * self.batch_size)
        return float(self.local_epochs or 0) * float(self.rows_per_client or 0)

    def describe(self) -> str:
        work = (f"{self.local_steps} steps of batch {self.batch_size}" if self.local_steps is not None
                else f"{self.local_epochs:g} epochs of {self.rows_per_client:,.0f} rows")
        clients = f"{self.clients_per_round} clients" if self.clients_per_round else "its clients"
        return f"{self.rounds} rounds x {clients} x {work}"


class Variant(_Strict):
    """A method under its own label with fixed options, e.g. ``fedaghn-released``, and optionally its own run
    settings merged over the dataset's (an ablation of K_c is ``config: {train: {local_steps: 1}}``)."""

    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _method_is_named_once(self) -> Variant:
        if "method" in self.config or "seed" in self.config:
            raise ValueError("a variant's config cannot set method or seed: use its method and options")
        return self


#: Names that become folder names (suite dataset keys, method labels): no separators, no leading dot, no
#: control characters, so a hostile suite cannot write outside ``--out`` (``../../x``, ``/abs``).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def check_safe_name(name: str, what: str) -> str:
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} cannot name a folder: use letters, digits, '.', '_', '+', '-' "
                         f"(not first), at most 100 characters")
    return name


class Pretrain(_Strict):
    """A base pretrained on public text before the section's cells run (:func:`graphfed.models.pretrained.pretrain`):
    one base for every seed, as a user downloads one pretrained checkpoint; each cell whose model is the section's
    starts from it (``model.base``)."""

    steps: int = Field(default=2000, ge=1)
    batch: int = Field(default=64, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    stride: int = Field(default=8, ge=1, description="characters between the starts of two public windows")
    seed: int = Field(default=0, ge=0)


class SuiteDataset(_Strict):
    title: str | None = None
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    methods: list[str] = Field(min_length=1, description="method names or labels of `variants`")
    method_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    variants: dict[str, Variant] = Field(default_factory=dict)
    seeds: int | None = Field(default=None, ge=1, description="default: the suite's seeds")
    paper_budgets: list[PaperBudget] = Field(default_factory=list, description="what the papers ran this "
                                             "setting for: the report states the section's budget as a fraction "
                                             "of each")
    paper: list[PaperReference] = Field(default_factory=list)
    pretrain: Pretrain | None = Field(default=None, description="pretrain a base on public text first; cells "
                                      "of the section's model start from it")

    @model_validator(mode="after")
    def _labels_are_folder_names(self) -> SuiteDataset:
        for label in (*self.methods, *self.variants):
            check_safe_name(label, "method label")
        return self


class Claim(_Strict):
    """A paper's headline claim, checked against the suite's own cells (or answered by another report)."""

    claim: str = Field(description="the claim as the paper makes it")
    seed_file: str | None = Field(default=None, description="the paper in ../shared/seeds/ (its number, e.g. "
                                  "'003'); only our own questions may name none")
    table: str = Field(description="where the paper makes the claim: table, figure or section")
    paper_numbers: str = Field(default="", description="the paper's own numbers for the claim, as printed")
    question: bool = Field(default=False, description="our own question, not a claim the paper makes")
    note: str = ""
    dataset: str | None = Field(default=None, description="the suite's dataset key whose table tests the claim")
    better: str | None = Field(default=None, description="the method claimed to be better")
    than: list[str] = Field(default_factory=list, description="the methods it is claimed to beat")
    column: Literal["test", "novel", "late", "time"] = Field(
        default="test", description="the score compared: test, novel or late joiners' (the metric), or time (the "
        "simulated seconds to train.target_score: lower is better; undecided while a seed never reached it)")
    factor: float | None = Field(default=None, gt=1, description="MSE only: claimed ratio (theirs / ours), e.g. 100")
    see: str | None = Field(default=None, description="instead of a cell: the report that answers the claim")

    @model_validator(mode="after")
    def _a_cell_or_a_report(self) -> Claim:
        if self.seed_file is None and not self.question:
            raise ValueError(f"claim {self.claim!r}: name the paper (seed_file) it comes from")
        if self.see is None and (self.dataset is None or self.better is None or not self.than):
            raise ValueError(f"claim {self.claim!r}: give dataset, better and than (or see: another report)")
        return self


class Suite(_Strict):
    name: str
    description: str = ""
    seeds: int = Field(default=3, ge=1)
    base: dict[str, Any] = Field(default_factory=dict)
    datasets: dict[str, SuiteDataset] = Field(min_length=1)
    report: str = Field(default="report.md", description="file name of the report in --out (a suite whose own "
                        "script writes report.md, e.g. robustness.yaml, names another)")
    claims: list[Claim] = Field(default_factory=list, description="the papers' claims: a verdict table on top")
    deviations: dict[str, list[str]] = Field(default_factory=dict, description="per paper, every way this suite "
                                             "differs from it, with the reason")

    @model_validator(mode="after")
    def _keys_are_folder_names(self) -> Suite:
        for key in self.datasets:
            check_safe_name(key, "dataset key")
        for claim in self.claims:
            if claim.dataset is not None and claim.dataset not in self.datasets:
                raise ValueError(f"claim {claim.claim!r}: dataset {claim.dataset!r} is not a key of the suite")
        check_safe_name(self.report, "report file name")
        if not self.report.endswith(".md"):
            raise ValueError(f"report {self.report!r}: a markdown file name ending in .md")
        return self


#: the folder of ``--out`` that holds the sections' pretrained bases
BASES = "bases"


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    dataset: str  # the suite's key
    method: str  # the method's name, or a variant's label
    config: RunConfig

    def directory(self, out: Path) -> Path:
        path = out / "runs" / self.dataset / self.method / f"seed{self.config.seed}"
        if not path.resolve().is_relative_to(out.resolve()):  # the names are checked on load; never trust them
            raise ConfigError(f"cell {self.dataset}/{self.method} would be written outside {out}")
        return path


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``, section by section; a section that names another model or method (``name``)
    starts from none of the other one's ``options``, which belong to it."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            below = merged[key]
            if "name" in value and value["name"] != below.get("name"):
                below = {part: setting for part, setting in below.items() if part != "options"}
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def packaged_suites() -> dict[str, Path]:
    """The suites shipped inside the package, by name (``smoke``, ``paper``, ...): they work from an installed
    wheel anywhere; ``graphfed bench NAME`` runs one."""
    folder = Path(str(importlib.resources.files("graphfed") / "configs" / "suites"))
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def resolve_suite(path: str | Path) -> Path:
    """``path`` when it is a file; else the packaged suite it names (``smoke``, ``smoke.yaml``, and the path the
    docs used before the suites were packaged, ``benchmarks/suites/smoke.yaml``), so the docs' commands work from an
    installed wheel in an empty folder; else ConfigError naming the packaged suites."""
    given = Path(path)
    if given.is_file():
        return given
    found = packaged_suites().get(given.stem if given.suffix in (".yaml", ".yml") else given.name)
    if found is None:
        raise ConfigError(f"suite file not found: {given}; give a suite YAML, or the name of a packaged suite: "
                          f"{', '.join(packaged_suites()) or 'none installed'}")
    return found


def load_suite(path: Path) -> Suite:
    """Read and validate a suite file (or a packaged suite by name, :func:`resolve_suite`); ConfigError with one
    line naming the file and the field."""
    path = resolve_suite(path)
    data = read_yaml_mapping(path, "suite file")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{path}: {field}: {message}" if field else f"{path}: {message}") from None
    for config in (suite.base, *(entry.config for entry in suite.datasets.values())):
        _anchor_data_dir(config, path.parent)
    return suite


def _anchor_data_dir(config: dict[str, Any], folder: Path) -> None:
    """A relative ``dataset.data_dir`` in a suite is relative to the suite file, not to where bench runs."""
    dataset = config.get("dataset")
    data_dir = dataset.get("data_dir") if isinstance(dataset, dict) else None
    if isinstance(data_dir, str) and not Path(data_dir).expanduser().is_absolute():
        dataset["data_dir"] = str((folder / data_dir).resolve())


def base_file(key: str, entry: SuiteDataset, shared: dict[str, Any]) -> str:
    """The file name of section ``key``'s pretrained base: it names what the base is (the pretraining, the model
    without its adapter, the federation's plays), so a base pretrained otherwise is another file and the runs
    from it are runs of another config."""
    assert entry.pretrain is not None
    model, dataset = shared.get("model", {}), shared.get("dataset", {})
    identity = {"pretrain": entry.pretrain.model_dump(), "model": model.get("name"),
                "options": without_adapter(model.get("options", {})),
                "plays": [dataset.get("plays"), dataset.get("novel_plays")]}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{key}-{digest}.pt"


def _is_the_sections_model(data: dict[str, Any], shared: dict[str, Any]) -> bool:
    mine, theirs = data.get("model", {}), shared.get("model", {})
    return bool(mine.get("name") == theirs.get("name") and without_adapter(mine.get("options", {}))
                == without_adapter(theirs.get("options", {})))


def suite_cells(suite: Suite, datasets: list[str] | None = None, methods: list[str] | None = None,
                seeds: int | None = None, overrides: dict[str, Any] | None = None,
                out: Path | None = None) -> list[Cell]:
    """Every cell's validated config, all checked before anything runs. Filters select a part of the grid.

    A section with ``pretrain`` gives each cell of its model ``model.base: OUT/bases/<base_file>`` (just the file
    name without ``out``: a run's identity holds the base's file name, not where it lies)."""
    unknown = [key for key in datasets or [] if key not in suite.datasets]
    if unknown:
        raise ConfigError(f"--datasets: not in the suite: {', '.join(unknown)}; the suite has "
                          f"{', '.join(suite.datasets)}")
    cells = []
    for key, entry in suite.datasets.items():
        if datasets and key not in datasets:
            continue
        shared = _deep_merge(_deep_merge(suite.base, entry.config), overrides or {})
        for method in entry.methods:
            if methods and method not in methods:
                continue
            variant = entry.variants.get(method) or Variant(method=method, options=entry.method_options.get(method, {}))
            data = _deep_merge(_deep_merge(shared, variant.config),
                               {"method": {"name": variant.method, "options": variant.options}})
            if entry.pretrain is not None and _is_the_sections_model(data, shared):
                name = base_file(key, entry, shared)
                data["model"] = {**data.get("model", {}), "base": str(out / BASES / name) if out else name}
            first_seed = int(data.get("seed", 0))
            for k in range(seeds or entry.seeds or suite.seeds):
                data["seed"] = first_seed + k
                try:
                    config = validate_config(data)
                except ConfigError as err:
                    raise ConfigError(f"datasets.{key}, method {method}: {err}") from None
                cells.append(Cell(key, method, config))
    return cells


__all__ = ["BASES", "Cell", "Claim", "PaperReference", "Pretrain", "Suite", "SuiteDataset", "Variant", "base_file",
           "check_safe_name", "load_suite", "packaged_suites", "resolve_suite", "suite_cells"]
