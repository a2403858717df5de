"""`PolicySpec`: the policy a closed-loop run drives, as data carried whole from the command line to the workers; and
the stochastic sample count under one name (`samples`) from the command line to the controller's `predict`."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from drive.errors import UserError
from drive.loop.policies import ExpertPolicy
from drive.loop.specs import POLICY_KINDS, PolicySpec

ROOT = Path(__file__).resolve().parents[3]


def test_a_spec_pickles_round_trip_and_hashes_alike():
    spec = PolicySpec.parse(
        "ckpt:runs/x/best.pt", env="fake-road", samples=8, seed=3, shadow="pursuit", fallback="expert", threshold=0.5
    )
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and hash(again) == hash(spec)
    assert (again.kind, again.arg, again.samples, again.threshold) == ("ckpt", "runs/x/best.pt", 8, 0.5)
    assert str(again) == "ckpt:runs/x/best.pt"


def test_build_makes_the_expert_it_names():
    policy = PolicySpec.parse("expert:pursuit", env="fake-road").build()
    assert isinstance(policy, ExpertPolicy) and policy.name == "fake-road:pursuit"
    assert set(POLICY_KINDS) == {"expert", "ckpt"}


@pytest.mark.parametrize(
    ("text", "options", "words"),
    [
        ("pursuit", {}, "expected KIND:ARG"),
        ("robot:x", {}, "expected KIND:ARG"),
        ("ckpt:", {}, "expected KIND:ARG"),
        ("ckpt:x.pt", {"samples": 0}, "samples must be >= 1"),
        ("ckpt:x.pt", {"fallback": "panic"}, "fallback mode 'panic'"),
    ],
)
def test_a_bad_spec_fails_at_once_in_one_line(text, options, words):
    with pytest.raises(UserError, match=words) as caught:
        PolicySpec.parse(text, **options)
    assert "\n" not in str(caught.value)


# the names under which a count is stored or set on disk / on the command line, not passed along: config fields of
# controllers (checkpoint configs) and of the SA study tasks (`task.n_samples=`), read as `cfg.` / `opts.` fields
CONFIG_READERS = {"cfg", "opts"}


def _old_names(source: str, where: str) -> list[str]:
    tree = ast.parse(source, where)
    fields = {
        id(stmt.target)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == "n_samples":
            found.append(f"{where}:{node.lineno} parameter")
        elif isinstance(node, ast.keyword) and node.arg == "n_samples":
            found.append(f"{where}:{node.lineno} keyword")
        elif isinstance(node, ast.Name) and node.id == "n_samples" and id(node) not in fields:
            found.append(f"{where}:{node.lineno} name")
        elif isinstance(node, ast.Attribute) and node.attr == "n_samples":
            if not (isinstance(node.value, ast.Name) and node.value.id in CONFIG_READERS):
                found.append(f"{where}:{node.lineno} attribute")
    return found


def test_the_sample_count_travels_under_one_name():
    """`--samples` reaches `predict(x, samples)` as `samples` everywhere: no parameter, keyword, variable or policy
    attribute named n_samples is left in drive/ or agents/ (stored keys such as a threshold record's "n_samples" are
    strings, and stay as old files have them)."""
    paths = [path for folder in ("drive", "agents") for path in sorted((ROOT / folder).rglob("*.py"))]
    found = [hit for path in paths for hit in _old_names(path.read_text(), str(path.relative_to(ROOT)))]
    assert paths and not found, found


def test_the_scan_finds_the_old_name():
    source = "def f(x, n_samples=None):\n    return g(x, n_samples=n_samples) + self.n_samples\n"
    kinds = sorted(hit.split(" ")[1] for hit in _old_names(source, "probe.py"))
    assert kinds == ["attribute", "keyword", "name", "parameter"]
