"""Edge admission: client input -> an admitted ``GenerateRequest``, as one pipeline (see :mod:`.pipeline`)."""
