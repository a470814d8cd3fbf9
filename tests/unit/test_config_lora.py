"""engine.lora settings: validated, errors name the key, and they reach the engine's LoRAConfig."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from streams.config import Settings


def test_lora_settings_reach_the_engine_config() -> None:
    cfg = Settings(engine={"lora": {"adapters": {"sql": "/a/sql"}, "max_loaded": 2, "max_rank": 32}})
    lora = cfg.engine.lora
    assert lora.enabled and lora.adapters == {"sql": "/a/sql"} and (lora.max_loaded, lora.max_rank) == (2, 32)
    assert not Settings(engine={"lora": {"max_loaded": 0}}).engine.lora.enabled


@pytest.mark.parametrize(("lora", "message"), [
    ({"max_rnk": 8}, "engine.lora.max_rnk"),
    ({"max_rank": 0}, "engine.lora.max_rank"),
    ({"adapters": {"bad name": "/x"}}, "adapters: name 'bad name'"),
    ({"adapters": {"a": " "}}, "adapters.a: the path is empty"),
    ({"adapters": {"a": "/x"}, "max_loaded": 0}, "max_loaded is 0"),
    ({"adapters": {"smollm2-135m-instruct": "/x"}}, "is the base model's name"),
])
def test_bad_lora_settings_fail_naming_the_key(lora: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(engine={"lora": lora})
