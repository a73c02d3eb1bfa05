"""``graphfed bench SUITE.yaml``: a resumable grid of methods x datasets x seeds and its markdown report.

The suite file (the grid, the papers' numbers and claims) is described in :mod:`graphfed.suites`; the report
is written by :mod:`graphfed.report.suite`.

Every cell runs in its own directory ``OUT/runs/<dataset key>/<method>/seed<k>``. A cell whose directory holds
a summary of the same config and today's code that ended (completed, or stopped by its own numbers) is skipped;
one with a checkpoint of the same config resumes from it, so an interrupted grid continues where it stopped.
By default each cell runs in a fresh ``graphfed run`` process, which isolates failures and makes each summary's
``peak_rss_mb`` that cell's own peak memory; ``jobs`` > 1 runs that many such processes at once.
"""


from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphfed import runs
from graphfed.client.side_by_side import WORKERS_VARIABLE, usable_cores
from graphfed.config import ConfigError, RunConfig, dump_config, load_config, same_run
from graphfed.errors import GraphfedError, UntrustedInputError
from graphfed.provenance import stale_reason
from graphfed.report.suite import NOT_RUN, StaleOf, write_report
from graphfed.runs import RunResult
from graphfed.setup import resolve_method, run_roots
from graphfed.sim import checkpoint
from graphfed.sim.stages import check_privacy_first
from graphfed.slots import claim_order, fill_slot, import_archive, write_archive
from graphfed.suites import Cell, Suite, load_suite, suite_cells


# ---- running -------------------------------------------------------------------------------------------
def _same_config(directory: Path, config: RunConfig) -> bool:
    """Whether ``directory`` ran ``config``. Compared after validation, so a config.yaml written before a new
    field with a default existed still matches; the data's location is not compared (``same_run``), so committed
    results stay finished in a clone under another root."""
    try:
        return same_run(load_config(directory / runs.CONFIG), config)
    except (ConfigError, OSError):
        return False


def _ended(summary: RunResult) -> bool:
    """The run reached its end: it completed, or its own numbers stopped it (``stopped: ...``: a NaN update, a
    solver short of its tolerance), which the same code and config reproduce, so running it again adds nothing.
    A cell that failed (``failed: ...``: bad input, a crash) or was interrupted has not ended."""
    return summary.completed or summary.status.startswith("stopped:")


def _read_summary(directory: Path) -> RunResult | None:
    try:
        return runs.read_result(directory)
    except (OSError, UntrustedInputError):
        return None


def _ran_with_options(summary: RunResult, config: RunConfig) -> bool:
    """Whether the run ran ``config``'s method options as they resolve now. config.yaml keeps only the options
    that were set; the summary records all, so a run made before a default changed is not reused. An option added
    since the run (not in its summary) is taken to be at its default: a new option's default keeps the behaviour
    the method had before it existed."""
    resolved = resolve_method(config).options.model_dump(mode="json")
    recorded = resolved if summary.method_options is None else summary.method_options  # older ones lack them
    return all(key in resolved and resolved[key] == value for key, value in recorded.items())


def _finished_summary(directory: Path, config: RunConfig) -> RunResult | None:
    """The summary of this config's ended run (completed or stopped) in ``directory``, if there is one, whatever
    code produced it (the report marks a run from other code as stale)."""
    summary = _recorded_summary(directory, config)
    return summary if summary is not None and _ended(summary) else None


