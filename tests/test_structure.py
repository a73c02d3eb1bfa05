"""The layout's promises, checked: one place resolves a method, rules declare what they override."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from graphfed.client.contract import ClientRule
from graphfed.methods import METHODS
from graphfed.methods.fedavg import FedAvg

SRC = Path(__file__).parents[1] / "src" / "graphfed"


def _calls(name: str) -> list[str]:
    """Where ``name(...)`` is called in graphfed's sources, as ``file:line``."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_one_place_turns_method_name_into_a_class() -> None:
    """``method.name`` becomes a class and ``method.options`` typed options in ``setup.resolve_method`` only."""
    assert [call.split(":")[0] for call in _calls("method_class")] == ["setup.py"]
    assert [call.split(":")[0] for call in _calls("parse_options")] == ["setup.py"]


def _rule_classes() -> list[type[ClientRule]]:
    seen: list[type[ClientRule]] = []
    stack = [ClientRule]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


@pytest.mark.parametrize("rule", _rule_classes(), ids=lambda cls: cls.__name__)
def test_a_rule_declares_the_hooks_it_overrides(rule: type[ClientRule]) -> None:
    """The executor skips a hook whose flag is False; a rule overriding the hook must say so (here, and only here,
    function identity checks the declaration)."""
    assert rule.evaluates_own_weights == (rule.eval_weights is not ClientRule.eval_weights)
    assert rule.has_evaluation_network == (rule.evaluation_network is not ClientRule.evaluation_network)
    assert rule.has_eval_forward == (rule.eval_forward is not ClientRule.eval_forward)


def test_rules_of_every_method_are_covered() -> None:
    """Every registered method's rule class is among those checked above (imported through the registry)."""
    assert len(_rule_classes()) >= 12 and len(METHODS) == 38


@pytest.mark.parametrize("method", sorted(name for name, cls in METHODS.items() if issubclass(cls, FedAvg)))
def test_fedavg_family_declares_whether_it_sends_one_global_model(method: str) -> None:
    cls = METHODS[method]
    assert cls.sends_global_model == (cls.personalize is FedAvg.personalize)
