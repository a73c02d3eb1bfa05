"""A slot of device time spent on whole runs (``graphfed bench --time-budget``), the archive it hands back, and
``graphfed bench --import`` of that archive: runs that fit, in the claims' order; an archive that round-trips; a
tampered or stale one refused in one line, nothing imported."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from graphfed import bench
from graphfed.cli import app
from graphfed.slots import claim_order, write_archive
from graphfed.suites import load_suite, suite_cells


def _suite(tmp_path: Path) -> Path:
    """Three seeds of Ditto, Local and FedAvg on a tiny FL-N; a claim names FedAvg and Local, so they lead."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "slot", "seeds": 3,
        "base": {"torch_threads": 1, "train": {"rounds": 2, "local_steps": 2, "eval_every": 2}},
        "claims": [{"claim": "FedAvg beats Local", "seed_file": "004", "table": "none", "dataset": "fln",
                    "better": "fedavg", "than": ["local"], "question": True}],
        "datasets": {"fln": {"config": {"dataset": {"name": "fln", "num_clients": 4}},
                             "methods": ["ditto", "local", "fedavg"], "seeds": 3}}}))
    return suite


class FakeClock:
    """Each run takes ten seconds of the slot, whatever the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_slot_runs_what_fits_in_the_claims_order_and_its_archive_imports(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    suite, made = _suite(tmp_path), tmp_path / "slot"
    order = claim_order(load_suite(suite), suite_cells(load_suite(suite)))
    assert [(cell.method, cell.config.seed) for cell in order] == [
        ("local", 0), ("fedavg", 0), ("local", 1), ("fedavg", 1), ("local", 2), ("fedavg", 2),
        ("ditto", 0), ("ditto", 1), ("ditto", 2)]  # the claim's cells first, seed by seed
    clock, ran = FakeClock(), []
    real = bench.run_cells

    def ten_seconds_each(cells, out, **kwargs):  # type: ignore[no-untyped-def]
        if not cells:  # the report's rewrite runs nothing
            return real(cells, out, **kwargs)
        ran.append((cells[0].method, cells[0].config.seed))
        clock.now += 10.0
        return real(cells, out, in_process=True, echo=lambda line: None)

    monkeypatch.setattr(bench, "run_cells", ten_seconds_each)
    lines: list[str] = []
    _, archive, count = bench.run_slot(suite, made, 25.0, echo=lines.append, clock=clock)
    # the first run has no projection and runs; it projects 10 s for the next, which fits in 15; the third does not
    assert ran == [("local", 0), ("fedavg", 0)] and count == 2
    assert any("local seed 1: not started (projected 10 s, 5 s left)" in line for line in lines)
    assert archive == made / "slot.tar.gz" and archive.stat().st_size < 16 * 2**20
    with tarfile.open(archive) as opened:
        names = sorted(opened.getnames())
    assert "manifest.json" in names
    assert {"runs/fln/fedavg/seed0/summary.json", "runs/fln/local/seed0/summary.json"} < set(names)
    assert not any(name.endswith(("checkpoint.pt", "best.pt")) for name in names)  # results only

    # the archive round-trips into a fresh results folder, whose report then holds the two runs
    fresh = tmp_path / "committed"
    result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(fresh), "--import", str(archive)])
    assert result.exit_code == 0, result.output
    assert "imported 2 run(s)" in result.output
    for method in ("local", "fedavg"):
        assert (fresh / "runs" / "fln" / method / "seed0" / "summary.json").read_bytes() == (
            made / "runs" / "fln" / method / "seed0" / "summary.json").read_bytes()
    assert "| fedavg |" in (fresh / "report.md").read_text()


def _rewritten(archive: Path, target: Path, change: dict[str, bytes]) -> Path:
    """``archive`` with some members' bytes replaced (the manifest left as it was)."""
    with tarfile.open(archive) as source, tarfile.open(target, "w:gz") as out:
        for member in source.getmembers():
            handle = source.extractfile(member)
            data = change.get(member.name, handle.read() if handle else b"")
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return target


def test_a_tampered_or_stale_archive_is_refused_in_one_line_and_nothing_imported(tmp_path: Path) -> None:
    suite, made = _suite(tmp_path), tmp_path / "slot"
    cells = suite_cells(load_suite(suite), methods=["fedavg"], seeds=1)
    bench.run_cells(cells, made, in_process=True, echo=lambda line: None)
    archive = write_archive(tmp_path / "a.tar.gz", made, cells)
    summary_name = "runs/fln/fedavg/seed0/summary.json"
    summary = json.loads((made / summary_name).read_text())
    tampered = _rewritten(archive, tmp_path / "tampered.tar.gz",
                          {summary_name: json.dumps({**summary, "test_mean": 1.0}).encode()})
    (made / summary_name).write_text(json.dumps({**summary, "code": {**summary["code"],
                                                                      "behaviour": "0123456789abcdef"}}))
    stale = write_archive(tmp_path / "stale.tar.gz", made, cells)  # a consistent archive of other code's run
    for bad, why in ((tampered, "do not match its manifest (tampered or truncated)"),
                     (stale, "is stale (the engine behaves otherwise"),
                     (tmp_path / "suite.yaml", "not a readable graphfed archive")):
        out = tmp_path / f"into-{bad.stem}"
        result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(out), "--import", str(bad)])
        assert result.exit_code in (2, 3) and len(result.output.strip().splitlines()) == 1, result.output
        assert why in " ".join(result.output.split()), result.output
        assert not (out / "runs").exists()  # nothing imported
