"""The `calculator` tool: arithmetic by walking Python's AST, never eval.

Only numbers (int, float), the operators + - * / // % ** and unary +/-, and parentheses are accepted; a name, a
call, an attribute or any other node is refused with the node's kind. Sizes are bounded so no expression runs
long or grows large: exponents by absolute value, integers by bit length (checked before each power and product
is computed), the expression by length and depth.
"""
from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 1000
MAX_DEPTH = 50
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4096

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """Not arithmetic, or beyond the calculator's bounds (the message says which)."""


def evaluate(expression: str) -> Number:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as error:
        raise CalculatorError(f"not an arithmetic expression: {getattr(error, 'msg', error)}") from None
    result = _walk(tree.body, 0)
    if isinstance(result, float) and not math.isfinite(result):
        raise CalculatorError("the result is not a finite number")
    return result


def _walk(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, depth + 1), _walk(node.right, depth + 1)
        _check_size(node.op, left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses")


def _check_size(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse a power or product whose result would exceed the bounds before computing it."""
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is beyond ±{MAX_EXPONENT}")
        if isinstance(left, int) and isinstance(right, int) and right > 0 \
                and left.bit_length() * right > MAX_INT_BITS:
            raise CalculatorError(f"the result would exceed {MAX_INT_BITS} bits")
    if isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int) \
            and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"the result would exceed {MAX_INT_BITS} bits")


def _bounded(value: Number) -> Number:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise CalculatorError("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"the result would exceed {MAX_INT_BITS} bits")
    return value
