"""Evaluation on the bus: `specstream eval` over the completions log workers write (its records:
:mod:`streams.worker.completions_log`): replay against a candidate, score eval samples. See docs/eval.md."""
