"""Evaluation on the bus: the completions log workers write, and `specstream eval` (replay against a candidate,
score eval samples). See docs/eval.md."""
