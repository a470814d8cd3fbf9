"""The sandbox tool calls run in: bubblewrap namespaces, a seccomp filter, rlimits, a private tmpfs, a wall clock.

* :mod:`.view` - what a call sees (the bubblewrap command line)
* :mod:`.seccomp` - the syscalls it may not make
* :mod:`.runner` - :class:`Sandbox`: one call under its limits, and the start-up check

The threat model and what each limit stops: docs/tools.md.
"""
from streams.tools.sandbox.runner import RunOutcome, Sandbox, SandboxUnavailable

__all__ = ["RunOutcome", "Sandbox", "SandboxUnavailable"]
