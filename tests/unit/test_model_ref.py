"""A worker's model reference is checked before the engine is imported: one that names nothing fails at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.model_ref import check_model_ref
from tests.import_checks import loaded_after


def test_a_reference_to_nothing_is_refused_naming_it_and_the_known_models(tmp_path: Path) -> None:
    for missing in ("no-such-model", str(tmp_path / "gone.gguf"), str(tmp_path)):  # tmp_path: a folder, no config.json
        with pytest.raises(FileNotFoundError, match=r"model '.*' is neither a known model \(gemma-3-270m, smollm2-135m-instruct\)"):
            check_model_ref(missing)


def test_a_known_name_a_gguf_file_and_a_model_folder_pass(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for reference in ("smollm2-135m-instruct", str(tmp_path / "model.gguf"), str(folder)):
        check_model_ref(reference)


def test_checking_a_reference_imports_no_torch() -> None:
    code = "from engine.model_ref import check_model_ref\ncheck_model_ref('smollm2-135m-instruct')"
    assert loaded_after(code, ("torch", "transformers")) == []


def test_a_chunked_gguf_whose_package_is_missing_names_the_package_and_how_to_install_it() -> None:
    from engine.model_ref import KNOWN_MODELS, AssembledGgufSource

    gemma = KNOWN_MODELS["gemma-3-270m"]
    assert isinstance(gemma, AssembledGgufSource)
    missing = AssembledGgufSource("no_such_chunked_pkg", "no-such-chunked-pkg", gemma.filename, gemma.install_hint)
    with pytest.raises(FileNotFoundError, match=r"'no-such-chunked-pkg' is not installed \(install it: .*--only-group gemma"):
        missing.locate()
