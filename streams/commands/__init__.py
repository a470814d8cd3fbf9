"""The ``specstream`` commands, one module per command group; :mod:`streams.cli` builds the parser from them.

Each module has ``add_commands(commands)``, which adds its subcommands to the
CLI's subparsers with a ``handler(args, settings) -> exit status``:

* :mod:`.run`: ``worker`` and ``edge`` (one service in the foreground)
* :mod:`.up`: ``up`` (the whole local stack, supervised by :mod:`streams.supervisor`)
* :mod:`.status`: ``status`` (every service's latest announcement)
* :mod:`.kafka`: ``kafka ...`` (handed to infra.kafka's own parser) and the local broker ``up`` manages
* :mod:`.topics`: ``topics create|list|markdown|gc``
* :mod:`.send`: ``send`` (one request straight onto the request topic)
* :mod:`.tools`: ``tools list|call`` (the server-side tool registry) and ``tool-runner``
* :mod:`.setup`: ``prepare`` and ``config check|example|reference``
* :mod:`.plan`: ``plan`` (capacity: memory, KV cache, throughput, settings)
* :mod:`.autoscale`: ``autoscale`` (local workers by consumer lag; ``--render-keda``)
* :mod:`.adapters`: ``adapters load|unload|list`` (the LoRA adapter registry on the bus)
* :mod:`.rollout`: ``rollout start|status|pause|resume|abort`` (canary with automatic rollback)
* :mod:`.k8s`: ``k8s generate|build|validate`` (the manifests of infra/k8s)
"""
