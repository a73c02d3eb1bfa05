"""``graphfed data fetch`` / ``data list`` against a loopback HTTP server (a thread in the test; never the internet):
a good fetch, a checksum mismatch, an interrupted download resumed to the right bytes, a 404, a refused connection,
and archives whose members would land outside the target folder."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LoopbackHandler, tar_gz
from graphfed.cli import app
from graphfed.data import fetch
from graphfed.data.fetch import RemoteFile, Source, safe_extract
from graphfed.errors import DataError, DataMissingError

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB, so a download spans several chunks


def _publish(monkeypatch: pytest.MonkeyPatch, url: str, served: bytes | None, published: bytes = PAYLOAD) -> Source:
    """A dataset ``toy`` whose one file the server serves (``served``; None: not at all) and whose publisher's
    checksum and size are those of ``published``."""
    if served is not None:
        LoopbackHandler.files["/toy.bin"] = served
    source = Source("toy", "toy", "toy", "test", "a test file",
                    (RemoteFile("toy.bin", f"{url}/toy.bin", len(published),
                                hashlib.md5(published, usedforsecurity=False).hexdigest()),))
    monkeypatch.setitem(fetch.SOURCES, "toy", source)
    return source


def test_a_good_fetch_lands_verified_and_atomically(server: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(monkeypatch, server, PAYLOAD)
    result = CliRunner().invoke(app, ["data", "fetch", "toy", "--to", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "toy" / "toy.bin").read_bytes() == PAYLOAD
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["toy.bin"]  # no .part left behind
    assert "verified" in result.output
    again = fetch.fetch("toy", tmp_path, progress=False)
    assert again == ["toy.bin: already there (verified)"]


def test_a_checksum_mismatch_deletes_the_download_and_names_both_checksums(server: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tampered = bytes(len(PAYLOAD))  # the right size, other bytes
    _publish(monkeypatch, server, tampered)
    expected = hashlib.md5(PAYLOAD, usedforsecurity=False).hexdigest()
    got = hashlib.md5(tampered, usedforsecurity=False).hexdigest()
    result = CliRunner().invoke(app, ["data", "fetch", "toy", "--to", str(tmp_path), "--no-progress"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "toy.bin" in lines[0] and got in lines[0] and expected in lines[0]
    assert "deleted" in lines[0]
    assert not any((tmp_path / "toy").iterdir())


def test_an_interrupted_download_resumes_with_a_range_request(server: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(monkeypatch, server, PAYLOAD)
    (tmp_path / "toy").mkdir()
    half = len(PAYLOAD) // 2 + 123
    (tmp_path / "toy" / "toy.bin.part").write_bytes(PAYLOAD[:half])  # what an interrupted download left
    assert fetch.file_status(tmp_path / "toy", fetch.SOURCES["toy"].files[0]) == "partial"
    fetch.fetch("toy", tmp_path, progress=False)
    assert LoopbackHandler.ranges_seen == [f"bytes={half}-"]  # only the missing bytes were asked for
    assert (tmp_path / "toy" / "toy.bin").read_bytes() == PAYLOAD


def test_a_404_is_one_line_naming_the_url_and_where_a_file_fetched_by_hand_goes(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(monkeypatch, server, None)
    with pytest.raises(DataError, match=r"toy.bin: HTTP 404 .*put it at .*toy/toy.bin"):
        fetch.fetch("toy", tmp_path, progress=False)


def test_offline_the_error_names_the_url_and_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _publish(monkeypatch, f"http://127.0.0.1:{port}", None)
    result = CliRunner().invoke(app, ["data", "fetch", "toy", "--to", str(tmp_path), "--no-progress",
                                      "--timeout", "5"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert f"cannot reach http://127.0.0.1:{port}/toy.bin" in lines[0]
    assert f"put it at {tmp_path / 'toy' / 'toy.bin'}" in lines[0]


@pytest.mark.parametrize("bad", ["../escape.txt", "inner/../../escape.txt", "/tmp/graphfed-absolute-escape.txt"])
def test_an_archive_member_outside_the_folder_refuses_the_whole_archive(tmp_path: Path, bad: str) -> None:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(tar_gz({"good.txt": b"fine", bad: b"owned"}))
    target = tmp_path / "out" / "inside"
    with pytest.raises(DataError, match=r"would be written outside.*nothing was extracted"):
        safe_extract(archive, target)
    assert not (tmp_path / "out" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not Path("/tmp/graphfed-absolute-escape.txt").exists()
    assert not (target / "good.txt").exists()  # checked before a byte was written


def test_links_and_oversized_members_are_refused(tmp_path: Path) -> None:
    linked = tmp_path / "link.tar.gz"
    linked.write_bytes(tar_gz({"a.txt": b"x"}, links={"passwd": "/etc/passwd"}))
    with pytest.raises(DataError, match="link or a special file"):
        safe_extract(linked, tmp_path / "out")
    big = tmp_path / "big.tar.gz"
    big.write_bytes(tar_gz({"big.bin": bytes(2048)}))
    with pytest.raises(DataError, match=r"above the 1,024 limit"):
        safe_extract(big, tmp_path / "out", max_member_bytes=1024)
    fine = tmp_path / "fine.tar.gz"
    fine.write_bytes(tar_gz({"folder/a.bin": b"abc", "b.bin": b"de"}))
    assert safe_extract(fine, tmp_path / "ok") == 2
    assert (tmp_path / "ok" / "folder" / "a.bin").read_bytes() == b"abc"


def test_a_manual_file_says_where_to_get_it_and_where_it_goes(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """METR-LA's speeds are published on a web page (no direct link): fetch names the page and the path."""
    h5 = next(remote for remote in fetch.SOURCES["metr-la"].files if remote.name == "metr-la.h5")
    assert h5.manual and h5.url.startswith("https://github.com/liyaguang/DCRNN")
    monkeypatch.setitem(fetch.SOURCES, "toy", Source("toy", "metr-la", "metr-la", "MIT", "a manual file", (h5,)))
    with pytest.raises(DataMissingError, match=r"metr-la.h5 from https://github.com/liyaguang/DCRNN.* to .*metr-la"):
        fetch.fetch("toy", tmp_path, progress=False)