def _recorded_summary(directory: Path, config: RunConfig) -> RunResult | None:
    """The summary of this config in ``directory`` whether its run completed or stopped (a report lists a stopped
    run, e.g. one that met a NaN update, among the cells that did not complete), else None."""
    summary = _read_summary(directory) if _same_config(directory, config) else None
    return summary if summary is not None and _ran_with_options(summary, config) else None


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment (which the cells' processes inherit) for the block."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cell_environment(data_dir: Path | None, jobs: int) -> dict[str, str]:
    """Datasets whose config names no data_dir read ``data_dir`` (cells' configs stay location-free); with ``jobs``
    cells at once, each runs its clients side by side on its share of the cores (graphfed.client.side_by_side),
    unless the caller pinned how many."""
    values = {"GRAPHFED_DATA": str(data_dir.resolve())} if data_dir is not None else {}
    if jobs > 1 and WORKERS_VARIABLE not in os.environ:
        values[WORKERS_VARIABLE] = str(max(1, usable_cores() // jobs))
    return values


def _run_in_process(cell: Cell, directory: Path, resume: bool) -> RunResult:
    from graphfed.sim.engine import run_config

    return run_config(cell.config, directory, resume=resume, progress=False)


#: the cell processes running now (several with ``jobs`` > 1), so an interrupted grid can stop them
_RUNNING: set[subprocess.Popen[str]] = set()
_RUNNING_LOCK = threading.Lock()


def _run_in_subprocess(cell: Cell, directory: Path, resume: bool) -> RunResult:
    directory.mkdir(parents=True, exist_ok=True)
    cell_config = directory / "cell.yaml"
    runs.atomic_write_text(cell_config, dump_config(cell.config))
    command = [sys.executable, "-m", "graphfed.cli", "run", str(cell_config), "--out", str(directory),
               "--no-progress", *(["--resume"] if resume else [])]
    before = _summary_identity(directory)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _RUNNING_LOCK:
        _RUNNING.add(process)
    try:
        stdout, stderr = process.communicate()
    except BaseException:  # interrupted while waiting in this thread: the cell's process stops with us
        _stop([process])
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(process)
    return _written_result(directory, before, process.returncode, stderr or stdout)


def _summary_identity(directory: Path) -> tuple[int, int] | None:
    """The run's ``summary.json`` as the file system knows it (inode, modification time), None when there is none."""
    try:
        status = (directory / runs.SUMMARY).stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


def _written_result(directory: Path, before: tuple[int, int] | None, exit_code: int | None, output: str) -> RunResult:
    """What a cell's process wrote: its summary when the process wrote one (``before``: the summary's identity when
    it started), else a failure with the process's last lines. A summary left from an earlier run (a stale cell
    whose rerun failed to start) is not this process's result."""
    if _summary_identity(directory) not in (None, before):
        try:
            return runs.read_result(directory)
        except (OSError, UntrustedInputError):
            pass
    last_lines = output.strip().splitlines()[-3:]
    return RunResult(status=f"failed (exit {exit_code}): {' / '.join(last_lines) or 'no output'}")


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    """Interrupt cell processes (SIGTERM: ``graphfed run`` stops as on Ctrl-C, its checkpoints kept) and wait."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def stale(summary: RunResult, config: RunConfig) -> str | None:
    """Why a finished run of ``config`` is not a run of today's code (:func:`graphfed.provenance.stale_reason`: its
    engine's behaviour or one of its own modules changed), or None when it is."""
    return stale_reason(summary.code, run_roots(config), private=config.privacy.mechanism != "none")


def _reuse_or_plan(cell: Cell, directory: Path, keep_stale: bool,
                   label: str, echo: Any) -> tuple[RunResult | None, bool]:
    """The cell's ended summary when it is reused (echoes why), else ``(None, resume)``: how it must run."""
    same_config = _same_config(directory, cell.config)  # read config.yaml once per cell
    recorded = _read_summary(directory) if same_config else None
    ended = recorded if recorded is not None and _ended(recorded) else None
    summary = ended if ended is not None and _ran_with_options(ended, cell.config) else None
    why = stale(summary, cell.config) if summary is not None else None
    if summary is not None and (keep_stale or why is None):
        before = "done before" if summary.completed else f"ended before ({summary.status})"
        echo(f"{label}: {before}{f' by other code ({why}), kept' if why else ''}, skipped")
        return summary, False
    if why:
        echo(f"{label}: finished by other code ({why}), running again")
    # a run completed under other method defaults or other code starts over rather than resuming
    resume = same_config and ended is None and (directory / checkpoint.CHECKPOINT).is_file()
    echo(f"{label}: {'resuming' if resume else 'running'} ...")
    return None, resume


def _run_cell(cell: Cell, directory: Path, resume: bool, in_process: bool) -> RunResult:
    begin = time.perf_counter()
    try:
        summary = (_run_in_process if in_process else _run_in_subprocess)(cell, directory, resume)
    except GraphfedError as err:  # the cell's input or run state; a bug is not caught here
        summary = RunResult(status=f"failed: {err}")
    summary.cell_seconds = round(time.perf_counter() - begin, 1)
    return summary


#: a pack's cells (their configs differ in the seed only), their directories and whether each resumes
PackJob = list[tuple[Cell, Path, bool]]


def _run_pack_in_process(job: PackJob) -> list[RunResult]:
    from graphfed.sim.pack import Pack

    return Pack([cell.config for cell, _, _ in job], [directory for _, directory, _ in job]).run(
        [resume for _, _, resume in job])


def _run_pack_in_subprocess(job: PackJob) -> list[RunResult]:
    """The pack in a fresh ``graphfed run-pack`` process (each cell's config written beside its run)."""
    entries = []
    for cell, directory, resume in job:
        directory.mkdir(parents=True, exist_ok=True)
        runs.atomic_write_text(directory / "cell.yaml", dump_config(cell.config))
        entries.append({"config": str(directory / "cell.yaml"), "out": str(directory), "resume": resume})
    pack_file = job[0][1].parent / "pack.json"
    runs.atomic_write_text(pack_file, json.dumps(entries, indent=1) + "\n")
    before = [_summary_identity(directory) for _, directory, _ in job]
    process = subprocess.Popen([sys.executable, "-m", "graphfed.cli", "run-pack", str(pack_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _RUNNING_LOCK:
        _RUNNING.add(process)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        _stop([process])
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(process)
        pack_file.unlink(missing_ok=True)
    return [_written_result(directory, identity, process.returncode, stderr or stdout)
            for (_, directory, _), identity in zip(job, before, strict=True)]


def _run_pack(job: PackJob, in_process: bool) -> list[RunResult]:
    """A pack of cells (one cell: the cell alone); each summary's cell time is its share of the pack's."""
    if len(job) == 1:
        cell, directory, resume = job[0]
        return [_run_cell(cell, directory, resume, in_process)]
    begin = time.perf_counter()
    try:
        summaries = (_run_pack_in_process if in_process else _run_pack_in_subprocess)(job)
    except GraphfedError as err:
        summaries = [RunResult(status=f"failed: {err}") for _ in job]
    share = round((time.perf_counter() - begin) / len(job), 1)
    for summary in summaries:
        summary.cell_seconds = share
    return summaries


def _pack_jobs(cells: list[Cell], plans: list[tuple[int, Path, bool]], pack: int) -> list[list[tuple[int, Path, bool]]]:
    """The cells to run, grouped into packs of at most ``pack`` (0: no limit) cells of one dataset key and method
    whose configs differ in their seed only (1, or a config that cannot be packed: one cell per job)."""
    from graphfed.sim.pack import pack_key, pack_refusal

    jobs: list[list[tuple[int, Path, bool]]] = []
    for plan in plans:
        cell = cells[plan[0]]
        if jobs and pack != 1 and pack_refusal(cell.config) is None:
            last = cells[jobs[-1][0][0]]
            if (last.dataset, last.method) == (cell.dataset, cell.method) and pack_key(last.config) == pack_key(
                    cell.config) and (pack == 0 or len(jobs[-1]) < pack):
                jobs[-1].append(plan)
                continue
        jobs.append([plan])
    return jobs


def _ran_line(label: str, summary: RunResult) -> str:
    return f"{label}: {summary.status}, test {summary.metric or ''} {summary.test_mean}, {summary.cell_seconds} s"


def run_cells(cells: list[Cell], out: Path, in_process: bool = False, data_dir: Path | None = None,
              echo: Any = print, keep_stale: bool = False, jobs: int = 1,
              pack: int = 0) -> dict[tuple[str, str], list[RunResult]]:
    """Run (or reuse) every cell; returns summaries by (dataset key, method). A failed cell does not stop the grid.

    A finished cell is reused only when the code that produced it is today's (its summary's code id); a cell from
    other code runs again from scratch, unless ``keep_stale`` (then the report marks it stale). The seeds of a
    (dataset, method) cell run as one pack (:mod:`graphfed.sim.pack`: their clients' calls shared, each run's numbers
    its own) of at most ``pack`` runs (0: all; 1: none). ``jobs`` > 1 runs that many packs or cells at once, each in
    its own process (not with ``in_process``); the numbers depend on neither."""
    if jobs > 1 and in_process:
        raise ConfigError(f"--jobs {jobs} runs each cell in its own process: leave out --in-process")
    if jobs > 1:
        cores = usable_cores()  # what this process may use, which a container or taskset can make fewer
        threads = max((cell.config.torch_threads or cores for cell in cells), default=1)
        if jobs * threads > cores:
            echo(f"note: {jobs} jobs x {threads} torch threads is more than the {cores} CPU cores this process may "
                 "use: the cells will slow each other down (the numbers do not change)")
    summaries: list[RunResult | None] = [None] * len(cells)
    labels = [f"[{index + 1}/{len(cells)}] {cell.dataset} {cell.method} seed {cell.config.seed}"
              for index, cell in enumerate(cells)]
    to_run = []
    for index, cell in enumerate(cells):
        summaries[index], resume = _reuse_or_plan(cell, cell.directory(out), keep_stale, labels[index], echo)
        if summaries[index] is None:
            to_run.append((index, cell.directory(out), resume))
    with _environment(_cell_environment(data_dir, jobs)), ThreadPoolExecutor(max_workers=jobs) as pool:
        running: dict[Future[list[RunResult]], list[int]] = {}
        try:
            for job in _pack_jobs(cells, to_run, pack):
                work = [(cells[index], directory, resume) for index, directory, resume in job]
                indices = [index for index, _, _ in job]
                if jobs == 1:
                    for index, summary in zip(indices, _run_pack(work, in_process), strict=True):
                        summaries[index] = summary
                        echo(_ran_line(labels[index], summary))
                else:  # a worker thread waits on the job's process
                    running[pool.submit(_run_pack, work, False)] = indices
                    while len(running) >= jobs:  # start the next job only when one has ended
                        _collect(running, summaries, labels, echo)
            while running:
                _collect(running, summaries, labels, echo)
        except BaseException:  # Ctrl-C or SIGTERM: stop the cell processes too, then report the interruption
            for future in running:
                future.cancel()
            with _RUNNING_LOCK:
                still_running = list(_RUNNING)
            _stop(still_running)
            raise
    results: dict[tuple[str, str], list[RunResult]] = {}
    for cell, summary in zip(cells, summaries, strict=True):
        assert summary is not None  # every cell was reused or run
        results.setdefault((cell.dataset, cell.method), []).append(summary)
    return results


def _collect(running: dict[Future[list[RunResult]], list[int]], summaries: list[RunResult | None], labels: list[str],
             echo: Any) -> None:
    """Wait for a running job to end; record and echo each of its cells."""
    done, _ = wait(running, return_when=FIRST_COMPLETED)
    for future in done:
        for index, summary in zip(running.pop(future), future.result(), strict=True):
            summaries[index] = summary
            echo(_ran_line(labels[index], summary))


def ensure_bases(suite: Suite, cells: list[Cell], data_dir: Path | None, echo: Any = print) -> None:
    """Pretrain each section's base (``pretrain`` in the suite) that ``cells`` start from and that is not yet in
    ``OUT/bases``; a base there is reused (its file name says how it was pretrained, :func:`base_file`)."""
    from graphfed.models.pretrained import pretrain

    for key, entry in suite.datasets.items():
        spec = entry.pretrain
        starting = [cell for cell in cells if cell.dataset == key and cell.config.model.base]
        if spec is None or not starting:
            continue
        path = Path(str(starting[0].config.model.base))
        if path.is_file():
            echo(f"{key}: base {path.name} pretrained before, reused")
            continue
        echo(f"{key}: pretraining the base on public plays ({spec.steps} steps of {spec.batch} windows) -> {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with _environment(_cell_environment(data_dir, 1)):
            record = pretrain(starting[0].config.model_copy(update={"seed": spec.seed}), path, steps=spec.steps,
                              batch=spec.batch, lr=spec.lr, stride=spec.stride, echo=echo)
        echo(f"{key}: base written, loss {record['final_loss']:.3f}, {record['seconds']} s")


def run_suite(suite_path: Path, out: Path, datasets: list[str] | None = None, methods: list[str] | None = None,
              seeds: int | None = None, overrides: dict[str, Any] | None = None, data_dir: Path | None = None,
              in_process: bool = False, command: str | None = None, echo: Any = print,
              report_only: bool = False, keep_stale: bool = False, jobs: int = 1, pack: int = 0) -> tuple[Path, bool]:
    """Run a suite end to end; returns the report path and whether every cell completed. ``report_only``: run
    nothing, rewrite the report from the finished run directories. ``keep_stale``: reuse finished cells from other
    code instead of running them again (the report marks them). ``jobs``: cells run at once, each in its own
    process."""
    begin = time.perf_counter()
    suite = load_suite(suite_path)
    cells = suite_cells(suite, seeds=seeds, overrides=overrides, out=out)
    selected = [] if report_only else suite_cells(suite, datasets, methods, seeds, overrides, out=out)
    first_of_each = {(cell.dataset, cell.method): cell.config for cell in reversed(selected)}
    check_privacy_first((f"datasets.{key}, method {method}", config) for (key, method), config in first_of_each.items())
    ensure_bases(suite, selected, data_dir, echo)
    results = run_cells(selected, out, in_process=in_process, data_dir=data_dir, echo=echo, keep_stale=keep_stale,
                        jobs=jobs, pack=pack)
    all_done = all(s.completed for results_of_cell in results.values() for s in results_of_cell)
    # The report covers the whole suite: cells a filtered invocation skipped count if an earlier one finished them.
    for cell in cells:
        if cell not in selected:
            recorded = _recorded_summary(cell.directory(out), cell.config)
            results.setdefault((cell.dataset, cell.method), []).append(recorded or RunResult(status=NOT_RUN))
    command = command or shlex.join(["graphfed", "bench", str(suite_path), "--out", str(out)])
    report = write_report(suite, cells, results, out, None if report_only else command, time.perf_counter() - begin,
                          stale_judge(cells))
    return report, all_done


def run_slot(suite_path: Path, out: Path, budget: float, archive: Path | None = None,
             datasets: list[str] | None = None, methods: list[str] | None = None, seeds: int | None = None,
             overrides: dict[str, Any] | None = None, data_dir: Path | None = None, in_process: bool = False,
             echo: Any = print, clock: Any = time.monotonic) -> tuple[Path, Path, int]:
    """One slot of ``budget`` seconds (:mod:`graphfed.slots`): the suite's runs not yet finished by today's code,
    in the order of the claims they decide, each started only when its projected time fits what is left; the
    finished runs written to one archive (``archive``, default ``OUT/slot.tar.gz``) and the report rewritten.
    Returns (report, archive, runs made)."""
    suite = load_suite(suite_path)
    selected = suite_cells(suite, datasets, methods, seeds, overrides, out=out)
    first_of_each = {(cell.dataset, cell.method): cell.config for cell in reversed(selected)}
    check_privacy_first((f"datasets.{key}, method {method}", config) for (key, method), config in first_of_each.items())
    ensure_bases(suite, selected, data_dir, echo)

    def recorded(cell: Cell) -> RunResult | None:
        return _finished_summary(cell.directory(out), cell.config)

    todo = [cell for cell in claim_order(suite, selected)
            if (summary := recorded(cell)) is None or stale(summary, cell.config) is not None]
    echo(f"slot of {budget:.0f} s: {len(todo)} of {len(selected)} runs to make, in the order of the claims")

    def run(cell: Cell) -> RunResult:
        return run_cells([cell], out, in_process=in_process, data_dir=data_dir, echo=echo)[(cell.dataset,
                                                                                             cell.method)][0]

    made = fill_slot(todo, budget, run, recorded, echo, clock)
    finished = [cell for cell, summary in made if summary.completed]
    written = write_archive(archive or out / "slot.tar.gz", out, finished)
    report, _ = run_suite(suite_path, out, seeds=seeds, overrides=overrides, echo=echo, report_only=True)
    echo(f"{len(finished)} finished run(s) in {written} ({written.stat().st_size / 2**20:.2f} MiB)")
    return report, written, len(finished)


def import_runs(suite_path: Path, out: Path, archive: Path, echo: Any = print) -> tuple[Path, int]:
    """Merge a slot's archive into ``out`` (every run checked: its files against the manifest, its config
    against its cell's, its code against today's) and rewrite the report; returns (report, runs imported)."""
    suite = load_suite(suite_path)
    imported = import_archive(archive, out, suite_cells(suite))
    report, _ = run_suite(suite_path, out, echo=echo, report_only=True)
    return report, len(imported)


def stale_judge(cells: list[Cell]) -> StaleOf:
    """:func:`stale` for a report over ``cells``: a run is judged against its own cell's config."""
    configs = {(cell.dataset, cell.method, cell.config.seed): cell.config for cell in cells}

    def judge(key: str, method: str, run: RunResult) -> str | None:
        config = configs.get((key, method, run.seed))
        return None if config is None else stale(run, config)

    return judge


def stale_run_dir(run_dir: Path) -> str | None:
    """:func:`stale` of the run in ``run_dir``, judged against its own ``config.yaml`` (benchmark reports that read
    run folders use it)."""
    return stale(runs.read_result(run_dir), load_config(run_dir / runs.CONFIG))


def code_sentence(run_dirs: list[Path]) -> str:
    """One sentence for a benchmark report that reads run folders: how many of its runs are current, and why the
    others are stale (:func:`stale_run_dir`)."""
    reasons = Counter(stale_run_dir(run_dir) for run_dir in run_dirs)
    current = reasons.pop(None, 0)
    text = (f"**Code.** {current} of {len(run_dirs)} runs are current: their engine's behaviour and their own "
            "method, model and dataset modules are today's (each summary.json records them; `graphfed bench` re-runs "
            "a stale run).")
    if reasons:
        text += " Stale: " + "; ".join(f"{why}: {count}" for why, count in reasons.most_common()) + "."
    return text


def finished_results(suite: Suite, out: Path) -> tuple[list[Cell], dict[tuple[str, str], list[RunResult]]]:
    """Every cell of ``suite`` and, per (dataset, method), the recorded summaries in ``out`` (completed or stopped;
    a "not run" marker where there is none): what a report is written from."""
    cells = suite_cells(suite)
    results: dict[tuple[str, str], list[RunResult]] = {}
    for cell in cells:
        recorded = _recorded_summary(cell.directory(out), cell.config)
        results.setdefault((cell.dataset, cell.method), []).append(recorded or RunResult(status=NOT_RUN))
    return cells, results


# ---- what a run would do -------------------------------------------------------------------------------


@dataclass
class SectionPlan:
    """One dataset section of a suite as ``graphfed bench --plan`` sees it: its finished runs by code, and the
    training time still needed to bring it to today's code."""

    dataset: str
    current: int = 0  #: runs ended (completed or stopped) under today's code: reused
    stale: Counter[str] = field(default_factory=Counter)  #: runs finished by other code, by why: run again
    missing: int = 0  #: runs never ended (or ended under another config): run
    seconds: float = 0.0  #: estimated training time of the stale and missing runs
    unestimated: int = 0  #: stale or missing runs with nothing to estimate their time from

    @property
    def to_run(self) -> int:
        return sum(self.stale.values()) + self.missing


def plan_suite(suite_path: Path, out: Path, datasets: list[str] | None = None, methods: list[str] | None = None,
               seeds: int | None = None, overrides: dict[str, Any] | None = None) -> list[SectionPlan]:
    """What ``graphfed bench`` with the same arguments would run, without running or writing anything: per dataset
    section, the runs finished by today's code, by other code (stale) and not at all, and an estimate of the
    training time the stale and missing runs need. A stale run is estimated by its own recorded training time
    (``wall_seconds``), a missing one by the mean of the same method's finished runs in that section, else of the
    section's; process start and data loading come on top."""
    cells = suite_cells(load_suite(suite_path), datasets, methods, seeds, overrides)
    finished = {id(cell): _finished_summary(cell.directory(out), cell.config) for cell in cells}
    times: dict[tuple[str, str | None], list[float]] = {}
    for cell in cells:
        summary = finished[id(cell)]
        if summary is not None and summary.wall_seconds is not None:
            for key in ((cell.dataset, cell.method), (cell.dataset, None)):
                times.setdefault(key, []).append(summary.wall_seconds)
    plans: dict[str, SectionPlan] = {}
    for cell in cells:
        plan = plans.setdefault(cell.dataset, SectionPlan(cell.dataset))
        summary = finished[id(cell)]
        why = stale(summary, cell.config) if summary is not None else None
        if summary is not None and why is None:
            plan.current += 1
            continue
        if summary is None:
            plan.missing += 1
            known = times.get((cell.dataset, cell.method)) or times.get((cell.dataset, None))
            estimate = sum(known) / len(known) if known else None
        else:
            plan.stale[why or ""] += 1
            estimate = summary.wall_seconds
        if estimate is None:
            plan.unestimated += 1
        else:
            plan.seconds += estimate
    return list(plans.values())


__all__ = ["SectionPlan", "code_sentence", "finished_results", "import_runs", "plan_suite", "run_cells", "run_slot",
           "run_suite", "stale", "stale_judge", "stale_run_dir"]
