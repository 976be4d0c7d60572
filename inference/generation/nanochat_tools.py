"""nanochat's built-in calculator tool, served as nanochat's engine serves it.

The model writes ``<|python_start|>expression<|python_end|>``; the engine evaluates the
expression (``use_calculator`` in nanochat/engine.py: pure arithmetic, or a string's
``.count(...)``) and forces ``<|output_start|>`` + the result's tokens + ``<|output_end|>``
into the reply, in place of what the model would have sampled. The tool is the model's own:
it needs no declaration from the client (function tools a client declares are refused, the
model has no convention for them).

``use_calculator`` evaluates with Python's ``eval`` behind character and pattern guards; here
the same two forms are evaluated from the parsed expression tree (numbers, + - * /, unary
signs, parentheses; ``'literal'.count('literal')``), so the results are Python's own
(``10/2`` is ``5.0``, ``2+3*4`` is ``14``) and nothing else can run.
"""

from __future__ import annotations

import ast
import operator
from collections import deque

from inference.engine.tokenizer.nanochat_bpe import NanochatTokenizer

ARITHMETIC_CHARS = frozenset("0123456789*+-/.() ")
STRING_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ ")
# engine.py's list: any of these in the lower-cased expression refuses it.
DANGEROUS = (
    "__",
    "import",
    "exec",
    "eval",
    "compile",
    "open",
    "file",
    "input",
    "raw_input",
    "globals",
    "locals",
    "vars",
    "dir",
    "getattr",
    "setattr",
    "delattr",
    "hasattr",
)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_DIGITS = 4300  # Python's own int-to-str limit: a longer result would fail str() there too


def use_calculator(expression: str) -> str | None:
    """``str(result)`` of the expression, or None where nanochat's calculator gives none
    (a refused character or pattern, a syntax error, a division by zero)."""
    expr = expression.replace(",", "")
    if all(ch in ARITHMETIC_CHARS for ch in expr):
        if "**" in expr:
            return None
        return _evaluate(expr, _arithmetic)
    if not all(ch in STRING_CHARS for ch in expr):
        return None
    lowered = expr.lower()
    if any(pattern in lowered for pattern in DANGEROUS) or ".count(" not in expr:
        return None
    return _evaluate(expr, _count)


def _evaluate(expr: str, evaluate) -> str | None:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        result = evaluate(tree.body)
        text = str(result)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, _Refused):
        return None
    return text if len(text) <= MAX_DIGITS else None


class _Refused(Exception):
    """The expression has a form the calculator does not evaluate."""


def _arithmetic(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arithmetic(node.operand))
    raise _Refused


def _count(node: ast.AST) -> int:
    """``'haystack'.count('needle')`` and nothing else."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        raise _Refused
    target, args = node.func.value, node.args
    if node.func.attr != "count" or node.keywords or len(args) != 1:
        raise _Refused
    if not all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in (target, args[0])):
        raise _Refused
    return target.value.count(args[0].value)


class CalculatorState:
    """One reply's tool state (nanochat engine.py RowState): collects the tokens between
    ``<|python_start|>`` and ``<|python_end|>``, and on the end queues the forced output."""

    def __init__(self, tokenizer: NanochatTokenizer):
        self.tokenizer = tokenizer
        self.python_start = tokenizer.special_id("<|python_start|>")
        self.python_end = tokenizer.special_id("<|python_end|>")
        self.output_start = tokenizer.special_id("<|output_start|>")
        self.output_end = tokenizer.special_id("<|output_end|>")
        self.forced: deque[int] = deque()
        self.expression: list[int] | None = None  # tokens of the open python block

    def next_forced(self) -> int | None:
        """The token the engine must emit next instead of sampling, if any."""
        return self.forced.popleft() if self.forced else None

    def observe(self, token: int) -> None:
        """Follow the reply one token further (forced tokens included)."""
        if token == self.python_start:
            self.expression = []
        elif token == self.python_end and self.expression is not None:
            expression, self.expression = self.expression, None
            if expression:
                self._queue_result(self.tokenizer.decode(expression).decode("utf-8", errors="replace"))
        elif self.expression is not None:
            self.expression.append(token)

    def _queue_result(self, expression: str) -> None:
        result = use_calculator(expression)
        if result is not None:
            self.forced.extend([self.output_start, *self.tokenizer.encode(result), self.output_end])
