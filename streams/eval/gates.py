"""Rollout gates: command-line thresholds on report values; `specstream eval` exits non-zero when one fails.

Each gate reads one value of the report by its path. A value that could not be measured (no reference answers,
no recorded latency to compare with) fails its gate: a rollout must not pass on missing evidence.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Gate:
    flag: str  # command-line option, without the leading dashes
    path: tuple[str, ...]  # where the value lies in the report
    bound: Literal["min", "max"]
    meaning: str


GATES = (
    Gate("min-exact-match", ("scores", "exact_match_rate"), "min", "exact-match rate against the recording"),
    Gate("max-p50-ttft-regression", ("scores", "latency", "ttft_s", "p50", "relative"), "max",
         "relative rise of p50 time to first token"),
    Gate("max-p99-ttft-regression", ("scores", "latency", "ttft_s", "p99", "relative"), "max",
         "relative rise of p99 time to first token"),
    Gate("max-p99-itl-regression", ("scores", "latency", "itl_s", "p99", "relative"), "max",
         "relative rise of p99 inter-token latency"),
    Gate("max-p99-e2e-regression", ("scores", "latency", "e2e_s", "p99", "relative"), "max",
         "relative rise of p99 end-to-end latency"),
    Gate("max-finish-reason-changes", ("scores", "finish_reason_changes", "rate"), "max",
         "share of requests whose finish reason changed"),
    Gate("max-error-rate", ("scores", "error_rate", "candidate"), "max", "share of failed requests"),
    Gate("min-reference-exact-match", ("scores", "reference", "candidate", "exact_match"), "min",
         "exact match against reference answers"),
    Gate("min-token-f1", ("scores", "reference", "candidate", "token_f1"), "min",
         "mean token F1 against reference answers"),
)


def parse_fraction(text: str) -> float:
    """'10%' -> 0.1, '0.99' -> 0.99."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or a percentage such as 10%, got {text!r}") from None


def add_gate_options(parser: argparse.ArgumentParser, *, flags: tuple[str, ...] | None = None) -> None:
    group = parser.add_argument_group("gates (exit status 1 when one fails; N or N%)")
    for gate in GATES:
        if flags is None or gate.flag in flags:
            bound = "lowest" if gate.bound == "min" else "highest"
            group.add_argument(f"--{gate.flag}", type=parse_fraction, metavar="X", help=f"{bound} allowed {gate.meaning}")


@dataclass(frozen=True)
class GateResult:
    gate: str
    threshold: float
    value: float | None
    passed: bool

    def describe(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.4g}"
        return f"{'PASS' if self.passed else 'FAIL'} --{self.gate} {self.threshold:g}: {shown}"


def check_gates(args: argparse.Namespace, report: dict[str, Any]) -> list[GateResult]:
    results = []
    for gate in GATES:
        threshold = getattr(args, gate.flag.replace("-", "_"), None)
        if threshold is None:
            continue
        value = _lookup(report, gate.path)
        passed = value is not None and (value >= threshold if gate.bound == "min" else value <= threshold)
        results.append(GateResult(gate.flag, threshold, value, passed))
    return results


def gate_section(results: list[GateResult]) -> dict[str, Any]:
    return {"passed": all(r.passed for r in results), "results": [asdict(r) for r in results]}


def _lookup(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = report
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return float(node)
