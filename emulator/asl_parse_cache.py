"""moto parses a state machine's ASL once per execution: here each definition is parsed once.

moto's Step Functions interpreter runs ANTLR over the definition when the machine is created (to
validate it) and again for every execution it starts; for our provision machine that is ~0.4 s of
CPU on an idle core, more than many of the executions themselves take. The ANTLR parse tree depends
on the definition text alone and moto's preprocessor only reads it, so the tree is kept per
definition and each caller still gets evaluation components built fresh from it, as before (an
execution's components hold its state). A definition that fails to parse is not kept: it fails
again, with moto's own error, every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor

from emulator.moto_internals import patch_point

KEPT_DEFINITIONS = 64
"""Tests deploy a handful of distinct definitions; the oldest beyond this are dropped."""

_PARSE = "moto.stepfunctions.parser.asl.parse.asl_parser:AmazonStateLanguageParser.parse"


class _Trees:
    def __init__(self, parse: Any) -> None:
        self._parse = parse
        self._trees: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, definition: str) -> tuple[Any, Any]:
        with self._lock:
            tree = self._trees.get(definition)
            if tree is not None:
                self._trees.move_to_end(definition)
        if tree is None:
            program, tree = self._parse(definition)  # raises on a bad definition: nothing kept
            with self._lock:
                self._trees[definition] = tree
                while len(self._trees) > KEPT_DEFINITIONS:
                    self._trees.popitem(last=False)
            return program, tree
        return Preprocessor().visit(tree), tree


def install() -> None:
    """Parse each definition once in this process (idempotent)."""
    owner, name = patch_point(_PARSE)
    current = owner.__dict__[name]
    if isinstance(current.__func__, _Bound):
        return
    trees = _Trees(current.__func__)
    setattr(owner, name, staticmethod(_Bound(trees)))


class _Bound:
    """The replacement `parse`, recognisable so `install` is idempotent."""

    def __init__(self, trees: _Trees) -> None:
        self.trees = trees

    def __call__(self, definition: str) -> tuple[Any, Any]:
        return self.trees.parse(definition)
