"""`specstream draft train`: a draft head for the served target, trained from the completions log.

    prompts.py  the built-in prompt set used when the log is thin
    source.py   training sequences from the completions topic (Kafka) and from generation with the target
    train.py    the whole run: data, one target pass, training, held-out acceptance, the artifact
    cli.py      the command line
"""
