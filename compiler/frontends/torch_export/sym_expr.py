"""Whether a symbolic shape expression of a ``.pt2`` program is safe to hand to ``sympy.sympify``.

``torch.export.load`` parses each ``expr_str`` of the program's JSON with ``sympy.sympify``, which
``eval``s it with Python's builtins in reach. ``torch.export.save`` writes them in ``sympy.srepr``
form: ``Mul(Integer(16), Symbol('s44', positive=True, integer=True))``. ``is_plain`` accepts an
expression (parsed with ``ast``, never run) made only of:

- calls of sympy's arithmetic, comparison and logic classes and ``torch.utils._sympy.functions``'
  functions, by name; ``Symbol('<letters><digits>', <assumption>=True|False, ...)``;
- numbers below 2**64, the operators ``+ - * / // % & | ~ not and or`` and comparisons;
- powers and shifts (``Pow``, ``PowByNatural``, ``FloatPow``, ``LShift``, ``RShift``) by a literal
  at most 64 of a base that holds no power or shift, so that evaluating them cannot take hours;
  no ``**`` or ``<<`` operators;

at most 4096 characters. Anything else (a name, an attribute, a string, a subscript, a lambda)
is refused.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re

import sympy
import torch.utils._sympy.functions as torch_sympy

_SYMBOL = re.compile(r"[a-z]+[0-9]+")
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})
_FUNCTIONS = frozenset(
    {n for n, v in vars(torch_sympy).items()
     if inspect.isclass(v) and issubclass(v, sympy.Basic) and v.__module__ == torch_sympy.__name__}
    | {"Add", "Mul", "Integer", "Rational", "Float", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
       "Equality", "Unequality", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or",
       "Not", "floor", "ceiling"} | _POWERS)
_CONSTANTS = frozenset({"True", "False", "true", "false", "oo", "zoo", "nan"})
_ASSUMPTIONS = frozenset(importlib.import_module("sympy.core.assumptions")._assume_defined)   # positive, integer...
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.Invert,
              ast.Not, ast.UAdd, ast.USub, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_MAX_CHARS = 4096
_MAX_EXPONENT = 64


def is_plain(text: object) -> bool:
    """True when ``text`` is a symbolic expression as the module doc describes."""
    if not isinstance(text, str) or len(text) > _MAX_CHARS:
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _plain(tree.body)


def _plain(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and abs(node.value) < 2 ** 64
    if isinstance(node, ast.Name):
        return bool(_SYMBOL.fullmatch(node.id)) or node.id in _CONSTANTS
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _OPERATORS) and _plain(node.left) and _plain(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, _OPERATORS) and _plain(node.operand)
    if isinstance(node, ast.BoolOp):
        return isinstance(node.op, _OPERATORS) and all(_plain(v) for v in node.values)
    if isinstance(node, ast.Compare):
        return all(isinstance(op, _OPERATORS) for op in node.ops) and all(map(_plain, [node.left, *node.comparators]))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _plain_call(node.func.id, node)
    return False


def _plain_call(name: str, node: ast.Call) -> bool:
    if name == "Symbol":
        return (len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and bool(_SYMBOL.fullmatch(node.args[0].value))
                and all(k.arg in _ASSUMPTIONS and isinstance(k.value, ast.Constant) and isinstance(k.value.value, bool)
                        for k in node.keywords))
    if name not in _FUNCTIONS or node.keywords or not all(_plain(a) for a in node.args):
        return False
    if name in _POWERS:
        return len(node.args) == 2 and _small_literal(node.args[1]) and not _has_power(node.args[0])
    return True


def _small_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" and len(node.args) == 1:
        node = node.args[0]
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and 0 <= node.value <= _MAX_EXPONENT


def _has_power(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _POWERS for n in ast.walk(node))
