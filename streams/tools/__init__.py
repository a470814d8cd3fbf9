"""Server-side tools: calls the model makes, executed as intents on the bus by tool runners, in a sandbox.

* :mod:`.calculator` - safe arithmetic (an AST walker with bounds, no eval)
* :mod:`.executors` - one validated call to its output or error (calculator in process, python in the sandbox)
* :mod:`.file_search` - file_search calls: the tenant's vector stores searched through the rag service
* :mod:`.checks` - allowlist, tenant permission and JSON-schema validation of an intent
* :mod:`.runner` - the tool-runner consumer on the foundation
* :mod:`.sandbox` - the isolation python calls run in
* :mod:`.client` - publish an intent and wait for its result (``specstream tools call``, the benchmark)
"""