SHARED = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared data folder is absent")
def test_data_list_names_every_folder_of_the_shared_data() -> None:
    rows = {row.folder: row for row in fetch.list_data(SHARED)}
    expected = {"mnist": ("mnist", "repackaged"), "fashion-mnist": ("fashion-mnist", "repackaged"),
                "cifar10-jpeg": ("cifar10", "present"), "metr-la-week": ("metr-la-week", "present"),
                "femnist": ("femnist", "present"), "tpt48": ("tpt48", "present"),
                "cifar10": ("cifar10", "missing"), "cifar100": ("cifar100", "missing"),
                "metr-la": ("metr-la", "missing"), "pems-bay": ("pems-bay", "missing"),
                "shakespeare": ("shakespeare", "present")}
    assert {folder: (row.dataset, row.status) for folder, row in rows.items()} == expected
    assert rows["cifar100"].command == f"graphfed data fetch cifar100 --to {SHARED}"
    result = CliRunner().invoke(app, ["data", "list", "--data-dir", str(SHARED)])
    assert result.exit_code == 0 and all(folder in result.output for folder in expected)


def _publish_dated(monkeypatch: pytest.MonkeyPatch, url: str) -> Source:
    """A dataset ``toy`` whose one file is re-issued under its processing date, as NOAA's nClimDiv is."""
    source = Source("toy", "toy", "toy", "test", "a dated file",
                    (RemoteFile("series-{date}", f"{url}/series-{{date}}", dated_by=f"{url}/procdate.txt"),))
    monkeypatch.setitem(fetch.SOURCES, "toy", source)
    return source


def test_a_dated_file_is_fetched_under_the_publishers_current_date(server: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """NOAA renames its nClimDiv files each month: fetch reads the date stamp, then downloads that file."""
    _publish_dated(monkeypatch, server)
    LoopbackHandler.files.update({"/procdate.txt": b"20240105\n", "/series-20240105": PAYLOAD,
                           "/series-20231204": b"an older issue"})
    assert fetch.fetch("toy", tmp_path, progress=False) == [
        "series-20240105: downloaded (no published checksum)"]
    assert (tmp_path / "toy" / "series-20240105").read_bytes() == PAYLOAD
    remote = fetch.SOURCES["toy"].files[0]
    assert fetch.file_status(tmp_path / "toy", remote) == "present"
    LoopbackHandler.files["/procdate.txt"] = b"20240206"  # a newer issue: what is there already is kept, not re-fetched
    assert fetch.fetch("toy", tmp_path, progress=False) == ["series-20240105: already there (present)"]


@pytest.mark.parametrize("stamp", [b"<html>moved</html>", b"2024-01-05", b""])
def test_a_date_stamp_that_is_not_a_date_is_refused_before_any_download(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamp: bytes) -> None:
    _publish_dated(monkeypatch, server)
    LoopbackHandler.files["/procdate.txt"] = stamp
    with pytest.raises(DataError, match=r"procdate.txt: expected a date stamp YYYYMMDD"):
        fetch.fetch("toy", tmp_path, progress=False)
    assert not (tmp_path / "toy").exists() or not any((tmp_path / "toy").iterdir())


def test_a_dated_file_offline_names_the_stamp_url_and_the_path(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _publish_dated(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(DataMissingError, match=rf"cannot reach http://127.0.0.1:{port}/procdate.txt .*offline, "
                                               r"fetch it by hand and put it at .*toy/series-YYYYMMDD"):
        fetch.fetch("toy", tmp_path, progress=False)


def test_tpt48_is_fetched_from_noaa_and_needs_nothing_else() -> None:
    """TPT-48's one file is NOAA's statewide nClimDiv issue, found through NOAA's procdate.txt; this project's CSV
    counts as the same data where it lies."""
    (remote,) = fetch.SOURCES["tpt48"].files
    assert remote.dated_by == "https://www.ncei.noaa.gov/pub/data/cirs/climdiv/procdate.txt"
    assert remote.name == "climdiv-tmpcst-v1.0.0-{date}" and not remote.manual
    assert "tpt48_monthly_tavg_F_1895-2019.csv" in remote.aliases
